#pragma once
// What every layout policy shares: the geometry of a buffer from the layout's block shape. Not public API.

#include <pagestash/detail/math.hpp>
#include <pagestash/layouts/geometry.hpp>

#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// A layout's name, `kind<part, ...>`, joined at compile time from its tags' names.
struct LayoutName {
  char chars[64] = {};
  int size = 0;  // past 63 characters: not a constant expression
  constexpr LayoutName& operator<<(const char* s) {
    while (*s != '\0') chars[size++] = *s++;
    return *this;
  }
};
template <class... Parts>
constexpr LayoutName layout_name(const char* kind, const char* first, Parts... rest) {
  LayoutName n;
  n << kind << "<" << first;
  ((n << ", " << rest), ...);
  return n << ">";
}

/// The name of an element type: its own `name` (BF16, FP16), or fp32, uint8.
template <class T>
constexpr const char* element_name() {
  if constexpr (cuda::std::is_same_v<T, float>) return "fp32";
  else if constexpr (cuda::std::is_same_v<T, cuda::std::uint8_t>) return "uint8";
  else return T::name;
}

/// What unquantized layouts share: one data buffer of T, one element per (token, hidden).
template <class T>
struct UnquantizedRows {
  using data_type = T;
  using scale_type = void;
  static constexpr cuda::std::int64_t granule = 1;                 ///< the layout's least granule (tokens)
  static constexpr cuda::std::int64_t hidden_multiple = 1;         ///< hidden must be a multiple of this
  static constexpr cuda::std::int64_t packed_count_alignment = 1;  ///< Packed: every count a multiple of this

  PAGESTASH_HOST_DEVICE static constexpr bool has(BufferRole role) { return role == BufferRole::data; }

  PAGESTASH_HOST_DEVICE static BlockShape block(BufferRole, cuda::std::int64_t tokens, cuda::std::int64_t hidden) {
    return BlockShape{tokens, hidden * static_cast<cuda::std::int64_t>(sizeof(T)), TokenAxis::rows, 1, false};
  }
};

/// A tensor's granule: the largest of Layout::granule and every buffer's (max_tokens must be a multiple of it).
template <class Layout>
PAGESTASH_HOST_DEVICE cuda::std::int64_t granule(cuda::std::int64_t hidden) {
  cuda::std::int64_t largest = Layout::granule;
  for_each_token_role([&](BufferRole role) {
    if (!Layout::has(role)) return;
    const cuda::std::int64_t g = Layout::block(role, 0, hidden).granule();
    if (g > largest) largest = g;
  });
  return largest;
}

/// Layout::packed_count_alignment, or 1 for a layout that does not say (custom layouts).
template <class Layout, class = void>
inline constexpr cuda::std::int64_t packed_count_alignment_of = 1;
template <class Layout>
inline constexpr cuda::std::int64_t
    packed_count_alignment_of<Layout, cuda::std::void_t<decltype(Layout::packed_count_alignment)>> =
        Layout::packed_count_alignment;

/// What every count must be a multiple of:
///   CapacityPadded  1 (partial granules are live as a whole)
///   Packed          whole granules of every buffer, and the layout's packed_count_alignment
///                   (128 for quantized layouts: TE's device grouped kernels require it)
///   PackedPadded    the tokens one index of every buffer covers (the quantization block
///                   along tokens: 32 MXFP8 and 16 NVFP4 columnwise, 1 rowwise)
template <class Layout>
PAGESTASH_HOST_DEVICE cuda::std::int64_t count_alignment(cuda::std::int64_t hidden) {
  using P = typename Layout::placement;
  if (!P::packed) return 1;
  cuda::std::int64_t a = P::pads_group_scales ? 1 : packed_count_alignment_of<Layout>;
  for_each_token_role([&](BufferRole role) {
    if (!Layout::has(role)) return;
    const BlockShape b = Layout::block(role, 0, hidden);
    const cuda::std::int64_t need = P::pads_group_scales ? b.tokens_per_index : b.granule();
    if (need > a) a = need;
  });
  return a;
}

/// Most tokens that groups padded to `pad` can occupy when G counts, multiples of `alignment` (which divides pad), sum
/// to at most M. Every group with a partial pad costs at least `alignment` tokens and adds one pad; fill k = min(G, M /
/// alignment) such groups, the rest of the tokens in whole pads: pad * (k + (M - k * alignment) / pad).
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t most_padded_tokens(cuda::std::int64_t M, cuda::std::int32_t G,
                                                                   cuda::std::int64_t alignment,
                                                                   cuda::std::int64_t pad) {
  if (pad <= alignment) return M;
  const cuda::std::int64_t k = G < M / alignment ? G : M / alignment;
  return pad * (k + (M - k * alignment) / pad);
}

/// Geometry of one buffer of Layout, for the allocation shape (max_tokens, hidden, groups).
template <class Layout>
PAGESTASH_HOST_DEVICE BufferGeometry make_geometry(BufferRole role, cuda::std::int64_t max_tokens,
                                                   cuda::std::int64_t hidden, cuda::std::int32_t groups) {
  using P = typename Layout::placement;
  BufferGeometry g;
  g.present = Layout::has(role);
  if (!g.present) return g;
  g.groups = groups;
  g.packed = P::packed;
  if (role == BufferRole::amax) {  // one FP32 per group, kept whole
    g.whole = true;
    g.block = BlockShape{1, 4 * static_cast<cuda::std::int64_t>(groups)};
    g.total_bytes = g.block.bytes();
    return g;
  }
  if (!g.packed) {
    g.block = Layout::block(role, max_tokens, hidden);
    g.total_bytes = groups * g.block.bytes();
    return g;
  }
  const BlockShape shape = Layout::block(role, 0, hidden);
  g.block = Layout::block(role, shape.granule(), hidden);
  if (P::pads_group_scales && role == BufferRole::scales) g.pad_tokens = shape.swizzle_tokens();
  // The allocation holds the most that any counts the stash accepts can fill.
  g.total_bytes = g.group_bytes(most_padded_tokens(max_tokens, groups, count_alignment<Layout>(hidden), g.pad_tokens));
  return g;
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
