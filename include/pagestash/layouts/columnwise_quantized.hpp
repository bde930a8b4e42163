#pragma once
// ColumnwiseQuantized<Format, Placement, Scales>: what backward's weight-gradient GEMM reads. Blocks run along tokens.
// Per group of t tokens (t = m_g packed, C capacity-padded), K hidden, Kp = roundup(K, 128):
//
//   MXFP8  data    [t, K] bytes (not transposed)           token axis: rows
//          scales  compact  [t/32, Kp]                     token axis: rows, 32 tokens a row
//                  swizzled [Kp, t/32] in 128x4 tiles      token axis: cols, 128 tokens a tile
//   NVFP4  data    [K, t/2] bytes, TRANSPOSED per group    token axis: cols, 2 tokens a byte
//          scales  compact  [Kp, t/16]                     token axis: cols, 16 tokens a byte
//                  swizzled [Kp, t/16] in 128x4 tiles      token axis: cols, 64 tokens a tile
//
// Scale rows past K are TE's padding (it allocates [roundup(K, 128), ...] either way).
//          amax    [G] FP32 (one per group)

#include <pagestash/layouts/detail/quantized_layout.hpp>
#include <pagestash/layouts/placement.hpp>

PAGESTASH_NAMESPACE_BEGIN

template <class Format, class Placement = Packed, class Scales = SwizzledScales>
struct ColumnwiseQuantized : detail::QuantizedLayoutBase<Format, Placement, Scales> {
  static constexpr Direction direction = Direction::columnwise;
  static constexpr detail::LayoutName name_chars =
      detail::layout_name("ColumnwiseQuantized", Format::name, Placement::name, Scales::name);
  static constexpr const char* name = name_chars.chars;

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole role, cuda::std::int64_t t, cuda::std::int64_t K) {
    constexpr cuda::std::int64_t b = Format::block_size;
    const cuda::std::int64_t Kp = detail::round_up(K, 128);
    if constexpr (Format::transposed_columnwise) {  // NVFP4
      if (role == BufferRole::data) return BlockShape{K, t / 2, TokenAxis::cols, 2, false};
      return BlockShape{Kp, t / b, TokenAxis::cols, b, Scales::swizzled};
    } else {  // MXFP8
      if (role == BufferRole::data) return BlockShape{t, K, TokenAxis::rows, 1, false};
      if (Scales::swizzled) return BlockShape{Kp, t / b, TokenAxis::cols, b, true};
      return BlockShape{t / b, Kp, TokenAxis::rows, b, false};
    }
  }
};

PAGESTASH_NAMESPACE_END
