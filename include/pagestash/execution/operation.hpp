#pragma once
// The body of one kernel launch of stash, reload or discard, written once for any grid: a
// thread runs it with its GridContext (its block's team, its warp's lanes, where its block
// and warp sit in the grid). The CUDA kernels (cuda.cuh) only supply CUDA's context; the
// tests' grid emulator runs the same body on host threads, several blocks of several warps.
//
// The launch protocol, over the record's LaunchWords:
//   arrival  a launch's fate is decided once, by the first of its blocks to find it
//            undecided, in one compare-exchange of `arrival` (the newest launch to arrive,
//            whether it was refused, whether the record is held): a record that is free
//            (or held by a launch from before a pool reset) is taken, else the launch is
//            refused. Every later block of the launch finds that decision, whatever
//            happened in between: it joins when its launch holds the record (`owner`), and
//            refuses when its launch is the refused one in `arrival` or among the refused
//            launches remembered (counted in `refused`; the error flag raised, the pool's
//            error count once per launch). The block that refuses its launch remembers it,
//            once, right after its compare-exchange, in the next of
//            LaunchWords::remembered_launches slots, and the word moves off a refused launch
//            only once it is remembered. So a launch is done or refused as a whole under
//            every block order, never a hang, never a mix of two, as long as fewer than
//            remembered_launches other launches on the record are refused between its first
//            block's arrival and its last's (docs/design.md). Launch ids
//            need only be unique (GridContext::launch), not ordered; the words keep each
//            one reduced once to 62 bits (kept_launch_id), the same in every word.
//   verdict  the block that took the record resets the launch words, publishes `owner`,
//            runs begin_* and publishes copy / skip with the plan's size, in one word; the
//            others wait for `owner`, then each warp's first lane polls for the verdict word
//            (relaxed loads, one acquire fence after the wait) and hands it to its lanes: no
//            block barrier between the verdict and a warp's first tile, in any block.
//   tiles    block b's first chunk of tiles is chunk b of the plan, no claim needed (a plan
//            of at most one chunk a block touches no counter); the chunks after the grid's
//            first are claimed from an atomic counter (a block that starts late, or a grid
//            smaller than the device, leaves no tail beyond its own first chunk); a block
//            reads the counter before it adds to it, so that late blocks of a small plan
//            leave without a read-modify-write, and claims its next chunk while it copies
//            the current one. Each warp moves a run of consecutive tiles of its block's
//            chunk, carrying its item along.
//   poison   a reload that does not restore (refused, or its verdict skip) fills its
//            destination with poison (ReloadOptions::poison), every block its share.
//   finish   the last block out (finished == blocks - 1) completes the operation
//            (end_reload returns the pages) and releases the record (`arrival`'s held bit).
// Per block that is two read-modify-writes on the launch's line (arrival, finish) and one
// per claim; the grid is sized so that few blocks carry them (stash/policy.hpp).
// docs/design.md ("Memory ordering") argues why each fence is where it is.

#include <pagestash/execution/executor.hpp>
#include <pagestash/stash/look_ahead.hpp>
#include <pagestash/stash/policy.hpp>
#include <pagestash/stash/steps.hpp>

PAGESTASH_NAMESPACE_BEGIN
/// What a launch does (run_operation): one of the three operations on a record.
enum class Operation : int { stash, reload, discard };

/// Where a thread is in a launch: its block's team, its warp's lanes, the grid's shape, and the launch's identity.
template <class Team, class Lanes>
struct GridContext {
  Team team;
  Lanes lanes;
  cuda::std::int64_t block;   ///< this block's index
  cuda::std::int64_t blocks;  ///< blocks in the launch
  cuda::std::int64_t warp;    ///< this thread's warp in its block
  cuda::std::int64_t warps;   ///< warps per block
  /// Never 0, and no other launch that may overlap this one has it: on the device the grid's own id (%gridid, new for
  /// every launch and every graph replay), so that no host value (captured in a graph, or drawn by another copy of the
  /// library) can make two launches look like one.
  cuda::std::uint64_t launch;
};

namespace detail {

enum Verdict : cuda::std::int32_t { verdict_pending = 0, verdict_copy = 1, verdict_skip = 2 };
enum class Arrival : cuda::std::int32_t { owner, joined, refused };

/// A refused block: counted, and the pool's error raised (counted once per launch, by the deciding block: `first`).
PAGESTASH_HOST_DEVICE inline Arrival refuse_block(const PoolRef& pool, LaunchWords& words, bool first) {
  device_atomic<cuda::std::int32_t>(words.refused).fetch_add(1, cuda::std::memory_order_relaxed);
  raise_error(pool, Flag::refused_launch, first);
  return Arrival::refused;
}

/// Whether launch `id` is among the refused launches the words remember, every slot read at once, and what `also` reads
/// with them: one round trip.
template <class Also>
PAGESTASH_HOST_DEVICE bool remembered(LaunchWords& words, cuda::std::uint64_t id, const Also& also) {
  const OneRound together;
  also();
  bool found = false;
  PAGESTASH_UNROLL
  for (int k = 0; k < LaunchWords::remembered_launches; ++k)
    found |= device_atomic<cuda::std::uint64_t>(words.remembered[k]).load(poll_order) == id;
  return found;
}
PAGESTASH_HOST_DEVICE inline bool remembered(LaunchWords& words, cuda::std::uint64_t id) {
  return remembered(words, id, [] {});
}

/// A launch's id as the launch words keep it, in `arrival`, `owner` and the remembered launches alike: its low 62 bits
/// (`arrival`'s other two are its state), never 0. %gridid counts a context's launches, so two launches that may
/// overlap on a record are far closer than 2^62 apart and keep distinct ids.
PAGESTASH_HOST_DEVICE inline cuda::std::uint64_t kept_launch_id(cuda::std::uint64_t id) {
  const cuda::std::uint64_t low = id & (~cuda::std::uint64_t{0} >> launch_id_shift);
  return low != 0 ? low : 1;
}

/// A block's leader takes part in the launch on `words` (see the top of this file).
template <class Context>
PAGESTASH_HOST_DEVICE Arrival arrive(const Context& ctx, const PoolRef& pool, LaunchWords& words) {
  using u64 = cuda::std::uint64_t;
  const u64 me = kept_launch_id(ctx.launch);
  const device_atomic<u64> arrival(words.arrival), owner(words.owner);
  const device_atomic<cuda::std::int32_t> generation(words.generation), now(pool.state->counters.generation);
  // Acquire, as the owner below: what came before the word and the owner (the holder's generation, the launches
  // remembered). A word or owner read by a poll (relaxed) is acquired by a fence instead.
  u64 w = arrival.load(cuda::std::memory_order_acquire);
  for (bool acquired = true;; acquired = false) {
    const u64 newest = w >> launch_id_shift;
    const bool held = (w & launch_held) != 0, refused = (w & launch_refused) != 0;
    if (refused && newest == me) return refuse_block(pool, words, false);
    // After the word: an owner older than the word (a replay's id, equal to the taker's, before its release cleared it)
    // must not pass for the taker's publication.
    u64 holder = held ? owner.load(cuda::std::memory_order_acquire) : 0;
    if (held && !refused && holder != newest) {
      // The newest launch took the record and publishes its id right after: wait for it, or for the word to move on.
      const u64 seen = w;
      while ((holder = owner.load(poll_order)) != newest && (w = arrival.load(poll_order)) == seen) spin_pause();
      if (w != seen) continue;
      acquired = false;
    }
    if (!acquired) acquire_fence();
    if (held && holder == me) return Arrival::joined;
    // The pool's generation (a holder from before a pool reset is none), read with the remembered launches: one round.
    cuda::std::int32_t pool_generation = 0, held_generation = 0;
    const auto generations = [&] {
      pool_generation = now.load(cuda::std::memory_order_relaxed);
      held_generation = generation.load(cuda::std::memory_order_relaxed);
    };
    if (remembered(words, me, generations)) return refuse_block(pool, words, false);
    if (refused && !remembered(words, newest)) {
      // The word names a refused launch whose deciding block has not remembered it yet (it does right after naming
      // it): the word moves on only once it has, so that the launch's later blocks find it refused.
      const u64 seen = w;
      while (!remembered(words, newest) && (w = arrival.load(poll_order)) == seen) spin_pause();
      continue;
    }
    // This launch's fate is not decided yet: take the record if nothing holds it (or a launch from before a pool
    // reset), else refuse the launch. The word then names this launch.
    const bool take = !held || held_generation != pool_generation;
    const u64 decided = me << launch_id_shift | launch_held | (take ? u64{0} : launch_refused);
    if (!arrival.compare_exchange_strong(w, decided, cuda::std::memory_order_acq_rel, poll_order)) continue;
    if (!take) {
      // Remembered once, by the block that decided: one slot per refused launch, whatever its blocks do.
      const cuda::std::uint32_t slot =
          device_atomic<cuda::std::uint32_t>(words.next_remembered).fetch_add(1, cuda::std::memory_order_relaxed);
      device_atomic<u64>(words.remembered[slot % LaunchWords::remembered_launches])
          .store(me, cuda::std::memory_order_release);
      return refuse_block(pool, words, true);
    }
    // Taken: the previous holder released the record (or a reset left it held). Atomic, as all launch-word accesses.
    device_atomic<cuda::std::uint64_t>(words.verdict).store(verdict_pending, cuda::std::memory_order_relaxed);
    device_atomic<cuda::std::int32_t>(words.finished).store(0, cuda::std::memory_order_relaxed);
    // The counter numbers the tiles after the grid's first chunks (block b's own: chunk b, run_operation).
    device_atomic<cuda::std::int64_t>(words.next_tile)
        .store(ctx.blocks * ctx.warps * StashPolicy::tiles_per_warp_claim, cuda::std::memory_order_relaxed);
    generation.store(pool_generation, cuda::std::memory_order_relaxed);
    owner.store(me, cuda::std::memory_order_release);
    return Arrival::owner;
  }
}

/// What a warp starts its copies with: the verdict and the plan's size.
struct Start {
  PlanSize plan;
  cuda::std::int32_t verdict;
  cuda::std::int32_t unused;
};

/// The verdict word: the verdict in bits 0-1, the plan's tiles in bits 2-32 and its items in bits 33-63 (each under
/// 2^31: max_plan_tiles, WorkTotals), so that a block reads its start in the load that finds the verdict.
PAGESTASH_HOST_DEVICE constexpr cuda::std::uint64_t verdict_word(cuda::std::int32_t verdict, const PlanSize& plan) {
  using u64 = cuda::std::uint64_t;
  return static_cast<u64>(verdict) | static_cast<u64>(plan.tiles) << 2 | static_cast<u64>(plan.items) << 33;
}
PAGESTASH_HOST_DEVICE constexpr Start start_of(cuda::std::uint64_t word, int tile_shift) {
  Start s{};
  s.verdict = static_cast<cuda::std::int32_t>(word & 3);
  s.plan.tiles = static_cast<cuda::std::int64_t>(word >> 2 & 0x7FFFFFFF);
  s.plan.items = static_cast<cuda::std::int32_t>(word >> 33);
  s.plan.tile_shift = tile_shift;
  return s;
}
// The word holds the largest plan whole.
static_assert(start_of(verdict_word(verdict_copy, PlanSize{max_plan_tiles, 0x7FFFFFFF, 0}), 0).plan.tiles ==
              max_plan_tiles);
static_assert(start_of(verdict_word(verdict_skip, PlanSize{max_plan_tiles, 0x7FFFFFFF, 0}), 0).plan.items ==
              0x7FFFFFFF);
static_assert(start_of(verdict_word(verdict_skip, PlanSize{max_plan_tiles, 0x7FFFFFFF, 0}), 0).verdict == verdict_skip);

}  // namespace detail

/// Moves `cursor` to the item that owns `tile`, as seek_item does, with the warp's lanes: each round every lane reads
/// one item of the range left, and the range shrinks 32-fold (a binary search takes log2 of the items). The last round
/// (32 or 64 items left) reads every item left and the one after each lane's, so that the lane holding the answer
/// knows it and hands on its tiles and grid: a plan of up to 64 items takes one round, up to 2048 two. Every lane of
/// the warp calls it, with the same tile.
template <class Lanes>
PAGESTASH_HOST_DEVICE void seek_item_on_warp(const Lanes& lanes, const TileWork& w, ItemCursor& c,
                                             cuda::std::int32_t tile) {
  if constexpr (cuda::std::is_same_v<Lanes, SerialTeam>) {  // one lane (a serial context): the binary search
    detail::seek_item(w, c, tile);
  } else {
    using u32 = cuda::std::uint32_t;
    constexpr int last_step = 2;
    cuda::std::int32_t lo = 0, hi = w.item_count;  // the answer is in [lo, hi); items[lo].first_tile <= tile
    for (;;) {
      const cuda::std::int32_t step = (hi - lo + lanes.size() - 1) / lanes.size();
      const cuda::std::int32_t at = lo + lanes.rank() * step;
      if (step <= last_step) {
        u32 found[5] = {0, 0, 0, 0, 0};  // the item, its first tile, end and grid: the answer's lane's, 0 elsewhere
        cuda::std::int32_t first[last_step + 1];  // of items at, at + 1, ...: the end of the one before
        cuda::std::int64_t grid[last_step];       // of items at, at + 1, ...
        {
          const detail::OneRound together;
          PAGESTASH_UNROLL
          for (int k = 0; k <= last_step; ++k) {
            first[k] = static_cast<cuda::std::int32_t>(max_plan_tiles);
            if (k < last_step) grid[k] = -1;
            if (k <= step && at + k < w.item_count && at < hi) {
              detail::note_load(&w.items[at + k]);
              first[k] = static_cast<cuda::std::int32_t>(w.items[at + k].first_tile);
              if (k < last_step) grid[k] = w.items[at + k].grid;
            }
          }
        }
        PAGESTASH_UNROLL
        for (int k = 0; k < last_step; ++k) {
          if (k < step && at + k < hi && first[k] <= tile && tile < first[k + 1]) {
            found[0] = static_cast<u32>(at + k);
            found[1] = static_cast<u32>(first[k]);
            found[2] = static_cast<u32>(first[k + 1]);
            found[3] = static_cast<u32>(static_cast<cuda::std::uint64_t>(grid[k]));
            found[4] = static_cast<u32>(static_cast<cuda::std::uint64_t>(grid[k]) >> 32);
          }
        }
        lanes.max_over(found, lanes.size());
        c.item = static_cast<cuda::std::int32_t>(found[0]);
        c.first = static_cast<cuda::std::int32_t>(found[1]);
        c.end = static_cast<cuda::std::int32_t>(found[2]);
        c.grid = static_cast<cuda::std::int64_t>(static_cast<cuda::std::uint64_t>(found[4]) << 32 | found[3]);
        return;
      }
      u32 best[1] = {static_cast<u32>(lo)};
      if (at < hi) {
        detail::note_load(&w.items[at]);
        if (w.items[at].first_tile <= tile) best[0] = static_cast<u32>(at);
      }
      lanes.max_over(best, lanes.size());
      lo = static_cast<cuda::std::int32_t>(best[0]);
      hi = lo + step < hi ? lo + step : hi;
    }
  }
}

namespace detail {

/// A reload that does not restore poisons its destination (unless `options` say not to), split over the grid's threads.
template <class Traits, Operation Op, class Context>
PAGESTASH_HOST_DEVICE void poison_unrestored(const Context& ctx, const GroupedView<typename Traits::layout>& view,
                                             ReloadOptions options) {
  if (Op == Operation::reload && options.poison)
    poison_buffers<Traits>(view, ctx.block * ctx.team.size() + ctx.team.rank(), ctx.blocks * ctx.team.size());
}

}  // namespace detail

/// One launch of operation Op on `rec`, as thread (ctx.block, ctx.team.rank()) runs it.
template <class Traits, Operation Op, class Team, class Lanes>
PAGESTASH_HOST_DEVICE void run_operation(const GridContext<Team, Lanes>& ctx, const PoolRef& pool,
                                         const GroupedView<typename Traits::layout>& view, const RecordRef& rec,
                                         ReloadOptions options) {
  using namespace detail;  // the launch protocol's words and steps
  const Team& team = ctx.team;
  LaunchWords& words = rec.header->launch;

  const int tile_shift = tile_shift_for(pool.page_shift, StashPolicy::tile_shift);
  constexpr cuda::std::int64_t per_warp = StashPolicy::tiles_per_warp_claim;
  const cuda::std::int64_t chunk = ctx.warps * per_warp;
  // The look-ahead (stash/look_ahead.hpp): a stash's warps but the leader's read the view's counts while the leader
  // arrives (read-only to every launch, whichever holds the record), and, where the block joined, plan from them and
  // prefetch their first claim before the verdict. A reload's would read the record's counts and page ids, which
  // another launch may be writing until this one holds the record (docs/design.md, "Verdict"). `chunk` is a constant
  // on the device (device_grid_context).
  constexpr bool looking = Op == Operation::stash && !cuda::std::is_same_v<Lanes, SerialTeam>;
  bool ahead = false;
  if constexpr (looking) {
    ahead = ctx.warp != 0 && looks_ahead<Traits>(view);
    if (ahead) stage_counts<Traits>(ctx.lanes, view);
  }

  const Arrival arrival = team.share(team.leader() ? arrive(ctx, pool, words) : Arrival::joined);
  if (arrival == Arrival::refused) return poison_unrestored<Traits, Op>(ctx, view, options);

  Start start{};
  start.verdict = verdict_skip;
  if (arrival == Arrival::owner) {
    Begun begun{};
    if constexpr (Op == Operation::stash) begun = begin_stash<Traits>(team, pool, view, rec, tile_shift);
    if constexpr (Op == Operation::reload)
      begun = begin_reload<Traits>(team, pool, view, rec, options.zero_tail, tile_shift);
    if constexpr (Op == Operation::discard) discard_pages(team, pool, rec, record_kind<Traits>(view));
    start.verdict = begun.copy ? verdict_copy : verdict_skip;
    // The header and plan, by every thread, before the verdict: the barrier, then the leader's release store. This
    // block's threads read the plan's size the leader wrote before the barrier (not kept in registers through the
    // steps: a stash kernel spilled).
    team.publish();
    if (team.leader())
      device_atomic<cuda::std::uint64_t>(words.verdict)
          .store(verdict_word(start.verdict, begun.plan), cuda::std::memory_order_release);
    if (Op != Operation::discard && begun.copy) start.plan = plan_size(*rec.header);
  } else {
    if constexpr (looking) {
      const cuda::std::int64_t claim = ctx.block * chunk + ctx.warp * per_warp;
      if (ahead) look_ahead<Traits>(ctx.lanes, pool, view, tile_shift, claim, claim + per_warp);
    }
    // Each warp's first lane waits for the verdict, with the plan's size in its word, and hands both on (its lanes'
    // reads of the plan come after its acquire fence and the hand-off): no block barrier on the way to the first tile.
    if (ctx.lanes.rank() == 0) {
      const cuda::std::uint64_t word = spin_until(device_atomic<cuda::std::uint64_t>(words.verdict),
                                                  [](cuda::std::uint64_t v) { return (v & 3) != verdict_pending; });
      acquire_fence();  // the owner's header and plan
      start = start_of(word, tile_shift);
    }
    start = ctx.lanes.share(start);
  }
  const cuda::std::int32_t verdict = start.verdict;
  if (verdict == verdict_skip) poison_unrestored<Traits, Op>(ctx, view, options);

  if (Op != Operation::discard && verdict == verdict_copy) {
    const TileWork work = tile_work<Traits>(pool, view, rec, Op == Operation::stash, start.plan);
    // Tile indices are 32-bit (work_bounds caps a plan at 2^31 - 1); sums and claims 64-bit (they overshoot), clamped
    // (below). 64-bit indices left sm_90's gather 15 words in flight of 20 and cost sm_100 spills (check_kernels.py).
    const auto tiles = static_cast<cuda::std::int32_t>(start.plan.tiles);
    const auto below = [tiles](cuda::std::int64_t x) { return x < tiles ? static_cast<cuda::std::int32_t>(x) : tiles; };
    ItemCursor cursor;
    // Test, then claim: a block that comes late to a launch whose tiles are all claimed leaves after a load, not a
    // read-modify-write on the launch's line. The grid's first chunks are the blocks' own (block b's: chunk b); the
    // counter starts after them (arrive), so a plan they hold takes no read-modify-write at all. The leader reads the
    // counter as the chunk starts and claims the next chunk after its warp's first span (its two tiles where one span
    // holds them, else the first: a block holds at most half a chunk more than it copies): no warp's first load waits
    // on the claim, and the barrier that hands it on waits on its one round trip at most. A compressed kernel claims
    // before its tiles instead: its codec leaves no register for the flag and the compare through the first tile
    // (sm_100's FP16 -> FP8 1x128 stash spilled), one for the claim's result. (All claiming first, sm_100's packed
    // quantized stashes spilled: check_kernels.py.)
    constexpr bool claim_first = compression_of<Traits>::compressed;
    const device_atomic<cuda::std::int64_t> next(words.next_tile);
    for (cuda::std::int32_t first = below(ctx.block * chunk); first < tiles; first = team.share(first)) {
      // The leader's warp (warp 0) has a tile in every chunk: begin == first < tiles.
      const cuda::std::int32_t begin = below(first + ctx.warp * per_warp), end = below(begin + per_warp);
      const bool open = team.leader() && next.load(cuda::std::memory_order_relaxed) < tiles;
      first = tiles;
      if (claim_first && open) first = below(next.fetch_add(chunk, cuda::std::memory_order_relaxed));
      // Each chunk's first tile: its item found by the warp together, one round for up to 32 items, not a binary
      // search (a warp's chunks are a block's warps x tiles_per_warp_claim tiles apart: mostly in another item).
      // run_tile's seek then moves on from it. (Only where the tile leaves the cursor's item, sm_100's bulk BF16
      // stash spilled.)
      if (begin < end) seek_item_on_warp(ctx.lanes, work, cursor, begin);
      bool claim_after = !claim_first && open;
      for (cuda::std::int32_t t = begin; t < end;) {
        t = run_tile<Traits>(ctx.lanes, work, cursor, t, end);  // the warp's tiles, spanned where they can be
        if (claim_after) first = below(next.fetch_add(chunk, cuda::std::memory_order_relaxed)), claim_after = false;
      }
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
  // Released: the next launch's compare-exchange reads this and acquires. `owner` is cleared first: a graph replays a
  // kernel node with its %gridid, so the next launch to take the record may have this launch's id, and its other
  // blocks must wait for its reset words, not join on this launch's.
  if (team.leader()) {
    device_atomic<cuda::std::uint64_t>(words.owner).store(0, cuda::std::memory_order_relaxed);
    device_atomic<cuda::std::uint64_t>(words.arrival).fetch_and(~launch_held, cuda::std::memory_order_release);
  }
}

PAGESTASH_NAMESPACE_END
