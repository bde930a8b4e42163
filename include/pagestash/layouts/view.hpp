#pragma once
// GroupedView<Layout>: a trivially copyable, non-owning view of one grouped tensor, passed by value to kernels. The
// counts live in device memory (host memory for the host executor) and are never read on the host by the stash.

#include <pagestash/detail/errors.hpp>
#include <pagestash/layouts/detail/layout_common.hpp>
#include <pagestash/layouts/stash_traits.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

template <class Layout>
struct GroupedView {
  using layout = Layout;
  using data_type = typename Layout::data_type;
  using scale_type = typename Layout::scale_type;

  data_type* data = nullptr;
  scale_type* scales = nullptr;                ///< unused (void*) for layouts without scales
  float* amax = nullptr;                       ///< one FP32 per group; NVFP4 only
  const cuda::std::int32_t* counts = nullptr;  ///< G live token counts
  cuda::std::int64_t max_tokens = 0;           ///< packed: rows allocated in all; capacity-padded: rows per group
  cuda::std::int64_t hidden = 0;
  cuda::std::int32_t groups = 1;

  PAGESTASH_HOST_DEVICE void* buffer(BufferRole role) const {
    return role == BufferRole::data
               ? static_cast<void*>(data)
               : (role == BufferRole::scales ? static_cast<void*>(scales) : static_cast<void*>(amax));
  }
  PAGESTASH_HOST_DEVICE BufferGeometry geometry(BufferRole role) const {
    return detail::make_geometry<Layout>(role, max_tokens, hidden, groups);
  }
  /// Size of the buffer's allocation (0 for a buffer the layout does not have). For PackedPadded scales, the most that
  /// any counts the stash accepts can fill (the counts are on the device): docs/layouts.md gives the formula.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t buffer_bytes(BufferRole role) const { return geometry(role).total_bytes; }
  /// Every count must be a multiple of this (1 if capacity-padded; see detail::count_alignment, docs/layouts.md).
  PAGESTASH_HOST_DEVICE cuda::std::int64_t count_alignment() const { return detail::count_alignment<Layout>(hidden); }
  /// The tensor's granule: the layout's and every buffer's, the largest; max_tokens must be a multiple of it
  /// (validate_shape checks it).
  PAGESTASH_HOST_DEVICE cuda::std::int64_t granule() const { return detail::granule<Layout>(hidden); }
  /// Rows of the token space: where group g's rows start in a [rows, hidden] source.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t token_rows() const {
    return Layout::placement::packed ? max_tokens : groups * max_tokens;
  }

  /// Named construction: each returns a copy with one field set, so that a view reads as what each number is
  /// (make_view<Layout>().with_max_tokens(256).with_hidden(1024)...).
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_data(data_type* p) const { return with(&GroupedView::data, p); }
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_scales(scale_type* p) const { return with(&GroupedView::scales, p); }
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_amax(float* p) const { return with(&GroupedView::amax, p); }
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_counts(const cuda::std::int32_t* p) const {
    return with(&GroupedView::counts, p);
  }
  /// Packed: rows allocated in all; capacity-padded: rows per group (the capacity).
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_max_tokens(cuda::std::int64_t n) const {
    return with(&GroupedView::max_tokens, n);
  }
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_hidden(cuda::std::int64_t n) const {
    return with(&GroupedView::hidden, n);
  }
  PAGESTASH_HOST_DEVICE constexpr GroupedView with_groups(cuda::std::int32_t n) const {
    return with(&GroupedView::groups, n);
  }

 private:
  template <class Field, class Value>
  PAGESTASH_HOST_DEVICE constexpr GroupedView with(Field GroupedView::*field, Value value) const {
    GroupedView v = *this;
    v.*field = value;
    return v;
  }
};

/// An empty view of `Layout` (no buffers, no counts, one group) to build by name:
///   const auto view = make_view<Layout>().with_max_tokens(4096).with_hidden(512)
///                         .with_data(rows).with_counts(live);
template <class Layout>
PAGESTASH_HOST_DEVICE constexpr GroupedView<Layout> make_view() {
  return GroupedView<Layout>{};
}

/// Whether a group of m tokens fits the view, `before` tokens being in the groups before it (which matter for packed
/// placement only).
template <class Layout>
PAGESTASH_HOST_DEVICE bool count_fits(const GroupedView<Layout>& v, cuda::std::int64_t before, cuda::std::int64_t m) {
  return m >= 0 && (Layout::placement::packed ? before + m : m) <= v.max_tokens && m % v.count_alignment() == 0;
}

/// Byte alignment every buffer pointer must have (16-byte vector copies).
inline constexpr std::uintptr_t buffer_alignment = 16;

namespace detail {
template <class Layout>
[[noreturn]] void refuse_view(const std::string& what) {
  throw_invalid(std::string("GroupedView<") + Layout::name + ">", what);
}
}  // namespace detail

/// Host checks of the shape: throws std::invalid_argument naming the field and its value.
template <class Layout>
void validate_shape(const GroupedView<Layout>& v) {
  if (v.groups < 1) detail::refuse_view<Layout>("groups = " + std::to_string(v.groups) + " must be at least 1");
  if (v.hidden < 1) detail::refuse_view<Layout>("hidden = " + std::to_string(v.hidden) + " must be positive");
  if (v.max_tokens < 0) detail::refuse_view<Layout>("max_tokens = " + std::to_string(v.max_tokens) + " is negative");
  if (v.hidden % Layout::hidden_multiple != 0)
    detail::refuse_view<Layout>("hidden = " + std::to_string(v.hidden) + " is not a multiple of the block size " +
                                std::to_string(Layout::hidden_multiple));
  const cuda::std::int64_t granule = v.granule();
  if (v.max_tokens % granule != 0)
    detail::refuse_view<Layout>("max_tokens = " + std::to_string(v.max_tokens) + " is not a multiple of the granule " +
                                std::to_string(granule));
  if (cuda::std::is_same_v<Layout, Plain<typename Layout::data_type>> && v.groups != 1)
    detail::refuse_view<Layout>("groups = " + std::to_string(v.groups) + ", Plain has exactly one group");
}

/// The rule of a compressed stash's shape, written once: every line of `hidden` values holds whole blocks of its
/// format (any hidden, lossless). "" when `hidden` keeps it, else what is wrong, after the value: "must be a multiple
/// of 32 (the block of compression 'mxfp8'): pad hidden to 64". validate_compression, the PyTorch ops and their
/// sizer each put it after their own name for hidden.
template <class Compression>
std::string compression_refusal(cuda::std::int64_t hidden) {
  if constexpr (Compression::compressed) {
    if (hidden % Compression::block != 0)
      return "must be a multiple of " + std::to_string(Compression::block) + " (the block of compression '" +
             Compression::name + "'): pad hidden to " +
             std::to_string((hidden / Compression::block + 1) * Compression::block);
  }
  return {};
}

/// Host check of a compressed stash's shape (compression_refusal).
template <class Traits>
void validate_compression(const GroupedView<typename Traits::layout>& v) {
  const std::string refusal = compression_refusal<compression_of<Traits>>(v.hidden);
  if (!refusal.empty())
    detail::refuse_view<typename Traits::layout>("hidden = " + std::to_string(v.hidden) + " " + refusal);
}

/// Full host check before any launch: shape, plus every buffer that Traits saves is non-null and 16-byte aligned, and
/// (when the counts are read) the counts pointer is set.
template <class Traits>
void validate(const GroupedView<typename Traits::layout>& v, bool counts_read = true) {
  static_assert(check_stash_traits<Traits>());
  using Layout = typename Traits::layout;
  validate_shape(v);
  validate_compression<Traits>(v);
  if (counts_read && v.counts == nullptr) detail::refuse_view<Layout>("counts is null");
  for_each_role([&](BufferRole role) {
    if (handling_of<Traits>(role) == Handling::dropped) return;
    const auto address = reinterpret_cast<std::uintptr_t>(v.buffer(role));
    if (address == 0) detail::refuse_view<Layout>(std::string(name_of(role)) + " is null");
    if (role != BufferRole::amax && address % buffer_alignment != 0)
      detail::refuse_view<Layout>(std::string(name_of(role)) + " = " + std::to_string(address) +
                                  " is not 16-byte aligned");
  });
}

PAGESTASH_NAMESPACE_END
