#pragma once
// Block-scaled formats: a block of values shares one scale.
//
//   MXFP8<E4M3|E5M2>  32 values, E8M0 scale chosen as in the OCP MX spec v1.0 (section 6.3):
//                     X = 2^(floor(log2(amax)) - emax_elem), elements = sat(v / X).
//   NVFP4             16 values of E2M1, E4M3 scale, and a per-tensor FP32 scale on top:
//                     encode = 448 * 6 / tensor_amax (as TransformerEngine), block scale
//                     s = E4M3(block_amax / 6 * encode), elements = E2M1(v * encode / s).
//
// A block holding NaN or infinity gets a NaN scale (MXFP8) and NaN/saturated elements.
// These are reference implementations: correctness first, speed does not matter.

#include <pagestash/formats/scalar.hpp>

#include <cuda/std/limits>
#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

/// MXFP8 with element type E4M3 or E5M2.
template <class Element>
struct MXFP8 {
  static_assert(cuda::std::is_same_v<Element, E4M3> || cuda::std::is_same_v<Element, E5M2>,
                "MXFP8<Element>: Element must be pagestash::E4M3 or pagestash::E5M2");
  using element_type = Element;
  using data_storage = Element;  ///< what a data buffer holds: one element a byte
  using scale_type = E8M0;
  static constexpr int block_size = 32;
  static constexpr int element_bits = 8;
  /// Columnwise data keeps the [M, K] shape (TransformerEngine does not transpose MXFP8).
  static constexpr bool transposed_columnwise = false;

  /// MXFP8 has no per-tensor scale; the type exists so that all formats share one API.
  struct TensorScale {
    PAGESTASH_HOST_DEVICE static TensorScale from_amax(float) { return {}; }
  };
};

using MXFP8_E4M3 = MXFP8<E4M3>;
using MXFP8_E5M2 = MXFP8<E5M2>;

/// NVFP4: E2M1 elements packed two per byte, E4M3 block scales, FP32 per-tensor amax.
struct NVFP4 {
  using element_type = E2M1;
  using data_storage = E2M1x2;  ///< what a data buffer holds: two elements a byte
  using scale_type = E4M3;
  static constexpr int block_size = 16;
  static constexpr int element_bits = 4;
  /// Columnwise data and scales are stored transposed, [K, M/2] and [K, M/16] (as TE).
  static constexpr bool transposed_columnwise = true;

  struct TensorScale {
    float encode;  ///< multiplies values before the block scale is applied

    /// TransformerEngine's rule: 448 * 6 / amax, capped at FLT_MAX, and 1 for amax == 0.
    PAGESTASH_HOST_DEVICE static TensorScale from_amax(float amax) {
      float encode = 448.0f * 6.0f / amax;
      if (encode > cuda::std::numeric_limits<float>::max()) encode = cuda::std::numeric_limits<float>::max();
      if (amax == 0.0f || encode == 0.0f) encode = 1.0f;
      return TensorScale{encode};
    }
  };
};

namespace detail {
/// max |v| over n values; the quiet NaN (0x7FC00000, positive) if any value is NaN, as the
/// device producer computes it.
template <class T>
PAGESTASH_HOST_DEVICE float abs_max(const T* values, cuda::std::int64_t n) {
  float amax = 0.0f;
  for (cuda::std::int64_t i = 0; i < n; ++i) {
    const float v = to_float(values[i]);
    const float a = v < 0.0f ? -v : v;
    if (a != a) return cuda::std::numeric_limits<float>::quiet_NaN();
    if (a > amax) amax = a;
  }
  return amax;
}
}  // namespace detail

/// Quantizes `Format::block_size` values; writes one element code per value and returns the
/// block scale.
template <class Element>
PAGESTASH_HOST_DEVICE E8M0 quantize_block(MXFP8<Element>, const float* values,
                                          typename MXFP8<Element>::TensorScale, Element* codes) {
  constexpr int n = MXFP8<Element>::block_size;
  const float amax = detail::abs_max(values, n);
  if (!(amax <= cuda::std::numeric_limits<float>::max())) {  // NaN or infinity in the block
    for (int i = 0; i < n; ++i) codes[i] = Element::from_float(detail::quiet_nan());
    return E8M0::from_bits(E8M0::nan_code);
  }
  const int emax_elem = detail::floor_log2(Element::max());
  const E8M0 scale = amax == 0.0f ? E8M0::from_exponent(-E8M0::bias)
                                  : E8M0::from_exponent(detail::floor_log2(amax) - emax_elem);
  const float inverse = detail::exact_pow2(-scale.exponent());
  for (int i = 0; i < n; ++i) codes[i] = Element::from_float(values[i] * inverse);
  return scale;
}

template <class Element>
PAGESTASH_HOST_DEVICE void dequantize_block(MXFP8<Element>, const Element* codes, E8M0 scale,
                                            typename MXFP8<Element>::TensorScale, float* values) {
  const float s = scale.to_float();
  for (int i = 0; i < MXFP8<Element>::block_size; ++i) values[i] = codes[i].to_float() * s;
}

PAGESTASH_HOST_DEVICE inline E4M3 quantize_block(NVFP4, const float* values, NVFP4::TensorScale tensor,
                                                 E2M1* codes) {
  constexpr int n = NVFP4::block_size;
  const float amax = detail::abs_max(values, n);
  const E4M3 scale = E4M3::from_float(amax / 6.0f * tensor.encode);
  const float s = scale.to_float();
  const float factor = s == 0.0f ? 0.0f : tensor.encode / s;
  for (int i = 0; i < n; ++i) codes[i] = E2M1::from_float(values[i] * factor);
  return scale;
}

PAGESTASH_HOST_DEVICE inline void dequantize_block(NVFP4, const E2M1* codes, E4M3 scale,
                                                   NVFP4::TensorScale tensor, float* values) {
  const float s = scale.to_float() / tensor.encode;
  for (int i = 0; i < NVFP4::block_size; ++i) values[i] = codes[i].to_float() * s;
}

PAGESTASH_NAMESPACE_END
