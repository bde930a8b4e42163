#pragma once
// The host check every operation on a CUDA stream makes first (the CUDA executor and nccl.cuh): the CUDA stream belongs
// to the pool's device. Host code: compiles with a plain C++ compiler, links cudart.

#include <pagestash/cuda/error.hpp>
#include <pagestash/detail/errors.hpp>

#include <cuda_runtime_api.h>

#include <string>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// Refuses `op` when the CUDA stream `stream` belongs to another device than `pool_device`. A stream being captured
/// refuses cudaStreamGetDevice (and the capture would be invalidated): there the current device, whose context a
/// launch into the stream uses, is checked.
inline void check_stream_device(const char* op, cudaStream_t stream, int pool_device) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PAGESTASH_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  int device = 0;
  if (capture == cudaStreamCaptureStatusNone) PAGESTASH_CUDA_TRY(cudaStreamGetDevice(stream, &device));
  else PAGESTASH_CUDA_TRY(cudaGetDevice(&device));
  if (device != pool_device)
    throw_invalid(std::string("pagestash::") + op, "the CUDA stream belongs to device " + std::to_string(device) +
                                                       ", the pool lives on device " + std::to_string(pool_device));
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
