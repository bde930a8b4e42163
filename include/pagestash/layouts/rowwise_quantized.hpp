#pragma once
// RowwiseQuantized<Format, Placement, Scales>: blocks along hidden (forward-only stashes).
// Per group of t tokens, K hidden:
//
//   MXFP8  data    [t, K] bytes                             token axis: rows
//          scales  [t, roundup(K/32, 4)]   compact or 128x4 tiles (128 tokens a tile row)
//   NVFP4  data    [t, K/2] bytes (two values per byte)     token axis: rows
//          scales  [t, roundup(K/16, 4)]   compact or 128x4 tiles
//          amax    [G] FP32 (one per group)

#include <pagestash/layouts/detail/quantized_layout.hpp>
#include <pagestash/layouts/placement.hpp>

PAGESTASH_NAMESPACE_BEGIN

template <class Format, class Placement = Packed, class Scales = SwizzledScales>
struct RowwiseQuantized : detail::QuantizedLayoutBase<Format, Placement, Scales> {
  static constexpr Direction direction = Direction::rowwise;
  static constexpr detail::LayoutName name_chars =
      detail::layout_name("RowwiseQuantized", Format::name, Placement::name, Scales::name);
  static constexpr const char* name = name_chars.chars;

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole role, cuda::std::int64_t t, cuda::std::int64_t K) {
    if (role == BufferRole::data) return BlockShape{t, K * Format::element_bits / 8, TokenAxis::rows, 1, false};
    return BlockShape{t, detail::round_up(K / Format::block_size, 4), TokenAxis::rows, 1, Scales::swizzled};
  }
};

PAGESTASH_NAMESPACE_END
