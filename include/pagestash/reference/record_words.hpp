#pragma once
// A record header's words, for tests that compare or forge a record's memory: which bytes a
// refused step may write, and a launch that took the record and never finished. The header's
// layout is the library's own (stash/record.hpp, detail::RecordHeader), not API.

#include <pagestash/stash/record.hpp>

#include <cstddef>
#include <cstdint>

PAGESTASH_NAMESPACE_BEGIN

/// Bytes [offset, offset + bytes) of a record's memory.
struct RecordBytes {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

/// The summary's error, which a step refusing the record writes.
inline RecordBytes record_error_bytes() {
  return {offsetof(detail::RecordHeader, summary) + offsetof(RecordSummary, error), sizeof(Flag)};
}

/// The launch words, where a launch leaves its id (the record is free after it).
inline RecordBytes record_launch_bytes() {
  return {offsetof(detail::RecordHeader, launch), sizeof(detail::LaunchWords)};
}

/// Leaves a host record's launch words as launch `id` leaves them if it took the record at the
/// pool's `generation`, had `finished` blocks finish and `next_tile` claimed, and died.
inline void forge_held_launch(const RecordRef& rec, std::uint64_t id, std::int32_t generation, std::int32_t finished,
                              std::int64_t next_tile) {
  detail::LaunchWords& words = rec.header->launch;
  words.arrival = id << detail::launch_id_shift | detail::launch_held;
  words.owner = id;
  words.generation = generation;
  words.finished = finished;
  words.next_tile = next_tile;
}

PAGESTASH_NAMESPACE_END
