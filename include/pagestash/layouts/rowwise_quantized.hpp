#pragma once
// RowwiseQuantized<Format, Placement, Scales>: blocks along hidden (forward-only stashes).
// Per group of t tokens, K hidden:
//
//   MXFP8  data    [t, K] bytes                             token axis: rows
//          scales  [t, roundup(K/32, 4)]   compact or 128x4 tiles (128 tokens a tile row)
//   NVFP4  data    [t, K/2] bytes (two values per byte)     token axis: rows
//          scales  [t, roundup(K/16, 4)]   compact or 128x4 tiles
//          amax    [G] FP32 (one per group)

#include <pagestash/detail/layout_common.hpp>
#include <pagestash/formats/block.hpp>
#include <pagestash/formats/matrix.hpp>
#include <pagestash/layouts/placement.hpp>

PAGESTASH_NAMESPACE_BEGIN

template <class Format, class Placement = Packed, class Scales = SwizzledScales>
struct RowwiseQuantized {
  static_assert(cuda::std::is_same_v<Format, MXFP8_E4M3> || cuda::std::is_same_v<Format, MXFP8_E5M2> ||
                    cuda::std::is_same_v<Format, NVFP4>,
                "pagestash::RowwiseQuantized<Format>: Format must be MXFP8_E4M3, MXFP8_E5M2 or NVFP4");
  using format = Format;
  using data_type = cuda::std::conditional_t<Format::element_bits == 4, E2M1x2, typename Format::element_type>;
  using scale_type = typename Format::scale_type;
  using placement = Placement;
  using scale_arrangement = Scales;
  static constexpr Direction direction = Direction::rowwise;
  static constexpr const char* name = "RowwiseQuantized";
  static constexpr cuda::std::int64_t token_multiple = 128;
  static constexpr cuda::std::int64_t hidden_multiple = Format::block_size;

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) {
    return role != BufferRole::amax || cuda::std::is_same_v<Format, NVFP4>;
  }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole role, cuda::std::int64_t t, cuda::std::int64_t K) {
    if (role == BufferRole::data) return BlockShape{t, K * Format::element_bits / 8, TokenAxis::rows, 1, false};
    return BlockShape{t, detail::round_up(K / Format::block_size, 4), TokenAxis::rows, 1, Scales::swizzled};
  }
};

PAGESTASH_NAMESPACE_END
