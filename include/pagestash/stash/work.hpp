#pragma once
// What one stash or reload moves, and the per-tile copy both executors run.
//
// The page stream: the live bytes of every paged buffer of a grouped tensor, laid end to
// end and cut into pages. Buffers come in role order (data, then scales), segments (one
// group of one buffer) in group order, each starting on a 16-byte boundary of the stream;
// inside a segment the lines follow each other with no padding, so a stream holds at most
// 15 bytes per segment more than the live bytes. The copy keeps one side on its 16-byte
// grid (a stream vector never straddles two pages) and gathers the other when it is not
// aligned alike.
//
// The work: a list of items, one per (paged buffer, segment, kind). A `copy` item moves the
// live runs of a segment between the buffer and the stream; a `zero` item (reload with
// zero_tail) clears the dead rest of each line. Each line is cut into tiles of at most
// tile_bytes; item k owns tiles [first_tile(k), first_tile(k + 1)). A tile is the unit
// one warp (or one host thread) copies.

#include <pagestash/detail/team.hpp>
#include <pagestash/layouts/view.hpp>
#include <pagestash/pool/free_list.hpp>

#include <cuda/std/cstdint>

#if !defined(__CUDA_ARCH__)
#  include <cstring>
#endif

PAGESTASH_NAMESPACE_BEGIN

/// Alignment of every segment in the page stream.
inline constexpr cuda::std::int64_t stream_alignment = 16;
/// Largest piece of a line one tile covers.
inline constexpr cuda::std::int64_t tile_bytes = 4096;
/// Most tiles a plan may have (tile indices inside an item are 32-bit): 8 TiB of stream.
inline constexpr cuda::std::int64_t max_plan_tiles = 0x7FFFFFFF;

enum class WorkKind : cuda::std::int32_t { copy = 0, zero = 1 };

struct WorkItem {
  cuda::std::int64_t first_tile;  ///< tiles of the items before this one
  cuda::std::int64_t stream;      ///< copy: stream offset of the segment's first line
  Segment segment;                ///< where its lines are in the buffer, for the planned counts
  BufferRole role;
  WorkKind kind;
};

struct WorkTotals {  // no member initializers: teams share it through __shared__ memory
  cuda::std::int32_t items;
  cuda::std::int64_t tiles;
  cuda::std::int64_t stream_bytes;  ///< bytes the pages hold (segments padded to 16)
  cuda::std::int64_t live_bytes;    ///< bytes of the live runs
};

namespace detail {

PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t ceil_div(cuda::std::int64_t a, cuda::std::int64_t b) {
  return (a + b - 1) / b;
}

/// The bytes of one line a work item covers: the live run (copy) or the dead rest (zero).
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t item_line_bytes(const Segment& seg, WorkKind kind) {
  return kind == WorkKind::copy ? seg.live : seg.pitch - seg.live;
}

/// Most items a plan of `groups` groups can have: two paged buffers, each with one
/// segment per group and both kinds.
PAGESTASH_HOST_DEVICE constexpr cuda::std::int32_t max_work_items(cuda::std::int32_t groups) { return 4 * groups; }

/// Segments of a buffer for the given counts.
struct SegmentsAt {
  const cuda::std::int32_t* counts;
  PAGESTASH_HOST_DEVICE Segment operator()(const BufferGeometry& geo, cuda::std::int32_t s) const {
    return geo.segment(s, counts);
  }
};

/// Segments of a buffer at their largest, whatever the counts (for bounds).
struct LargestSegments {
  PAGESTASH_HOST_DEVICE Segment operator()(const BufferGeometry& geo, cuda::std::int32_t s) const {
    return geo.largest_segment(s);
  }
};

/// Plans the work over the buffers Traits pages, segment s of each buffer being
/// segment_of(geometry, s). Writes the items when `items` is non-null. One thread.
template <class Traits, class SegmentOf>
PAGESTASH_HOST_DEVICE WorkTotals plan_segments(const GroupedView<typename Traits::layout>& v,
                                               const SegmentOf& segment_of, bool zero_tail, WorkItem* items) {
  WorkTotals t{};
  PAGESTASH_UNROLL
  for (int k = 0; k < 2; ++k) {  // index loops, not braced lists: those are arrays in local memory
    const auto kind = static_cast<WorkKind>(k);
    if (kind == WorkKind::zero && !zero_tail) break;
    PAGESTASH_UNROLL
    for (int r = 0; r < 2; ++r) {
      const auto role = static_cast<BufferRole>(r);
      if (handling_of<Traits>(role) != Handling::paged) continue;
      const BufferGeometry geo = v.geometry(role);
      for (cuda::std::int32_t s = 0; s < geo.segment_count(); ++s) {
        const Segment seg = segment_of(geo, s);
        const cuda::std::int64_t line_bytes = item_line_bytes(seg, kind);
        if (items != nullptr) items[t.items] = WorkItem{t.tiles, t.stream_bytes, seg, role, kind};
        ++t.items;
        t.tiles += seg.lines * ceil_div(line_bytes, tile_bytes);
        if (kind == WorkKind::copy) {
          t.stream_bytes += ceil_div(seg.lines * seg.live, stream_alignment) * stream_alignment;
          t.live_bytes += seg.lines * seg.live;
        }
      }
    }
  }
  return t;
}

/// Plans the work of a stash (zero_tail = false) or reload for the given counts.
template <class Traits>
PAGESTASH_HOST_DEVICE WorkTotals plan_work(const GroupedView<typename Traits::layout>& v,
                                           const cuda::std::int32_t* counts, bool zero_tail, WorkItem* items) {
  return plan_segments<Traits>(v, SegmentsAt{counts}, zero_tail, items);
}

/// Everything a tile needs, trivially copyable (a kernel argument or a host local).
struct TileWork {
  unsigned char* data;    ///< of the view being stashed or restored
  unsigned char* scales;
  /// A select, not an array indexed at run time: that would put the struct in local memory.
  PAGESTASH_HOST_DEVICE unsigned char* buffer(BufferRole role) const { return role == BufferRole::data ? data : scales; }
  const WorkItem* items;
  cuda::std::int32_t item_count;
  const cuda::std::int32_t* page_ids;
  PoolRef pool;
  bool to_pages;  ///< stash: buffer -> pages; reload: pages -> buffer
};

/// 16 bytes as four little-endian words (CUDA's hosts are little-endian), held in registers
/// between a load and a store.
struct Vector16 {
  cuda::std::uint32_t w[4];
};

PAGESTASH_HOST_DEVICE inline Vector16 load16(const unsigned char* src) {
#if defined(__CUDA_ARCH__)
  const uint4 u = *reinterpret_cast<const uint4*>(src);
  return {{u.x, u.y, u.z, u.w}};
#else
  Vector16 x;
  std::memcpy(x.w, src, 16);
  return x;
#endif
}

PAGESTASH_HOST_DEVICE inline void store16(unsigned char* dst, const Vector16& x) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
#else
  std::memcpy(dst, x.w, 16);
#endif
}

PAGESTASH_HOST_DEVICE inline void copy16(unsigned char* dst, const unsigned char* src) { store16(dst, load16(src)); }

PAGESTASH_HOST_DEVICE inline void zero16(unsigned char* dst) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
#else
  std::memset(dst, 0, 16);
#endif
}

/// The low word of (hi:lo) >> bits, bits < 32.
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t funnel_shift_right(cuda::std::uint32_t lo, cuda::std::uint32_t hi,
                                                                    unsigned bits) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, bits);
#else
  return bits == 0 ? lo : (lo >> bits) | (hi << (32 - bits));
#endif
}

/// The 16 bytes at src_at(i).. (which sit `offset` bytes past a 4-byte boundary) as four
/// little-endian words, from the five aligned words around them. The device loads those
/// words whole (each holds a wanted byte, so it lies in the same page and allocation); the
/// host assembles them from the wanted bytes only (zero elsewhere), so that the same
/// shifts run on the CPU without reading a byte outside the range.
template <class SrcAt>
PAGESTASH_HOST_DEVICE Vector16 gather16(const SrcAt& src_at, cuda::std::int64_t i, unsigned offset) {
  const cuda::std::int64_t first = i - offset;
  cuda::std::uint32_t words[5];
  for (int k = 0; k < 5; ++k) {
#if defined(__CUDA_ARCH__)
    words[k] = k < 4 || offset != 0 ? *reinterpret_cast<const cuda::std::uint32_t*>(src_at(first + 4 * k)) : 0;
#else
    words[k] = 0;
    for (int b = 0; b < 4; ++b) {
      const cuda::std::int64_t at = first + 4 * k + b;
      if (at >= i && at < i + 16) words[k] |= cuda::std::uint32_t{*src_at(at)} << (8 * b);
    }
#endif
  }
  Vector16 out;
  for (int k = 0; k < 4; ++k) out.w[k] = funnel_shift_right(words[k], words[k + 1], 8 * offset);
  return out;
}

/// The item that owns `tile`: the last one whose first_tile <= tile (empty items share
/// their first_tile with the next one and are skipped).
PAGESTASH_HOST_DEVICE inline cuda::std::int32_t find_item(const TileWork& w, cuda::std::int64_t tile) {
  cuda::std::int32_t lo = 0, hi = w.item_count;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const cuda::std::int32_t mid = lo + (hi - lo) / 2;
    if (w.items[mid].first_tile <= tile) lo = mid; else hi = mid;
  }
  return lo;
}

/// Copies (or clears) one tile; the lanes of a team split its 16-byte vectors.
template <class Lanes>
PAGESTASH_HOST_DEVICE void run_tile(const Lanes& lanes, const TileWork& w, cuda::std::int64_t tile) {
  const WorkItem item = w.items[find_item(w, tile)];
  const Segment& seg = item.segment;
  const cuda::std::int64_t line_bytes = item_line_bytes(seg, item.kind);
  const cuda::std::int64_t tiles_per_line = ceil_div(line_bytes, tile_bytes);
  // 32-bit division (inline; a 64-bit one is a call, around which the compiler keeps the
  // loop's values on the stack): a plan has fewer than 2^31 tiles (work_bounds checks).
  const auto local = static_cast<cuda::std::uint32_t>(tile - item.first_tile);
  const auto per_line = static_cast<cuda::std::uint32_t>(tiles_per_line);
  const cuda::std::int64_t line = local / per_line;
  const cuda::std::int64_t begin = cuda::std::int64_t{local % per_line} * tile_bytes;
  const cuda::std::int64_t n = line_bytes - begin < tile_bytes ? line_bytes - begin : tile_bytes;
  const bool zero = item.kind == WorkKind::zero;
  unsigned char* buf = w.buffer(item.role) + seg.line_offset(line) + (zero ? seg.live : 0) + begin;

  if (zero) {
    const bool aligned = reinterpret_cast<cuda::std::uintptr_t>(buf) % 16 == 0;
    // Bytes up to the first aligned address, then vectors, then the tail.
    const cuda::std::int64_t head =
        aligned ? 0 : cuda::std::int64_t{16} - static_cast<cuda::std::int64_t>(reinterpret_cast<cuda::std::uintptr_t>(buf) % 16);
    const cuda::std::int64_t h = head < n ? head : n;
    const cuda::std::int64_t vectors = (n - h) / 16;
    for (cuda::std::int64_t i = lanes.rank(); i < h; i += lanes.size()) buf[i] = 0;
    for (cuda::std::int64_t i = lanes.rank(); i < vectors; i += lanes.size()) zero16(buf + h + 16 * i);
    for (cuda::std::int64_t i = h + 16 * vectors + lanes.rank(); i < n; i += lanes.size()) buf[i] = 0;
    return;
  }

  const cuda::std::int64_t stream = item.stream + line * seg.live + begin;  // lines back to back
  const cuda::std::int64_t page_mask = w.pool.page_bytes - 1;
  auto at_stream = [&](cuda::std::int64_t pos) {
    return w.pool.page(w.page_ids[pos >> w.pool.page_shift]) + (pos & page_mask);
  };
  // The destination moves in 16-byte vectors on its own 16-byte grid (the stream's chunks
  // never straddle a page: pages are 2^k >= 256 bytes, aligned); its edges byte by byte,
  // so no byte outside the tile is written. The source is read as 16-byte vectors when it
  // is aligned alike, else gathered from the aligned 4-byte words around it.
  const bool to_pages = w.to_pages;
  auto dst_at = [&](cuda::std::int64_t i) { return to_pages ? at_stream(stream + i) : buf + i; };
  auto src_at = [&](cuda::std::int64_t i) -> const unsigned char* { return to_pages ? buf + i : at_stream(stream + i); };
  const auto dst_misalign = static_cast<cuda::std::int64_t>((to_pages ? static_cast<cuda::std::uintptr_t>(stream)
                                                                       : reinterpret_cast<cuda::std::uintptr_t>(buf)) % 16);
  const auto src_misalign = static_cast<cuda::std::int64_t>((to_pages ? reinterpret_cast<cuda::std::uintptr_t>(buf)
                                                                       : static_cast<cuda::std::uintptr_t>(stream)) % 16);
  const cuda::std::int64_t head_bytes = (16 - dst_misalign) % 16;
  const cuda::std::int64_t h = head_bytes < n ? head_bytes : n;
  const cuda::std::int64_t vectors = (n - h) / 16;
  for (cuda::std::int64_t i = lanes.rank(); i < h; i += lanes.size()) *dst_at(i) = *src_at(i);
  if (src_misalign == dst_misalign) {
    // Loads of `in_flight` vectors are issued before their stores: the pointers may alias,
    // so the compiler would not hoist a load above the previous store by itself.
    constexpr int in_flight = 4;
    const cuda::std::int64_t stride = lanes.size();
    cuda::std::int64_t v = lanes.rank();
    for (; v + (in_flight - 1) * stride < vectors; v += in_flight * stride) {
      Vector16 batch[in_flight];
      PAGESTASH_UNROLL
      for (int k = 0; k < in_flight; ++k) batch[k] = load16(src_at(h + 16 * (v + k * stride)));
      PAGESTASH_UNROLL
      for (int k = 0; k < in_flight; ++k) store16(dst_at(h + 16 * (v + k * stride)), batch[k]);
    }
    for (; v < vectors; v += stride) copy16(dst_at(h + 16 * v), src_at(h + 16 * v));
  } else {
    for (cuda::std::int64_t v = lanes.rank(); v < vectors; v += lanes.size()) {
      const cuda::std::int64_t i = h + 16 * v;
      store16(dst_at(i), gather16(src_at, i, static_cast<unsigned>((src_misalign + i) % 4)));
    }
  }
  for (cuda::std::int64_t i = h + 16 * vectors + lanes.rank(); i < n; i += lanes.size()) *dst_at(i) = *src_at(i);
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
