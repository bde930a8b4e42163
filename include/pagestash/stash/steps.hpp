#pragma once
// The steps of stash, reload and discard, written once for any team (detail/team.hpp). An executor runs `begin_*` on
// one team, then every tile of the plan (stash/copy.hpp), then `end_reload`; the host executor does this on one CPU
// thread, the CUDA executor inside one kernel launch. A step that cannot do its work records why in the record and, for
// stash and reload (discard: only for another pool's record), raises a pool flag: `overflow` when the pool had no room,
// `error` (and the kind's flag) for misuse. Either way the step's results cannot be trusted and the caller reruns it
// (pool/flags.hpp, docs/api.md "Failures").

#include <pagestash/stash/compress.hpp>
#include <pagestash/stash/record.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// Copies the buffers Traits keeps whole (e.g. NVFP4 amax) into the record, or back.
template <class Traits, class Team>
PAGESTASH_HOST_DEVICE void copy_kept(const Team& team, const GroupedView<typename Traits::layout>& v,
                                     const RecordRef& rec, bool to_record) {
  unsigned char* kept = rec.kept;
  for_each_role([&](BufferRole role) {
    if (handling_of<Traits>(role) != Handling::kept) return;
    auto* buf = static_cast<unsigned char*>(v.buffer(role));
    const cuda::std::int64_t n = v.buffer_bytes(role);
    for (cuda::std::int64_t i = team.rank(); i < n; i += team.size()) {
      if (to_record) kept[i] = buf[i];
      else buf[i] = kept[i];
    }
    kept += round_up(n, 16);
  });
}

/// Fills the buffers Traits pages or keeps with poison, every byte 0xFF: NaN in BF16, FP16,
/// FP32, FP8 and E8M0, and in NVFP4's E4M3 scales and FP32 amax (its E2M1 data has no NaN).
/// Thread i of n takes the 16-byte pieces i, i + n, ... of each buffer (amax may be unaligned).
template <class Traits>
PAGESTASH_HOST_DEVICE void poison_buffers(const GroupedView<typename Traits::layout>& v, cuda::std::int64_t i,
                                          cuda::std::int64_t n) {
  for_each_role([&](BufferRole role) {
    if (handling_of<Traits>(role) == Handling::dropped) return;
    auto* buf = static_cast<unsigned char*>(v.buffer(role));
    const cuda::std::int64_t bytes = v.buffer_bytes(role);
    for (cuda::std::int64_t q = 16 * i; q < bytes; q += 16 * n)
      store_bytes(buf + q, Vector16{{~0u, ~0u, ~0u, ~0u}}, bytes - q < 16 ? static_cast<unsigned>(bytes - q) : 16u);
  });
}

/// Whether the record holds pages of the pool's current generation.
PAGESTASH_HOST_DEVICE inline Flag check_holds_pages(const PoolRef& pool, const RecordHeader& h) {
  if (h.summary.state != RecordState::stashed) return Flag::not_stashed;
  const cuda::std::int32_t generation =
      device_atomic<cuda::std::int32_t>(pool.state->counters.generation).load(cuda::std::memory_order_relaxed);
  return h.summary.generation == generation ? Flag::none : Flag::stale;
}

/// Whether the record was made for another pool (its memory attached to this one's): its
/// page ids, counts and plan are not this pool's. Every step checks it first, on the leader,
/// before it trusts or writes anything else of the record, the pool or the pages (a stash and a discard read the
/// record's state, and a discard its kind, and take the pool's lock in the same round, and let go of both when they
/// refuse).
PAGESTASH_HOST_DEVICE inline bool is_foreign(const PoolRef& pool, const RecordHeader& h) {
  note_load(&h.pool_id);  // with the pool's id: one round trip
  return h.pool_id != pool.state->id;
}

/// Whether the record was made for another kind than `kind` (the operation's: its traits' hash, a constant of the
/// kernel, and its view's shape; a reload may write into a taller destination): read as what it is not, its parts are
/// elsewhere. Reloads and discards check it right after is_foreign, before anything else of the record is read or
/// written. A stash does not compare (every form of the check cost some stash kernel, at 64 registers on sm_100, a
/// spilled register) but writes its own kind, with what it stashes: the record is of a piece, and a reload as its
/// earlier kind is refused. The host checks a host record's kind before a stash (check_stash), and a stash's writes
/// stay in memory of its own size (Python's ops attach a stash only to that).
PAGESTASH_HOST_DEVICE inline bool is_other_kind(const RecordHeader& h, const RecordKind& kind, bool taller_ok = false) {
  const RecordKind& made = h.made_for;
  note_load(&made);
  const bool tokens = taller_ok ? made.max_tokens <= kind.max_tokens : made.max_tokens == kind.max_tokens;
  return made.traits != kind.traits || !tokens || made.hidden != kind.hidden || made.groups != kind.groups;
}

/// The leader refuses the operation as misuse: the record says why, the pool raises its kind.
PAGESTASH_HOST_DEVICE inline void refuse(const PoolRef& pool, RecordHeader& h, Flag error) {
  h.summary.error = error;
  raise_error(pool, error);
}

/// What the tiles of a plan need of the record's header (begin_* writes it; a block reads it, plan_size, once it has
/// the verdict).
struct PlanSize {
  cuda::std::int64_t tiles;
  cuda::std::int32_t items;
  cuda::std::int32_t tile_shift;
};

PAGESTASH_HOST_DEVICE inline PlanSize plan_size(const RecordHeader& h) {
  note_load(&h);  // one line, one round trip
  return PlanSize{h.tiles, h.items, h.tile_shift};
}

/// What begin_stash and begin_reload decide: whether the tiles are to be copied, and the plan's size (the verdict's).
struct Begun {
  PlanSize plan;
  bool copy;
};

/// Stash, first step: snapshot the counts, check them, plan, take pages (the pool's lock held from the record's checks
/// on), keep the small buffers. Returns whether the tiles are to be copied, and the plan. The team's writes are handed
/// on by its next barrier (the caller's publish()).
template <class Traits, class Team>
PAGESTASH_HOST_DEVICE Begun begin_stash(const Team& team, const PoolRef& pool,
                                        const GroupedView<typename Traits::layout>& v, const RecordRef& rec,
                                        int tile_shift) {
  RecordHeader& h = *rec.header;
  Flag refused = Flag::none;  // another pool's record, or one that would lose its pages
  if (team.leader()) {
    bool foreign = false;
    Flag holds = Flag::none;
    {
      // The record's checks and the pool's lock, held through the count check and the plan to the page take: one
      // round where a lock taken after the plan is one more on the way to the verdict.
      const OneRound together;
      foreign = is_foreign(pool, h);
      holds = check_holds_pages(pool, h);
      acquire_pool_lock(pool);
    }
    if (foreign) refused = Flag::foreign_record;
    else if (holds == Flag::none) refused = Flag::still_stashed;
    if (refused != Flag::none) refuse(pool, h, refused);
    else h.made_for = record_kind<Traits>(v);  // what the record holds from now on: its reloads and discards compare
  }
  if (team.share(refused) != Flag::none) {
    unlock_pool(team, pool);
    return Begun{};
  }
  // The count check by the whole team (block scans over groups), each count snapshot into the record as it is read:
  // one read, and the counts checked are the record's (a scan's barrier follows each chunk's writes, before the plan
  // reads them). A check that fails stops at the chunk of its first bad group, and leaves the rest of the snapshot.
  const CountCheck check = check_counts_of(team, v, [&](cuda::std::int32_t g) {
    note_load(&v.counts[g]);
    const cuda::std::int32_t m = v.counts[g];
    rec.counts[g] = m;
    return m;
  });
  Flag error = check.verdict();
  WorkTotals totals{};  // a stash that fails on its counts holds nothing
  if (error == Flag::none)
    totals = plan_work_on_team<Traits>(team, v, SegmentsAt{rec.counts}, false, tile_shift, rec.items);
  if (team.leader()) {
    h.summary.first_bad_group = check.first_bad_group;
    h.tile_shift = tile_shift;
    h.tiles = totals.tiles;
    h.items = totals.items;
    h.summary.stream_bytes = totals.stream_bytes;
    h.summary.live_bytes = totals.live_bytes;
  }
  const cuda::std::int64_t need =
      (totals.stream_bytes + pool.page_bytes - 1) >> pool.page_shift;  // pages are 2^k bytes
  Taken taken{TakeResult::taken, 0, 0};
  if (error == Flag::none) {
    taken = take_pages(team, pool, need, totals.stream_bytes, rec.page_ids);  // it releases the lock
    if (taken.result != TakeResult::taken) error = Flag::overflow;
  } else {
    unlock_pool(team, pool);
  }
  if (team.leader()) {
    h.summary.error = error;
    h.summary.pages = error == Flag::none ? need : 0;
    h.summary.device_pages = error == Flag::none ? taken.device_pages : 0;
    h.summary.generation = taken.generation;
    h.summary.state = state_after_stash(error);
    if (error == Flag::bad_counts) raise_error(pool, Flag::bad_counts);
    if (error == Flag::overflow) raise_overflow(pool);
  }
  if (error == Flag::none) copy_kept<Traits>(team, v, rec, true);
  return Begun{PlanSize{totals.tiles, totals.items, tile_shift}, error == Flag::none};
}

/// Reload, first step: check the record, plan the copy back (and the zeroing), restore the
/// kept buffers. Returns whether the tiles are to be copied (then end_reload must follow), and the plan. The team's
/// writes are handed on by its next barrier (the caller's publish()).
template <class Traits, class Team>
PAGESTASH_HOST_DEVICE Begun begin_reload(const Team& team, const PoolRef& pool,
                                         const GroupedView<typename Traits::layout>& dest, const RecordRef& rec,
                                         bool zero_tail, int tile_shift) {
  RecordHeader& h = *rec.header;
  Flag error = Flag::none;
  if (team.leader()) {
    const bool foreign = is_foreign(pool, h);
    const bool other = !foreign && is_other_kind(h, record_kind<Traits>(dest), /*taller_ok=*/true);
    error = foreign ? Flag::foreign_record : (other ? Flag::record_mismatch : check_holds_pages(pool, h));
    // A record whose stash overflowed or failed already raised its flag: reloading it (as a
    // captured step does) is no new misuse, and its error keeps the first cause.
    const bool stash_failed =
        !foreign && !other && (h.summary.state == RecordState::overflowed || h.summary.state == RecordState::failed);
    if (error != Flag::none && !stash_failed) refuse(pool, h, error);
    if (error == Flag::none) h.summary.error = error;
  }
  error = team.share(error);
  if (error != Flag::none) return Begun{};
  const WorkTotals totals =
      plan_work_on_team<Traits>(team, dest, SegmentsAt{rec.counts}, zero_tail, tile_shift, rec.items);
  if (team.leader()) {
    h.tile_shift = tile_shift;
    h.tiles = totals.tiles;
    h.items = totals.items;
  }
  copy_kept<Traits>(team, dest, rec, false);
  return Begun{PlanSize{totals.tiles, totals.items, tile_shift}, true};
}

/// Reload, last step, after every tile is copied: return the pages. `locked`: the leader holds the pool's lock already.
template <class Team>
PAGESTASH_HOST_DEVICE void end_reload(const Team& team, const PoolRef& pool, const RecordRef& rec,
                                      RecordState final_state = RecordState::reloaded, bool locked = false) {
  RecordHeader& h = *rec.header;
  if (!locked) lock_pool(team, pool);
  note_load(&h.summary);
  return_pages(team, pool, rec.page_ids, h.summary.pages, h.summary.device_pages, h.summary.stream_bytes);
  if (team.leader()) {
    h.summary.state = final_state;
    h.summary.pages = 0;
    h.summary.device_pages = 0;
  }
  team.sync();
}

/// The tile work of the plan of size `plan` the record holds, over view's buffers.
template <class Traits>
PAGESTASH_HOST_DEVICE TileWork tile_work(const PoolRef& pool, const GroupedView<typename Traits::layout>& v,
                                         const RecordRef& rec, bool to_pages, const PlanSize& plan) {
  TileWork w{};
  w.data = static_cast<unsigned char*>(v.buffer(BufferRole::data));
  w.scales = static_cast<unsigned char*>(v.buffer(BufferRole::scales));
  w.items = rec.items;
  w.item_count = plan.items;
  w.page_ids = rec.page_ids;
  w.pool = pool;
  w.tile_shift = plan.tile_shift;
  w.to_pages = to_pages;
  return w;
}

}  // namespace detail

/// Discard: return the pages without copying. A record that holds none is left alone and the reason recorded; no flag
/// is raised, as nothing was lost (but for another pool's record, or one that holds another kind than `kind`, the
/// caller's: misuse).
template <class Team>
PAGESTASH_HOST_DEVICE void discard_pages(const Team& team, const PoolRef& pool, const RecordRef& rec,
                                         const RecordKind& kind) {
  using namespace detail;  // the record's steps
  RecordHeader& h = *rec.header;
  Flag error = Flag::none;
  if (team.leader()) {
    bool foreign = false, other = false;
    {
      const OneRound together;  // the record's checks and the pool's lock
      foreign = is_foreign(pool, h);
      other = is_other_kind(h, kind);  // read, not trusted, when foreign
      error = check_holds_pages(pool, h);
      acquire_pool_lock(pool);
    }
    if (foreign || other) {
      error = foreign ? Flag::foreign_record : Flag::record_mismatch;
      refuse(pool, h, error);
    } else {
      h.summary.error = error;
    }
  }
  if (team.share(error) == Flag::none) end_reload(team, pool, rec, RecordState::discarded, /*locked=*/true);
  else unlock_pool(team, pool);
}

PAGESTASH_NAMESPACE_END
