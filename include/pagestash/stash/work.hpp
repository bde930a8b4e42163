#pragma once
// What one stash or reload moves: the page stream, the work items and their tiles.
//
// The page stream: the live bytes of every paged buffer of a grouped tensor, laid end to end and cut into pages.
// Buffers come in role order (data, then scales), segments (one group of one buffer) in group order, each starting on a
// 16-byte boundary of the stream; inside a segment the lines follow each other with no padding, so a stream holds at
// most 15 bytes per segment more than the live bytes.
//
// The work: a list of items, one per (paged buffer, segment, kind). A `copy` item moves the live runs of a segment
// between the buffer and the stream; a `zero` item (reload with zero_tail) clears the dead rest of each line. An item's
// bytes, its runs end to end, are cut into tiles: a copy item's on the stream's grid of 2^tile_shift bytes (so a tile
// never straddles a page, and its page is looked up once), or of a smaller power of two that holds at most
// max_tile_lines of its lines, a zero item's from its own start. A tile may cover part of
// one long line or many short ones. Item k owns tiles [first_tile(k), first_tile(k + 1)); a tile is the unit one warp
// (or host thread) moves. stash/copy.hpp moves the bytes of a tile.

#include <pagestash/detail/team.hpp>
#include <pagestash/layouts/view.hpp>
#include <pagestash/pool/free_list.hpp>
#include <pagestash/stash/policy.hpp>

#include <cuda/std/bit>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

/// Alignment of every segment in the page stream.
inline constexpr cuda::std::int64_t stream_alignment = 16;
/// Most tiles a plan may have (tile indices are 32-bit): 8 TiB of stream.
inline constexpr cuda::std::int64_t max_plan_tiles = 0x7FFFFFFF;
/// Most lines a tile of a copy item may hold (its tile is then smaller than the executor's, a power of two): a warp
/// moves a tile of short lines in a round or two of loads (stash/copy.hpp's staged mover), so that an expert of a token
/// or two is not one 4 KiB tile of 4096 lines that one warp waits on while the others are done.
inline constexpr cuda::std::int64_t max_tile_lines = 256;
/// Most bytes a segment of several lines may hold (offsets in it are 32-bit): a group's
/// block of 4 GiB (a single-line segment, e.g. a packed buffer, has no limit).
inline constexpr cuda::std::int64_t max_lined_segment_bytes = 0xFFFFFFFFLL;

/// The largest tile, log2: a tile's byte offsets times a line's run stay under 2^32, so that locate finds a line by a
/// multiply-high (detail::ShortDivisor), not a division a vector.
inline constexpr int max_tile_shift = 16;
static_assert(StashPolicy90::tile_shift <= max_tile_shift && StashPolicy100::tile_shift <= max_tile_shift &&
              HostPolicy::tile_shift <= max_tile_shift);

/// log2 of the tile size of an executor (its policy's tile_shift, stash/policy.hpp) on a
/// pool of 2^page_shift-byte pages: the executor's, or a page when pages are smaller.
PAGESTASH_HOST_DEVICE constexpr int tile_shift_for(int page_shift, int executor_shift) {
  return page_shift < executor_shift ? page_shift : executor_shift;
}

enum class WorkKind : cuda::std::int32_t { copy = 0, zero = 1 };

struct WorkItem {
  cuda::std::int64_t first_tile;  ///< tiles of the items before this one
  cuda::std::int64_t stream;      ///< copy: stream offset of the segment's first line
  Segment segment;                ///< where its lines are in the buffer, for the planned counts
  BufferRole role;
  WorkKind kind;
  /// A copy item's tiles on the stream's grid (stream_grid: its first tile's cell, log2 of its tiles), a zero item's
  /// -1: an item's search hands it on, so that a tile's page id is read with its item, not after it (resolve_tile).
  cuda::std::int64_t grid;
};

struct WorkTotals {  // no member initializers: teams share it through __shared__ memory
  cuda::std::int32_t items;
  cuda::std::int64_t tiles;
  cuda::std::int64_t stream_bytes;  ///< bytes the pages hold (segments padded to 16)
  cuda::std::int64_t live_bytes;    ///< bytes of the live runs
};

namespace detail {

/// The bytes of one line a work item covers: the live run (copy) or the dead rest (zero).
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t item_line_bytes(const Segment& seg, WorkKind kind) {
  return kind == WorkKind::copy ? seg.live : seg.pitch - seg.live;
}

/// A copy item's WorkItem::grid: the cell of stream offset `stream` on the grid of 2^shift, and shift (under 64).
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t stream_grid(cuda::std::int64_t stream, int shift) {
  return (stream >> shift) << 6 | shift;
}

/// Tiles of `bytes` bytes starting at `begin` on a grid of 2^shift.
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t tiles_on_grid(cuda::std::int64_t begin, cuda::std::int64_t bytes,
                                                              int shift) {
  return bytes == 0 ? 0 : ((begin + bytes - 1) >> shift) - (begin >> shift) + 1;
}

/// Stream bytes a segment of `bytes` live bytes takes: rounded up to stream_alignment.
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t stream_bytes_of(cuda::std::int64_t bytes) {
  return ceil_div(bytes, stream_alignment) * stream_alignment;
}

/// log2 of the tiles of an item: the executor's tile_shift, or, for a copy item of several lines (not coded), the
/// largest power of two that holds at most max_tile_lines of its lines, if smaller (more than max_tile_lines / 2 lines
/// a tile). A power of two of at least 256 bytes: tiles stay on the stream's grid, on 16 bytes and within a page.
PAGESTASH_HOST_DEVICE inline int item_tile_shift(const Segment& seg, bool capped, int tile_shift) {
  if (!capped || seg.lines <= 1 || seg.live <= 0) return tile_shift;
  const auto most = static_cast<cuda::std::uint64_t>(max_tile_lines * seg.live);
  const int shift = static_cast<int>(cuda::std::bit_width(most)) - 1;
  return shift < tile_shift ? shift : tile_shift;
}

/// Tiles of an item of segment `seg` (`bytes` bytes, tiles of 2^shift, item_tile_shift): a copy item's on the stream's
/// grid from `stream`, a zero item's from its own start; with `bound`, a copy item's as if it started anywhere, and,
/// capped, whatever its run up to seg's: at most 2 lines / max_tile_lines tiles (more than max_tile_lines / 2 lines a
/// tile), or, uncapped, bytes / 2^tile_shift, and one more for the grid.
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t item_tiles(const Segment& seg, cuda::std::int64_t stream,
                                                           cuda::std::int64_t bytes, bool copy, bool capped, bool bound,
                                                           int tile_shift) {
  if (bound && copy) {
    if (bytes == 0) return 0;
    cuda::std::int64_t most = ceil_div(bytes, cuda::std::int64_t{1} << tile_shift);
    if (capped && seg.lines > 1 && ceil_div(2 * seg.lines, max_tile_lines) > most)
      most = ceil_div(2 * seg.lines, max_tile_lines);
    return most + 1;
  }
  return tiles_on_grid(copy ? stream : 0, bytes, item_tile_shift(seg, capped && copy, tile_shift));
}

}  // namespace detail

/// Most items a plan of `groups` groups can have: two paged buffers, each with one segment per group and both kinds.
PAGESTASH_HOST_DEVICE constexpr cuda::std::int32_t max_work_items(cuda::std::int32_t groups) { return 4 * groups; }

/// Segments of a buffer for the given counts.
struct SegmentsAt {
  static constexpr bool bound = false;
  const cuda::std::int32_t* counts;
  /// Whether a count is a global load (the critical path's counter, detail/atomics.hpp), not one in shared memory.
  bool global = true;
  PAGESTASH_HOST_DEVICE Segment operator()(const BufferGeometry& geo, cuda::std::int32_t s) const {
    if (global) detail::note_load(counts + s);
    return geo.segment(s, counts);
  }
};

/// Segments of a buffer at their largest, whatever the counts (for bounds: a segment's
/// tiles are counted as if it started anywhere on the grid).
struct LargestSegments {
  static constexpr bool bound = true;
  PAGESTASH_HOST_DEVICE Segment operator()(const BufferGeometry& geo, cuda::std::int32_t s) const {
    return geo.largest_segment(s);
  }
};

namespace detail {
/// Segments of the buffer in `role` that Traits pages (none where it keeps or drops it).
template <class Traits>
PAGESTASH_HOST_DEVICE cuda::std::int32_t paged_segments(const GroupedView<typename Traits::layout>& v,
                                                        BufferRole role) {
  return handling_of<Traits>(role) == Handling::paged ? v.geometry(role).segment_count() : 0;
}

/// Where plan_work_on_team puts item i (of `tiles` tiles): into an array (none where null), or to a callable.
template <class Out>
PAGESTASH_HOST_DEVICE void put_item(const Out& out, cuda::std::int32_t i, const WorkItem& item,
                                    cuda::std::int64_t tiles) {
  if constexpr (cuda::std::is_pointer_v<Out>) {
    if (out != nullptr) out[i] = item;
  } else if constexpr (!cuda::std::is_same_v<Out, cuda::std::nullptr_t>) {
    out(i, item, tiles);
  }
}
}  // namespace detail

/// The plan of a stash (zero_tail = false) or reload over the buffers Traits pages, segment s of each buffer being
/// segment_of(geometry, s), in tiles of 2^tile_shift bytes, by the whole team: threads take items rank, rank + size,
/// ... (in the order kind, role, segment); stream offsets and first tiles are team scans. `items`: an array the items
/// are written to (none where null), or a callable that gets each, fn(index, item, its tiles), on its thread. Every
/// thread gets the totals. The one plan: the host runs it on one thread (plan_work), a kernel on a block, a warp's
/// look-ahead (stash/look_ahead.hpp) on its lanes.
template <class Traits, class Team, class SegmentOf, class Items>
PAGESTASH_HOST_DEVICE WorkTotals plan_work_on_team(const Team& team, const GroupedView<typename Traits::layout>& v,
                                                   const SegmentOf& segment_of, bool zero_tail, int tile_shift,
                                                   const Items& items) {
  const cuda::std::int32_t data_segments = detail::paged_segments<Traits>(v, BufferRole::data);
  const cuda::std::int32_t per_kind = data_segments + detail::paged_segments<Traits>(v, BufferRole::scales);
  WorkTotals t{};
  t.items = per_kind * (zero_tail ? 2 : 1);
  for (cuda::std::int32_t base = 0; base < t.items; base += team.size()) {
    const cuda::std::int32_t i = base + team.rank();
    const bool mine = i < t.items;
    const cuda::std::int32_t j = mine ? i % per_kind : 0;
    const auto kind = mine && i >= per_kind ? WorkKind::zero : WorkKind::copy;
    const auto role = j < data_segments ? BufferRole::data : BufferRole::scales;
    Segment seg{};
    PAGESTASH_UNROLL
    for (int r = 0; r < 2; ++r)  // a constant role for geometry(): no struct indexed at run time
      if (mine && static_cast<int>(role) == r)
        seg = segment_of(v.geometry(static_cast<BufferRole>(r)), j < data_segments ? j : j - data_segments);
    const cuda::std::int64_t bytes = seg.lines * detail::item_line_bytes(seg, kind);
    const bool copy = mine && kind == WorkKind::copy;
    // A compressed copy item (compressed traits page data only): its tiles cover the codes, a byte per value.
    using Compression = compression_of<Traits>;
    const bool coded = Compression::compressed && copy;
    const cuda::std::int64_t values =
        bytes / static_cast<cuda::std::int64_t>(sizeof(typename Traits::layout::data_type));
    cuda::std::int64_t stream_size = detail::stream_bytes_of(bytes);
    if constexpr (Compression::compressed) stream_size = coded ? compressed_stream_bytes<Compression>(values) : 0;
    cuda::std::int64_t chunk_stream = 0, chunk_live = 0, chunk_tiles = 0;
    const cuda::std::int64_t stream = t.stream_bytes + team.exclusive_sum(copy ? stream_size : 0, chunk_stream);
    team.exclusive_sum(copy ? bytes : 0, chunk_live);
    const cuda::std::int64_t tiles = mine ? detail::item_tiles(seg, stream, coded ? values : bytes, copy,
                                                               !Compression::compressed, SegmentOf::bound, tile_shift)
                                          : 0;
    const cuda::std::int64_t first_tile = t.tiles + team.exclusive_sum(tiles, chunk_tiles);
    if (mine) {
      const int shift = detail::item_tile_shift(seg, !Compression::compressed && copy, tile_shift);
      detail::put_item(items, i,
                       WorkItem{first_tile, stream, seg, role, kind, copy ? detail::stream_grid(stream, shift) : -1},
                       tiles);
    }
    t.stream_bytes += chunk_stream;
    t.live_bytes += chunk_live;
    t.tiles += chunk_tiles;
  }
  return t;
}

/// The plan for the given counts on one thread (host code: the host executor, bounds,
/// tools that count a stash's pages).
template <class Traits>
PAGESTASH_HOST_DEVICE WorkTotals plan_work(const GroupedView<typename Traits::layout>& v,
                                           const cuda::std::int32_t* counts, bool zero_tail, WorkItem* items = nullptr,
                                           int tile_shift = StashPolicy::tile_shift) {
  return plan_work_on_team<Traits>(SerialTeam{}, v, SegmentsAt{counts}, zero_tail, tile_shift, items);
}

/// The count check: Flag::none when the view holds every count, else Flag::bad_counts and the first group whose count
/// it cannot hold (negative, beyond max_tokens, off the packed alignment, or, packed, beyond the total).
struct CountCheck {
  cuda::std::int32_t first_bad_group;  ///< -1 when every count fits
  PAGESTASH_HOST_DEVICE constexpr Flag verdict() const { return first_bad_group >= 0 ? Flag::bad_counts : Flag::none; }
};

namespace detail {

/// The count check by the whole team, count g being count_of(g): threads take groups rank, rank + size, ...; the
/// packed prefix is a team scan. Every thread gets the answer.
template <class Layout, class Team, class CountOf>
PAGESTASH_HOST_DEVICE CountCheck check_counts_of(const Team& team, const GroupedView<Layout>& v,
                                                 const CountOf& count_of) {
  cuda::std::int64_t before = 0;  // tokens of the chunks done
  for (cuda::std::int32_t base = 0; base < v.groups; base += team.size()) {
    const cuda::std::int32_t g = base + team.rank();
    const cuda::std::int64_t m = g < v.groups ? count_of(g) : 0;
    cuda::std::int64_t chunk_tokens = 0, bad_groups = 0, first_plus_one = 0;
    const cuda::std::int64_t next = before + team.exclusive_sum(m, chunk_tokens);
    const bool bad = g < v.groups && !count_fits(v, next, m);
    const cuda::std::int64_t bad_before = team.exclusive_sum(bad ? 1 : 0, bad_groups);
    team.exclusive_sum(bad && bad_before == 0 ? g + 1 : 0, first_plus_one);  // one thread adds, all read
    if (bad_groups > 0) return CountCheck{static_cast<cuda::std::int32_t>(first_plus_one - 1)};
    before += chunk_tokens;
  }
  return CountCheck{-1};
}

}  // namespace detail

/// The count check of `counts` by the whole team.
template <class Layout, class Team>
PAGESTASH_HOST_DEVICE CountCheck check_counts(const Team& team, const GroupedView<Layout>& v,
                                              const cuda::std::int32_t* counts) {
  return detail::check_counts_of(team, v, [counts](cuda::std::int32_t g) {
    detail::note_load(counts + g);
    return counts[g];
  });
}

/// The count check on one thread (host code; counts in host memory).
template <class Layout>
PAGESTASH_HOST_DEVICE CountCheck check_counts(const GroupedView<Layout>& v, const cuda::std::int32_t* counts) {
  return check_counts(SerialTeam{}, v, counts);
}

/// Everything the tiles of a plan need, trivially copyable (a kernel argument or a host local).
struct TileWork {
  unsigned char* data;  ///< of the view being stashed or restored
  unsigned char* scales;
  /// A select, not an array indexed at run time: that would put the struct in local memory.
  PAGESTASH_HOST_DEVICE unsigned char* buffer(BufferRole role) const {
    return role == BufferRole::data ? data : scales;
  }
  const WorkItem* items;
  cuda::std::int32_t item_count;
  const cuda::std::int32_t* page_ids;
  PoolRef pool;
  int tile_shift;
  bool to_pages;  ///< stash: buffer -> pages; reload: pages -> buffer
};

/// The item a warp (or host thread) is in, carried from tile to tile: tiles are claimed in
/// increasing order, so the next tile is usually in the same item, else a later one.
struct ItemCursor {
  cuda::std::int32_t item = -1;
  cuda::std::int32_t first = 0;  ///< the item's tiles: [first, end)
  cuda::std::int32_t end = 0;
  /// The item's grid as its search read it, for the next tile alone: kept through a copy, every stash kernel spilled.
  cuda::std::int64_t grid = grid_unknown;
  static constexpr cuda::std::int64_t grid_unknown = -2;
};

/// A span: one tile, or consecutive tiles of one item on one page (resolve_tile), resolved: its stream bytes and where
/// they are in the buffer. The span's first `head` bytes end the line they start in (or end the span); the rest are
/// runs of `run` bytes starting at `body`, `pitch` apart.
struct TileSpan {
  unsigned char* stream;  ///< copy items: the tile's first stream byte; zero items: null
  unsigned char* head;    ///< the buffer byte of the tile's first byte
  unsigned char* body;    ///< the start of the next line's run
  cuda::std::int64_t pitch;
  cuda::std::uint32_t bytes;       ///< of the tile
  cuda::std::uint32_t head_bytes;  ///< <= bytes
  cuda::std::uint32_t run;         ///< each later line's run (clamped to 2^31: longer ones outlast a tile)
  cuda::std::uint32_t per_run;     ///< ShortDivisor(min(run, bytes)).m: locate's line without a division
  cuda::std::int32_t tiles;        ///< the plan's tiles it covers
  bool last;                       ///< it ends the item
};

namespace detail {

/// Moves the cursor to the item that owns `tile`: the last one whose first_tile <= tile (empty items share their
/// first_tile with the next one and are skipped). A binary search only when the tile has left the cursor's item, and
/// only over the items after it when it moved forward.
PAGESTASH_HOST_DEVICE inline void seek_item(const TileWork& w, ItemCursor& c, cuda::std::int32_t tile) {
  if (c.item >= 0 && tile >= c.first && tile < c.end) return;
  cuda::std::int32_t lo = c.item >= 0 && tile >= c.end ? c.item + 1 : 0, hi = w.item_count;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const cuda::std::int32_t mid = lo + (hi - lo) / 2;
    note_load(&w.items[mid]);
    if (w.items[mid].first_tile <= tile) lo = mid;
    else hi = mid;
  }
  c.item = lo;
  note_load(&w.items[lo]);  // with the next item's: one round trip
  c.first = static_cast<cuda::std::int32_t>(w.items[lo].first_tile);
  c.grid = w.items[lo].grid;
  c.end = lo + 1 < w.item_count ? static_cast<cuda::std::int32_t>(w.items[lo + 1].first_tile)
                                : static_cast<cuda::std::int32_t>(max_plan_tiles);
}

/// n / d by a multiply-high (no division in a loop), for n d < 2^32: m = ceil(2^32 / d) is exact there, since n times
/// m d's excess over 2^32 (under d) stays under 2^32. d = 1: m = 0, n itself.
struct ShortDivisor {
  cuda::std::uint32_t m;
  PAGESTASH_HOST_DEVICE explicit ShortDivisor(cuda::std::uint32_t d) : m(d <= 1 ? 0u : 0xFFFFFFFFu / d + 1) {}
  /// The divisor whose multiplier `m` a tile keeps (computed once, where the tile is resolved).
  PAGESTASH_HOST_DEVICE static ShortDivisor kept(cuda::std::uint32_t multiplier) {
    ShortDivisor x(1);
    x.m = multiplier;
    return x;
  }
  PAGESTASH_HOST_DEVICE cuda::std::uint32_t of(cuda::std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return m == 0 ? n : __umulhi(n, m);
#else
    return m == 0 ? n : static_cast<cuda::std::uint32_t>((cuda::std::uint64_t{n} * m) >> 32);
#endif
  }
};

/// Where byte q of a tile is in the buffer, and how many bytes of its run follow (it included).
struct Piece {
  unsigned char* at;
  cuda::std::uint32_t room;
};

/// Per vector: the line by a multiply-high (TileSpan::per_run), exact since d < bytes <= 2^max_tile_shift.
PAGESTASH_HOST_DEVICE inline Piece locate(const TileSpan& s, cuda::std::uint32_t q) {
  if (q < s.head_bytes) return {s.head + q, s.head_bytes - q};
  const cuda::std::uint32_t d = q - s.head_bytes, line = ShortDivisor::kept(s.per_run).of(d), col = d - line * s.run;
  return {s.body + static_cast<cuda::std::int64_t>(line) * s.pitch + col, s.run - col};
}

}  // namespace detail

namespace detail {

/// Tile j of `item` (its grid: `grid`), with the tiles after it of the `tiles` wanted, as a span (its stream pointer
/// null); `stream` gets the stream offset of the span's first byte (a copy item's). Its tiles: those wanted, up to the
/// end of the first one's page (a copy item's), and no more bytes than a tile may have (locate's division). Short
/// lines (copied, at most staged_max_run bytes) stay a tile a span: the staged mover's rounds grow with a span's lines
/// faster than the lookups they save. The tiles' mover and a warp's look-ahead (stash/look_ahead.hpp) both read it.
PAGESTASH_HOST_DEVICE inline TileSpan span_of(const TileWork& w, const WorkItem& item, cuda::std::int64_t grid,
                                              cuda::std::int64_t j, cuda::std::int64_t tiles,
                                              cuda::std::int64_t& stream) {
  const bool copy = grid >= 0;
  const Segment& seg = item.segment;
  const cuda::std::int64_t run = item_line_bytes(seg, item.kind);
  const cuda::std::int64_t bytes = seg.lines * run;
  // The tile's bytes [a, e) of the item: the grid is the stream's for a copy item (the plan's tiles, its grid's shift).
  const cuda::std::int64_t origin = copy ? item.stream : 0;
  const int shift = copy ? static_cast<int>(grid & 63) : w.tile_shift;
  const cuda::std::int64_t cell = ((origin >> shift) + j) << shift;
  if (copy && seg.lines > 1 && run <= StashPolicy::staged_max_run) tiles = 1;
  if (tiles > (cuda::std::int64_t{1} << (max_tile_shift - shift)))
    tiles = cuda::std::int64_t{1} << (max_tile_shift - shift);
  if (copy) {
    const cuda::std::int64_t page_end = ((cell >> w.pool.page_shift) + 1) << w.pool.page_shift;
    if (tiles > (page_end - cell) >> shift) tiles = (page_end - cell) >> shift;
  }
  if (tiles < 1) tiles = 1;
  const cuda::std::int64_t a = (cell > origin ? cell : origin) - origin;
  const cuda::std::int64_t next = cell + (tiles << shift) - origin;
  const cuda::std::int64_t e = next < bytes ? next : bytes;

  // A segment of several lines holds less than 4 GiB (work_bounds checks): 32-bit division
  // (inline; a 64-bit one is a call, around which the compiler keeps values on the stack).
  cuda::std::int64_t line = 0, col = a;
  if (seg.lines > 1) {
    line = static_cast<cuda::std::uint32_t>(a) / static_cast<cuda::std::uint32_t>(run);
    col = static_cast<cuda::std::uint32_t>(a) % static_cast<cuda::std::uint32_t>(run);
  }
  unsigned char* line_start = w.buffer(item.role) + seg.line_offset(line) + (copy ? 0 : seg.live);
  TileSpan s;
  s.bytes = static_cast<cuda::std::uint32_t>(e - a);
  const cuda::std::int64_t head = run - col;
  s.head_bytes = head < s.bytes ? static_cast<cuda::std::uint32_t>(head) : s.bytes;
  s.head = line_start + col;
  s.body = line_start + seg.pitch;
  s.pitch = seg.pitch;
  s.run = static_cast<cuda::std::uint32_t>(run < 0x80000000LL ? run : 0x80000000LL);
  // A run of at least the tile's bytes has line 0 for every byte past the head: so has a divisor of the tile's bytes.
  s.per_run = ShortDivisor(s.run < s.bytes ? s.run : s.bytes).m;
  s.tiles = static_cast<cuda::std::int32_t>(tiles);
  s.last = e == bytes;
  s.stream = nullptr;
  stream = item.stream + a;
  return s;
}

}  // namespace detail

/// Resolves tile `tile` of the plan, with the tiles after it before `until` in its item and on its page, as one span:
/// one lookup of the item and the page id for them all, one mover (docs/design.md, "Spans"). Moves the cursor there.
PAGESTASH_HOST_DEVICE inline TileSpan resolve_tile(const TileWork& w, ItemCursor& cursor, cuda::std::int32_t tile,
                                                   cuda::std::int32_t until = 0) {
  detail::seek_item(w, cursor, tile);
  const WorkItem& item = w.items[cursor.item];
  const cuda::std::int64_t j = tile - cursor.first;
  cuda::std::int64_t grid = cursor.grid;
  cursor.grid = ItemCursor::grid_unknown;
  if (grid == ItemCursor::grid_unknown) detail::note_load(&item), grid = item.grid;  // a round: no search handed it on
  const bool copy = grid >= 0;
  // The tile's page id with its item, one round trip (a tile is on one page: its cell's).
  cuda::std::int32_t page_id = 0;
  {
    const detail::OneRound together;
    detail::note_load(&item);
    const cuda::std::int64_t slot = copy ? (((grid >> 6) + j) << (grid & 63)) >> w.pool.page_shift : 0;
    if (copy) detail::note_load(&w.page_ids[slot]), page_id = w.page_ids[slot];
  }
  cuda::std::int64_t stream = 0;
  TileSpan s = detail::span_of(w, item, grid, j, (until < cursor.end ? until : cursor.end) - tile, stream);
  if (copy) s.stream = w.pool.page(page_id) + (stream & (w.pool.page_bytes - 1));
  return s;
}

PAGESTASH_NAMESPACE_END
