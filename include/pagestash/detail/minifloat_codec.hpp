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
  static constexpr bool same_exponent_as_binary32 = E == 8 && Spec::bias == 127;
  static_assert(same_exponent_as_binary32 || min_normal_exp - M >= -126, "subnormals must be binary32 normals");

  /// a if c else b, as arithmetic: a float operation feeding a conditional would stop the host's vectorizer (it may
  /// trap, so the compiler does not speculate it and keeps a branch).
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t blend(bool c, cuda::std::uint32_t a, cuda::std::uint32_t b) {
    return b ^ ((a ^ b) & (0u - static_cast<cuda::std::uint32_t>(c)));
  }

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

  /// Magnitude code of |x| rounded to nearest even, before any overflow handling: the result may exceed
  /// Spec::max_finite (infinity's bits give such a code). `abs_bits` is a binary32 magnitude, not NaN.
  ///
  /// Branch-free, so the host's loops over many values vectorize (the compressed stash's host path codes every value).
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t round_magnitude(cuda::std::uint32_t abs_bits) {
    // A normal of the format: the bits below its mantissa rounded off in one add (a carry out of the mantissa moves
    // into the exponent by itself), the exponent rebiased.
    constexpr int shift = 23 - M;
    const cuda::std::uint32_t normal =
        ((abs_bits + ((cuda::std::uint32_t{1} << (shift - 1)) - 1) + ((abs_bits >> shift) & 1u)) >> shift) -
        (static_cast<cuda::std::uint32_t>(127 - Spec::bias) << M);
    if constexpr (same_exponent_as_binary32) {
      return normal;  // binary32's own exponent: its subnormals are the format's, the same formula
    } else {
      // Below the smallest normal: adding 2^(min_normal_exp - M + 23), whose ulp is the format's subnormal step,
      // rounds |x| to nearest even in IEEE addition and leaves the step count in the sum's low bits. The addend is
      // |x| clamped in integers: a product that made x (the quantizer's value times its scale) is not fused into the
      // addition (-ffp-contract=fast, on by default with FMA), which would round once where the format rounds twice.
      // A binary32 subnormal, flushed or not, rounds to 0.
      constexpr cuda::std::uint32_t smallest_normal = static_cast<cuda::std::uint32_t>(127 + min_normal_exp) << 23;
      const float magic = float_from_bits(static_cast<cuda::std::uint32_t>(127 + min_normal_exp - M + 23) << 23);
      const float below = float_from_bits(abs_bits < smallest_normal ? abs_bits : smallest_normal);
#if defined(__CUDA_ARCH__)
      const float sum = __fadd_rn(below, magic);  // never contracted
#else
      const float sum = below + magic;
#endif
      return blend(abs_bits < smallest_normal, float_bits(sum) - float_bits(magic), normal);
    }
  }

  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t encode(float x) {
    const cuda::std::uint32_t bits = float_bits(x);
    const cuda::std::uint32_t abs_bits = bits & 0x7FFFFFFFu;
    constexpr cuda::std::uint32_t overflow_code =
        Spec::on_overflow == overflow_rule::to_infinity ? infinity_code : Spec::max_finite;
    const cuda::std::uint32_t mag = round_magnitude(abs_bits);
    const cuda::std::uint32_t code = (bits >> 31) << (E + M) | (mag > Spec::max_finite ? overflow_code : mag);
    return blend(abs_bits > 0x7F800000u, Spec::nan_code, code);
  }

  PAGESTASH_HOST_DEVICE static float decode(cuda::std::uint32_t code) {
    const cuda::std::uint32_t mag = code & magnitude_mask;
    // A normal's binary32 bits: the exponent rebiased, the mantissa widened (binary32's own exponent: every code).
    const cuda::std::uint32_t normal = (mag << (23 - M)) + (static_cast<cuda::std::uint32_t>(127 - Spec::bias) << 23);
    cuda::std::uint32_t value = normal;
    if constexpr (!same_exponent_as_binary32) {
      // A subnormal: an exact product (the format's subnormals are binary32 normals).
      const float subnormal = static_cast<float>(mag & ((cuda::std::uint32_t{1} << M) - 1)) *
                              float_from_bits(static_cast<cuda::std::uint32_t>(127 + min_normal_exp - M) << 23);
      value = blend((mag >> M) == 0, float_bits(subnormal), value);
    }
    if constexpr (Spec::specials == special_codes::ieee) value = blend(mag == infinity_code, 0x7F800000u, value);
    value |= (code & sign_bit) << (31 - E - M);
    return float_from_bits(blend(is_nan_code(code), 0x7FC00000u, value));
  }
};

}  // namespace detail
PAGESTASH_NAMESPACE_END
