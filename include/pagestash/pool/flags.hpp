#pragma once
// What a training loop acts on without a device-wide sync: the pool's sticky flags, in a stable layout at the start of
// the pool's memory (PagePool::flags() points at them), and the snapshot an executor writes into the caller's memory
// (report()). Two flags decide: `overflow` (capacity: rerun the step without paging, or with a larger pool after reset)
// and `error` (misuse: a bug to report; its kind has a flag of its own). Either way the step's results cannot be
// trusted.
//
// Every flag is 0 or 1 and sticky until reset, so that flags from several ranks combine with a max
// (pagestash/nccl.cuh's agree() all-reduces them in place).

#include <pagestash/config.hpp>

#include <cuda/std/cstdint>

#include <cassert>
#include <stdexcept>

PAGESTASH_NAMESPACE_BEGIN

/// The flags, one table: each word's name, category and meaning, in the words' order. The fields, Flag, flag_names,
/// flag_meanings, category_of() and decide() are made from it, so that C++ and Python name and judge a kind of failure
/// one way.
#define PAGESTASH_POOL_FLAGS(X)                                                                                    \
  X(overflow, capacity,                                                                                            \
    "capacity: a stash found no room (or found this flag set and did nothing); rerun the step without paging, or " \
    "with a larger pool")                                                                                          \
  X(error, misuse, "misuse, of one of the kinds below: the operation did nothing; a bug to report")                \
  X(host_spill, info, "a stash used host pages (not a failure)")                                                   \
  X(bad_counts, misuse,                                                                                            \
    "a stash found a count its tensor cannot hold (negative, beyond the capacity, or off the packed alignment)")   \
  X(still_stashed, misuse, "a stash into a record that still held pages")                                          \
  X(not_stashed, misuse, "a reload of a record that holds no pages (a double reload, or one after a discard)")     \
  X(stale, misuse, "a reload of a record stashed before the pool's reset")                                         \
  X(refused_launch, misuse, "a launch on a record while another launch on it was in flight")                       \
  X(foreign_record, misuse, "an operation with a record made for another pool")                                    \
  X(record_mismatch, misuse,                                                                                       \
    "an operation whose layout, buffer handling, compression or shape is not the one its record was made for")     \
  X(unbalanced, misuse,                                                                                            \
    "at the step's end (end_step) pages were still held: a record was neither reloaded nor discarded (a leak)")

/// What a raised flag says of the step: rerun it without paging, a bug (rerun, report), nothing.
enum class FlagCategory : cuda::std::int32_t { capacity, misuse, info };

/// A kind of failure, one per PoolFlags word (word_of), and `none`: no failure, 0 as success is in CUDA's status codes.
/// A record says with one of these why its last operation did nothing (RecordStatus::error).
enum class Flag : cuda::std::int32_t {
  none = 0,
#define PAGESTASH_FLAG_ENUMERATOR(name, category, meaning) name,
  PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_ENUMERATOR)
#undef PAGESTASH_FLAG_ENUMERATOR
};

/// The index of a kind's PoolFlags word, and the kind of a word.
PAGESTASH_HOST_DEVICE constexpr int word_of(Flag kind) { return static_cast<int>(kind) - 1; }
PAGESTASH_HOST_DEVICE constexpr Flag flag_at(int word) { return static_cast<Flag>(word + 1); }

struct PoolFlags {
#define PAGESTASH_FLAG_FIELD(name, category, meaning) cuda::std::int32_t name;
  PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_FIELD)
#undef PAGESTASH_FLAG_FIELD

  /// The word of one kind. `none` has no word: asking for it is a bug, which throws on the host and fails an assert on
  /// the device.
  PAGESTASH_HOST_DEVICE cuda::std::int32_t& operator[](Flag kind) {
    switch (kind) {
#define PAGESTASH_FLAG_CASE(name, category, meaning) \
  case Flag::name: return name;
      PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_CASE)
#undef PAGESTASH_FLAG_CASE
      case Flag::none: break;
    }
#ifdef __CUDA_ARCH__
    assert(kind != Flag::none);  // a debug build traps; the library never asks for none
    return error;
#else
    throw std::logic_error("PoolFlags[Flag::none]: `none` has no flag word");
#endif
  }
};

/// The flags' names and meanings, in the order of PoolFlags' words (for tools that read the words).
inline constexpr const char* flag_names[] = {
#define PAGESTASH_FLAG_NAME(name, category, meaning) #name,
    PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_NAME)
#undef PAGESTASH_FLAG_NAME
};
inline constexpr const char* flag_meanings[] = {
#define PAGESTASH_FLAG_MEANING(name, category, meaning) meaning,
    PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_MEANING)
#undef PAGESTASH_FLAG_MEANING
};
inline constexpr int flag_count = sizeof(flag_names) / sizeof(flag_names[0]);
static_assert(sizeof(PoolFlags) == flag_count * sizeof(cuda::std::int32_t),
              "PoolFlags is flag_count int32 words, in the table's order: its layout is documented API");

inline const char* name_of(Flag kind) { return kind == Flag::none ? "none" : flag_names[word_of(kind)]; }

/// The category of a kind (the table's; `none`, no failure, is info).
PAGESTASH_HOST_DEVICE constexpr FlagCategory category_of(Flag kind) {
  switch (kind) {  // a switch, not an array: an array indexed at run time lives on the kernels' stack
#define PAGESTASH_FLAG_CATEGORY_CASE(name, category, meaning) \
  case Flag::name: return FlagCategory::category;
    PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_CATEGORY_CASE)
#undef PAGESTASH_FLAG_CATEGORY_CASE
    case Flag::none: break;
  }
  return FlagCategory::info;
}

inline const char* name_of(FlagCategory c) {
  return c == FlagCategory::capacity ? "capacity" : c == FlagCategory::misuse ? "misuse" : "info";
}

/// The pool's counters, one table: type, name, meaning. PoolCounters' fields and for_each_counter (the names tools
/// print, e.g. the Python package's dicts) are made from it.
#define PAGESTASH_POOL_COUNTERS(X)                                                                               \
  X(cuda::std::int64_t, device_pages_free, "ids on the device stack")                                            \
  X(cuda::std::int64_t, host_pages_free, "ids on the host stack")                                                \
  X(cuda::std::int64_t, peak_pages_held, "device + host pages held at once, at most")                            \
  X(cuda::std::int64_t, peak_device_pages_held, "device pages held at once, at most")                            \
  X(cuda::std::int64_t, live_bytes, "bytes held in pages now (segments padded to 16)")                           \
  X(cuda::std::int64_t, peak_live_bytes, "most bytes held in pages at once")                                     \
  X(cuda::std::int64_t, stashes, "stashes that took pages")                                                      \
  X(cuda::std::int64_t, reloads, "reloads and discards that returned pages")                                     \
  X(cuda::std::int64_t, overflows, "operations that found no room, or the overflow flag set")                    \
  X(cuda::std::int64_t, errors, "operations refused as misuse")                                                  \
  X(cuda::std::int64_t, pages_held_at_step_end, "pages still held when end_step last ran (0: balanced)")         \
  X(cuda::std::int64_t, device_pages, "device pages the pool has (its config's, then as grow, shrink leave it)") \
  X(cuda::std::int64_t, host_pages, "host pages the pool has (the same)")                                        \
  X(cuda::std::int32_t, generation, "resets so far")

/// The pool's counters, as the pool's memory holds them (detail::PoolState, pool/page_pool.hpp) and as a snapshot
/// (PoolStats) carries them. Trivial: value-initialize it (PoolCounters{}) for zeros.
struct PoolCounters {
#define PAGESTASH_COUNTER_FIELD(type, name, meaning) type name;
  PAGESTASH_POOL_COUNTERS(PAGESTASH_COUNTER_FIELD)
#undef PAGESTASH_COUNTER_FIELD
};

/// Calls f(name, value) for each counter, in the struct's order.
template <class F>
void for_each_counter(const PoolCounters& c, F&& f) {
#define PAGESTASH_COUNTER_VISIT(type, name, meaning) f(#name, cuda::std::int64_t{c.name});
  PAGESTASH_POOL_COUNTERS(PAGESTASH_COUNTER_VISIT)
#undef PAGESTASH_COUNTER_VISIT
}

/// What every rank does after a step, from the flags all ranks agreed on.
enum class StepDecision : cuda::std::int32_t {
  keep = 0,                  ///< nothing failed: keep the step
  rerun_without_paging = 1,  ///< overflow somewhere: reset the pool, rerun the step without paging (or a larger pool)
  report_error = 2,          ///< misuse somewhere: a bug; rerun to keep training, and report the kinds
};

inline const char* name_of(StepDecision d) {
  switch (d) {
    case StepDecision::keep: return "keep";
    case StepDecision::rerun_without_paging: return "rerun_without_paging";
    case StepDecision::report_error: return "report_error";
  }
  return "?";
}

/// What a raised flag of a category decides: the step's decision is the most severe of its raised flags' (misuse first:
/// it is a bug even where capacity also ran out).
PAGESTASH_HOST_DEVICE constexpr StepDecision decision_of(FlagCategory c) {
  return c == FlagCategory::misuse     ? StepDecision::report_error
         : c == FlagCategory::capacity ? StepDecision::rerun_without_paging
                                       : StepDecision::keep;
}

/// The decision for agreed flags, from the table's categories.
PAGESTASH_HOST_DEVICE constexpr StepDecision decide(const PoolFlags& agreed) {
  StepDecision d = StepDecision::keep;
#define PAGESTASH_FLAG_DECIDE(name, category, meaning) \
  if (agreed.name != 0 && decision_of(FlagCategory::category) > d) d = decision_of(FlagCategory::category);
  PAGESTASH_POOL_FLAGS(PAGESTASH_FLAG_DECIDE)
#undef PAGESTASH_FLAG_DECIDE
  return d;
}

PAGESTASH_NAMESPACE_END
