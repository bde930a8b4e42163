#pragma once
// The sector floor of a stash (docs/design.md's glossary): the 32-byte sectors a perfect copy of the live runs must
// read and write, whatever the copy engine. A stash reads the sectors of the paged buffers that hold live bytes and
// writes the stream's; a reload reads the stream's and writes the buffers': the same sectors. From the library's one
// description of where the bytes are: the byte runs of each buffer (reference/byte_runs.hpp) and the plan's stream
// offset of each segment (plan_work). Host code, no GPU: stash_bench's column and launch_cost's ratio.

#include <pagestash/layouts/compression.hpp>
#include <pagestash/layouts/view.hpp>
#include <pagestash/reference/byte_runs.hpp>
#include <pagestash/stash/work.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pagestash_bench {

/// Bytes of a sector, the unit a GPU's memory reads and writes.
constexpr std::int64_t sector_bytes = 32;

/// Sectors of ascending byte ranges [offset, offset + bytes), each sector once: add() them in order of offset.
class SectorSpan {
 public:
  void add(std::int64_t offset, std::int64_t bytes) {
    if (bytes <= 0) return;
    std::int64_t first = offset / sector_bytes;
    const std::int64_t last = (offset + bytes - 1) / sector_bytes;
    if (first <= last_) first = last_ + 1;  // shares a sector with the range before
    if (first <= last) sectors_ += last - first + 1;
    last_ = std::max(last_, last);
  }
  std::int64_t sectors() const { return sectors_; }

 private:
  std::int64_t sectors_ = 0, last_ = -1;
};

struct SectorFloor {
  std::int64_t buffer_sectors = 0;  ///< of the paged buffers, each on a sector (cudaMalloc's are on 256 bytes)
  std::int64_t stream_sectors = 0;  ///< of the pages (whole sectors: a page is 2^k bytes, on its size)
  std::int64_t live_bytes = 0;
  /// A stash's (or a reload's) sectors read and written.
  std::int64_t sectors() const { return buffer_sectors + stream_sectors; }
  /// Bytes of those sectors per live byte moved: 2 for a copy of whole sectors, more where sectors are partly live.
  double per_live_byte() const {
    return live_bytes ? static_cast<double>(sector_bytes * sectors()) / static_cast<double>(live_bytes) : 0;
  }
};

/// The sector floor of a stash of view v (its shape) with `counts`, of traits Tr (lossless: the stream holds the live
/// bytes themselves).
template <class Tr>
SectorFloor sector_floor(const pagestash::GroupedView<typename Tr::layout>& v, const std::int32_t* counts) {
  namespace ps = pagestash;
  static_assert(!ps::compression_of<Tr>::compressed, "sector_floor: a lossless stream");
  SectorFloor f;
  for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales, ps::BufferRole::amax}) {
    if (ps::handling_of<Tr>(role) != ps::Handling::paged) continue;  // kept bytes go to the record, not the pages
    const ps::BufferGeometry geo = v.geometry(role);
    SectorSpan span;
    for (std::int64_t i = 0; i < ps::run_count(geo); ++i) {
      const ps::ByteRun run = ps::byte_run(geo, i, counts);
      span.add(run.offset, run.bytes);
    }
    f.buffer_sectors += span.sectors();
  }
  // The stream: each copy item's live bytes end to end from its offset, items in stream order.
  std::vector<ps::WorkItem> items(static_cast<std::size_t>(ps::max_work_items(v.groups)));
  const ps::WorkTotals plan = ps::plan_work<Tr>(v, counts, false, items.data());
  SectorSpan stream;
  for (std::int32_t i = 0; i < plan.items; ++i) {
    const ps::WorkItem& item = items[static_cast<std::size_t>(i)];
    if (item.kind == ps::WorkKind::copy) stream.add(item.stream, item.segment.lines * item.segment.live);
  }
  f.stream_sectors = stream.sectors();
  f.live_bytes = plan.live_bytes;
  return f;
}

}  // namespace pagestash_bench
