#pragma once
// A stash warp's look-ahead: before its launch's verdict, a warp plans from the view's counts where its first claim's
// bytes are and prefetches them into L2, so that they come from memory while the owner decides, and the warp's first
// loads after the verdict find them there (docs/design.md, "Look-ahead"). The warp runs the owner's plan
// (plan_work_on_team) on its lanes, over counts copied into its stage; it writes nothing but its stage, and what it
// finds is a hint: the tiles are copied from the owner's plan, whatever the counts were when the warp read them. Every
// range it prefetches is inside the view's buffers (bad counts plan bytes outside: it skips those).

#include <pagestash/stash/copy.hpp>
#include <pagestash/stash/work.hpp>

PAGESTASH_NAMESPACE_BEGIN

namespace detail {
/// What a look-ahead's lanes hand to lane 0 in the warp's stage, before the counts: the item of the claim's first tile
/// (a zero item's grid while none is found) and the claim's tiles in it. Through shared memory, not registers: the
/// plan's loop and the span's arithmetic never hold their values at once.
struct alignas(16) AheadSlot {
  WorkItem item;
  cuda::std::int64_t tiles;
};
}  // namespace detail

/// Whether a warp looks ahead on a stash of view `v`: its counts fit the warp's stage (beside what its lanes hand on),
/// and its items are few enough (StashPolicy::look_ahead_items) for the warp to have planned them before the owner's
/// verdict. Not a compressed stash's: its tiles are of codes (stash/compress.hpp), and its codec leaves no registers to
/// spare.
template <class Traits>
PAGESTASH_HOST_DEVICE bool looks_ahead(const GroupedView<typename Traits::layout>& v) {
  if constexpr (compression_of<Traits>::compressed) return false;
  constexpr auto most_groups = static_cast<cuda::std::int32_t>((StashPolicy::stage_bytes - sizeof(detail::AheadSlot)) /
                                                               sizeof(cuda::std::int32_t));
  const cuda::std::int32_t items =
      detail::paged_segments<Traits>(v, BufferRole::data) + detail::paged_segments<Traits>(v, BufferRole::scales);
  return v.groups <= most_groups && items <= StashPolicy::look_ahead_items;
}

namespace detail {

/// x as a value of the look-ahead's own: on the device each of its words passes an empty asm, so that the compiler
/// shares nothing the look-ahead computes from it with the launch's later code, which would then hold it in registers
/// from the look-ahead through the copy loop (without it, stash kernels of sm_90 spilled there: check_kernels.py).
template <class T>
PAGESTASH_HOST_DEVICE T own_copy(T x) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(T) % 4 == 0 && alignof(T) >= 4);
  cuda::std::uint32_t w[sizeof(T) / 4];
  memcpy(w, &x, sizeof(T));
  PAGESTASH_UNROLL
  for (unsigned k = 0; k < sizeof(T) / 4; ++k) asm volatile("" : "+r"(w[k]));
  memcpy(&x, w, sizeof(T));
#endif
  return x;
}

/// Prefetches [lo, hi) into L2, widened to 16 bytes and kept in [first, end) (first on 16 bytes): the whole bytes of
/// the range's sectors a bulk prefetch may name, none outside the allocation.
PAGESTASH_HOST_DEVICE inline void prefetch_range(const unsigned char* lo, const unsigned char* hi,
                                                 const unsigned char* first, const unsigned char* end) {
  if (lo < first || hi > end || lo >= hi) return;
  const auto base = reinterpret_cast<cuda::std::uintptr_t>(first);
  const cuda::std::uintptr_t a = (reinterpret_cast<cuda::std::uintptr_t>(lo) - base) & ~cuda::std::uintptr_t{15};
  cuda::std::uintptr_t e = (reinterpret_cast<cuda::std::uintptr_t>(hi) - base + 15) & ~cuda::std::uintptr_t{15};
  const cuda::std::uintptr_t size = static_cast<cuda::std::uintptr_t>(end - first);
  if (e > size) e = size & ~cuda::std::uintptr_t{15};
  if (e > a) prefetch_to_l2(first + a, static_cast<cuda::std::uint32_t>(e - a));
}

}  // namespace detail

/// A stash warp's look-ahead, its first half: the view's counts into the warp's stage, one round, by every lane of the
/// warp, on a view that looks_ahead (while its block's leader arrives: the round is the arrival's).
template <class Traits, class Lanes>
PAGESTASH_HOST_DEVICE void stage_counts(const Lanes& lanes, const GroupedView<typename Traits::layout>& v) {
  auto* counts = reinterpret_cast<cuda::std::int32_t*>(detail::stage_of(lanes) + sizeof(detail::AheadSlot));
  const detail::OneRound together;
  for (cuda::std::int32_t g = lanes.rank(); g < v.groups; g += lanes.size()) {
    detail::note_load(v.counts + g);
    counts[g] = v.counts[g];
  }
}

/// Its second half, once the block joined its launch: the plan over those counts, by every lane of the warp, finds the
/// item of the claim's first tile (tiles [claim_begin, claim_end)), and lane 0 prefetches the claim's first span in
/// the buffer. After the arrival, where the block joined: the owner's warps have the plan itself to make, and their
/// verdict is on every block's path.
template <class Traits, class Lanes>
PAGESTASH_HOST_DEVICE void look_ahead(const Lanes& lanes, const PoolRef& pool,
                                      const GroupedView<typename Traits::layout>& view, int shift,
                                      cuda::std::int64_t claim_begin, cuda::std::int64_t claim_end) {
  const GroupedView<typename Traits::layout> v = detail::own_copy(view);
  const int tile_shift = detail::own_copy(shift);
  const cuda::std::int64_t tile = detail::own_copy(claim_begin), until = detail::own_copy(claim_end);
  unsigned char* stage = detail::stage_of(lanes);
  auto& ahead = *reinterpret_cast<detail::AheadSlot*>(stage);
  auto* counts = reinterpret_cast<cuda::std::int32_t*>(stage + sizeof(detail::AheadSlot));
  if (lanes.rank() == 0) ahead.item.grid = -1;
  lanes.sync_lanes();
  // A negative count (the owner's check refuses it) plans bytes below zero: nothing to look ahead for.
  cuda::std::uint32_t negative[1] = {0};
  for (cuda::std::int32_t g = lanes.rank(); g < v.groups; g += lanes.size()) negative[0] |= counts[g] < 0 ? 1u : 0u;
  lanes.max_over(negative, lanes.size());
  if (negative[0] != 0) return;
  plan_work_on_team<Traits>(lanes, v, SegmentsAt{counts, false}, false, tile_shift,
                            [&](cuda::std::int32_t, const WorkItem& item, cuda::std::int64_t tiles) {
                              const cuda::std::int64_t end = item.first_tile + tiles;
                              if (item.grid < 0 || tile < item.first_tile || tile >= end) return;  // not its item
                              ahead.item = item;
                              ahead.tiles = (until < end ? until : end) - tile;
                            });
  lanes.sync_lanes();
  if (lanes.rank() == 0 && ahead.item.grid >= 0 && ahead.tiles > 0) {
    TileWork w{};
    w.data = static_cast<unsigned char*>(v.buffer(BufferRole::data));
    w.scales = static_cast<unsigned char*>(v.buffer(BufferRole::scales));
    w.pool = pool;
    w.tile_shift = tile_shift;
    const WorkItem item = ahead.item;
    cuda::std::int64_t stream = 0;
    const TileSpan s = detail::span_of(w, item, item.grid, tile - item.first_tile, ahead.tiles, stream);
    // The span's bytes in the buffer, from its head to its last byte (the dead rest of its lines too: one instruction,
    // where a span of short lines would take one a line), at most two tiles' worth.
    const unsigned char* first = w.buffer(item.role);
    const unsigned char* end = detail::locate(s, s.bytes - 1).at + 1;
    const cuda::std::int64_t most = cuda::std::int64_t{2} << tile_shift;
    if (end - s.head > most) end = s.head + most;
    // Each role a constant: a view's geometry indexed at run time would be a struct in local memory.
    const cuda::std::int64_t bytes =
        item.role == BufferRole::data ? v.buffer_bytes(BufferRole::data) : v.buffer_bytes(BufferRole::scales);
    detail::prefetch_range(s.head, end, first, first + bytes);
  }
  lanes.sync_lanes();  // the stage is the movers' again
}

PAGESTASH_NAMESPACE_END
