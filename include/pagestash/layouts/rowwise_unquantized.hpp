#pragma once
// RowwiseUnquantized<T, Placement>: a grouped BF16 or FP16 tensor, group rows contiguous.
//
//   data  [M, K] elements            packed: prefix T*K*2    capacity: g: [g*C*K*2, +m_g*K*2)

#include <pagestash/layouts/detail/layout_common.hpp>
#include <pagestash/formats/scalar.hpp>
#include <pagestash/layouts/placement.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class T, class Placement = Packed>
struct RowwiseUnquantized : detail::UnquantizedRows<T> {
  static_assert(cuda::std::is_same_v<T, BF16> || cuda::std::is_same_v<T, FP16>,
                "pagestash::RowwiseUnquantized<T>: T must be pagestash::BF16 or pagestash::FP16");
  using placement = Placement;
  static constexpr const char* name = "RowwiseUnquantized";
};

PAGESTASH_NAMESPACE_END
