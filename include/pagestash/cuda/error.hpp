#pragma once
// Checked CUDA runtime calls (host code: compiles with a plain C++ compiler, links cudart).
// Every failing status becomes a pagestash::CudaError naming the call and where it was made.

#include <pagestash/config.hpp>

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t status, const char* what_call, const char* file, int line)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what_call +
                           " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")"),
        status_(status) {}
  cudaError_t status() const noexcept { return status_; }

 private:
  cudaError_t status_;
};

namespace detail {
inline void cuda_check(cudaError_t status, const char* what_call, const char* file, int line) {
  if (status == cudaSuccess) return;
  // Reported here, so no longer the runtime's last error: a later launch's check must not report it again.
  (void)cudaGetLastError();
  throw CudaError(status, what_call, file, line);
}
}  // namespace detail

PAGESTASH_NAMESPACE_END

/// Throws pagestash::CudaError when `call` does not return cudaSuccess.
#define PAGESTASH_CUDA_TRY(call) ::pagestash::detail::cuda_check((call), #call, __FILE__, __LINE__)
/// Checks the launch that just happened (configuration errors are reported at once).
#define PAGESTASH_CUDA_CHECK_LAUNCH() PAGESTASH_CUDA_TRY(cudaGetLastError())
