// The reference formats run on the device through the same per-block functions as on the
// host: one thread per (line, block), grid-stride.

#include "format_kernels.hpp"

#include <pagestash/pagestash.cuh>
#include <pagestash/reference/reference.cuh>

namespace pagestash_test {
namespace {

template <class Format>
__global__ void quantize_kernel(const pagestash::BF16* source, pagestash::QuantizedMatrix<Format> q,
                                typename Format::TensorScale tensor) {
  const std::int64_t units = q.line_count() * q.blocks_per_line();
  for (std::int64_t u = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; u < units;
       u += std::int64_t{gridDim.x} * blockDim.x) {
    pagestash::quantize_matrix_block(source, q, tensor, u / q.blocks_per_line(), u % q.blocks_per_line());
  }
}

template <class Format>
__global__ void dequantize_kernel(pagestash::QuantizedMatrix<Format> q, typename Format::TensorScale tensor,
                                  float* out) {
  const std::int64_t units = q.line_count() * q.blocks_per_line();
  for (std::int64_t u = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; u < units;
       u += std::int64_t{gridDim.x} * blockDim.x) {
    pagestash::dequantize_matrix_block(q, tensor, out, u / q.blocks_per_line(), u % q.blocks_per_line());
  }
}

constexpr int threads = 128;
int blocks_for(std::int64_t units) {
  const std::int64_t needed = (units + threads - 1) / threads;
  return static_cast<int>(needed < 1 ? 1 : (needed > 4096 ? 4096 : needed));
}

}  // namespace

template <class Format>
void quantize_on_device(const pagestash::BF16* source, const pagestash::QuantizedMatrix<Format>& q,
                        typename Format::TensorScale tensor) {
  pagestash::validate_matrix(q);
  quantize_kernel<Format><<<blocks_for(q.line_count() * q.blocks_per_line()), threads>>>(source, q, tensor);
  PAGESTASH_CUDA_CHECK_LAUNCH();
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
}

template <class Format>
void dequantize_on_device(const pagestash::QuantizedMatrix<Format>& q, typename Format::TensorScale tensor,
                          float* out) {
  pagestash::validate_matrix(q);
  dequantize_kernel<Format><<<blocks_for(q.line_count() * q.blocks_per_line()), threads>>>(q, tensor, out);
  PAGESTASH_CUDA_CHECK_LAUNCH();
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
}

#define PAGESTASH_INSTANTIATE_FORMAT(Format)                                                                  \
  template void quantize_on_device<Format>(const pagestash::BF16*, const pagestash::QuantizedMatrix<Format>&, \
                                           Format::TensorScale);                                              \
  template void dequantize_on_device<Format>(const pagestash::QuantizedMatrix<Format>&, Format::TensorScale, float*);

PAGESTASH_INSTANTIATE_FORMAT(pagestash::MXFP8_E4M3)
PAGESTASH_INSTANTIATE_FORMAT(pagestash::MXFP8_E5M2)
PAGESTASH_INSTANTIATE_FORMAT(pagestash::NVFP4)

}  // namespace pagestash_test
