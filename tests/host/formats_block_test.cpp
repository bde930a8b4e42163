// Block formats: quantization compared byte for byte with the same recipe written with
// CUDA's conversions, and round-trip error bounds per element.

#include <pagestash/formats/block.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/test_data.hpp"

#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ps = pagestash;

namespace {

float fp8_value(__nv_fp8_storage_t c, __nv_fp8_interpretation_t kind) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(c, kind)));
}

// The OCP MX recipe written with CUDA's conversions and std::ldexp.
template <class Element>
void oracle_mxfp8(const float* v, std::uint8_t* codes, std::uint8_t& scale) {
  constexpr auto kind = std::is_same_v<Element, ps::E4M3> ? __NV_E4M3 : __NV_E5M2;
  constexpr int emax_elem = std::is_same_v<Element, ps::E4M3> ? 8 : 15;
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
  int shared = -127;
  if (amax > 0) shared = std::max(-127, std::min(127, std::ilogb(amax) - emax_elem));
  scale = static_cast<std::uint8_t>(shared + 127);
  for (int i = 0; i < 32; ++i) codes[i] = __nv_cvt_float_to_fp8(std::ldexp(v[i], -shared), __NV_SATFINITE, kind);
}

void oracle_nvfp4(const float* v, float encode, std::uint8_t* codes, std::uint8_t& scale) {
  float amax = 0;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(v[i]));
  scale = __nv_cvt_float_to_fp8(amax / 6.0f * encode, __NV_SATFINITE, __NV_E4M3);
  const float s = fp8_value(scale, __NV_E4M3);
  const float factor = s == 0 ? 0 : encode / s;
  for (int i = 0; i < 16; ++i) codes[i] = __nv_cvt_float_to_fp4(v[i] * factor, __NV_E2M1, cudaRoundNearest);
}

// Blocks with a spread of magnitudes: ordinary, tiny (subnormal after scaling), huge,
// all zero, one outlier among small values.
std::vector<std::vector<float>> test_blocks(int n, std::uint32_t seed) {
  std::vector<std::vector<float>> blocks;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-40.0f, 40.0f);
  for (int b = 0; b < 2000; ++b) {
    auto v = pagestash_test::random_activations(n, seed + b, std::exp2(exponent(rng)));
    if (b % 7 == 0) v[b % n] *= 1000.0f;
    blocks.push_back(v);
  }
  blocks.push_back(std::vector<float>(n, 0.0f));
  blocks.push_back(std::vector<float>(n, -0.0f));
  std::vector<float> subnormal(n);
  for (int i = 0; i < n; ++i) subnormal[i] = pagestash_test::float_from_bits(1u + 97u * i) * (i % 2 ? -1 : 1);
  blocks.push_back(subnormal);
  return blocks;
}

template <class Element>
void check_mxfp8_block(const std::vector<float>& v) {
  using Format = ps::MXFP8<Element>;
  Element codes[32];
  const ps::E8M0 scale = ps::quantize_block(Format{}, v.data(), {}, codes);
  std::uint8_t expected[32], expected_scale;
  oracle_mxfp8<Element>(v.data(), expected, expected_scale);
  REQUIRE(scale.bits == expected_scale);
  for (int i = 0; i < 32; ++i) REQUIRE(codes[i].bits == expected[i]);

  // Round trip: half a unit in the last place of the element at the scaled magnitude
  // (3 mantissa bits for E4M3, 2 for E5M2), the element's subnormal step below its
  // normal range, and saturation at the element's max.
  float out[32];
  ps::dequantize_block(Format{}, codes, scale, {}, out);
  constexpr int mantissa_bits = Element::spec::mantissa_bits;
  const int min_normal_exp = 1 - Element::spec::bias;
  const double x_scale = std::ldexp(1.0, scale.exponent());
  for (int i = 0; i < 32; ++i) {
    const double scaled = std::fabs(v[i]) / x_scale;
    const double err = std::fabs(static_cast<double>(out[i]) - v[i]);
    if (scaled > Element::max()) {
      CHECK(std::fabs(out[i]) == doctest::Approx(Element::max() * x_scale));
      continue;
    }
    const double ulp_half = std::ldexp(1.0, std::max(std::ilogb(scaled), min_normal_exp) - mantissa_bits - 1);
    // ldexp on subnormal float results may lose further bits: allow float's own step.
    const double tolerance = ulp_half * x_scale + std::ldexp(1.0, -149);
    if (scaled == 0) CHECK(out[i] == 0.0f);
    else CHECK(err <= tolerance);
  }
}

}  // namespace

TEST_CASE("MXFP8 E4M3 blocks match the OCP recipe written with CUDA's conversions") {
  for (const auto& block : test_blocks(32, 11)) check_mxfp8_block<ps::E4M3>(block);
}

TEST_CASE("MXFP8 E5M2 blocks match the OCP recipe written with CUDA's conversions") {
  for (const auto& block : test_blocks(32, 12)) check_mxfp8_block<ps::E5M2>(block);
}

TEST_CASE("MXFP8 scale is the largest power of two keeping amax within the element range") {
  // amax = 448 * 2^k fits E4M3 exactly: scale 2^k; just above it needs no larger scale
  // (the OCP rule floors log2), so the element saturates.
  float v[32] = {};
  ps::E4M3 codes[32];
  v[3] = 448.0f * 4;
  CHECK(ps::quantize_block(ps::MXFP8_E4M3{}, v, {}, codes).exponent() == 2);
  CHECK(codes[3].to_float() == 448.0f);
  v[3] = 511.0f;
  CHECK(ps::quantize_block(ps::MXFP8_E4M3{}, v, {}, codes).exponent() == 0);
  CHECK(codes[3].to_float() == 448.0f);
}

TEST_CASE("MXFP8 block with NaN or infinity gets a NaN scale") {
  float v[32] = {};
  ps::E4M3 codes[32];
  v[5] = std::numeric_limits<float>::infinity();
  CHECK(ps::quantize_block(ps::MXFP8_E4M3{}, v, {}, codes).is_nan());
  v[5] = std::nanf("");
  CHECK(ps::quantize_block(ps::MXFP8_E4M3{}, v, {}, codes).is_nan());
  float out[32];
  ps::dequantize_block(ps::MXFP8_E4M3{}, codes, ps::E8M0::from_bits(0xFF), {}, out);
  for (float x : out) CHECK(std::isnan(x));
}

TEST_CASE("NVFP4 tensor scale follows TransformerEngine's rule") {
  CHECK(ps::NVFP4::TensorScale::from_amax(2688.0f).encode == 1.0f);
  CHECK(ps::NVFP4::TensorScale::from_amax(1.0f).encode == 2688.0f);
  CHECK(ps::NVFP4::TensorScale::from_amax(0.0f).encode == 1.0f);
  CHECK(ps::NVFP4::TensorScale::from_amax(1e-45f).encode == std::numeric_limits<float>::max());
}

TEST_CASE("NVFP4 blocks match the recipe written with CUDA's conversions, within the error bound") {
  for (const auto& block : test_blocks(16, 13)) {
    float amax = 0;
    for (float x : block) amax = std::max(amax, std::fabs(x));
    // The tensor amax is at least the block amax: sometimes equal, sometimes far larger.
    const float tensor_amax = amax * (block[0] > 0 ? 1.0f : 37.0f);
    const auto tensor = ps::NVFP4::TensorScale::from_amax(tensor_amax);
    ps::E2M1 codes[16];
    const ps::E4M3 scale = ps::quantize_block(ps::NVFP4{}, block.data(), tensor, codes);
    std::uint8_t expected[16], expected_scale;
    oracle_nvfp4(block.data(), tensor.encode, expected, expected_scale);
    REQUIRE(scale.bits == expected_scale);
    for (int i = 0; i < 16; ++i) REQUIRE(codes[i].bits == expected[i]);

    float out[16];
    ps::dequantize_block(ps::NVFP4{}, codes, scale, tensor, out);
    const double s = static_cast<double>(scale.to_float()) / tensor.encode;
    for (int i = 0; i < 16; ++i) {
      const double err = std::fabs(static_cast<double>(out[i]) - block[i]);
      if (s == 0) {
        // The block scale underflowed E4M3: the whole block is below half its smallest step.
        CHECK(std::fabs(block[i]) * tensor.encode / 6.0f <= std::ldexp(1.0, -10) * 1.0001);
        continue;
      }
      // In units of the block scale: E2M1 rounds within 1/4 of max(|x|, 1); beyond 6 it
      // saturates.
      const double x = std::fabs(block[i]) / s;
      const double bound = 0.25 * std::max(x, 1.0) + std::max(0.0, x - 6.0);
      CHECK(err <= bound * s * (1 + 1e-6));
    }
  }
}

TEST_CASE("abs_max is the positive quiet NaN when any value is NaN, of either sign (as the device producer)") {
  const float values[4] = {1.0f, -std::nanf(""), 3.0f, -2.0f};
  for (int first_nan = 0; first_nan < 2; ++first_nan) {
    const float amax = ps::abs_max(values + 1 - first_nan, 3);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &amax, 4);
    CHECK(bits == 0x7FC00000u);
  }
  CHECK(ps::abs_max(values + 2, 2) == 3.0f);
}
