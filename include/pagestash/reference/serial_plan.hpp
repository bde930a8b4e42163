#pragma once
// The serial oracles of the count check and the plan, written as plainly as they can be: a
// loop over groups, and a loop over (kind, role, segment). The product's one implementation
// of each is a team's (check_counts, plan_work_on_team in stash/work.hpp); the emulator test
// holds a block of it to these, item for item. The producers use plan_groups for where each
// group's rows start.

#include <pagestash/stash/work.hpp>

PAGESTASH_NAMESPACE_BEGIN

/// Where each group's rows start in the token space (exclusive prefix sums for packed
/// placement, g * max_tokens for capacity-padded), and the count check. Host+device: the
/// counts are read wherever this runs. `group_rows` may be null.
template <class Layout>
PAGESTASH_HOST_DEVICE CountCheck plan_groups(const GroupedView<Layout>& v, const cuda::std::int32_t* counts,
                                             cuda::std::int64_t* group_rows) {
  CountCheck check{-1};
  cuda::std::int64_t next = 0;
  for (cuda::std::int32_t g = 0; g < v.groups; ++g) {
    const cuda::std::int64_t m = counts[g];
    if (!count_fits(v, next, m) && check.first_bad_group < 0) check.first_bad_group = g;
    if (group_rows != nullptr) group_rows[g] = Layout::placement::packed ? next : g * v.max_tokens;
    next += m;
  }
  return check;
}

/// Appends the item of one segment to a serial plan (writing it when `items` is non-null). A copy item of several lines
/// has tiles of the largest power of two up to 2^tile_shift bytes that holds at most max_tile_lines lines.
inline void append_item(WorkTotals& t, const Segment& seg, BufferRole role, WorkKind kind, int tile_shift,
                        WorkItem* items) {
  const cuda::std::int64_t bytes = seg.lines * detail::item_line_bytes(seg, kind);
  int shift = tile_shift;
  while (kind == WorkKind::copy && seg.lines > 1 && seg.live > 0 &&
         (cuda::std::int64_t{1} << shift) > max_tile_lines * seg.live)
    --shift;
  // The grid's cell and shift as WorkItem::grid packs them, zero items none.
  const cuda::std::int64_t grid = kind == WorkKind::copy ? (t.stream_bytes >> shift) * 64 + shift : -1;
  if (items != nullptr) items[t.items] = WorkItem{t.tiles, t.stream_bytes, seg, role, kind, grid};
  ++t.items;
  if (kind == WorkKind::copy) {
    t.tiles += detail::tiles_on_grid(t.stream_bytes, bytes, shift);
    t.stream_bytes += detail::stream_bytes_of(bytes);
    t.live_bytes += bytes;
  } else {
    t.tiles += detail::tiles_on_grid(0, bytes, tile_shift);
  }
}

/// The plan for the given counts, one item after the other.
template <class Traits>
WorkTotals serial_plan_work(const GroupedView<typename Traits::layout>& v, const cuda::std::int32_t* counts,
                            bool zero_tail, WorkItem* items, int tile_shift) {
  WorkTotals t{};
  for (const WorkKind kind : {WorkKind::copy, WorkKind::zero}) {
    if (kind == WorkKind::zero && !zero_tail) break;
    for (const BufferRole role : {BufferRole::data, BufferRole::scales}) {
      if (handling_of<Traits>(role) != Handling::paged) continue;
      const BufferGeometry geo = v.geometry(role);
      for (cuda::std::int32_t s = 0; s < geo.segment_count(); ++s)
        append_item(t, geo.segment(s, counts), role, kind, tile_shift, items);
    }
  }
  return t;
}

PAGESTASH_NAMESPACE_END
