#pragma once
// Host checks every executor makes before it runs or launches anything: each throws
// std::invalid_argument saying what does not match.

#include <pagestash/detail/errors.hpp>
#include <pagestash/stash/record.hpp>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

/// The memory-space check of every front door (both executors' operations, grow, shrink, report, end_step, reset, and
/// nccl.cuh's agree), in one wording: throws unless the pool is in the executor's memory.
inline void check_memory_space(const char* op, MemorySpace executor, MemorySpace pool) {
  if (pool != executor)
    detail::throw_invalid(std::string("pagestash::") + op,
                          std::string("the pool is in ") + name_of(pool) + " memory, the executor runs on " +
                              name_of(executor) +
                              " memory (pagestash::host takes a host pool, pagestash::on(stream) a device pool)");
}

/// report's check on either executor: the pool in the executor's memory, and somewhere to write.
inline void check_report(MemorySpace executor, const PagePool& pool, const PoolStats* dst) {
  check_memory_space("report", executor, pool.space());
  if (dst == nullptr) detail::throw_invalid("pagestash::report", "dst is null");
}

template <class Traits>
void check_pool_and_record(const char* op, MemorySpace executor, const PagePool& pool, const StashRecord<Traits>& rec) {
  check_memory_space(op, executor, pool.space());
  // Where an attached device object leaves an id unknown, the steps refuse it in memory.
  if (!rec.same_pool(pool))
    detail::throw_invalid("pagestash::" + std::string(op), "the record was made for another pool");
}

template <class Traits>
void check_stash(MemorySpace executor, const PagePool& pool, const GroupedView<typename Traits::layout>& v,
                 const StashRecord<Traits>& rec) {
  check_pool_and_record("stash", executor, pool, rec);
  validate<Traits>(v);
  // A host record's kind is read for free, when it is attached; a device record's stash writes its own, which its
  // reloads compare.
  if (!rec.stashable())
    detail::throw_invalid("pagestash::stash",
                          "the record was made for another kind (layout, buffer handling, "
                          "compression or shape) than this stash's");
  if (v.max_tokens != rec.max_tokens() || v.hidden != rec.hidden() || v.groups != rec.groups())
    detail::throw_invalid("pagestash::stash",
                          "the view's shape (max_tokens " + std::to_string(v.max_tokens) + ", hidden " +
                              std::to_string(v.hidden) + ", groups " + std::to_string(v.groups) +
                              ") differs from the record's (" + std::to_string(rec.max_tokens()) + ", " +
                              std::to_string(rec.hidden()) + ", " + std::to_string(rec.groups()) + ")");
}

/// Returns the most tiles a reload into `dest` can have (larger than the record's for a
/// larger destination, whose plan is checked to fit).
template <class Traits>
cuda::std::int64_t check_reload(MemorySpace executor, const PagePool& pool, const StashRecord<Traits>& rec,
                                const GroupedView<typename Traits::layout>& dest) {
  check_pool_and_record("reload", executor, pool, rec);
  validate<Traits>(dest, /*counts_read=*/false);
  if (dest.hidden != rec.hidden() || dest.groups != rec.groups())
    detail::throw_invalid("pagestash::reload", "the destination's hidden " + std::to_string(dest.hidden) +
                                                   " and groups " + std::to_string(dest.groups) +
                                                   " differ from the record's (" + std::to_string(rec.hidden()) + ", " +
                                                   std::to_string(rec.groups()) + ")");
  if (dest.max_tokens < rec.max_tokens())
    detail::throw_invalid("pagestash::reload", "the destination is too small: max_tokens " +
                                                   std::to_string(dest.max_tokens) + " < " +
                                                   std::to_string(rec.max_tokens()) + " of the record");
  return dest.max_tokens == rec.max_tokens() ? rec.max_tiles() : work_bounds<Traits>(dest, rec.page_shift()).tiles;
}

PAGESTASH_NAMESPACE_END
