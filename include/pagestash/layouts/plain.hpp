#pragma once
// Plain<T>: one [max_tokens, hidden] tensor of T; live rows [0, n) with n on the device.
//
//   data  [max_tokens, hidden * sizeof(T)] bytes     live: prefix n * hidden * sizeof(T)

#include <pagestash/detail/layout_common.hpp>
#include <pagestash/layouts/placement.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

template <class T>
struct Plain {
  static_assert(cuda::std::is_trivially_copyable_v<T>, "pagestash::Plain<T>: T must be trivially copyable");
  using data_type = T;
  using scale_type = void;
  using placement = Packed;  // one group: both placements coincide
  static constexpr const char* name = "Plain";
  /// max_tokens must be a multiple of this.
  static constexpr cuda::std::int64_t token_multiple = 1;
  /// The block size `hidden` must be a multiple of (1: any).
  static constexpr cuda::std::int64_t hidden_multiple = 1;

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) { return role == BufferRole::data; }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole, cuda::std::int64_t tokens, cuda::std::int64_t hidden) {
    return BlockShape{tokens, hidden * static_cast<cuda::std::int64_t>(sizeof(T)), TokenAxis::rows, 1, false};
  }
};

PAGESTASH_NAMESPACE_END
