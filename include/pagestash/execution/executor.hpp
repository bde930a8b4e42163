#pragma once
// Where an operation runs, chosen by the caller as in Thrust:
//
//   pagestash::host        the reference executor: runs the steps on the calling CPU thread
//                          (HostExecutor{n} copies with n threads), on a host-memory pool
//   pagestash::on(stream)  CUDA kernels enqueued on the CUDA stream `stream`, on a device-memory pool
//
// The operations themselves (stash, reload, discard, reset, end_step, report) are declared in execution/host.hpp and
// execution/cuda.cuh.

#include <pagestash/detail/errors.hpp>
#include <pagestash/pool/memory_space.hpp>

#include <cuda/std/cstdint>

#include <cuda_runtime_api.h>

#include <stdexcept>

PAGESTASH_NAMESPACE_BEGIN

/// Options of reload (either executor).
struct ReloadOptions {
  bool zero_tail = false;  ///< also clear the bytes of the paged buffers outside the live rows
  /// A reload that does not restore (docs/api.md "Failures") fills the paged and kept buffers with poison (every byte
  /// 0xFF: NaN), so that any use shows; off: left as they were.
  bool poison = true;
};

struct HostExecutor {
  static constexpr MemorySpace memory = MemorySpace::host;
  unsigned threads = 1;  ///< CPU threads that copy tiles, at most (the plan is made on the caller's)
  /// A thread more for each this many bytes of the stream (a thread costs its start): 0, every thread.
  cuda::std::int64_t bytes_per_thread = 0;
};
inline constexpr HostExecutor host{};

struct CudaExecutor {
  static constexpr MemorySpace memory = MemorySpace::device;
  cudaStream_t stream = nullptr;
  int max_blocks = 0;  ///< caps the grid (e.g. to leave SMs to the GEMMs beside it); 0: full occupancy
  /// sm_90 and newer: an operation's kernel may start while the one before it on the stream ends, and waits for that
  /// one's end before its first access (only the launch's latency is hidden). Off: plain launches.
  bool programmatic_launch = true;

  CudaExecutor with_max_blocks(int blocks) const { return CudaExecutor{stream, blocks, programmatic_launch}; }
  CudaExecutor with_programmatic_launch(bool on) const { return CudaExecutor{stream, max_blocks, on}; }
};

/// The executor for the CUDA stream `stream`. The legacy default CUDA stream (null) is refused: it cannot be captured
/// into a graph and serialises with every other; use a created one or cudaStreamPerThread.
inline CudaExecutor on(cudaStream_t stream) {
  if (stream == nullptr)
    detail::throw_invalid("pagestash::on",
                          "the null (legacy default) CUDA stream is not accepted; pass a created "
                          "stream or cudaStreamPerThread");
  return CudaExecutor{stream, 0};
}

PAGESTASH_NAMESPACE_END
