#pragma once
// What a training loop acts on without a device-wide sync: the pool's sticky flags, in a
// stable layout at the start of the pool's counters (PagePool::flags() points at them), and
// the report an executor writes into the caller's memory (report()).
//
//   overflow  capacity: a stash found no room (or found the flag set and did nothing). The
//             step's results cannot be trusted; rerun it without paging, or with a larger
//             pool after reset.
//   error     misuse: a bug to report (its kinds below). The operation did nothing; the
//             step's results cannot be trusted either.
//
// Every field is 0 or 1 and sticky until reset, so that flags from several ranks combine
// with a max (pagestash/nccl.cuh's agree() all-reduces them in place).

#include <pagestash/config.hpp>

#include <cuda/std/cstdint>

PAGESTASH_NAMESPACE_BEGIN

struct PoolFlags {
  cuda::std::int32_t overflow;        ///< capacity: rerun the step without paging, or with a larger pool
  cuda::std::int32_t error;           ///< misuse: any of the kinds below
  cuda::std::int32_t host_spill;      ///< some stash used host pages (not a failure)
  cuda::std::int32_t bad_counts;      ///< error: a stash found a count its view cannot hold
  cuda::std::int32_t still_stashed;   ///< error: a stash into a record that still holds pages
  cuda::std::int32_t not_stashed;     ///< error: a reload of a record that holds no pages
  cuda::std::int32_t stale;           ///< error: a reload of a record stashed before a reset
  cuda::std::int32_t refused_launch;  ///< error: a launch on a record with another launch in flight
  cuda::std::int32_t foreign_record;  ///< error: an operation with a record made for another pool
};
static_assert(sizeof(PoolFlags) == 36, "PoolFlags is 9 int32 words: its layout is documented API");

/// The flags' names, in the order of PoolFlags' words (for tools that read the words).
inline constexpr const char* flag_names[] = {"overflow",    "error", "host_spill",     "bad_counts",    "still_stashed",
                                             "not_stashed", "stale", "refused_launch", "foreign_record"};
static_assert(sizeof(flag_names) / sizeof(flag_names[0]) == sizeof(PoolFlags) / sizeof(cuda::std::int32_t));

/// The kinds of misuse (each a PoolFlags field).
enum class ErrorKind : cuda::std::int32_t {
  bad_counts,
  still_stashed,
  not_stashed,
  stale,
  refused_launch,
  foreign_record,
};

/// The flag of one kind of misuse.
PAGESTASH_HOST_DEVICE inline cuda::std::int32_t& flag_of(PoolFlags& f, ErrorKind kind) {
  switch (kind) {
    case ErrorKind::bad_counts: return f.bad_counts;
    case ErrorKind::still_stashed: return f.still_stashed;
    case ErrorKind::not_stashed: return f.not_stashed;
    case ErrorKind::stale: return f.stale;
    case ErrorKind::refused_launch: return f.refused_launch;
    default: return f.foreign_record;
  }
}

/// The pool's counters as the caller gets them: one struct for a report (PoolReport) and
/// for what stats() reads back (PoolStats). Trivial, as a report lives in device memory:
/// value-initialize it (PoolCounts{}) for zeros. (The pool's memory keeps them in
/// PoolCounters, pool/free_list.hpp, in the order its steps are compiled for.)
struct PoolCounts {
  cuda::std::int64_t device_pages_free;       ///< ids on the device stack
  cuda::std::int64_t host_pages_free;         ///< ids on the host stack
  cuda::std::int64_t peak_pages_used;         ///< device + host pages held at once, at most
  cuda::std::int64_t peak_device_pages_used;
  cuda::std::int64_t live_bytes;              ///< bytes held in pages now (segments padded to 16)
  cuda::std::int64_t peak_live_bytes;         ///< most bytes held in pages at once
  cuda::std::int64_t stashes;                 ///< stashes that took pages
  cuda::std::int64_t reloads;                 ///< reloads and discards that returned pages
  cuda::std::int64_t overflows;               ///< operations that found no room, or the overflow flag set
  cuda::std::int64_t errors;                  ///< operations refused as misuse
  cuda::std::int32_t generation;              ///< resets so far
};

/// Calls f(name, value) for each counter, in the struct's order: the one list of their
/// names, for tools that print or export them (the Python package's dicts).
template <class F>
void for_each_count(const PoolCounts& c, F&& f) {
  f("device_pages_free", c.device_pages_free);
  f("host_pages_free", c.host_pages_free);
  f("peak_pages_used", c.peak_pages_used);
  f("peak_device_pages_used", c.peak_device_pages_used);
  f("live_bytes", c.live_bytes);
  f("peak_live_bytes", c.peak_live_bytes);
  f("stashes", c.stashes);
  f("reloads", c.reloads);
  f("overflows", c.overflows);
  f("errors", c.errors);
  f("generation", cuda::std::int64_t{c.generation});
}

/// The flags and counters, as report() writes them into the caller's memory (pinned,
/// mapped or device) in stream order: no device-wide sync, no allocation.
struct PoolReport : PoolCounts {
  PoolFlags flags;
};

/// What every rank does after a step, from the flags all ranks agreed on.
enum class StepDecision : cuda::std::int32_t {
  keep = 0,                 ///< nothing failed: keep the step
  rerun_without_paging = 1, ///< overflow somewhere: reset the pool, run the step again without paging (or with a larger pool)
  report_error = 2,         ///< misuse somewhere: a bug; rerun to keep training, and report the kinds
};

inline const char* name_of(StepDecision d) {
  switch (d) {
    case StepDecision::keep: return "keep";
    case StepDecision::rerun_without_paging: return "rerun_without_paging";
    case StepDecision::report_error: return "report_error";
  }
  return "?";
}

/// The decision for agreed flags (misuse first: it is a bug even where capacity also ran out).
PAGESTASH_HOST_DEVICE constexpr StepDecision decide(const PoolFlags& agreed) {
  return agreed.error != 0 ? StepDecision::report_error
                           : (agreed.overflow != 0 ? StepDecision::rerun_without_paging : StepDecision::keep);
}

PAGESTASH_NAMESPACE_END
