#pragma once
// RowwiseUnquantized<T, Placement>: a grouped BF16 or FP16 tensor, group rows contiguous.
//
//   data  [M, K] elements            packed: prefix T*K*2    capacity: g: [g*C*K*2, +m_g*K*2)

#include <pagestash/detail/layout_common.hpp>
#include <pagestash/formats/scalar.hpp>
#include <pagestash/layouts/placement.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class T, class Placement = Packed>
struct RowwiseUnquantized {
  static_assert(cuda::std::is_same_v<T, BF16> || cuda::std::is_same_v<T, FP16>,
                "pagestash::RowwiseUnquantized<T>: T must be pagestash::BF16 or pagestash::FP16");
  using data_type = T;
  using scale_type = void;
  using placement = Placement;
  static constexpr const char* name = "RowwiseUnquantized";
  static constexpr cuda::std::int64_t token_multiple = 1;
  static constexpr cuda::std::int64_t hidden_multiple = 1;

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) { return role == BufferRole::data; }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole, cuda::std::int64_t tokens, cuda::std::int64_t hidden) {
    return BlockShape{tokens, hidden * static_cast<cuda::std::int64_t>(sizeof(T)), TokenAxis::rows, 1, false};
  }
};

PAGESTASH_NAMESPACE_END
