#pragma once
// Every layout configuration the tests and the kernel instantiations cover: each dtype x
// layout x placement x scale arrangement (PackedPadded only where it differs from Packed:
// layouts with scales). X(name) is called once per alias.

#include <pagestash/layouts/layouts.hpp>

namespace pagestash_test::layouts {
namespace ps = pagestash;
using Pf32 = ps::Plain<float>;
using Pbf16 = ps::Plain<ps::BF16>;
using RuBf16 = ps::RowwiseUnquantized<ps::BF16, ps::Packed>;
using RuFp16 = ps::RowwiseUnquantized<ps::FP16, ps::Packed>;
using RuBf16Cap = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
using RuFp16Cap = ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>;
using RuF32 = ps::RowwiseUnquantized<float, ps::Packed>;
using RuF32Cap = ps::RowwiseUnquantized<float, ps::CapacityPadded>;
#define PAGESTASH_QUANTIZED_ALIASES(Prefix, Layout)                                       \
  using Prefix##Mx4PackSw = ps::Layout<ps::MXFP8_E4M3, ps::Packed, ps::SwizzledScales>;         \
  using Prefix##Mx4PackCo = ps::Layout<ps::MXFP8_E4M3, ps::Packed, ps::CompactScales>;          \
  using Prefix##Mx4PadSw = ps::Layout<ps::MXFP8_E4M3, ps::PackedPadded, ps::SwizzledScales>;   \
  using Prefix##Mx4PadCo = ps::Layout<ps::MXFP8_E4M3, ps::PackedPadded, ps::CompactScales>;    \
  using Prefix##Mx4CapSw = ps::Layout<ps::MXFP8_E4M3, ps::CapacityPadded, ps::SwizzledScales>;  \
  using Prefix##Mx4CapCo = ps::Layout<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>;   \
  using Prefix##Mx5PackSw = ps::Layout<ps::MXFP8_E5M2, ps::Packed, ps::SwizzledScales>;         \
  using Prefix##Mx5PackCo = ps::Layout<ps::MXFP8_E5M2, ps::Packed, ps::CompactScales>;          \
  using Prefix##Mx5PadSw = ps::Layout<ps::MXFP8_E5M2, ps::PackedPadded, ps::SwizzledScales>;   \
  using Prefix##Mx5PadCo = ps::Layout<ps::MXFP8_E5M2, ps::PackedPadded, ps::CompactScales>;    \
  using Prefix##Mx5CapSw = ps::Layout<ps::MXFP8_E5M2, ps::CapacityPadded, ps::SwizzledScales>;  \
  using Prefix##Mx5CapCo = ps::Layout<ps::MXFP8_E5M2, ps::CapacityPadded, ps::CompactScales>;   \
  using Prefix##Nv4PackSw = ps::Layout<ps::NVFP4, ps::Packed, ps::SwizzledScales>;              \
  using Prefix##Nv4PackCo = ps::Layout<ps::NVFP4, ps::Packed, ps::CompactScales>;               \
  using Prefix##Nv4PadSw = ps::Layout<ps::NVFP4, ps::PackedPadded, ps::SwizzledScales>;         \
  using Prefix##Nv4PadCo = ps::Layout<ps::NVFP4, ps::PackedPadded, ps::CompactScales>;          \
  using Prefix##Nv4CapSw = ps::Layout<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>;       \
  using Prefix##Nv4CapCo = ps::Layout<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>;
PAGESTASH_QUANTIZED_ALIASES(Col, ColumnwiseQuantized)
PAGESTASH_QUANTIZED_ALIASES(Row, RowwiseQuantized)
#undef PAGESTASH_QUANTIZED_ALIASES
}  // namespace pagestash_test::layouts

#define PAGESTASH_TEST_QUANTIZED(X, Prefix)                                                             \
  X(Prefix##Mx4PackSw) X(Prefix##Mx4PackCo) X(Prefix##Mx4PadSw) X(Prefix##Mx4PadCo) X(Prefix##Mx4CapSw)         \
  X(Prefix##Mx4CapCo) X(Prefix##Mx5PackSw) X(Prefix##Mx5PackCo) X(Prefix##Mx5PadSw) X(Prefix##Mx5PadCo)        \
  X(Prefix##Mx5CapSw) X(Prefix##Mx5CapCo) X(Prefix##Nv4PackSw) X(Prefix##Nv4PackCo) X(Prefix##Nv4PadSw)        \
  X(Prefix##Nv4PadCo) X(Prefix##Nv4CapSw) X(Prefix##Nv4CapCo)
#define PAGESTASH_TEST_FOR_EACH_LAYOUT(X)                                                \
  X(Pf32) X(Pbf16) X(RuBf16) X(RuFp16) X(RuBf16Cap) X(RuFp16Cap) X(RuF32) X(RuF32Cap) \
  PAGESTASH_TEST_QUANTIZED(X, Col) PAGESTASH_TEST_QUANTIZED(X, Row)

namespace pagestash_test::layouts {
#define PAGESTASH_TEST_COUNT_LAYOUT(L) +1
/// How many layouts PAGESTASH_TEST_FOR_EACH_LAYOUT names (the tests that count per layout).
inline constexpr int layout_count = 0 PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_TEST_COUNT_LAYOUT);
#undef PAGESTASH_TEST_COUNT_LAYOUT
}  // namespace pagestash_test::layouts

namespace pagestash_test {
namespace ps = pagestash;
/// The non-default StashTraits the tests use (each also instantiated for the device).
namespace traits {
using DataOnly = ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>,
                                     ps::Handling::paged>;
using ScalesOnly = ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::SwizzledScales>,
                                       ps::Handling::dropped, ps::Handling::paged, ps::Handling::kept>;
using NoAmax = ps::BufferSelection<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>,
                                   ps::Handling::paged, ps::Handling::paged, ps::Handling::dropped>;
using MxScales = ps::BufferSelection<ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::CompactScales>,
                                     ps::Handling::dropped, ps::Handling::paged>;
}  // namespace traits
}  // namespace pagestash_test

/// The non-default StashTraits above (the kernels are instantiated for these and for the
/// default one of every layout).
#define PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(X)                                                   \
  X(pagestash_test::traits::DataOnly) X(pagestash_test::traits::ScalesOnly) X(pagestash_test::traits::NoAmax) \
  X(pagestash_test::traits::MxScales)
