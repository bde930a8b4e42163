#pragma once
// The steps of stash, reload and discard, written once for any team (detail/team.hpp). An
// executor runs `begin_*` on one team, then every tile of the plan (stash/copy.hpp), then
// `end_reload`; the host executor does this on one CPU thread, the CUDA executor inside one
// kernel launch. A step that cannot do its work records why in the record and, for stash
// and reload (discard: only for another pool's record), raises a pool flag: `overflow` when
// the pool had no room, `error` (and the kind's flag) for misuse. Either way the step's
// results cannot be trusted and the caller reruns it (pool/flags.hpp, docs/api.md
// "Failures").

#include <pagestash/stash/copy.hpp>
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
      if (to_record) kept[i] = buf[i]; else buf[i] = kept[i];
    }
    kept += round_up(n, 16);
  });
}

/// Whether the record holds pages of the pool's current generation.
PAGESTASH_HOST_DEVICE inline RecordError check_holds_pages(const PoolRef& pool, const RecordHeader& h) {
  if (h.state != RecordState::stashed) return RecordError::not_stashed;
  const cuda::std::int32_t generation =
      device_atomic<cuda::std::int32_t>(pool.counters->generation).load(cuda::std::memory_order_relaxed);
  return h.generation == generation ? RecordError::none : RecordError::stale;
}

/// Whether the record was made for another pool (its memory attached to this one's): its
/// page ids, counts and plan are not this pool's. Every step checks it first, on the leader,
/// before it reads or writes anything else of the record, the pool or the pages.
PAGESTASH_HOST_DEVICE inline bool is_foreign(const PoolRef& pool, const RecordHeader& h) {
  return h.pool_id != pool.counters->id;
}

/// The pool's flag for a record's error (one that is misuse).
PAGESTASH_HOST_DEVICE inline ErrorKind kind_of(RecordError e) {
  switch (e) {
    case RecordError::bad_counts: return ErrorKind::bad_counts;
    case RecordError::still_stashed: return ErrorKind::still_stashed;
    case RecordError::stale: return ErrorKind::stale;
    case RecordError::foreign_pool: return ErrorKind::foreign_record;
    default: return ErrorKind::not_stashed;
  }
}

/// The leader refuses the operation as misuse: the record says why, the pool raises its kind.
PAGESTASH_HOST_DEVICE inline void refuse(const PoolRef& pool, RecordHeader& h, RecordError error) {
  h.error = error;
  raise_error(pool, kind_of(error));
}

/// Stash, first step: snapshot the counts, check them, plan, take pages, keep the small
/// buffers. Returns whether the tiles are to be copied.
template <class Traits, class Team>
PAGESTASH_HOST_DEVICE bool begin_stash(const Team& team, const PoolRef& pool,
                                       const GroupedView<typename Traits::layout>& v, const RecordRef& rec,
                                       int tile_shift) {
  RecordHeader& h = *rec.header;
  RecordError refused = RecordError::none;  // another pool's record, or one that would lose its pages
  if (team.leader()) {
    if (is_foreign(pool, h)) refused = RecordError::foreign_pool;
    else if (check_holds_pages(pool, h) == RecordError::none) refused = RecordError::still_stashed;
    if (refused != RecordError::none) refuse(pool, h, refused);
  }
  if (team.share(refused) != RecordError::none) return false;
  for (cuda::std::int32_t g = team.rank(); g < v.groups; g += team.size()) rec.counts[g] = v.counts[g];
  team.sync();

  // The count check and the plan, by the whole team (block scans over groups and segments).
  const cuda::std::int32_t first_bad = first_bad_group(team, v, rec.counts);
  RecordError error = first_bad >= 0 ? RecordError::bad_counts : RecordError::none;
  WorkTotals totals{};  // a stash that fails on its counts holds nothing
  if (error == RecordError::none)
    totals = plan_work_on_team<Traits>(team, v, rec.counts, false, tile_shift, rec.items);
  if (team.leader()) {
    h.first_bad_group = first_bad;
    h.tile_shift = tile_shift;
    h.tiles = totals.tiles;
    h.items = totals.items;
    h.stream_bytes = totals.stream_bytes;
    h.live_bytes = totals.live_bytes;
  }
  const cuda::std::int64_t need = (totals.stream_bytes + pool.page_bytes - 1) >> pool.page_shift;  // pages are 2^k bytes
  Taken taken{TakeResult::taken, 0, 0};
  if (error == RecordError::none) {
    taken = take_pages(team, pool, need, totals.stream_bytes, rec.page_ids);
    if (taken.result != TakeResult::taken) error = RecordError::pool_overflow;
  }
  if (team.leader()) {
    h.error = error;
    h.pages = error == RecordError::none ? need : 0;
    h.device_pages = error == RecordError::none ? taken.device_pages : 0;
    h.generation = taken.generation;
    h.state = error == RecordError::none ? RecordState::stashed
                                         : (error == RecordError::bad_counts ? RecordState::failed : RecordState::overflowed);
    if (error == RecordError::bad_counts) raise_error(pool, ErrorKind::bad_counts);
    if (error == RecordError::pool_overflow) raise_overflow(pool);
  }
  if (error == RecordError::none) copy_kept<Traits>(team, v, rec, true);
  team.sync();
  return error == RecordError::none;
}

/// Reload, first step: check the record, plan the copy back (and the zeroing), restore the
/// kept buffers. Returns whether the tiles are to be copied (then end_reload must follow).
template <class Traits, class Team>
PAGESTASH_HOST_DEVICE bool begin_reload(const Team& team, const PoolRef& pool,
                                        const GroupedView<typename Traits::layout>& dest, const RecordRef& rec,
                                        bool zero_tail, int tile_shift) {
  RecordHeader& h = *rec.header;
  RecordError error = RecordError::none;
  if (team.leader()) {
    const bool foreign = is_foreign(pool, h);
    error = foreign ? RecordError::foreign_pool : check_holds_pages(pool, h);
    // A record whose stash overflowed or failed already raised its flag: reloading it (as a
    // captured step does) is no new misuse, and its error keeps the first cause.
    const bool stash_failed = !foreign && (h.state == RecordState::overflowed || h.state == RecordState::failed);
    if (error != RecordError::none && !stash_failed) refuse(pool, h, error);
    if (error == RecordError::none) h.error = error;
  }
  error = team.share(error);
  if (error == RecordError::none) {
    const WorkTotals totals =
        plan_work_on_team<Traits>(team, dest, rec.counts, zero_tail, tile_shift, rec.items);
    if (team.leader()) {
      h.tile_shift = tile_shift;
      h.tiles = totals.tiles;
      h.items = totals.items;
    }
  }
  if (error == RecordError::none) copy_kept<Traits>(team, dest, rec, false);
  team.sync();
  return error == RecordError::none;
}

/// Reload, last step, after every tile is copied: return the pages.
template <class Team>
PAGESTASH_HOST_DEVICE void end_reload(const Team& team, const PoolRef& pool, const RecordRef& rec,
                                      RecordState final_state = RecordState::reloaded) {
  RecordHeader& h = *rec.header;
  return_pages(team, pool, rec.page_ids, h.pages, h.device_pages, h.stream_bytes);
  if (team.leader()) {
    h.state = final_state;
    h.pages = 0;
    h.device_pages = 0;
  }
  team.sync();
}

/// Discard: return the pages without copying. A record that holds none is left alone and
/// the reason recorded; no flag is raised, as nothing was lost (but for another pool's
/// record: misuse).
template <class Team>
PAGESTASH_HOST_DEVICE void discard_pages(const Team& team, const PoolRef& pool, const RecordRef& rec) {
  RecordHeader& h = *rec.header;
  RecordError error = RecordError::none;
  if (team.leader()) {
    error = is_foreign(pool, h) ? RecordError::foreign_pool : check_holds_pages(pool, h);
    if (error == RecordError::foreign_pool) refuse(pool, h, error);
    else h.error = error;
  }
  if (team.share(error) == RecordError::none) end_reload(team, pool, rec, RecordState::discarded);
}

/// The tile work of the plan the record holds, over view's buffers.
template <class Traits>
PAGESTASH_HOST_DEVICE TileWork tile_work(const PoolRef& pool, const GroupedView<typename Traits::layout>& v,
                                         const RecordRef& rec, bool to_pages) {
  TileWork w{};
  w.data = static_cast<unsigned char*>(v.buffer(BufferRole::data));
  w.scales = static_cast<unsigned char*>(v.buffer(BufferRole::scales));
  w.items = rec.items;
  w.item_count = rec.header->items;
  w.page_ids = rec.page_ids;
  w.pool = pool;
  w.tile_shift = rec.header->tile_shift;
  w.to_pages = to_pages;
  return w;
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
