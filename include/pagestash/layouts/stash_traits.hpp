#pragma once
// StashTraits<Layout>: what a stash does with each buffer of a layout, chosen at compile time.
//
//   Handling::paged    live bytes moved into pool pages (the big buffers)
//   Handling::kept     copied whole into the stash record (small, e.g. NVFP4's per-group amax)
//   Handling::dropped  not needed in backward; neither saved nor restored
//
// Defaults follow what backward needs: the tensor for Plain, rowwise data for BF16/FP16/FP32, data + scales (+ amax
// kept) for quantized layouts. Write your own with BufferSelection<Layout, data, scales, amax, compression>, or any
// struct with the same members (`compression` optional, Lossless without it: layouts/compression.hpp); every pagestash
// entry point checks it with check_stash_traits<Traits>().

#include <pagestash/layouts/columnwise_quantized.hpp>
#include <pagestash/layouts/compression.hpp>
#include <pagestash/layouts/plain.hpp>
#include <pagestash/layouts/rowwise_quantized.hpp>
#include <pagestash/layouts/rowwise_unquantized.hpp>

PAGESTASH_NAMESPACE_BEGIN

enum class Handling : int { dropped = 0, paged = 1, kept = 2 };

namespace detail {
template <class...>
inline constexpr bool always_false = false;

template <class L, Handling Data, Handling Scales, Handling Amax, class Compression = Lossless>
constexpr bool check_selection() {
  static_assert(!Compression::compressed || compressible<L>,
                "StashTraits: a Compressed stash pages a BF16 or FP16 Plain or RowwiseUnquantized tensor only");
  static_assert(L::has(BufferRole::data) || Data == Handling::dropped,
                "StashTraits: this layout has no data buffer; set data = Handling::dropped");
  static_assert(L::has(BufferRole::scales) || Scales == Handling::dropped,
                "StashTraits: this layout has no scales buffer; set scales = Handling::dropped");
  static_assert(L::has(BufferRole::amax) || Amax == Handling::dropped,
                "StashTraits: this layout has no amax buffer; set amax = Handling::dropped");
  static_assert(Data == Handling::paged || Scales == Handling::paged,
                "StashTraits: nothing is paged; set data or scales to Handling::paged");
  static_assert(Amax != Handling::paged,
                "StashTraits: amax is a few bytes per group; use Handling::kept, not Handling::paged");
  return true;
}
}  // namespace detail

/// Checks a traits type; every static_assert says what to fix. Returns true when it compiles.
template <class Traits>
constexpr bool check_stash_traits() {
  return detail::check_selection<typename Traits::layout, Traits::data, Traits::scales, Traits::amax,
                                 compression_of<Traits>>();
}

/// A checked selection of what happens to each buffer of Layout, and how the paged bytes are kept.
template <class Layout, Handling Data, Handling Scales = Handling::dropped, Handling Amax = Handling::dropped,
          class Compression = Lossless>
struct BufferSelection {
  using layout = Layout;
  static constexpr Handling data = Data;
  static constexpr Handling scales = Scales;
  static constexpr Handling amax = Amax;
  using compression = Compression;

  static_assert(detail::check_selection<Layout, Data, Scales, Amax, Compression>());
};

/// The default traits of Layout with its data buffer paged in Format: e.g.
/// `CompressedTraits<RowwiseUnquantized<BF16, CapacityPadded>, MXFP8_E4M3>`.
template <class Layout, class Format>
using CompressedTraits =
    BufferSelection<Layout, Handling::paged, Handling::dropped, Handling::dropped, Compressed<Format>>;

/// What Traits does with one buffer.
template <class Traits>
PAGESTASH_HOST_DEVICE constexpr Handling handling_of(BufferRole role) {
  return role == BufferRole::data ? Traits::data : (role == BufferRole::scales ? Traits::scales : Traits::amax);
}

/// Default traits per layout; specialise for your own layouts.
template <class Layout>
struct StashTraits {
  static_assert(detail::always_false<Layout>,
                "pagestash::StashTraits<Layout>: no default for this layout; specialise StashTraits or use "
                "BufferSelection<Layout, data, scales, amax>");
};

template <class T>
struct StashTraits<Plain<T>> : BufferSelection<Plain<T>, Handling::paged> {};

template <class T, class P>
struct StashTraits<RowwiseUnquantized<T, P>> : BufferSelection<RowwiseUnquantized<T, P>, Handling::paged> {};

template <class F, class P, class S>
struct StashTraits<ColumnwiseQuantized<F, P, S>>
    : BufferSelection<ColumnwiseQuantized<F, P, S>, Handling::paged, Handling::paged,
                      ColumnwiseQuantized<F, P, S>::has(BufferRole::amax) ? Handling::kept : Handling::dropped> {};

template <class F, class P, class S>
struct StashTraits<RowwiseQuantized<F, P, S>>
    : BufferSelection<RowwiseQuantized<F, P, S>, Handling::paged, Handling::paged,
                      RowwiseQuantized<F, P, S>::has(BufferRole::amax) ? Handling::kept : Handling::dropped> {};

PAGESTASH_NAMESPACE_END
