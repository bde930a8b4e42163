#pragma once
// What every layout policy shares: the geometry of a buffer from the layout's block shape,
// and the integer helpers. Not public API.

#include <pagestash/layouts/geometry.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t round_up(cuda::std::int64_t x, cuda::std::int64_t m) {
  return (x + m - 1) / m * m;
}

/// What unquantized layouts share: one data buffer of T, one element per (token, hidden).
template <class T>
struct UnquantizedRows {
  using data_type = T;
  using scale_type = void;
  static constexpr cuda::std::int64_t token_multiple = 1;   ///< max_tokens must be a multiple of this
  static constexpr cuda::std::int64_t hidden_multiple = 1;  ///< hidden must be a multiple of this

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) { return role == BufferRole::data; }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole, cuda::std::int64_t tokens, cuda::std::int64_t hidden) {
    return BlockShape{tokens, hidden * static_cast<cuda::std::int64_t>(sizeof(T)), TokenAxis::rows, 1, false};
  }
};

/// Geometry of one buffer of Layout, for the allocation shape (max_tokens, hidden, groups).
template <class Layout>
PAGESTASH_HOST_DEVICE BufferGeometry make_geometry(BufferRole role, cuda::std::int64_t max_tokens,
                                                   cuda::std::int64_t hidden, cuda::std::int32_t groups) {
  BufferGeometry g;
  g.present = Layout::has(role);
  if (!g.present) return g;
  g.groups = groups;
  g.packed = Layout::placement::packed;
  if (role == BufferRole::amax) {  // one FP32 per group, kept whole
    g.whole = true;
    g.block = BlockShape{1, 4 * static_cast<cuda::std::int64_t>(groups)};
    g.total_bytes = g.block.bytes();
    return g;
  }
  if (g.packed) {
    const cuda::std::int64_t granule = Layout::block(role, 0, hidden).granule_tokens();
    g.block = Layout::block(role, granule, hidden);
    g.total_bytes = Layout::block(role, max_tokens, hidden).bytes();
  } else {
    g.block = Layout::block(role, max_tokens, hidden);
    g.total_bytes = groups * g.block.bytes();
  }
  return g;
}

/// Largest token granule of the layout's buffers: a packed layout needs every count to be a
/// multiple of it.
template <class Layout>
PAGESTASH_HOST_DEVICE cuda::std::int64_t largest_granule(cuda::std::int64_t hidden) {
  cuda::std::int64_t largest = 1;
  for (BufferRole role : {BufferRole::data, BufferRole::scales}) {
    if (!Layout::has(role)) continue;
    const cuda::std::int64_t g = Layout::block(role, 0, hidden).granule_tokens();
    if (g > largest) largest = g;
  }
  return largest;
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
