#pragma once
// The host reference executor: stash, reload, discard and reset on a host-memory pool, by
// the same steps and per-tile copies the CUDA kernels run (stash/steps.hpp). Synchronous.
// Operations on different records may run at once on different threads against one pool.

#include <pagestash/execution/executor.hpp>
#include <pagestash/stash/checks.hpp>
#include <pagestash/stash/steps.hpp>

#include <thread>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN

namespace detail {

/// log2 of the host executor's tile size on `pool`.
inline int tile_shift_on_host(const PoolRef& pool) { return tile_shift_for(pool.page_shift, HostPolicy::tile_shift); }

/// Every tile of the plan, split over the executor's threads in consecutive ranges. A thread copies a line's run at a
/// time (copy_tile_pieces); a compressed stash's tiles are coded as on the device, by a team of one.
template <class Traits>
void run_tiles_on_host(const HostExecutor& ex, const TileWork& work, cuda::std::int64_t tiles) {
  auto threads = static_cast<cuda::std::int64_t>(ex.threads > 1 ? ex.threads : 1);
  if (ex.bytes_per_thread > 0) {
    const cuda::std::int64_t by_bytes = (tiles << work.tile_shift) / ex.bytes_per_thread;
    threads = by_bytes < 1 ? 1 : (by_bytes < threads ? by_bytes : threads);
  }
  auto run_share = [&](cuda::std::int64_t k) {
    ItemCursor cursor;
    for (auto t = static_cast<cuda::std::int32_t>(tiles * k / threads); t < tiles * (k + 1) / threads; ++t) {
      if constexpr (compression_of<Traits>::compressed) {
        run_tile<Traits>(SerialTeam{}, work, cursor, t);
      } else {
        const TileSpan s = resolve_tile(work, cursor, t);
        copy_tile_pieces(s, tile_op(work, cursor));
      }
    }
  };
  if (threads == 1) return run_share(0);
  std::vector<std::thread> workers;
  for (cuda::std::int64_t k = 1; k < threads; ++k) workers.emplace_back(run_share, k);
  run_share(0);
  for (auto& w : workers) w.join();
}

// The operations after the host checks, on the handles: what runs where the host cannot
// tell a record of another pool (the steps refuse it in memory; the tests run these so).

}  // namespace detail

template <class Traits>
void stash_on_host(const HostExecutor& ex, const PoolRef& pool, const GroupedView<typename Traits::layout>& view,
                   const RecordRef& rec) {
  using namespace detail;  // the steps and the tile loop
  const Begun begun = begin_stash<Traits>(SerialTeam{}, pool, view, rec, tile_shift_on_host(pool));
  if (begun.copy) run_tiles_on_host<Traits>(ex, tile_work<Traits>(pool, view, rec, true, begun.plan), begun.plan.tiles);
}

template <class Traits>
void reload_on_host(const HostExecutor& ex, const PoolRef& pool, const RecordRef& rec,
                    const GroupedView<typename Traits::layout>& dest, ReloadOptions options) {
  using namespace detail;  // the steps and the tile loop
  const Begun begun = begin_reload<Traits>(SerialTeam{}, pool, dest, rec, options.zero_tail, tile_shift_on_host(pool));
  if (!begun.copy) {
    if (options.poison) poison_buffers<Traits>(dest, 0, 1);
    return;
  }
  run_tiles_on_host<Traits>(ex, tile_work<Traits>(pool, dest, rec, false, begun.plan), begun.plan.tiles);
  end_reload(SerialTeam{}, pool, rec);
}

/// Moves the live bytes of every buffer Traits pages into pages of `pool`, and the kept
/// buffers into `rec`. See RecordState / RecordStatus::error for what happens when it cannot.
template <class Traits>
void stash(const HostExecutor& ex, PagePool& pool, const GroupedView<typename Traits::layout>& view,
           StashRecord<Traits>& rec) {
  check_stash(ex.memory, pool, view, rec);
  stash_on_host<Traits>(ex, pool.ref(), view, rec.ref());
}

/// Copies the record's bytes back into `dest` (same hidden and groups, max_tokens at least
/// the record's) and returns its pages to the pool.
template <class Traits>
void reload(const HostExecutor& ex, PagePool& pool, StashRecord<Traits>& rec,
            const GroupedView<typename Traits::layout>& dest, ReloadOptions options = {}) {
  check_reload(ex.memory, pool, rec, dest);
  reload_on_host<Traits>(ex, pool.ref(), rec.ref(), dest, options);
}

/// Returns the record's pages without copying (a backward that is skipped).
template <class Traits>
void discard(const HostExecutor& ex, PagePool& pool, StashRecord<Traits>& rec) {
  check_pool_and_record("discard", ex.memory, pool, rec);
  discard_pages(SerialTeam{}, pool.ref(), rec.ref(), record_kind<Traits>(rec.shape()));
}

/// Writes the pool's flags and counters into *dst (see PoolStats). Synchronous, like every
/// host operation; operations on other threads may run meanwhile.
inline void report(const HostExecutor& ex, const PagePool& pool, PoolStats* dst) {
  check_report(ex.memory, pool, dst);
  write_report(SerialTeam{}, pool.ref(), dst);
}

/// Checks, at the end of a step, that every page came back (pool/free_list.hpp, check_balance): raises `unbalanced` if
/// a record of the step still holds pages. Call it after the step's last reload or discard, before report().
inline void end_step(const HostExecutor& ex, PagePool& pool) {
  check_memory_space("end_step", ex.memory, pool.space());
  check_balance(SerialTeam{}, pool.ref());
}

/// Frees every page, clears the flags and statistics; records stashed before become stale.
/// No operation may be in flight on the pool.
inline void reset(const HostExecutor& ex, PagePool& pool) {
  check_memory_space("reset", ex.memory, pool.space());
  reset_pool(SerialTeam{}, pool.ref());
}

/// Grows a pool with a reserve (PoolConfig) to device_pages and host_pages: no fewer than it has, none beyond its
/// reserve. Backs the memory (out of memory: throws, the pool as it was), then puts the new pages' ids on the free
/// stacks under the pool's lock: operations may run meanwhile, and no page, id or address moves.
inline void grow(const HostExecutor& ex, PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
  check_memory_space("grow", ex.memory, pool.space());
  detail::PoolResize::grow(pool, device_pages, host_pages,
                           [&] { grow_pages(SerialTeam{}, pool.ref(), device_pages, host_pages); });
}

/// Shrinks a pool with a reserve to device_pages and host_pages (no more than it has) when every page is back (after
/// a balanced end_step), and gives back the memory past them. Refused (std::invalid_argument, nothing changed) while a
/// record holds pages.
inline void shrink(const HostExecutor& ex, PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
  check_memory_space("shrink", ex.memory, pool.space());
  detail::PoolResize::shrink(pool, device_pages, host_pages, [&] {
    shrink_pages(SerialTeam{}, pool.ref(), device_pages, host_pages);
    return pool.ref().state->resized;
  });
}

PAGESTASH_NAMESPACE_END
