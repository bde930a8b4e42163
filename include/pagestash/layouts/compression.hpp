#pragma once
// Compression: how a stash keeps the live bytes of a paged buffer, a choice of StashTraits.
//
//   Lossless            byte for byte (the default)
//   Compressed<Format>  a BF16 or FP16 data buffer paged quantized in Format (MXFP8_E4M3, MXFP8_E5M2 or FP8Block128,
//                       formats/block.hpp): about half the pages; the reload writes dequantize(quantize(x)) back. Lossy
//                       and opt-in; docs/layouts.md "Compressed stash" has the rules.
//
// The page stream of a compressed segment of n elements: the n element codes, to 16 bytes, then the n / block scales
// (n / 32 bytes in every format: an E8M0 per 32 values or an FP32 per 128), the whole rounded up to 128 bytes, so that
// every segment starts on 128 bytes and a tile of codes on a block.

#include <pagestash/formats/block.hpp>
#include <pagestash/detail/math.hpp>
#include <pagestash/layouts/detail/layout_common.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

struct Lossless {
  static constexpr bool compressed = false;
  static constexpr const char* name = "lossless";
};

/// Every format a compressed stash offers, as X(format): the one list (Compressed's check, compression_names and the
/// name dispatch in layouts/recipes.hpp, the benchmarks and the PyTorch ops read it).
#define PAGESTASH_FOR_EACH_COMPRESSION(X) \
  X(::pagestash::MXFP8_E4M3) X(::pagestash::MXFP8_E5M2) X(::pagestash::FP8Block128)

/// Whether Format is one of PAGESTASH_FOR_EACH_COMPRESSION's.
template <class Format>
inline constexpr bool compression_format = false
#define PAGESTASH_IS_COMPRESSION_FORMAT(F) || cuda::std::is_same_v<Format, F>
    PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_IS_COMPRESSION_FORMAT);
#undef PAGESTASH_IS_COMPRESSION_FORMAT

template <class Format>
struct Compressed {
  static_assert(compression_format<Format>,
                "pagestash::Compressed<Format>: Format must be one of PAGESTASH_FOR_EACH_COMPRESSION's formats");
  using format = Format;
  static constexpr bool compressed = true;
  static constexpr const char* name = Format::name;
  static constexpr int block = Format::block_size;
  static constexpr int scale_bytes = static_cast<int>(sizeof(typename Format::scale_type));
};

/// Whether a layout's data can be paged compressed: BF16 or FP16 Plain or RowwiseUnquantized rows.
template <class Layout>
inline constexpr bool compressible = cuda::std::is_base_of_v<detail::UnquantizedRows<BF16>, Layout> ||
                                     cuda::std::is_base_of_v<detail::UnquantizedRows<FP16>, Layout>;

/// Alignment of a compressed segment in the page stream: the longest block's codes.
inline constexpr cuda::std::int64_t compressed_alignment = 128;

/// Stream bytes of a compressed segment of `elements` values (a multiple of the block).
template <class Compression>
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t compressed_stream_bytes(cuda::std::int64_t elements) {
  return detail::round_up(detail::round_up(elements, 16) + elements / Compression::block * Compression::scale_bytes,
                          compressed_alignment);
}

namespace detail {
template <class Traits, class = void>
struct compression_member {
  using type = Lossless;
};
template <class Traits>
struct compression_member<Traits, cuda::std::void_t<typename Traits::compression>> {
  using type = typename Traits::compression;
};
}  // namespace detail

/// The compression of a traits type: its `compression` member, or Lossless when it has none.
template <class Traits>
using compression_of = typename detail::compression_member<Traits>::type;

PAGESTASH_NAMESPACE_END
