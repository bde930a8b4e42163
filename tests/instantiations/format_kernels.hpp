#pragma once
// Host entry points of the test kernels in format_kernels.cu (callable from g++ code).
// Pointers are device pointers; calls are synchronous and throw pagestash::CudaError.

#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/reference.hpp>

namespace pagestash_test {

template <class Format>
void quantize_on_device(const pagestash::BF16* source, const pagestash::QuantizedMatrix<Format>& q,
                        typename Format::TensorScale tensor);

template <class Format>
void dequantize_on_device(const pagestash::QuantizedMatrix<Format>& q, typename Format::TensorScale tensor, float* out);

}  // namespace pagestash_test
