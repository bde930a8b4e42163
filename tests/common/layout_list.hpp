#pragma once
// Every layout the tests and the kernel instantiations cover: every recipe of
// pagestash/layouts/recipes.hpp, then the layouts only the tests use (Plain of other types,
// the rowwise-quantized layouts). X((layout)) is called once per layout: PAGESTASH_LAYOUT(L)
// is its type.

#include <pagestash/layouts/recipes.hpp>

#define PAGESTASH_TEST_ROWWISE_QUANTIZED(X, Format)                                              \
  X((pagestash::RowwiseQuantized<Format, pagestash::Packed, pagestash::SwizzledScales>))         \
  X((pagestash::RowwiseQuantized<Format, pagestash::Packed, pagestash::CompactScales>))          \
  X((pagestash::RowwiseQuantized<Format, pagestash::PackedPadded, pagestash::SwizzledScales>))   \
  X((pagestash::RowwiseQuantized<Format, pagestash::PackedPadded, pagestash::CompactScales>))    \
  X((pagestash::RowwiseQuantized<Format, pagestash::CapacityPadded, pagestash::SwizzledScales>)) \
  X((pagestash::RowwiseQuantized<Format, pagestash::CapacityPadded, pagestash::CompactScales>))
/// The layouts only the tests use.
#define PAGESTASH_TEST_PLAIN_LAYOUTS(X) X((pagestash::Plain<float>)) X((pagestash::Plain<pagestash::BF16>))
#define PAGESTASH_TEST_ROWWISE_QUANTIZED_LAYOUTS(X)          \
  PAGESTASH_TEST_ROWWISE_QUANTIZED(X, pagestash::MXFP8_E4M3) \
  PAGESTASH_TEST_ROWWISE_QUANTIZED(X, pagestash::MXFP8_E5M2) PAGESTASH_TEST_ROWWISE_QUANTIZED(X, pagestash::NVFP4)
#ifndef PAGESTASH_TEST_FEW_LAYOUTS
#  define PAGESTASH_TEST_FOR_EACH_LAYOUT(X) \
    PAGESTASH_FOR_EACH_RECIPE(X) PAGESTASH_TEST_PLAIN_LAYOUTS(X) PAGESTASH_TEST_ROWWISE_QUANTIZED_LAYOUTS(X)
#else
// One layout of each family, the partial-word ends among them (-DPAGESTASH_TEST_FEW_LAYOUTS):
// scripts/test's ThreadSanitizer build, whose races are the pool's and the launch protocol's,
// alike in every layout, and its quick loop. The compressed and non-default lists below
// shrink with it.
#  define PAGESTASH_TEST_FOR_EACH_LAYOUT(X)    \
    X((pagestash_test::layouts::Pbf16))        \
    X((pagestash_test::layouts::RuBf16))       \
    X((pagestash_test::layouts::RuFp16Cap))    \
    X((pagestash_test::layouts::ColNv4PackSw)) \
    X((pagestash_test::layouts::ColMx4CapSw))  \
    X((pagestash_test::layouts::RowMx4PadCo))
#endif

namespace pagestash_test::layouts {
namespace ps = pagestash;
#define PAGESTASH_TEST_COUNT_LAYOUT(L) +1
/// How many layouts PAGESTASH_TEST_FOR_EACH_LAYOUT names (the tests that count per layout).
inline constexpr int layout_count = 0 PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_TEST_COUNT_LAYOUT);
/// One layout of each family only (-DPAGESTASH_TEST_FEW_LAYOUTS: scripts/test's ThreadSanitizer step and quick loop).
#ifdef PAGESTASH_TEST_FEW_LAYOUTS
inline constexpr bool few_layouts = true;
#else
inline constexpr bool few_layouts = false;
#endif
#undef PAGESTASH_TEST_COUNT_LAYOUT

// Short names of the layouts single tests use.
using Pf32 = ps::Plain<float>;
using Pbf16 = ps::Plain<ps::BF16>;
using RuBf16 = ps::RowwiseUnquantized<ps::BF16, ps::Packed>;
using RuBf16Cap = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
using RuFp16 = ps::RowwiseUnquantized<ps::FP16, ps::Packed>;
using RuFp16Cap = ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>;
using ColMx4CapSw = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::SwizzledScales>;
using ColNv4PackSw = ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::SwizzledScales>;
using ColNv4PackCo = ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::CompactScales>;
using ColNv4PadSw = ps::ColumnwiseQuantized<ps::NVFP4, ps::PackedPadded, ps::SwizzledScales>;
using ColNv4CapSw = ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>;
using ColNv4CapCo = ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>;
using RowMx4PackSw = ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::SwizzledScales>;
using RowMx4PackCo = ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::CompactScales>;
using RowMx4PadCo = ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::PackedPadded, ps::CompactScales>;
using RowNv4CapSw = ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>;
}  // namespace pagestash_test::layouts

namespace pagestash_test {
namespace ps = pagestash;
/// The non-default StashTraits the tests use (each also instantiated for the device).
namespace traits {
using DataOnly =
    ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>, ps::Handling::paged>;
using ScalesOnly = ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::SwizzledScales>,
                                       ps::Handling::dropped, ps::Handling::paged, ps::Handling::kept>;
using NoAmax = ps::BufferSelection<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>,
                                   ps::Handling::paged, ps::Handling::paged, ps::Handling::dropped>;
using MxScales = ps::BufferSelection<ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::CompactScales>,
                                     ps::Handling::dropped, ps::Handling::paged>;
/// Compressed stashes (layouts/compression.hpp): every format, each 16-bit type and placement once.
using Bf16Mx4 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::MXFP8_E4M3>;
using Bf16Mx5 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::MXFP8_E5M2>;
using Bf16B128 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::FP8Block128>;
using Fp16CapMx4 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>, ps::MXFP8_E4M3>;
using Fp16CapMx5 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>, ps::MXFP8_E5M2>;
using Fp16CapB128 = ps::CompressedTraits<ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>, ps::FP8Block128>;
}  // namespace traits
}  // namespace pagestash_test

#ifndef PAGESTASH_TEST_FEW_LAYOUTS
#  define PAGESTASH_TEST_FOR_EACH_COMPRESSED_TRAITS(X) \
    X(pagestash_test::traits::Bf16Mx4)                 \
    X(pagestash_test::traits::Bf16Mx5)                 \
    X(pagestash_test::traits::Bf16B128)                \
    X(pagestash_test::traits::Fp16CapMx4) X(pagestash_test::traits::Fp16CapMx5) X(pagestash_test::traits::Fp16CapB128)
#else
#  define PAGESTASH_TEST_FOR_EACH_COMPRESSED_TRAITS(X) \
    X(pagestash_test::traits::Bf16Mx4) X(pagestash_test::traits::Fp16CapB128)
#endif

/// Every compressed stash the host tests cover: each 16-bit layout (Plain and RowwiseUnquantized, every placement)
/// with each format. X((traits)) is called once for each: PAGESTASH_LAYOUT(T) is its type.
#define PAGESTASH_TEST_COMPRESSED_LAYOUT(X, L)               \
  X((pagestash::CompressedTraits<L, pagestash::MXFP8_E4M3>)) \
  X((pagestash::CompressedTraits<L, pagestash::MXFP8_E5M2>)) X((pagestash::CompressedTraits<L, pagestash::FP8Block128>))
#ifndef PAGESTASH_TEST_FEW_LAYOUTS
#  define PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(X)                      \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::Pbf16)     \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::RuBf16)    \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::RuBf16Cap) \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::RuFp16)    \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::RuFp16Cap)
#else
#  define PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(X) \
    PAGESTASH_TEST_COMPRESSED_LAYOUT(X, pagestash_test::layouts::RuFp16Cap)
#endif

/// The buffer selections above (BufferSelection: some buffers not paged).
#ifndef PAGESTASH_TEST_FEW_LAYOUTS
#  define PAGESTASH_TEST_FOR_EACH_SELECTION_TRAITS(X) \
    X(pagestash_test::traits::DataOnly)               \
    X(pagestash_test::traits::ScalesOnly) X(pagestash_test::traits::NoAmax) X(pagestash_test::traits::MxScales)
#else
#  define PAGESTASH_TEST_FOR_EACH_SELECTION_TRAITS(X) X(pagestash_test::traits::ScalesOnly)
#endif

/// The non-default StashTraits above (the kernels are instantiated for these and for the
/// default one of every layout).
#define PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(X) \
  PAGESTASH_TEST_FOR_EACH_SELECTION_TRAITS(X) PAGESTASH_TEST_FOR_EACH_COMPRESSED_TRAITS(X)
