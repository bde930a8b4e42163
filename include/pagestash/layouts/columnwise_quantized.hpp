#pragma once
// ColumnwiseQuantized<Format, Placement, Scales>: what backward's weight-gradient GEMM reads.
// Blocks run along tokens. Per group of t tokens (t = m_g packed, C capacity-padded), K hidden,
// Kp = roundup(K, 128):
//
//   MXFP8  data    [t, K] bytes (not transposed)           token axis: rows
//          scales  compact  [t/32, Kp]                     token axis: rows, 32 tokens a row
//                  swizzled [Kp, t/32] in 128x4 tiles      token axis: cols, 128 tokens a tile
//   NVFP4  data    [K, t/2] bytes, TRANSPOSED per group    token axis: cols, 2 tokens a byte
//          scales  compact  [K, t/16]                      token axis: cols, 16 tokens a byte
//                  swizzled [Kp, t/16] in 128x4 tiles      token axis: cols, 64 tokens a tile
//          amax    [G] FP32 (one per group)

#include <pagestash/detail/layout_common.hpp>
#include <pagestash/formats/block.hpp>
#include <pagestash/formats/matrix.hpp>
#include <pagestash/layouts/placement.hpp>

PAGESTASH_NAMESPACE_BEGIN

template <class Format, class Placement = Packed, class Scales = SwizzledScales>
struct ColumnwiseQuantized {
  static_assert(cuda::std::is_same_v<Format, MXFP8_E4M3> || cuda::std::is_same_v<Format, MXFP8_E5M2> ||
                    cuda::std::is_same_v<Format, NVFP4>,
                "pagestash::ColumnwiseQuantized<Format>: Format must be MXFP8_E4M3, MXFP8_E5M2 or NVFP4");
  using format = Format;
  using data_type = cuda::std::conditional_t<Format::element_bits == 4, E2M1x2, typename Format::element_type>;
  using scale_type = typename Format::scale_type;
  using placement = Placement;
  using scale_arrangement = Scales;
  static constexpr Direction direction = Direction::columnwise;
  static constexpr const char* name = "ColumnwiseQuantized";
  /// TE pads block scales to whole 128x4 tiles: max_tokens must be a multiple of 128.
  static constexpr cuda::std::int64_t token_multiple = 128;
  /// As TE requires of block-scaled tensors: hidden is a multiple of the block size.
  static constexpr cuda::std::int64_t hidden_multiple = Format::block_size;

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) {
    return role != BufferRole::amax || cuda::std::is_same_v<Format, NVFP4>;
  }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole role, cuda::std::int64_t t, cuda::std::int64_t K) {
    constexpr cuda::std::int64_t b = Format::block_size;
    const cuda::std::int64_t Kp = detail::round_up(K, 128);
    if constexpr (Format::transposed_columnwise) {  // NVFP4
      if (role == BufferRole::data) return BlockShape{K, t / 2, TokenAxis::cols, 2, false};
      return BlockShape{Scales::swizzled ? Kp : K, t / b, TokenAxis::cols, b, Scales::swizzled};
    } else {  // MXFP8
      if (role == BufferRole::data) return BlockShape{t, K, TokenAxis::rows, 1, false};
      if (Scales::swizzled) return BlockShape{Kp, t / b, TokenAxis::cols, b, true};
      return BlockShape{t / b, Kp, TokenAxis::rows, b, false};
    }
  }
};

PAGESTASH_NAMESPACE_END
