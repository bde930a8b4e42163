#pragma once
// Plain<T>: one [max_tokens, hidden] tensor of T; live rows [0, n) with n on the device.
//
//   data  [max_tokens, hidden * sizeof(T)] bytes     live: prefix n * hidden * sizeof(T)

#include <pagestash/layouts/detail/layout_common.hpp>
#include <pagestash/layouts/placement.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class T>
struct Plain : detail::UnquantizedRows<T> {
  static_assert(cuda::std::is_trivially_copyable_v<T>, "pagestash::Plain<T>: T must be trivially copyable");
  using placement = Packed;  // one group: both placements coincide
  static constexpr detail::LayoutName name_chars = detail::layout_name("Plain", detail::element_name<T>());
  static constexpr const char* name = name_chars.chars;
};

PAGESTASH_NAMESPACE_END
