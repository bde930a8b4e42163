#pragma once
// Bit-level helpers on IEEE binary32, host+device. Not public API.

#include <pagestash/config.hpp>

#include <cuda/std/bit>
#include <cuda/std/cstdint>
#include <cuda/std/limits>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t float_bits(float x) {
  return cuda::std::bit_cast<cuda::std::uint32_t>(x);
}

PAGESTASH_HOST_DEVICE inline float float_from_bits(cuda::std::uint32_t bits) {
  return cuda::std::bit_cast<float>(bits);
}

PAGESTASH_HOST_DEVICE inline float quiet_nan() { return float_from_bits(0x7FC00000u); }

/// 2^e as a float, exact for -149 <= e <= 127 (subnormal powers included).
PAGESTASH_HOST_DEVICE inline float exact_pow2(int e) {
  if (e >= -126) return float_from_bits(static_cast<cuda::std::uint32_t>(e + 127) << 23);
  return float_from_bits(cuda::std::uint32_t{1} << (e + 149));
}

/// floor(log2(|x|)) for a finite non-zero x, subnormals included.
PAGESTASH_HOST_DEVICE inline int floor_log2(float x) {
  const cuda::std::uint32_t abs_bits = float_bits(x) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(abs_bits >> 23);
  if (biased != 0) return biased - 127;
  return static_cast<int>(cuda::std::bit_width(abs_bits)) - 1 - 149;
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
