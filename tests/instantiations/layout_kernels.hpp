#pragma once
// Host entry points of the layout kernels in layout_kernels.cu (callable from g++ code).

#include <pagestash/layouts/layouts.hpp>
#include <pagestash/reference/reference.hpp>

namespace pagestash_test {

/// pagestash::produce_on_device on the default stream, then a synchronisation; returns the
/// producer's count check (Flag::none: counts valid).
template <class Layout>
pagestash::Flag produce_on_device_sync(const pagestash::GroupedView<Layout>& view, const pagestash::BF16* source,
                                       std::uint8_t poison);

}  // namespace pagestash_test
