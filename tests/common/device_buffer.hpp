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
  explicit DeviceBuffer(std::size_t n) : count(n) {
    PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T) + 1));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) {
    PAGESTASH_CUDA_TRY(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> v(count);
    PAGESTASH_CUDA_TRY(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

}  // namespace pagestash_test
