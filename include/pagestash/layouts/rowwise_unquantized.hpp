#pragma once
// RowwiseUnquantized<T, Placement>: a grouped BF16, FP16 or FP32 tensor, group rows contiguous (s = sizeof(T); the
// geometry depends on the element size only through s).
//
//   data  [M, K] elements            packed: prefix T*K*s    capacity: g: [g*C*K*s, +m_g*K*s)

#include <pagestash/layouts/detail/layout_common.hpp>
#include <pagestash/formats/scalar.hpp>
#include <pagestash/layouts/placement.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class T, class Placement = Packed>
struct RowwiseUnquantized : detail::UnquantizedRows<T> {
  static_assert(cuda::std::is_same_v<T, BF16> || cuda::std::is_same_v<T, FP16> || cuda::std::is_same_v<T, float>,
                "pagestash::RowwiseUnquantized<T>: T must be pagestash::BF16, pagestash::FP16 or float");
  using placement = Placement;
  static constexpr detail::LayoutName name_chars =
      detail::layout_name("RowwiseUnquantized", detail::element_name<T>(), Placement::name);
  static constexpr const char* name = name_chars.chars;
};

PAGESTASH_NAMESPACE_END
