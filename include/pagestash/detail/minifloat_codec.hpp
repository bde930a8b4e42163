#pragma once
// One encoder and one decoder for every small binary float format (BF16, FP16, FP8, FP4), each described by a Spec
// (formats/scalar.hpp). The only place that rounds, so every format rounds alike: to nearest even on the exact value.

#include <pagestash/detail/bits.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// What a format does with a value beyond its largest finite magnitude.
enum class overflow_rule { to_infinity, saturate };
/// Which codes are not finite numbers.
enum class special_codes {
  ieee,          ///< exponent all ones: infinity (mantissa 0) or NaN
  all_ones_nan,  ///< only the all-ones magnitude is NaN (FP8 E4M3 "fn"); no infinity
  none           ///< every code is finite (FP4 E2M1)
};

template <class Spec>
struct minifloat_codec {
  static constexpr int E = Spec::exponent_bits;
  static constexpr int M = Spec::mantissa_bits;
  static constexpr int min_normal_exp = 1 - Spec::bias;
  static constexpr cuda::std::uint32_t sign_bit = cuda::std::uint32_t{1} << (E + M);
  static constexpr cuda::std::uint32_t magnitude_mask = sign_bit - 1;
  static constexpr cuda::std::uint32_t infinity_code = ((cuda::std::uint32_t{1} << E) - 1) << M;

  PAGESTASH_HOST_DEVICE static bool is_nan_code(cuda::std::uint32_t code) {
    const cuda::std::uint32_t mag = code & magnitude_mask;
    if constexpr (Spec::specials == special_codes::ieee) return mag > infinity_code;
    else if constexpr (Spec::specials == special_codes::all_ones_nan) return mag == magnitude_mask;
    else return false;
  }

  PAGESTASH_HOST_DEVICE static bool is_inf_code(cuda::std::uint32_t code) {
    if constexpr (Spec::specials == special_codes::ieee) return (code & magnitude_mask) == infinity_code;
    else return false;
  }

  /// Magnitude code of |x| rounded to nearest even, before any overflow handling: the
  /// result may exceed Spec::max_finite. `abs_bits` is a finite binary32 magnitude.
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t round_magnitude(cuda::std::uint32_t abs_bits) {
    if (abs_bits == 0) return 0;
    const int biased = static_cast<int>(abs_bits >> 23);
    // |x| = significand * 2^scale, significand < 2^24.
    const cuda::std::uint64_t significand = (abs_bits & 0x7FFFFFu) | (biased != 0 ? 0x800000u : 0u);
    const int scale = (biased != 0 ? biased : 1) - 150;
    const int exponent = scale + static_cast<int>(cuda::std::bit_width(significand)) - 1;
    // Quantum of the target format at this magnitude (subnormals share the lowest one).
    const int binade = exponent > min_normal_exp ? exponent : min_normal_exp;
    const int shift = binade - M - scale;

    cuda::std::uint64_t rounded;
    if (shift <= 0) {
      rounded = significand << (-shift);
    } else if (shift > 40) {
      rounded = 0;  // far below half a quantum
    } else {
      rounded = significand >> shift;
      const cuda::std::uint64_t rest = significand & ((cuda::std::uint64_t{1} << shift) - 1);
      const cuda::std::uint64_t half = cuda::std::uint64_t{1} << (shift - 1);
      if (rest > half || (rest == half && (rounded & 1))) ++rounded;
    }
    // A carry out of the mantissa moves into the exponent field by itself.
    return static_cast<cuda::std::uint32_t>(rounded) + (static_cast<cuda::std::uint32_t>(binade - min_normal_exp) << M);
  }

  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t encode(float x) {
    const cuda::std::uint32_t bits = float_bits(x);
    const cuda::std::uint32_t sign = (bits >> 31) ? sign_bit : 0u;
    const cuda::std::uint32_t abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return Spec::nan_code;
    constexpr cuda::std::uint32_t overflow_code =
        Spec::on_overflow == overflow_rule::to_infinity ? infinity_code : Spec::max_finite;
    if (abs_bits == 0x7F800000u) return sign | overflow_code;
    const cuda::std::uint32_t mag = round_magnitude(abs_bits);
    return sign | (mag > Spec::max_finite ? overflow_code : mag);
  }

  PAGESTASH_HOST_DEVICE static float decode(cuda::std::uint32_t code) {
    const float sign = (code & sign_bit) ? -1.0f : 1.0f;
    if (is_nan_code(code)) return quiet_nan();
    if (is_inf_code(code)) return sign * cuda::std::numeric_limits<float>::infinity();
    const cuda::std::uint32_t mag = code & magnitude_mask;
    const cuda::std::uint32_t exp_field = mag >> M;
    const cuda::std::uint32_t mantissa = mag & ((cuda::std::uint32_t{1} << M) - 1);
    // Every value of these formats is exact in binary32, so this product is exact.
    if (exp_field == 0) return sign * static_cast<float>(mantissa) * exact_pow2(min_normal_exp - M);
    const float significand = static_cast<float>(mantissa | (cuda::std::uint32_t{1} << M));
    return sign * significand * exact_pow2(static_cast<int>(exp_field) - 1 + min_normal_exp - M);
  }
};

}  // namespace detail
PAGESTASH_NAMESPACE_END
