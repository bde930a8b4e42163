#pragma once
// What the quantized layouts share: format checks, buffer types, the buffers they have. Not public API.

#include <pagestash/layouts/detail/layout_common.hpp>
#include <pagestash/formats/block.hpp>
#include <pagestash/formats/direction.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

template <class Format, class Placement, class Scales>
struct QuantizedLayoutBase {
  static_assert(cuda::std::is_same_v<Format, MXFP8_E4M3> || cuda::std::is_same_v<Format, MXFP8_E5M2> ||
                    cuda::std::is_same_v<Format, NVFP4>,
                "pagestash quantized layout: Format must be MXFP8_E4M3, MXFP8_E5M2 or NVFP4");
  using format = Format;
  using data_type = cuda::std::conditional_t<Format::element_bits == 4, E2M1x2, typename Format::element_type>;
  using scale_type = typename Format::scale_type;
  using placement = Placement;
  using scale_arrangement = Scales;
  static constexpr cuda::std::int64_t granule = 128;  ///< TE pads block scales to whole 128x4 swizzle tiles: 128 tokens
  static constexpr cuda::std::int64_t hidden_multiple = Format::block_size;  ///< as TE requires of block-scaled tensors
  /// Packed placement: every count a multiple of 128, as TE's device grouped kernels require ("First dimension of each
  /// tensor in a group must be divisible by 128", grouped_layout.cuh).
  static constexpr cuda::std::int64_t packed_count_alignment = 128;

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) {
    return role != BufferRole::amax || cuda::std::is_same_v<Format, NVFP4>;
  }
};

}  // namespace detail
PAGESTASH_NAMESPACE_END
