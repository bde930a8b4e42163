#pragma once
// Scalar number formats: storage types with reference conversions from and to float.
//
//   BF16, FP16    2 bytes, IEEE-like; overflow rounds to infinity
//   E4M3, E5M2    1 byte FP8; saturating (values beyond the max become +-max, NaN -> 0x7F)
//   E2M1          FP4 in the low nibble of a byte; saturating, no NaN (NaN -> 0x7 = +6)
//   E2M1x2        two FP4 codes packed in one byte, first value in the low nibble (as CUDA)
//   E8M0          unsigned power-of-two scale 2^(bits-127); 0xFF is NaN
//
// The rounding rules match CUDA's host conversions (`cuda_bf16.h`, `cuda_fp16.h`, `cuda_fp8.h` with __NV_SATFINITE,
// `cuda_fp4.h` with cudaRoundNearest); the tests check them bit for bit. These functions favour clarity over speed.

#include <pagestash/detail/minifloat_codec.hpp>

PAGESTASH_NAMESPACE_BEGIN

/// A small binary float stored in `bits`. `Spec` describes the encoding.
template <class Spec>
struct Minifloat {
  using spec = Spec;
  using storage_type = typename Spec::storage_type;
  using codec = detail::minifloat_codec<Spec>;

  storage_type bits;

  static constexpr const char* name = Spec::name;

  PAGESTASH_HOST_DEVICE static Minifloat from_float(float x) {
    return Minifloat{static_cast<storage_type>(codec::encode(x))};
  }
  PAGESTASH_HOST_DEVICE static Minifloat from_bits(storage_type b) { return Minifloat{b}; }
  PAGESTASH_HOST_DEVICE float to_float() const { return codec::decode(bits); }
  PAGESTASH_HOST_DEVICE static float max() { return codec::decode(Spec::max_finite); }  ///< largest finite value
};

struct BF16Spec {
  using storage_type = cuda::std::uint16_t;
  static constexpr const char* name = "bf16";
  static constexpr int exponent_bits = 8, mantissa_bits = 7, bias = 127;
  static constexpr cuda::std::uint32_t max_finite = 0x7F7F, nan_code = 0x7FFF;
  static constexpr auto on_overflow = detail::overflow_rule::to_infinity;
  static constexpr auto specials = detail::special_codes::ieee;
};

struct FP16Spec {
  using storage_type = cuda::std::uint16_t;
  static constexpr const char* name = "fp16";
  static constexpr int exponent_bits = 5, mantissa_bits = 10, bias = 15;
  static constexpr cuda::std::uint32_t max_finite = 0x7BFF, nan_code = 0x7FFF;
  static constexpr auto on_overflow = detail::overflow_rule::to_infinity;
  static constexpr auto specials = detail::special_codes::ieee;
};

struct E4M3Spec {
  using storage_type = cuda::std::uint8_t;
  static constexpr const char* name = "e4m3";
  static constexpr int exponent_bits = 4, mantissa_bits = 3, bias = 7;
  static constexpr cuda::std::uint32_t max_finite = 0x7E, nan_code = 0x7F;  // max 448
  static constexpr auto on_overflow = detail::overflow_rule::saturate;
  static constexpr auto specials = detail::special_codes::all_ones_nan;
};

struct E5M2Spec {
  using storage_type = cuda::std::uint8_t;
  static constexpr const char* name = "e5m2";
  static constexpr int exponent_bits = 5, mantissa_bits = 2, bias = 15;
  static constexpr cuda::std::uint32_t max_finite = 0x7B, nan_code = 0x7F;  // max 57344
  static constexpr auto on_overflow = detail::overflow_rule::saturate;
  static constexpr auto specials = detail::special_codes::ieee;
};

struct E2M1Spec {
  using storage_type = cuda::std::uint8_t;
  static constexpr const char* name = "e2m1";
  static constexpr int exponent_bits = 2, mantissa_bits = 1, bias = 1;
  static constexpr cuda::std::uint32_t max_finite = 0x7, nan_code = 0x7;  // max 6
  static constexpr auto on_overflow = detail::overflow_rule::saturate;
  static constexpr auto specials = detail::special_codes::none;
};

using BF16 = Minifloat<BF16Spec>;
using FP16 = Minifloat<FP16Spec>;
using E4M3 = Minifloat<E4M3Spec>;
using E5M2 = Minifloat<E5M2Spec>;
using E2M1 = Minifloat<E2M1Spec>;

/// Two FP4 E2M1 values in one byte: the first (lower index) in the low nibble.
struct E2M1x2 {
  cuda::std::uint8_t bits;

  PAGESTASH_HOST_DEVICE static E2M1x2 pack(E2M1 first, E2M1 second) {
    return E2M1x2{static_cast<cuda::std::uint8_t>((first.bits & 0xF) | ((second.bits & 0xF) << 4))};
  }
  PAGESTASH_HOST_DEVICE E2M1 first() const { return E2M1{static_cast<cuda::std::uint8_t>(bits & 0xF)}; }
  PAGESTASH_HOST_DEVICE E2M1 second() const { return E2M1{static_cast<cuda::std::uint8_t>(bits >> 4)}; }
};

/// Unsigned power-of-two scale, value 2^(bits - 127); 0xFF is NaN.
struct E8M0 {
  cuda::std::uint8_t bits;

  static constexpr const char* name = "e8m0";
  static constexpr int bias = 127;
  static constexpr cuda::std::uint8_t nan_code = 0xFF;

  /// 2^e, clamped to the representable exponents [-127, 127].
  PAGESTASH_HOST_DEVICE static E8M0 from_exponent(int e) {
    const int clamped = e < -bias ? -bias : (e > bias ? bias : e);
    return E8M0{static_cast<cuda::std::uint8_t>(clamped + bias)};
  }
  /// The largest power of two not above |x| (round toward zero, saturating), as CUDA's `__nv_cvt_float_to_e8m0(x,
  /// __NV_SATFINITE, cudaRoundZero)`.
  PAGESTASH_HOST_DEVICE static E8M0 from_float(float x) {
    const cuda::std::uint32_t abs_bits = detail::float_bits(x) & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return E8M0{nan_code};
    if (abs_bits == 0) return E8M0{0};
    return from_exponent(detail::floor_log2(x));
  }
  PAGESTASH_HOST_DEVICE static E8M0 from_bits(cuda::std::uint8_t b) { return E8M0{b}; }
  PAGESTASH_HOST_DEVICE bool is_nan() const { return bits == nan_code; }
  PAGESTASH_HOST_DEVICE int exponent() const { return static_cast<int>(bits) - bias; }
  PAGESTASH_HOST_DEVICE float to_float() const {
    return is_nan() ? detail::quiet_nan() : detail::exact_pow2(exponent());
  }
};

/// Float value of a source element (float itself or any storage type above).
PAGESTASH_HOST_DEVICE inline float to_float(float x) { return x; }
template <class Spec>
PAGESTASH_HOST_DEVICE float to_float(Minifloat<Spec> x) {
  return x.to_float();
}

PAGESTASH_NAMESPACE_END
