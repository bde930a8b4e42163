#pragma once
// Seeded test inputs shared by the host and device tests.

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace pagestash_test {

inline float float_from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// Values every conversion must get right: zeros, infinities, NaNs, limits, subnormals.
inline std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          float_from_bits(0x7FC00000u),
                          float_from_bits(0xFFC00000u),
                          float_from_bits(0x7F800001u),
                          float_from_bits(0xFFFFFFFFu),
                          448.0f,
                          464.0f,
                          480.0f,
                          57344.0f,
                          61440.0f,
                          6.0f,
                          5.0f,
                          7.0f,
                          65504.0f,
                          65520.0f,
                          0.25f,
                          0.75f,
                          1.0f / 1024,
                          1.0f / 512,
                          3.0f / 2048};
  return v;
}

/// Random binary32 values: half uniform bit patterns (every exponent, subnormals, NaNs),
/// half with an exponent in [lo, hi] and a random mantissa and sign.
inline std::vector<float> random_floats(std::size_t n, int lo, int hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<int> exponent(lo, hi);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      v[i] = float_from_bits(any(rng));
    } else {
      const std::uint32_t biased = static_cast<std::uint32_t>(exponent(rng) + 127);
      v[i] = float_from_bits((any(rng) & 0x807FFFFFu) | (biased << 23));
    }
  }
  return v;
}

/// Random finite values with a spread of magnitudes, as activations look: normal-ish
/// values, a few outliers, some exact zeros.
inline std::vector<float> random_activations(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    const int p = pick(rng);
    x = p < 3 ? 0.0f : (p < 6 ? normal(rng) * 50.0f : normal(rng));
  }
  return v;
}

}  // namespace pagestash_test
