#pragma once
// The pool's mutable state and the steps that change it, written once for every team (detail/team.hpp): the host
// executor and the kernels take and return pages with the same code.
//
// Free pages sit on two stacks of page ids, one for device pages (ids [0, D)) and one for host pages (ids [D, D + H)).
// A stash takes the pages it needs from the top of the device stack, and the rest from the host stack; a reload pushes
// them back. A short critical section guarded by one spin lock (device-scope acquire/release) makes the stacks safe for
// stashes and reloads of different records running at once on different CUDA streams or host threads; the argument is
// in docs/design.md, "Memory ordering". The caller takes the lock (a discard's leader in the round of its checks of the
// record); take_pages and return_pages release it.

#include <pagestash/pool/page_pool.hpp>

#include <cuda/std/cstdint>

PAGESTASH_NAMESPACE_BEGIN

namespace detail {

/// A team's leader takes the pool's lock. Test-and-test-and-set: the exchange acquires (the one that finds the lock
/// free synchronises with its last holder's release), and waiters poll with relaxed loads (an acquire per poll would
/// invalidate the SM's L1 each time).
PAGESTASH_HOST_DEVICE inline void acquire_pool_lock(const PoolRef& pool) {
  const device_atomic<cuda::std::int32_t> lock(pool.state->lock);
  while (lock.exchange(1, cuda::std::memory_order_acquire) != 0)
    spin_until(lock, [](cuda::std::int32_t held) { return held == 0; });
}

template <class Team>
PAGESTASH_HOST_DEVICE void lock_pool(const Team& team, const PoolRef& pool) {
  if (team.leader()) acquire_pool_lock(pool);
  team.sync();
}

template <class Team>
PAGESTASH_HOST_DEVICE void unlock_pool(const Team& team, const PoolRef& pool) {
  team.publish();  // every thread's stack writes before the release
  if (team.leader()) device_atomic<cuda::std::int32_t>(pool.state->lock).store(0, cuda::std::memory_order_release);
}

/// Records an operation that found no room: sets the sticky overflow flag and counts it. Plain atomics, no lock.
PAGESTASH_HOST_DEVICE inline void raise_overflow(const PoolRef& pool) {
  device_atomic<cuda::std::int32_t>(pool.state->flags.overflow).store(1, cuda::std::memory_order_relaxed);
  device_atomic<cuda::std::int64_t>(pool.state->counters.overflows).fetch_add(1, cuda::std::memory_order_relaxed);
}

/// Records an operation refused as misuse: sets the sticky error flag and its kind's, and counts it (unless `count` is
/// false: a launch's later blocks). Plain atomics, no lock.
PAGESTASH_HOST_DEVICE inline void raise_error(const PoolRef& pool, Flag kind, bool count = true) {
  device_atomic<cuda::std::int32_t>(pool.state->flags[kind]).store(1, cuda::std::memory_order_relaxed);
  device_atomic<cuda::std::int32_t>(pool.state->flags.error).store(1, cuda::std::memory_order_relaxed);
  if (count)
    device_atomic<cuda::std::int64_t>(pool.state->counters.errors).fetch_add(1, cuda::std::memory_order_relaxed);
}

PAGESTASH_HOST_DEVICE inline bool overflow_raised(const PoolRef& pool) {
  return device_atomic<cuda::std::int32_t>(pool.state->flags.overflow).load(cuda::std::memory_order_relaxed) != 0;
}

enum class TakeResult : cuda::std::int32_t { taken = 0, overflow_set = 1, pool_full = 2 };

struct Taken {
  TakeResult result;
  cuda::std::int32_t generation;
  cuda::std::int64_t device_pages;  ///< ids[0, device_pages) are device pages, the rest host pages
};

/// With the pool's lock held (the leader's): takes `need` pages into ids[0, need), device pages first, then host pages,
/// and releases the lock. Does nothing if the overflow flag is set; if the pool cannot give `need` pages, sets the flag
/// and takes nothing. `live_bytes` feeds the statistics.
template <class Team>
PAGESTASH_HOST_DEVICE Taken take_pages(const Team& team, const PoolRef& pool, cuda::std::int64_t need,
                                       cuda::std::int64_t live_bytes, cuda::std::int32_t* ids) {
  PoolState& c = *pool.state;
  PoolCounters& n = c.counters;
  Taken t{TakeResult::taken, 0, 0};
  cuda::std::int64_t device_top = 0, host_top = 0;
  if (team.leader()) {
    bool overflow = false;
    {
      const OneRound together;  // the counters and the overflow flag
      note_load(&n);
      t.generation = n.generation;
      overflow = overflow_raised(pool);
    }
    if (overflow) {
      t.result = TakeResult::overflow_set;
    } else {
      t.device_pages = need < n.device_pages_free ? need : n.device_pages_free;
      const cuda::std::int64_t from_host = need - t.device_pages;
      if (from_host > n.host_pages_free) {
        t.result = TakeResult::pool_full;
        // At once, so that a stash racing with this one skips too.
        device_atomic<cuda::std::int32_t>(c.flags.overflow).store(1, cuda::std::memory_order_relaxed);
      } else {
        n.device_pages_free -= t.device_pages;
        n.host_pages_free -= from_host;
        if (from_host > 0)
          device_atomic<cuda::std::int32_t>(c.flags.host_spill).store(1, cuda::std::memory_order_relaxed);
        const cuda::std::int64_t used = n.device_pages + n.host_pages - n.device_pages_free - n.host_pages_free;
        const cuda::std::int64_t device_used = n.device_pages - n.device_pages_free;
        n.peak_pages_held = used > n.peak_pages_held ? used : n.peak_pages_held;
        n.peak_device_pages_held = device_used > n.peak_device_pages_held ? device_used : n.peak_device_pages_held;
        n.live_bytes += live_bytes;
        n.peak_live_bytes = n.live_bytes > n.peak_live_bytes ? n.live_bytes : n.peak_live_bytes;
        ++n.stashes;
      }
    }
    device_top = n.device_pages_free;
    host_top = n.host_pages_free;
  }
  t = team.share(t);
  device_top = team.share(device_top);
  host_top = team.share(host_top);
  if (t.result == TakeResult::taken) {
    // The ids just above the new tops are ours; copy them before a push can reuse the slots.
    for (cuda::std::int64_t i = team.rank(); i < need; i += team.size()) {
      note_load(i < t.device_pages ? &pool.device_stack[device_top + i]
                                   : &pool.host_stack[host_top + i - t.device_pages]);
      ids[i] = i < t.device_pages ? pool.device_stack[device_top + i] : pool.host_stack[host_top + i - t.device_pages];
    }
  }
  unlock_pool(team, pool);
  return t;
}

/// With the pool's lock held (the leader's): pushes ids[0, count) back, ids[0, device_pages) onto the device stack and
/// the rest onto the host stack, in any order relative to other records, and releases the lock.
template <class Team>
PAGESTASH_HOST_DEVICE void return_pages(const Team& team, const PoolRef& pool, const cuda::std::int32_t* ids,
                                        cuda::std::int64_t count, cuda::std::int64_t device_pages,
                                        cuda::std::int64_t live_bytes) {
  PoolCounters& n = pool.state->counters;
  cuda::std::int64_t device_top = 0, host_top = 0;
  if (team.leader()) {
    note_load(&n);
    device_top = n.device_pages_free;
    host_top = n.host_pages_free;
    n.device_pages_free += device_pages;
    n.host_pages_free += count - device_pages;
    n.live_bytes -= live_bytes;
    ++n.reloads;
  }
  device_top = team.share(device_top);
  host_top = team.share(host_top);
  for (cuda::std::int64_t i = team.rank(); i < count; i += team.size()) {
    note_load(&ids[i]);
    if (i < device_pages) {
      pool.device_stack[device_top + i] = ids[i];
    } else {
      pool.host_stack[host_top + i - device_pages] = ids[i];
    }
  }
  unlock_pool(team, pool);
}

/// The flags, read one word at a time (other teams raise them with atomics, without the lock).
PAGESTASH_HOST_DEVICE inline PoolFlags load_flags(const PoolRef& pool) {
  PoolFlags f{};
  PAGESTASH_UNROLL
  for (int k = 0; k < flag_count; ++k) {
    const Flag kind = flag_at(k);
    f[kind] = device_atomic<cuda::std::int32_t>(pool.state->flags[kind]).load(cuda::std::memory_order_relaxed);
  }
  return f;
}

}  // namespace detail

/// Writes the flags and counters into `dst` (the caller's memory), the counters under the lock: one snapshot.
template <class Team>
PAGESTASH_HOST_DEVICE void write_report(const Team& team, const PoolRef& pool, PoolStats* dst) {
  using namespace detail;  // the pool's atomics and locks
  lock_pool(team, pool);
  if (team.leader()) {
    PoolStats r{};
    const PoolCounters& n = pool.state->counters;
    r.config = {pool.page_bytes, n.device_pages, n.host_pages, pool.reserved_device_pages, pool.reserved_host_pages};
    // Atomic loads, as some counters are raised without the lock.
#define PAGESTASH_LOAD_COUNTER(type, name, meaning) \
  r.name = device_atomic<type>(pool.state->counters.name).load(cuda::std::memory_order_relaxed);
    PAGESTASH_POOL_COUNTERS(PAGESTASH_LOAD_COUNTER)
#undef PAGESTASH_LOAD_COUNTER
    r.flags = load_flags(pool);
    *dst = r;
  }
  unlock_pool(team, pool);
}

/// The end of a step, once every record of it was reloaded or discarded: counts the pages still held, and raises
/// `unbalanced` (misuse: a record was forgotten, its pages leak) when there are any.
template <class Team>
PAGESTASH_HOST_DEVICE void check_balance(const Team& team, const PoolRef& pool) {
  detail::lock_pool(team, pool);
  if (team.leader()) {
    PoolCounters& n = pool.state->counters;
    n.pages_held_at_step_end = n.device_pages + n.host_pages - n.device_pages_free - n.host_pages_free;
    if (n.pages_held_at_step_end != 0) detail::raise_error(pool, Flag::unbalanced);
  }
  detail::unlock_pool(team, pool);
}

/// Grows the pool to device_pages and host_pages (backed already: PoolResize::back): the new pages' ids go on top of
/// the free stacks, under the lock, so that operations may run meanwhile; no held page or id moves. Fewer pages than
/// the pool has change nothing.
template <class Team>
PAGESTASH_HOST_DEVICE void grow_pages(const Team& team, const PoolRef& pool, cuda::std::int64_t device_pages,
                                      cuda::std::int64_t host_pages) {
  detail::lock_pool(team, pool);
  PoolCounters& n = pool.state->counters;
  cuda::std::int64_t had[4] = {};  // pages and free ids, device then host
  if (team.leader())
    had[0] = n.device_pages, had[1] = n.device_pages_free, had[2] = n.host_pages, had[3] = n.host_pages_free;
  const cuda::std::int64_t d = team.share(had[0]), d_free = team.share(had[1]), h = team.share(had[2]),
                           h_free = team.share(had[3]);
  for (cuda::std::int64_t i = d + team.rank(); i < device_pages; i += team.size())
    pool.device_stack[d_free + i - d] = static_cast<cuda::std::int32_t>(i);
  for (cuda::std::int64_t i = h + team.rank(); i < host_pages; i += team.size())
    pool.host_stack[h_free + i - h] = static_cast<cuda::std::int32_t>(pool.reserved_device_pages + i);
  if (team.leader()) {
    if (device_pages > d) n.device_pages_free += device_pages - d, n.device_pages = device_pages;
    if (host_pages > h) n.host_pages_free += host_pages - h, n.host_pages = host_pages;
  }
  detail::unlock_pool(team, pool);
}

/// Shrinks the pool to device_pages and host_pages if every page is back (the end of a balanced step): the free stacks
/// then hold the ids of the pages kept, in order, and `resized` says 1; else nothing changes and it says 0 (refused).
/// Under the lock. The memory past the pages kept is given back afterwards (PoolResize::give_back).
template <class Team>
PAGESTASH_HOST_DEVICE void shrink_pages(const Team& team, const PoolRef& pool, cuda::std::int64_t device_pages,
                                        cuda::std::int64_t host_pages) {
  detail::lock_pool(team, pool);
  PoolCounters& n = pool.state->counters;
  bool all_back = false;
  if (team.leader())
    all_back = n.device_pages_free == n.device_pages && n.host_pages_free == n.host_pages &&
               device_pages <= n.device_pages && host_pages <= n.host_pages;
  if (team.share(all_back)) detail::fill_free_stacks(team, pool, device_pages, host_pages);
  if (team.leader()) {
    if (all_back) {
      n.device_pages = n.device_pages_free = device_pages;
      n.host_pages = n.host_pages_free = host_pages;
    }
    pool.state->resized = all_back ? 1 : 0;
  }
  detail::unlock_pool(team, pool);
}

PAGESTASH_NAMESPACE_END
