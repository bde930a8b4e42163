#pragma once
// A device allocation for the GPU tests (g++ code, CUDA runtime API).

#include <pagestash/cuda/error.hpp>

#include <cuda_runtime_api.h>

#include <vector>

namespace pagestash_test {

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t count;
  /// n elements, and `slack` bytes past them (1 by default, so that an empty buffer has an
  /// address too); slack 0 allocates exactly n * sizeof(T) bytes (null when that is 0), so
  /// that compute-sanitizer memcheck reports any access past the end.
  explicit DeviceBuffer(std::size_t n, std::size_t slack = 1) : count(n) {
    if (n * sizeof(T) + slack != 0)
      PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T) + slack));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// On the legacy default stream. From pageable memory cudaMemcpy may return before the
  /// copy has landed, and a non-blocking stream does not wait for the legacy one: before
  /// work on such a stream reads the buffer, synchronise (cudaDeviceSynchronize).
  void upload(const std::vector<T>& v) {
    if (!v.empty()) PAGESTASH_CUDA_TRY(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(count);
    if (count != 0) PAGESTASH_CUDA_TRY(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

}  // namespace pagestash_test
