#pragma once
// One group's block of one buffer, seen as a 2-D byte matrix [rows, cols], row-major or in the GEMM-ready 128x4 tiles
// that cuBLAS documents for block-scaled GEMMs. Tokens run along one axis; `tokens_per_index` tokens share one index on
// it (2 for packed FP4 bytes, 16 or 32 for block scales). The geometry and the producers derive everything from this.

#include <pagestash/config.hpp>
#include <pagestash/detail/math.hpp>

#include <cuda/std/cstdint>

PAGESTASH_NAMESPACE_BEGIN

enum class TokenAxis : cuda::std::uint8_t { rows, cols };

/// cuBLAS's scale-factor tile: 128 rows x 4 columns = 512 bytes. Tiles are stored row-block-major; inside a tile, row r
/// and column c sit at (r % 32) * 16 + (r / 32) * 4 + c.
struct SwizzleTile {
  static constexpr cuda::std::int64_t rows = 128;
  static constexpr cuda::std::int64_t cols = 4;
  static constexpr cuda::std::int64_t bytes = rows * cols;

  PAGESTASH_HOST_DEVICE static cuda::std::int64_t offset(cuda::std::int64_t r, cuda::std::int64_t c,
                                                         cuda::std::int64_t matrix_cols) {
    const cuda::std::int64_t tile = (r / rows) * (matrix_cols / cols) + c / cols;
    return tile * bytes + (r % 32) * 16 + ((r % rows) / 32) * 4 + c % cols;
  }
};

struct BlockShape {
  cuda::std::int64_t rows = 0;
  cuda::std::int64_t cols = 0;
  TokenAxis token_axis = TokenAxis::rows;
  cuda::std::int64_t tokens_per_index = 1;
  bool swizzled = false;

  PAGESTASH_HOST_DEVICE cuda::std::int64_t bytes() const { return rows * cols; }

  /// Byte offset of (r, c) inside the block.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t offset(cuda::std::int64_t r, cuda::std::int64_t c) const {
    return swizzled ? SwizzleTile::offset(r, c, cols) : r * cols + c;
  }

  PAGESTASH_HOST_DEVICE cuda::std::int64_t tokens() const {
    return (token_axis == TokenAxis::rows ? rows : cols) * tokens_per_index;
  }

  /// Tokens one 128x4 swizzle tile of scales spans: on its 4-wide side for blocks along tokens (columnwise,
  /// tokens_per_index > 1), its 128-high side for rowwise. The granule of swizzled scales, and what TE pads each
  /// tensor's scales to, compact or swizzled (scale blocks only).
  PAGESTASH_HOST_DEVICE cuda::std::int64_t swizzle_tokens() const {
    return tokens_per_index * (tokens_per_index > 1 ? SwizzleTile::cols : SwizzleTile::rows);
  }

  /// Smallest token count whose bytes are whole: a partial granule is live as a whole.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t granule() const { return swizzled ? swizzle_tokens() : tokens_per_index; }

  /// Token indices that are live for m tokens (whole granules).
  PAGESTASH_HOST_DEVICE cuda::std::int64_t live_indices(cuda::std::int64_t m) const {
    const cuda::std::int64_t g = granule();
    return detail::ceil_div(m, g) * (g / tokens_per_index);
  }

  /// Live bytes of a block form `lines()` runs, `pitch()` apart, of `run_bytes(m)`.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t lines() const {
    if (token_axis == TokenAxis::rows) return 1;
    return swizzled ? rows / SwizzleTile::rows : rows;
  }
  /// Bytes from one line to the next, a whole block for one line: bytes() / lines().
  PAGESTASH_HOST_DEVICE cuda::std::int64_t pitch() const {
    if (token_axis == TokenAxis::rows) return bytes();
    return swizzled ? (cols / SwizzleTile::cols) * SwizzleTile::bytes : cols;
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t run_bytes(cuda::std::int64_t m) const {
    const cuda::std::int64_t granules = detail::ceil_div(m, granule());
    if (token_axis == TokenAxis::rows) {
      return granules * (swizzled ? (cols / SwizzleTile::cols) * SwizzleTile::bytes : cols);
    }
    return granules * (swizzled ? SwizzleTile::bytes : 1);
  }
};

PAGESTASH_NAMESPACE_END
