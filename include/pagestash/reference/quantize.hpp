#pragma once
// Reference quantizers, for tests and examples, and the oracle of the compressed stash: one block, and
// a row-major [M, K] matrix in compact storage. Correctness first, speed does not matter.
//
// A block holding NaN or infinity gets a NaN scale; its codes are NaN where the element format has a NaN (FP8) and
// what rounding NaN gives where it has none (E2M1 saturates it to 6).
//
//   rowwise      blocks run along K (one scale per row and block of K)
//   columnwise   blocks run along M (one scale per column and block of M)
//
// Compact storage (no padding; layouts add padding and swizzling on top):
//
//   format  direction    data                      scales
//   MXFP8   rowwise      [M, K]     bytes          [M, K/32]
//   MXFP8   columnwise   [M, K]     bytes          [M/32, K]
//   NVFP4   rowwise      [M, K/2]   packed bytes   [M, K/16]    + FP32 amax
//   NVFP4   columnwise   [K, M/2]   packed bytes   [K, M/16]    + FP32 amax (transposed)
//
// The unit of work is one block ("line" = row for rowwise, column for columnwise); the same
// host+device function serves the host loop below and any device kernel.

#include <pagestash/detail/errors.hpp>
#include <pagestash/formats/block.hpp>
#include <pagestash/formats/direction.hpp>

#include <cuda/std/cstddef>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

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

/// Quantizes `Format::block_size` values; writes one element code per value and returns the
/// block scale.
template <class Element>
PAGESTASH_HOST_DEVICE E8M0 quantize_block(MXFP8<Element>, const float* values, typename MXFP8<Element>::TensorScale,
                                          Element* codes) {
  constexpr int n = MXFP8<Element>::block_size;
  const float amax = abs_max(values, n);
  if (!(amax <= cuda::std::numeric_limits<float>::max())) {  // NaN or infinity in the block
    for (int i = 0; i < n; ++i) codes[i] = Element::from_float(detail::quiet_nan());
    return E8M0::from_bits(E8M0::nan_code);
  }
  const int emax_elem = detail::floor_log2(Element::max());
  const E8M0 scale =
      amax == 0.0f ? E8M0::from_exponent(-E8M0::bias) : E8M0::from_exponent(detail::floor_log2(amax) - emax_elem);
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

PAGESTASH_HOST_DEVICE inline E4M3 quantize_block(NVFP4, const float* values, NVFP4::TensorScale tensor, E2M1* codes) {
  constexpr int n = NVFP4::block_size;
  const float amax = abs_max(values, n);
  const E4M3 scale = E4M3::from_float(amax / 6.0f * tensor.encode);
  const float s = scale.to_float();
  const float factor = s == 0.0f ? 0.0f : tensor.encode / s;
  for (int i = 0; i < n; ++i) codes[i] = E2M1::from_float(values[i] * factor);
  return scale;
}

PAGESTASH_HOST_DEVICE inline void dequantize_block(NVFP4, const E2M1* codes, E4M3 scale, NVFP4::TensorScale tensor,
                                                   float* values) {
  const float s = scale.to_float() / tensor.encode;
  for (int i = 0; i < NVFP4::block_size; ++i) values[i] = codes[i].to_float() * s;
}

PAGESTASH_HOST_DEVICE inline float quantize_block(FP8Block128, const float* values, FP8Block128::TensorScale,
                                                  E4M3* codes) {
  constexpr int n = FP8Block128::block_size;
  const float amax = abs_max(values, n);
  if (!(amax <= cuda::std::numeric_limits<float>::max())) {  // NaN or infinity in the block
    for (int i = 0; i < n; ++i) codes[i] = E4M3::from_float(detail::quiet_nan());
    return detail::quiet_nan();
  }
  float scale = amax == 0.0f ? 1.0f : 448.0f / amax;
  if (scale > cuda::std::numeric_limits<float>::max()) scale = cuda::std::numeric_limits<float>::max();
  for (int i = 0; i < n; ++i) codes[i] = E4M3::from_float(values[i] * scale);
  return 1.0f / scale;
}

PAGESTASH_HOST_DEVICE inline void dequantize_block(FP8Block128, const E4M3* codes, float scale,
                                                   FP8Block128::TensorScale, float* values) {
  for (int i = 0; i < FP8Block128::block_size; ++i) values[i] = codes[i].to_float() * scale;
}

/// Storage of one quantized [rows, cols] matrix, typed as the layouts' views are (MXFP8:
/// E4M3/E5M2 data and E8M0 scales; NVFP4: E2M1x2 data and E4M3 scales). `amax` is used by
/// NVFP4 only. Scales are compact unless `scale_pitch` says how far apart their rows are
/// (in scales), so that quantize_matrix can write straight into a layout whose scale rows
/// are padded (e.g. NVFP4 columnwise compact scales of a capacity-padded group).
template <class Format>
struct QuantizedMatrix {
  typename Format::data_storage* data = nullptr;
  typename Format::scale_type* scales = nullptr;
  float* amax = nullptr;
  cuda::std::int64_t rows = 0;
  cuda::std::int64_t cols = 0;
  Direction direction = Direction::rowwise;
  cuda::std::int64_t scale_pitch = 0;  ///< scales from one scale row to the next; 0: compact

  PAGESTASH_HOST_DEVICE cuda::std::int64_t line_count() const { return direction == Direction::rowwise ? rows : cols; }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t line_length() const { return direction == Direction::rowwise ? cols : rows; }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t blocks_per_line() const { return line_length() / Format::block_size; }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t data_bytes() const { return rows * cols * Format::element_bits / 8; }
  /// Scale rows, and scales in one (compact): [lines, blocks] or, MXFP8 columnwise, [blocks, cols].
  PAGESTASH_HOST_DEVICE bool scales_by_block() const {
    return !Format::transposed_columnwise && direction == Direction::columnwise;
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t scale_rows() const {
    return scales_by_block() ? blocks_per_line() : line_count();
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t compact_scale_pitch() const {
    return scales_by_block() ? cols : blocks_per_line();
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t row_pitch() const {
    return scale_pitch != 0 ? scale_pitch : compact_scale_pitch();
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t scale_bytes() const { return scale_rows() * row_pitch(); }

  /// Element (line, pos) of the source matrix, as an index into row-major [M, K].
  PAGESTASH_HOST_DEVICE cuda::std::int64_t source_index(cuda::std::int64_t line, cuda::std::int64_t pos) const {
    return direction == Direction::rowwise ? line * cols + pos : pos * cols + line;
  }
  /// Element (line, pos) in the data buffer, counted in elements (a packed FP4 byte holds
  /// elements 2i and 2i+1). Transposed formats store every direction line-major.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t data_index(cuda::std::int64_t line, cuda::std::int64_t pos) const {
    return Format::transposed_columnwise ? line * line_length() + pos : source_index(line, pos);
  }
  /// Scale of block b of a line, as an index into the scale buffer.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t scale_index(cuda::std::int64_t line, cuda::std::int64_t block) const {
    return scales_by_block() ? block * row_pitch() + line : line * row_pitch() + block;
  }
};

namespace detail {

template <class Format>
PAGESTASH_HOST_DEVICE typename Format::element_type load_element(const QuantizedMatrix<Format>& q,
                                                                 cuda::std::int64_t index) {
  using Element = typename Format::element_type;
  if constexpr (Format::element_bits == 4) {
    const E2M1x2 pair = q.data[index / 2];
    return index % 2 == 0 ? pair.first() : pair.second();
  } else {
    return Element::from_bits(q.data[index].bits);
  }
}

template <class Format>
PAGESTASH_HOST_DEVICE void store_element(const QuantizedMatrix<Format>& q, cuda::std::int64_t index,
                                         typename Format::element_type e) {
  if constexpr (Format::element_bits == 4) {
    cuda::std::uint8_t& byte = q.data[index / 2].bits;
    const int shift = index % 2 == 0 ? 0 : 4;
    byte = static_cast<cuda::std::uint8_t>((byte & ~(0xF << shift)) | ((e.bits & 0xF) << shift));
  } else {
    q.data[index] = e;
  }
}

}  // namespace detail

/// Quantizes block `block` of line `line` of the row-major [q.rows, q.cols] source.
template <class Format, class Source>
PAGESTASH_HOST_DEVICE void quantize_matrix_block(const Source* source, const QuantizedMatrix<Format>& q,
                                                 typename Format::TensorScale tensor, cuda::std::int64_t line,
                                                 cuda::std::int64_t block) {
  constexpr int n = Format::block_size;
  float values[n];
  typename Format::element_type codes[n];
  for (int i = 0; i < n; ++i) values[i] = to_float(source[q.source_index(line, block * n + i)]);
  const auto scale = quantize_block(Format{}, values, tensor, codes);
  for (int i = 0; i < n; ++i) detail::store_element(q, q.data_index(line, block * n + i), codes[i]);
  q.scales[q.scale_index(line, block)] = scale;
}

/// Dequantizes block `block` of line `line` into the row-major [q.rows, q.cols] float output.
template <class Format>
PAGESTASH_HOST_DEVICE void dequantize_matrix_block(const QuantizedMatrix<Format>& q,
                                                   typename Format::TensorScale tensor, float* out,
                                                   cuda::std::int64_t line, cuda::std::int64_t block) {
  constexpr int n = Format::block_size;
  float values[n];
  typename Format::element_type codes[n];
  for (int i = 0; i < n; ++i) codes[i] = detail::load_element(q, q.data_index(line, block * n + i));
  const auto scale = q.scales[q.scale_index(line, block)];
  dequantize_block(Format{}, codes, scale, tensor, values);
  for (int i = 0; i < n; ++i) out[q.source_index(line, block * n + i)] = values[i];
}

/// What a compressed stash and its reload make of n consecutive values of T (n a multiple of Format's block):
/// dequantize(quantize(x)) block by block, rounded back to T. The oracle of the compressed stash
/// (stash/compress.hpp).
template <class Format, class T>
PAGESTASH_HOST_DEVICE void round_trip_blocks(const T* source, cuda::std::int64_t n, T* out) {
  constexpr int b = Format::block_size;
  float values[b];
  typename Format::element_type codes[b];
  for (cuda::std::int64_t first = 0; first + b <= n; first += b) {
    for (int i = 0; i < b; ++i) values[i] = to_float(source[first + i]);
    const auto scale = quantize_block(Format{}, values, typename Format::TensorScale{}, codes);
    dequantize_block(Format{}, codes, scale, typename Format::TensorScale{}, values);
    for (int i = 0; i < b; ++i) out[first + i] = T::from_float(values[i]);
  }
}

/// Host check of a matrix description; throws std::invalid_argument naming the problem.
/// (Not an overload of the views' `validate<Traits>`: resolving that call would instantiate
/// QuantizedMatrix<Traits>, which has no storage types.)
template <class Format>
void validate_matrix(const QuantizedMatrix<Format>& q) {
  if (q.rows < 0 || q.cols < 0) detail::throw_invalid("QuantizedMatrix", "negative shape");
  if (q.line_length() % Format::block_size != 0) {
    detail::throw_invalid("QuantizedMatrix", std::string(q.direction == Direction::rowwise ? "cols" : "rows") + " = " +
                                                 std::to_string(q.line_length()) +
                                                 " is not a multiple of the block size " +
                                                 std::to_string(Format::block_size));
  }
  if (q.scale_pitch != 0 && q.scale_pitch < q.compact_scale_pitch())
    detail::throw_invalid("QuantizedMatrix", "scale_pitch = " + std::to_string(q.scale_pitch) +
                                                 " is shorter than a scale row (" +
                                                 std::to_string(q.compact_scale_pitch()) + ")");
  if (q.rows * q.cols > 0 && (q.data == nullptr || q.scales == nullptr))
    detail::throw_invalid("QuantizedMatrix", "data or scales is null");
  if (cuda::std::is_same_v<Format, NVFP4> && q.amax == nullptr)
    detail::throw_invalid("QuantizedMatrix<NVFP4>", "amax is null");
}

/// Quantizes a whole row-major source on the host. For NVFP4 the tensor amax is computed
/// from the source and stored in *q.amax.
template <class Format, class Source>
void quantize_matrix(const Source* source, const QuantizedMatrix<Format>& q) {
  validate_matrix(q);
  const float amax = abs_max(source, q.rows * q.cols);
  if (q.amax != nullptr) *q.amax = amax;
  const auto tensor = Format::TensorScale::from_amax(amax);
  for (cuda::std::int64_t line = 0; line < q.line_count(); ++line)
    for (cuda::std::int64_t b = 0; b < q.blocks_per_line(); ++b) quantize_matrix_block(source, q, tensor, line, b);
}

/// Dequantizes a whole matrix on the host into row-major float [rows, cols].
template <class Format>
void dequantize_matrix(const QuantizedMatrix<Format>& q, float* out) {
  validate_matrix(q);
  const auto tensor = Format::TensorScale::from_amax(q.amax != nullptr ? *q.amax : 0.0f);
  for (cuda::std::int64_t line = 0; line < q.line_count(); ++line)
    for (cuda::std::int64_t b = 0; b < q.blocks_per_line(); ++b) dequantize_matrix_block(q, tensor, out, line, b);
}

PAGESTASH_NAMESPACE_END
