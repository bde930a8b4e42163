#pragma once
// The body of one kernel launch of stash, reload or discard, written once for any grid: a
// thread runs it with its GridContext (its block's team, its warp's lanes, where its block
// and warp sit in the grid). The CUDA kernels (cuda.cuh) only supply CUDA's context; the
// tests' grid emulator runs the same body on host threads, several blocks of several warps.
//
// The launch protocol, over the record's LaunchWords:
//   arrival  each block's leader tries to take the record for this launch's epoch
//            (compare-exchange owner: 0 -> epoch). The block that takes it plans; a block
//            that finds the same epoch joins; a block that finds another epoch refuses
//            (counted in `refused`, the error flag raised) and leaves: never a hang.
//   verdict  the planner runs begin_* and publishes copy / skip; the others wait for it.
//   tiles    blocks claim chunks of tiles from an atomic counter (a block that starts late,
//            or a grid smaller than the device, leaves no tail); each warp moves a run of
//            consecutive tiles of its block's chunk, carrying its item along.
//   finish   the last block out (finished == blocks - 1) completes the operation
//            (end_reload returns the pages), clears the words and releases `owner`.
// docs/design.md ("Memory ordering") argues why each fence is where it is.

#include <pagestash/stash/steps.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

enum class Operation : int { stash, reload, discard };
enum Verdict : cuda::std::int32_t { verdict_pending = 0, verdict_copy = 1, verdict_skip = 2 };
enum class Arrival : cuda::std::int32_t { planner, joined, refused };

/// Consecutive tiles each warp of a block gets per claim: a block claims warps x this many
/// at once (64 KiB of 4 KiB tiles at 8 warps), few enough claims that the atomic is cheap,
/// small enough that the last claims even out.
inline constexpr cuda::std::int64_t tiles_per_warp_claim = 2;

/// Where a thread is in a launch: its block's team, its warp's lanes, the grid's shape.
template <class Team, class Lanes>
struct GridContext {
  Team team;
  Lanes lanes;
  cuda::std::int64_t block;   ///< this block's index
  cuda::std::int64_t blocks;  ///< blocks in the launch
  cuda::std::int64_t warp;    ///< this thread's warp in its block
  cuda::std::int64_t warps;   ///< warps per block
};

/// One launch of operation Op on `rec`, as thread (ctx.block, ctx.team.rank()) runs it.
template <class Traits, Operation Op, class Team, class Lanes>
PAGESTASH_HOST_DEVICE void run_operation(const GridContext<Team, Lanes>& ctx, const PoolRef& pool,
                                         const GroupedView<typename Traits::layout>& view, const RecordRef& rec,
                                         bool zero_tail, cuda::std::uint32_t epoch) {
  const Team& team = ctx.team;
  LaunchWords& words = rec.header->launch;

  Arrival arrival = Arrival::joined;
  if (team.leader()) {
    cuda::std::uint32_t owner = 0;
    if (device_atomic<cuda::std::uint32_t>(words.owner)
            .compare_exchange_strong(owner, epoch, cuda::std::memory_order_acquire, cuda::std::memory_order_relaxed)) {
      arrival = Arrival::planner;
    } else if (owner != epoch) {
      arrival = Arrival::refused;
      device_atomic<cuda::std::int32_t>(words.refused).fetch_add(1, cuda::std::memory_order_relaxed);
      raise_error(pool, ErrorKind::refused_launch);
    }
  }
  arrival = team.share(arrival);
  if (arrival == Arrival::refused) return;

  cuda::std::int32_t verdict = verdict_skip;
  if (arrival == Arrival::planner) {
    bool copy = false;
    const int tile_shift = tile_shift_for(pool.page_shift, device_tile_shift);
    if constexpr (Op == Operation::stash) copy = begin_stash<Traits>(team, pool, view, rec, tile_shift);
    if constexpr (Op == Operation::reload) copy = begin_reload<Traits>(team, pool, view, rec, zero_tail, tile_shift);
    if constexpr (Op == Operation::discard) discard_pages(team, pool, rec);
    verdict = copy ? verdict_copy : verdict_skip;
    team.publish();  // the header and plan, by every thread, before the verdict
    if (team.leader()) device_atomic<cuda::std::int32_t>(words.verdict).store(verdict, cuda::std::memory_order_release);
  } else if (team.leader()) {
    device_atomic<cuda::std::int32_t> published(words.verdict);
    while ((verdict = published.load(cuda::std::memory_order_acquire)) == verdict_pending) spin_pause();
  }
  verdict = team.share(verdict);

  if (Op != Operation::discard && verdict == verdict_copy) {
    const TileWork work = tile_work<Traits>(pool, view, rec, Op == Operation::stash);
    // Tile indices are 32-bit (work_bounds caps a plan at 2^31 - 1 tiles); the counter is
    // 64-bit, as claims overshoot the last tile.
    const auto tiles = static_cast<cuda::std::int32_t>(rec.header->tiles);
    const cuda::std::int64_t chunk = ctx.warps * tiles_per_warp_claim;
    ItemCursor cursor;
    for (;;) {
      cuda::std::int64_t first = 0;
      if (team.leader())
        first = device_atomic<cuda::std::int64_t>(words.next_tile).fetch_add(chunk, cuda::std::memory_order_relaxed);
      first = team.share(first);
      if (first >= tiles) break;
      const cuda::std::int64_t begin = first + ctx.warp * tiles_per_warp_claim;
      const auto end = static_cast<cuda::std::int32_t>(begin + tiles_per_warp_claim < tiles ? begin + tiles_per_warp_claim : tiles);
      for (auto t = static_cast<cuda::std::int32_t>(begin); t < end; ++t) run_tile(ctx.lanes, work, cursor, t);
    }
  }

  // The last block out: every block's copies happen-before its acq_rel increment.
  team.publish();
  bool last = false;
  if (team.leader())
    last = device_atomic<cuda::std::int32_t>(words.finished).fetch_add(1, cuda::std::memory_order_acq_rel) ==
           ctx.blocks - 1;
  if (!team.share(last)) return;
  if (Op == Operation::reload && verdict == verdict_copy) end_reload(team, pool, rec);
  if (team.leader()) {
    words.verdict = verdict_pending;
    words.finished = 0;
    words.next_tile = 0;
    device_atomic<cuda::std::uint32_t>(words.owner).store(0, cuda::std::memory_order_release);
  }
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
