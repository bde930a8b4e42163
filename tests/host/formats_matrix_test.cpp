// Matrix quantization: the storage conventions (columnwise of A is rowwise of A^T, with
// MXFP8 keeping [M, K] and NVFP4 transposing), every output byte written, and the
// round-trip error bound of each element.

#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/test_data.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace ps = pagestash;

namespace {

template <class Format>
struct Quantized {
  std::vector<std::uint8_t> data, scales;
  float amax = -1;
  ps::QuantizedMatrix<Format> ref;

  Quantized(std::int64_t rows, std::int64_t cols, ps::Direction dir, std::uint8_t poison,
            std::int64_t scale_pitch = 0) {
    ref.rows = rows;
    ref.cols = cols;
    ref.direction = dir;
    ref.scale_pitch = scale_pitch;
    data.assign(static_cast<std::size_t>(ref.data_bytes()), poison);
    scales.assign(static_cast<std::size_t>(ref.scale_bytes()), poison);
    ref.data = reinterpret_cast<typename Format::data_storage*>(data.data());
    ref.scales = reinterpret_cast<typename Format::scale_type*>(scales.data());
    ref.amax = &amax;
  }
};

std::vector<ps::BF16> to_bf16(const std::vector<float>& v) {
  std::vector<ps::BF16> out;
  for (float x : v) out.push_back(ps::BF16::from_float(x));
  return out;
}

template <class T>
std::vector<T> transpose(const std::vector<T>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<T> t(a.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  return t;
}

template <class Format>
void check_matrix(std::int64_t M, std::int64_t K, std::uint32_t seed) {
  const auto source = to_bf16(pagestash_test::random_activations(M * K, seed, 3.0f));
  const auto source_t = transpose(source, M, K);

  for (auto dir : {ps::Direction::rowwise, ps::Direction::columnwise}) {
    CAPTURE(static_cast<int>(dir));
    // Two poisons: every byte must come out the same, so every byte was written.
    Quantized<Format> a(M, K, dir, 0x00), b(M, K, dir, 0xFF);
    ps::quantize_matrix(source.data(), a.ref);
    ps::quantize_matrix(source.data(), b.ref);
    REQUIRE(a.data == b.data);
    REQUIRE(a.scales == b.scales);

    // Columnwise quantization of A equals rowwise quantization of A^T, stored as
    // TransformerEngine does: NVFP4 transposed, MXFP8 not (stated here, not read from the code).
    constexpr bool te_transposes = std::is_same_v<Format, ps::NVFP4>;
    if (dir == ps::Direction::columnwise) {
      Quantized<Format> rt(K, M, ps::Direction::rowwise, 0x5A);
      ps::quantize_matrix(source_t.data(), rt.ref);
      CHECK(rt.amax == a.amax);
      if constexpr (te_transposes) {
        CHECK(rt.data == a.data);      // [K, M/2]
        CHECK(rt.scales == a.scales);  // [K, M/16]
      } else {
        CHECK(transpose(rt.data, K, M) == a.data);                           // [M, K]
        CHECK(transpose(rt.scales, K, M / Format::block_size) == a.scales);  // [M/32, K]
      }
    }

    // Round trip against a block-by-block reference through quantize_block directly.
    std::vector<float> out(static_cast<std::size_t>(M * K), std::nanf(""));
    ps::dequantize_matrix(a.ref, out.data());
    const auto tensor = Format::TensorScale::from_amax(a.amax);
    for (std::int64_t line = 0; line < a.ref.line_count(); ++line) {
      for (std::int64_t blk = 0; blk < a.ref.blocks_per_line(); ++blk) {
        float values[Format::block_size], expected[Format::block_size];
        typename Format::element_type codes[Format::block_size];
        for (int i = 0; i < Format::block_size; ++i)
          values[i] = source[a.ref.source_index(line, blk * Format::block_size + i)].to_float();
        const auto scale = ps::quantize_block(Format{}, values, tensor, codes);
        ps::dequantize_block(Format{}, codes, scale, tensor, expected);
        for (int i = 0; i < Format::block_size; ++i) {
          const auto idx = a.ref.source_index(line, blk * Format::block_size + i);
          REQUIRE(pagestash_test::bits_of(out[idx]) == pagestash_test::bits_of(expected[i]));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("MXFP8 E4M3 matrix, both directions") { check_matrix<ps::MXFP8_E4M3>(96, 160, 21); }
TEST_CASE("MXFP8 E5M2 matrix, both directions") { check_matrix<ps::MXFP8_E5M2>(64, 96, 22); }
TEST_CASE("NVFP4 matrix, both directions") { check_matrix<ps::NVFP4>(48, 80, 23); }

TEST_CASE("NVFP4 matrix relative error stays within the format's bound") {
  const std::int64_t M = 64, K = 128;
  const auto source = to_bf16(pagestash_test::random_activations(M * K, 31, 1.0f));
  Quantized<ps::NVFP4> q(M, K, ps::Direction::rowwise, 0);
  ps::quantize_matrix(source.data(), q.ref);
  std::vector<float> out(M * K);
  ps::dequantize_matrix(q.ref, out.data());
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < M * K; ++i) {
    const double x = source[i].to_float();
    err2 += (out[i] - x) * (out[i] - x);
    ref2 += x * x;
  }
  // E2M1 has one mantissa bit: the relative RMS error of random data is roughly 10%.
  CHECK(std::sqrt(err2 / ref2) < 0.15);
  CHECK(std::sqrt(err2 / ref2) > 0.01);
}

TEST_CASE("matrix validation names the bad field") {
  Quantized<ps::MXFP8_E4M3> q(64, 48, ps::Direction::rowwise, 0);
  std::vector<float> src(64 * 48, 1.0f);
  CHECK_THROWS_WITH_AS(ps::quantize_matrix(src.data(), q.ref),
                       "QuantizedMatrix: cols = 48 is not a multiple of the block size 32", std::invalid_argument);
  Quantized<ps::NVFP4> n(40, 32, ps::Direction::columnwise, 0);
  CHECK_THROWS_WITH_AS(ps::quantize_matrix(src.data(), n.ref),
                       "QuantizedMatrix: rows = 40 is not a multiple of the block size 16", std::invalid_argument);
  Quantized<ps::NVFP4> no_amax(32, 32, ps::Direction::rowwise, 0);
  no_amax.ref.amax = nullptr;
  CHECK_THROWS_AS(ps::quantize_matrix(src.data(), no_amax.ref), std::invalid_argument);
}

namespace {

/// A scale pitch writes each scale row where a padded layout wants it: the compact scales
/// row by row, the padding left alone.
template <class Format>
void check_scale_pitch(std::int64_t rows, std::int64_t cols, ps::Direction dir) {
  std::vector<float> values = pagestash_test::random_activations(static_cast<std::size_t>(rows * cols), 41, 2.0f);
  const std::vector<ps::BF16> src = to_bf16(values);
  Quantized<Format> compact(rows, cols, dir, 0x11);
  ps::quantize_matrix(src.data(), compact.ref);
  const std::int64_t pitch = compact.ref.compact_scale_pitch() + 5;
  Quantized<Format> padded(rows, cols, dir, 0x77, pitch);
  ps::quantize_matrix(src.data(), padded.ref);
  CHECK(padded.data == compact.data);
  const std::int64_t row = compact.ref.compact_scale_pitch();
  for (std::int64_t r = 0; r < compact.ref.scale_rows(); ++r)
    for (std::int64_t i = 0; i < pitch; ++i) {
      const std::uint8_t got = padded.scales[static_cast<std::size_t>(r * pitch + i)];
      CHECK(got == (i < row ? compact.scales[static_cast<std::size_t>(r * row + i)] : std::uint8_t{0x77}));
    }
  std::vector<float> a(values.size()), b(values.size());
  ps::dequantize_matrix(compact.ref, a.data());
  ps::dequantize_matrix(padded.ref, b.data());
  CHECK(a == b);
}

TEST_CASE("matrix scale_pitch: scales written into padded rows, every format and direction") {
  for (auto dir : {ps::Direction::rowwise, ps::Direction::columnwise}) {
    check_scale_pitch<ps::MXFP8_E4M3>(64, 96, dir);
    check_scale_pitch<ps::NVFP4>(48, 64, dir);
  }
  Quantized<ps::NVFP4> short_rows(32, 32, ps::Direction::rowwise, 0, 1);
  std::vector<float> src(32 * 32, 1.0f);
  CHECK_THROWS_WITH_AS(ps::quantize_matrix(src.data(), short_rows.ref),
                       "QuantizedMatrix: scale_pitch = 1 is shorter than a scale row (2)", std::invalid_argument);
}

}  // namespace
