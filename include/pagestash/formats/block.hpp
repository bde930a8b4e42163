#pragma once
// Block-scaled formats: a block of values shares one scale.
//
//   MXFP8<E4M3|E5M2>  32 values, E8M0 scale chosen as in the OCP MX spec v1.0 (section 6.3):
//                     X = 2^(floor(log2(amax)) - emax_elem), elements = sat(v / X).
//   NVFP4             16 values of E2M1, E4M3 scale, and a per-tensor FP32 scale on top:
//                     encode = 448 * 6 / tensor_amax (as TransformerEngine), block scale
//                     s = E4M3(block_amax / 6 * encode), elements = E2M1(v * encode / s).
//   FP8Block128       128 values of E4M3, an FP32 scale (DeepSeek-V3's 1x128 activation tiles, as TransformerEngine's
//                     1D block scaling): scale = 448 / amax (capped at FLT_MAX; 1 when amax == 0), elements =
//                     sat(v * scale), and 1 / scale stored, the factor that dequantizes.
//
// The types only. The reference quantizers (tests, examples) are in reference/quantize.hpp; the compressed stash has
// its own (stash/compress.hpp).

#include <pagestash/formats/scalar.hpp>

#include <cuda/std/limits>
#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class Element>
struct MXFP8 {
  static_assert(cuda::std::is_same_v<Element, E4M3> || cuda::std::is_same_v<Element, E5M2>,
                "MXFP8<Element>: Element must be pagestash::E4M3 or pagestash::E5M2");
  using element_type = Element;
  using data_storage = Element;  ///< what a data buffer holds: one element a byte
  using scale_type = E8M0;
  static constexpr const char* name = cuda::std::is_same_v<Element, E4M3> ? "mxfp8" : "mxfp8_e5m2";
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
  static constexpr const char* name = "nvfp4";
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

/// FP8 E4M3 with one FP32 scale (stored as its inverse) per 128 values; used by the compressed stash.
struct FP8Block128 {
  using element_type = E4M3;
  using data_storage = E4M3;
  using scale_type = float;
  static constexpr const char* name = "fp8_1x128";
  static constexpr int block_size = 128;
  static constexpr int element_bits = 8;
  static constexpr bool transposed_columnwise = false;

  struct TensorScale {
    PAGESTASH_HOST_DEVICE static TensorScale from_amax(float) { return {}; }
  };
};

PAGESTASH_NAMESPACE_END
