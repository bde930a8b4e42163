// Scalar conversions against CUDA's own host conversions (the independent oracle):
// exhaustive over every code of every format for decoding, randomised for encoding.

#include <pagestash/formats/scalar.hpp>

#include "../common/test_data.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ps = pagestash;
using pagestash_test::bits_of;

namespace {

// ---- The oracle: CUDA's conversions, returning raw codes / floats -----------------------
std::uint32_t cuda_encode_bf16(float x) {
  const __nv_bfloat16 b = __float2bfloat16(x);
  std::uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}
std::uint32_t cuda_encode_fp16(float x) {
  const __half h = __float2half(x);
  std::uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
std::uint32_t cuda_encode_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
std::uint32_t cuda_encode_e5m2(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
std::uint32_t cuda_encode_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
std::uint32_t cuda_encode_e8m0(float x) { return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero); }

float half_raw_to_float(__half_raw raw) { return __half2float(__half(raw)); }
float cuda_decode_bf16(std::uint32_t c) {
  __nv_bfloat16_raw raw;
  raw.x = static_cast<unsigned short>(c);
  return __bfloat162float(__nv_bfloat16(raw));
}
float cuda_decode_fp16(std::uint32_t c) {
  __half_raw raw;
  raw.x = static_cast<unsigned short>(c);
  return half_raw_to_float(raw);
}
float cuda_decode_e4m3(std::uint32_t c) {
  return half_raw_to_float(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3));
}
float cuda_decode_e5m2(std::uint32_t c) {
  return half_raw_to_float(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E5M2));
}
float cuda_decode_e2m1(std::uint32_t c) {
  return half_raw_to_float(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1));
}
float cuda_decode_e8m0(std::uint32_t c) {
  return cuda_decode_bf16(__nv_cvt_e8m0_to_bf16raw(static_cast<__nv_fp8_storage_t>(c)).x);
}

// Decoded values agree when both are NaN (payloads are not a format property) or when
// their bits are identical (so +0 and -0 differ).
std::string hex(std::uint32_t x) {
  std::ostringstream os;
  os << "0x" << std::hex << x;
  return os.str();
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

template <class Format, class Oracle>
void check_decode_exhaustive(std::uint32_t code_count, Oracle oracle) {
  int mismatches = 0;
  for (std::uint32_t c = 0; c < code_count; ++c) {
    const float ours = Format::from_bits(static_cast<decltype(Format::bits)>(c)).to_float();
    const float theirs = oracle(c);
    if (!same_value(ours, theirs) && ++mismatches <= 5) {
      FAIL_CHECK(std::string(Format::name) << " code " << hex(c) << ": ours " << ours << " CUDA " << theirs);
    }
  }
  CHECK(mismatches == 0);
}

std::vector<float> encode_inputs(int lo, int hi, std::uint32_t seed) {
  auto v = pagestash_test::random_floats(200000, lo, hi, seed);
  for (float s : pagestash_test::special_floats()) {
    v.push_back(s);
    v.push_back(std::nextafter(s, 0.0f));
    v.push_back(std::nextafter(s, std::numeric_limits<float>::infinity()));
  }
  return v;
}

template <class Format, class Oracle>
void check_encode(const std::vector<float>& inputs, Oracle oracle) {
  int mismatches = 0;
  for (float x : inputs) {
    const std::uint32_t ours = Format::from_float(x).bits;
    const std::uint32_t theirs = oracle(x);
    if (ours != theirs && ++mismatches <= 5) {
      FAIL_CHECK(std::string(Format::name) << " encode of " << x << " (" << hex(bits_of(x)) << "): ours " << hex(ours)
                                           << " CUDA " << hex(theirs));
    }
  }
  CHECK(mismatches == 0);
}

// Exact ties: the midpoint of each pair of neighbouring finite codes, where rounding to
// nearest even decides.
template <class Format>
std::vector<float> midpoints(std::uint32_t positive_codes) {
  std::vector<float> v;
  for (std::uint32_t c = 0; c + 1 < positive_codes; ++c) {
    const float a = Format::from_bits(static_cast<decltype(Format::bits)>(c)).to_float();
    const float b = Format::from_bits(static_cast<decltype(Format::bits)>(c + 1)).to_float();
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    const double mid = (static_cast<double>(a) + b) / 2;
    v.push_back(static_cast<float>(mid));
    v.push_back(-static_cast<float>(mid));
  }
  return v;
}

}  // namespace

TEST_CASE("decode: every code agrees with CUDA") {
  check_decode_exhaustive<ps::BF16>(1u << 16, cuda_decode_bf16);
  check_decode_exhaustive<ps::FP16>(1u << 16, cuda_decode_fp16);
  check_decode_exhaustive<ps::E4M3>(256, cuda_decode_e4m3);
  check_decode_exhaustive<ps::E5M2>(256, cuda_decode_e5m2);
  check_decode_exhaustive<ps::E2M1>(16, cuda_decode_e2m1);
  check_decode_exhaustive<ps::E8M0>(256, cuda_decode_e8m0);
}

TEST_CASE("encode BF16 from random FP32 agrees with CUDA") {
  check_encode<ps::BF16>(encode_inputs(-140, 127, 1), cuda_encode_bf16);
}

TEST_CASE("encode FP16 from random FP32 agrees with CUDA") {
  auto inputs = encode_inputs(-30, 20, 2);
  const auto ties = midpoints<ps::FP16>(0x7C00);
  inputs.insert(inputs.end(), ties.begin(), ties.end());
  check_encode<ps::FP16>(inputs, cuda_encode_fp16);
}

TEST_CASE("encode FP8 E4M3 from random FP32 agrees with CUDA") {
  auto inputs = encode_inputs(-14, 12, 3);
  const auto ties = midpoints<ps::E4M3>(0x7F);
  inputs.insert(inputs.end(), ties.begin(), ties.end());
  check_encode<ps::E4M3>(inputs, cuda_encode_e4m3);
}

TEST_CASE("encode FP8 E5M2 from random FP32 agrees with CUDA") {
  auto inputs = encode_inputs(-20, 20, 4);
  const auto ties = midpoints<ps::E5M2>(0x7C);
  inputs.insert(inputs.end(), ties.begin(), ties.end());
  check_encode<ps::E5M2>(inputs, cuda_encode_e5m2);
}

TEST_CASE("encode: every float's top 16 bits, with and without bits below, agrees with CUDA") {
  // The codec rounds in one add for normals and one IEEE addition for subnormals, without branches: every
  // sign/exponent/top-mantissa pattern with no bits below, the lowest, ties and their neighbours (FP16's at bit 12,
  // the others' at bit 15 or above), all of them and a random pattern, in every format.
  std::mt19937 rng(7);
  std::vector<float> inputs;
  for (std::uint32_t top = 0; top < (1u << 16); ++top)
    for (std::uint32_t low : {0u, 1u, 0x0FFFu, 0x1000u, 0x1001u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu,
                              static_cast<std::uint32_t>(rng()) & 0xFFFFu}) {
      const std::uint32_t bits = top << 16 | low;
      float x;
      std::memcpy(&x, &bits, 4);
      inputs.push_back(x);
    }
  check_encode<ps::BF16>(inputs, cuda_encode_bf16);
  check_encode<ps::FP16>(inputs, cuda_encode_fp16);
  check_encode<ps::E4M3>(inputs, cuda_encode_e4m3);
  check_encode<ps::E5M2>(inputs, cuda_encode_e5m2);
  check_encode<ps::E2M1>(inputs, cuda_encode_e2m1);
}

TEST_CASE("encode FP4 E2M1 from random FP32 agrees with CUDA") {
  auto inputs = encode_inputs(-4, 4, 5);
  const auto ties = midpoints<ps::E2M1>(0x8);
  inputs.insert(inputs.end(), ties.begin(), ties.end());
  check_encode<ps::E2M1>(inputs, cuda_encode_e2m1);
}

TEST_CASE("encode E8M0 (round toward zero) from random FP32 agrees with CUDA") {
  check_encode<ps::E8M0>(encode_inputs(-140, 127, 6), cuda_encode_e8m0);
}

TEST_CASE("FP8 from BF16 inputs agrees with CUDA's BF16 -> FP8 conversion") {
  // Every BF16 code as input: the path activations take before quantization.
  int mismatches = 0;
  for (std::uint32_t c = 0; c < (1u << 16); ++c) {
    const float x = ps::BF16::from_bits(static_cast<std::uint16_t>(c)).to_float();
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(c);
    for (auto kind : {__NV_E4M3, __NV_E5M2}) {
      const std::uint32_t theirs = __nv_cvt_bfloat16raw_to_fp8(raw, __NV_SATFINITE, kind);
      const std::uint32_t ours = kind == __NV_E4M3 ? ps::E4M3::from_float(x).bits : ps::E5M2::from_float(x).bits;
      if (ours != theirs && ++mismatches <= 5) FAIL_CHECK("bf16 " << hex(c) << " -> fp8 kind " << kind);
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("format limits") {
  CHECK(ps::E4M3::max() == 448.0f);
  CHECK(ps::E5M2::max() == 57344.0f);
  CHECK(ps::E2M1::max() == 6.0f);
  CHECK(ps::FP16::max() == 65504.0f);
  CHECK(ps::BF16::max() == cuda_decode_bf16(0x7F7F));
  CHECK(ps::E8M0::from_exponent(-200).bits == 0);
  CHECK(ps::E8M0::from_exponent(200).bits == 254);
  CHECK(ps::E8M0::from_exponent(-3).to_float() == 0.125f);
}

TEST_CASE("E2M1x2 packs the first value in the low nibble, as CUDA's fp4x2") {
  for (std::uint32_t lo = 0; lo < 16; ++lo) {
    for (std::uint32_t hi = 0; hi < 16; ++hi) {
      const float2 pair{cuda_decode_e2m1(lo), cuda_decode_e2m1(hi)};
      const auto theirs = __nv_cvt_float2_to_fp4x2(pair, __NV_E2M1, cudaRoundNearest);
      const auto ours = ps::E2M1x2::pack(ps::E2M1::from_float(pair.x), ps::E2M1::from_float(pair.y));
      CHECK(ours.bits == theirs);
      CHECK(ours.first().bits == ps::E2M1::from_float(pair.x).bits);
      CHECK(ours.second().bits == ps::E2M1::from_float(pair.y).bits);
    }
  }
}
