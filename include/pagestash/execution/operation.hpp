#pragma once
// The body of one kernel launch of stash, reload or discard, written once for any grid: a
// thread runs it with its GridContext (its block's team, its warp's lanes, where its block
// and warp sit in the grid). The CUDA kernels (cuda.cuh) only supply CUDA's context; the
// tests' grid emulator runs the same body on host threads, several blocks of several warps.
//
// The launch protocol, over the record's LaunchWords:
//   arrival  a launch's fate is decided once, by its first block to arrive, in one
//            compare-exchange of `arrival` (the newest launch to arrive, whether it was
//            refused, whether the record is held): a record that is free (or held by a
//            launch from before a pool reset) is taken, else the launch is refused. Every
//            later block of the launch reads that decision, whatever happened in between:
//            it joins if its launch holds the record, and refuses otherwise (counted in
//            `refused`; the error flag raised, the pool's error count once per launch).
//            A block whose launch is older than the newest to arrive was decided by then
//            too. So a launch is done or refused as a whole under every block order: never
//            a hang, never a mix of two. This assumes launch ids grow (GridContext::launch):
//            a launch older than one already seen is refused.
//   verdict  the block that took the record resets the launch words, publishes `owner`,
//            runs begin_* and publishes copy / skip; the others wait for `owner`, then
//            poll for the verdict (relaxed loads, one acquire fence after each wait).
//   tiles    blocks claim chunks of tiles from an atomic counter (a block that starts late,
//            or a grid smaller than the device, leaves no tail); a block reads the counter
//            before it adds to it, so that late blocks of a small plan leave without a
//            read-modify-write. Each warp moves a run of consecutive tiles of its block's
//            chunk, carrying its item along.
//   finish   the last block out (finished == blocks - 1) completes the operation
//            (end_reload returns the pages) and releases the record (`arrival`'s held bit).
// Per block that is two read-modify-writes on the launch's line (arrival, finish) and one
// per claim; the grid is sized so that few blocks carry them (stash/policy.hpp).
// docs/design.md ("Memory ordering") argues why each fence is where it is.

#include <pagestash/stash/policy.hpp>
#include <pagestash/stash/steps.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

enum class Operation : int { stash, reload, discard };
enum Verdict : cuda::std::int32_t { verdict_pending = 0, verdict_copy = 1, verdict_skip = 2 };
enum class Arrival : cuda::std::int32_t { planner, joined, refused };

/// Where a thread is in a launch: its block's team, its warp's lanes, the grid's shape, and
/// the launch's identity.
template <class Team, class Lanes>
struct GridContext {
  Team team;
  Lanes lanes;
  cuda::std::int64_t block;   ///< this block's index
  cuda::std::int64_t blocks;  ///< blocks in the launch
  cuda::std::int64_t warp;    ///< this thread's warp in its block
  cuda::std::int64_t warps;   ///< warps per block
  /// Never 0, and no other launch that may overlap this one has it: on the device the
  /// grid's own id (%gridid, new for every launch and every graph replay), so that no host
  /// value (captured in a graph, or drawn by another copy of the library) can make two
  /// launches look like one.
  cuda::std::uint64_t launch;
};

/// A block of launch `me` refused: counted, and the pool's error raised (counted once per
/// launch when `first`).
PAGESTASH_HOST_DEVICE inline Arrival refuse_block(const PoolRef& pool, LaunchWords& words, bool first) {
  device_atomic<cuda::std::int32_t>(words.refused).fetch_add(1, cuda::std::memory_order_relaxed);
  raise_error(pool, Flag::refused_launch, first);
  return Arrival::refused;
}

/// A block's leader takes part in the launch on `words` (see the top of this file).
template <class Context>
PAGESTASH_HOST_DEVICE Arrival arrive(const Context& ctx, const PoolRef& pool, LaunchWords& words) {
  using u64 = cuda::std::uint64_t;
  const u64 me = ctx.launch;
  const device_atomic<u64> arrival(words.arrival), owner(words.owner);
  const device_atomic<u64> last_refused(words.last_refused);
  const auto is_me = [me](u64 o) { return o == me; };
  u64 w = arrival.load(poll_order);
  for (;;) {
    const u64 newest = w >> launch_id_shift;
    const bool held = (w & launch_held) != 0, refused = (w & launch_refused) != 0;
    if (newest == me && !refused && held) {
      // A block of this launch took the record: join once it has published itself (after
      // resetting the words).
      spin_until(owner, is_me);
      acquire_fence();
      return Arrival::joined;
    }
    if (newest == me && refused) return refuse_block(pool, words, false);
    if (newest >= me) {
      // Decided before this block came: this launch holds the record only if it took it
      // and a newer one was refused since (which published `owner` first); else it was
      // refused, or never arrived before the newer one (or reused an id: not held).
      if (held && refused && owner.load(poll_order) == me) {
        acquire_fence();
        return Arrival::joined;
      }
      return refuse_block(pool, words, last_refused.exchange(me, cuda::std::memory_order_relaxed) != me);
    }
    // The first block of this launch. A refusal is installed only once the holder's id is
    // in `owner` (its taker publishes it right after taking), so that the holder's later
    // blocks find it there.
    if (held && !refused) {
      while (owner.load(poll_order) != newest && arrival.load(poll_order) == w) spin_pause();
      if (owner.load(poll_order) != newest) {
        w = arrival.load(poll_order);
        continue;
      }
    }
    bool take = !held;
    if (held) {
      acquire_fence();  // the holder's `generation`, written before its `owner`
      const device_atomic<cuda::std::int32_t> generation(words.generation), now(pool.counters->counts.generation);
      take = generation.load(cuda::std::memory_order_relaxed) != now.load(cuda::std::memory_order_relaxed);
    }
    const u64 decided = me << launch_id_shift | launch_held | (take ? cuda::std::uint64_t{0} : launch_refused);
    if (!arrival.compare_exchange_strong(w, decided, poll_order, poll_order)) continue;
    if (!take) {
      last_refused.store(me, cuda::std::memory_order_relaxed);
      return refuse_block(pool, words, true);
    }
    // Taken: the previous holder released the record (or a reset left it held).
    acquire_fence();
    words.verdict = verdict_pending;
    words.finished = 0;
    words.next_tile = 0;
    device_atomic<cuda::std::int32_t>(words.generation)
        .store(device_atomic<cuda::std::int32_t>(pool.counters->counts.generation).load(cuda::std::memory_order_relaxed),
               cuda::std::memory_order_relaxed);
    owner.store(me, cuda::std::memory_order_release);
    return Arrival::planner;
  }
}

/// One launch of operation Op on `rec`, as thread (ctx.block, ctx.team.rank()) runs it.
template <class Traits, Operation Op, class Team, class Lanes>
PAGESTASH_HOST_DEVICE void run_operation(const GridContext<Team, Lanes>& ctx, const PoolRef& pool,
                                         const GroupedView<typename Traits::layout>& view, const RecordRef& rec,
                                         bool zero_tail) {
  const Team& team = ctx.team;
  LaunchWords& words = rec.header->launch;

  const Arrival arrival = team.share(team.leader() ? arrive(ctx, pool, words) : Arrival::joined);
  if (arrival == Arrival::refused) return;

  cuda::std::int32_t verdict = verdict_skip;
  if (arrival == Arrival::planner) {
    bool copy = false;
    const int tile_shift = tile_shift_for(pool.page_shift, StashPolicy::tile_shift);
    if constexpr (Op == Operation::stash) copy = begin_stash<Traits>(team, pool, view, rec, tile_shift);
    if constexpr (Op == Operation::reload) copy = begin_reload<Traits>(team, pool, view, rec, zero_tail, tile_shift);
    if constexpr (Op == Operation::discard) discard_pages(team, pool, rec);
    verdict = copy ? verdict_copy : verdict_skip;
    team.publish();  // the header and plan, by every thread, before the verdict
    if (team.leader()) device_atomic<cuda::std::int32_t>(words.verdict).store(verdict, cuda::std::memory_order_release);
  } else if (team.leader()) {
    verdict = spin_until(device_atomic<cuda::std::int32_t>(words.verdict),
                         [](cuda::std::int32_t v) { return v != verdict_pending; });
    acquire_fence();  // the planner's header and plan
  }
  verdict = team.share(verdict);

  if (Op != Operation::discard && verdict == verdict_copy) {
    const TileWork work = tile_work<Traits>(pool, view, rec, Op == Operation::stash);
    // Tile indices are 32-bit (work_bounds caps a plan at 2^31 - 1 tiles); claims are
    // 64-bit, as they overshoot the last tile.
    const cuda::std::int64_t tiles = rec.header->tiles;
    constexpr cuda::std::int64_t per_warp = StashPolicy::tiles_per_warp_claim;
    const cuda::std::int64_t chunk = ctx.warps * per_warp;
    ItemCursor cursor;
    for (;;) {
      cuda::std::int64_t first = tiles;
      if (team.leader()) {
        // Test, then claim: a block that comes late to a launch whose tiles are all claimed
        // leaves after a load, not a read-modify-write on the launch's line.
        const device_atomic<cuda::std::int64_t> next(words.next_tile);
        if (next.load(cuda::std::memory_order_relaxed) < tiles) first = next.fetch_add(chunk, cuda::std::memory_order_relaxed);
      }
      first = team.share(first);
      if (first >= tiles) break;
      const cuda::std::int64_t begin = first + ctx.warp * per_warp;
      const cuda::std::int64_t end = begin + per_warp < tiles ? begin + per_warp : tiles;
      for (cuda::std::int64_t t = begin; t < end; ++t) run_tile(ctx.lanes, work, cursor, static_cast<cuda::std::int32_t>(t));
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
  // Released: the next launch's compare-exchange reads this and acquires.
  if (team.leader())
    device_atomic<cuda::std::uint64_t>(words.arrival)
        .fetch_and(~launch_held, cuda::std::memory_order_release);
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
