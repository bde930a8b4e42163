#pragma once
// The copy engine (stash/copy.hpp) on hand-made segments, against a plain byte-for-byte
// oracle: every mover (the host executor's pieces, the warp's 16-byte vectors with `lanes`
// lanes run one after another, and the same lanes as a warp of host threads with a stage,
// which stages short lines, or moves bulk-copyable tiles by the bulk mover, stash/bulk_copy.hpp,
// in cases that have such tiles) stash the segments into pages given in a shuffled
// order, and reload them into a poisoned buffer, with or without zero_tail. Shared by the
// host tests and the fuzz target; a mismatch is returned as a message, not asserted, so
// that either can report it its own way.

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/serial_plan.hpp>

#include "grid_emulator.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace pagestash_test {

namespace ps = pagestash;

struct EngineCase {
  int page_shift = 8;                                     ///< 8 (256-byte pages) .. 16
  int executor_tile_shift = ps::StashPolicy::tile_shift;  ///< or HostPolicy::tile_shift
  int lanes = 32;                                         ///< lanes of the vector mover
  bool zero_tail = false;                                 ///< reload also clears the dead rest of each line
  unsigned base_misalign = 0;                             ///< the buffer's address mod 32 (a sector)
  std::vector<ps::Segment> segments;                      ///< in one buffer, not overlapping (lines * pitch each)
  std::uint32_t seed = 1;                                 ///< bytes, page order, tile order
};

/// One lane of a team of n, for running a warp's lanes one after another.
struct OneLane {
  int r, n;
  int rank() const { return r; }
  int size() const { return n; }
};

/// One lane of a warp of n host threads that share a barrier and a stage (the staged mover's).
struct ThreadLane {
  int r, n;
  HostBarrier* barrier;
  unsigned char* stage_bytes;
  int rank() const { return r; }
  int size() const { return n; }
  unsigned char* stage() const { return stage_bytes; }
  void sync_lanes() const { barrier->wait(); }
};

/// A random case: `count` segments of lines up to `max_live` bytes (some of 1-15 bytes,
/// some longer than a tile), pitches from live up, gaps and offsets of any alignment.
inline EngineCase random_engine_case(std::mt19937& rng, int count, std::int64_t max_live) {
  EngineCase c;
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  c.page_shift = static_cast<int>(pick(8, 17));
  c.executor_tile_shift = pick(0, 1) == 0 ? ps::StashPolicy::tile_shift : ps::HostPolicy::tile_shift;
  c.lanes = pick(0, 3) == 0 ? static_cast<int>(pick(1, 31)) : 32;
  c.zero_tail = pick(0, 1) == 1;
  c.base_misalign = static_cast<unsigned>(pick(0, 31));
  c.seed = static_cast<std::uint32_t>(rng());
  std::int64_t at = pick(0, 40);
  for (int i = 0; i < count; ++i) {
    ps::Segment s;
    const int kind = static_cast<int>(pick(0, 3));
    s.live = kind == 0 ? pick(0, 15) : (kind == 1 ? pick(16, 80) : pick(0, max_live));
    s.lines = kind == 3 ? 1 : pick(0, s.live <= 16 ? 400 : 40);
    s.pitch = s.live + (pick(0, 2) == 0 ? 0 : pick(0, 48));
    if (s.pitch == 0) s.pitch = 1;
    s.offset = at;
    c.segments.push_back(s);
    at += s.lines * s.pitch + pick(0, 40);
  }
  return c;
}

/// The items of the case's stash (copy items) or reload (and zero items with zero_tail).
inline std::vector<ps::WorkItem> engine_items(const EngineCase& c, bool reload, ps::WorkTotals& t) {
  std::vector<ps::WorkItem> items(2 * c.segments.size());
  t = ps::WorkTotals{};
  const int tile_shift = ps::tile_shift_for(c.page_shift, c.executor_tile_shift);
  for (int k = 0; k < (reload && c.zero_tail ? 2 : 1); ++k)
    for (const ps::Segment& s : c.segments)
      ps::append_item(t, s, ps::BufferRole::data, static_cast<ps::WorkKind>(k), tile_shift, items.data());
  items.resize(static_cast<std::size_t>(t.items));
  return items;
}

/// Runs the case; returns "" when both movers match the oracle, else what differed.
inline std::string check_engine(const EngineCase& c) {
  std::mt19937 rng(c.seed);
  std::int64_t buffer_bytes = 1;
  for (const ps::Segment& s : c.segments) buffer_bytes = std::max(buffer_bytes, s.offset + s.lines * s.pitch);

  // The source buffer (random non-zero bytes) at the requested misalignment.
  // (16 guard bytes on either side: a reload must not write them)
  const auto at_misalign = [&c](std::vector<unsigned char>& mem) {
    return mem.data() + (32 - reinterpret_cast<std::uintptr_t>(mem.data()) % 32) % 32 + 32 + c.base_misalign;
  };
  std::vector<unsigned char> source_mem(static_cast<std::size_t>(buffer_bytes) + 128);
  unsigned char* const source = at_misalign(source_mem);
  for (std::int64_t i = 0; i < buffer_bytes; ++i) source[i] = static_cast<unsigned char>(rng() % 255 + 1);

  // The oracle stream: each segment's runs back to back, zeros up to 16 bytes.
  std::vector<unsigned char> stream;
  for (const ps::Segment& s : c.segments) {
    for (std::int64_t l = 0; l < s.lines; ++l)
      stream.insert(stream.end(), source + s.line_offset(l), source + s.line_offset(l) + s.live);
    stream.resize((stream.size() + 15) / 16 * 16, 0);
  }
  ps::WorkTotals stash_totals{};
  std::vector<ps::WorkItem> stash_items = engine_items(c, false, stash_totals);
  if (stash_totals.stream_bytes != static_cast<std::int64_t>(stream.size()))
    return "plan: " + std::to_string(stash_totals.stream_bytes) + " stream bytes, oracle " +
           std::to_string(stream.size());

  // Pages in a shuffled order, the arena poisoned.
  ps::PoolConfig cfg;
  cfg.page_bytes = std::int64_t{1} << c.page_shift;
  const std::int64_t pages = std::max<std::int64_t>(1, ps::pages_for(stash_totals.stream_bytes, cfg.page_bytes));
  cfg.device_pages = pages + 2;
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(cfg.device_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const ps::PoolRef ref = pool.ref();
  auto page_byte = [&](std::int64_t p) {
    return ref.page(ids[static_cast<std::size_t>(p >> c.page_shift)]) + (p & (cfg.page_bytes - 1));
  };

  auto work_for = [&](const std::vector<ps::WorkItem>& items, unsigned char* buffer, bool to_pages) {
    ps::TileWork w{};
    w.data = buffer;
    w.scales = nullptr;
    w.items = items.data();
    w.item_count = static_cast<std::int32_t>(items.size());
    w.page_ids = ids.data();
    w.pool = ref;
    w.tile_shift = ps::tile_shift_for(c.page_shift, c.executor_tile_shift);
    w.to_pages = to_pages;
    return w;
  };
  // Tiles in increasing order (one cursor carried along), a span of up to 1-3 at a time (as a warp asks for its
  // claim's: resolve_tile keeps a span in one item and on one page, which the shuffled pages check), or shuffled, a
  // tile at a time (the cursor seeks back).
  auto run = [&](const ps::TileWork& w, std::int64_t tiles, int mover, bool shuffled) {
    std::vector<std::int32_t> order(static_cast<std::size_t>(tiles));
    std::iota(order.begin(), order.end(), 0);
    if (shuffled) std::shuffle(order.begin(), order.end(), rng);
    const auto until = [shuffled](std::int32_t t) { return shuffled ? 0 : t + 1 + t % 3; };
    if (mover >= 2) {  // a warp of host threads, each with its own cursor, through the same tiles
      HostBarrier barrier(c.lanes);
      std::vector<unsigned char> stage(ps::StashPolicy::stage_bytes + 16);
      unsigned char* const aligned = stage.data() + (16 - reinterpret_cast<std::uintptr_t>(stage.data()) % 16) % 16;
      HostThreads::borrow(c.lanes, [&](int lane) {
        ps::ItemCursor cursor;
        for (std::size_t i = 0; i < order.size();) {
          const ps::TileSpan s = ps::resolve_tile(w, cursor, order[i], until(order[i]));
          i += static_cast<std::size_t>(s.tiles);
          const ps::TileOp op = ps::tile_op(w, cursor);
          const ThreadLane lanes{lane, c.lanes, &barrier, aligned};
          // The staged (bulk) mover wherever it can move the tile, whether or not the policy has the kernels use it.
          if (mover == 3 && ps::tile_bulk_copyable(s, op)) ps::copy_tile_bulk(lanes, s, op);
          else if (ps::tile_stageable(s, op)) ps::copy_tile_staged(lanes, s, op);
          else ps::copy_tile_vectors(lanes, s, op);
        }
      });
      return;
    }
    ps::ItemCursor cursor;
    for (std::size_t i = 0; i < order.size();) {
      const ps::TileSpan s = ps::resolve_tile(w, cursor, order[i], until(order[i]));
      i += static_cast<std::size_t>(s.tiles);
      const ps::TileOp op = ps::tile_op(w, cursor);
      if (mover == 0) ps::copy_tile_pieces(s, op);
      else
        for (int lane = 0; lane < c.lanes; ++lane) ps::copy_tile_vectors(OneLane{lane, c.lanes}, s, op);
    }
  };

  std::vector<ps::WorkItem> reload_items;
  ps::WorkTotals reload_totals{};
  reload_items = engine_items(c, true, reload_totals);
  std::vector<unsigned char> dest_mem(source_mem.size());
  unsigned char* const dest = at_misalign(dest_mem);
  // The bulk mover only where it has tiles to move (one of the stash's or the reload's).
  const auto has_bulk = [&](const std::vector<ps::WorkItem>& items, std::int64_t tiles, bool to_pages) {
    const ps::TileWork w = work_for(items, source, to_pages);
    ps::ItemCursor cursor;
    for (std::int32_t t = 0; t < tiles; ++t) {
      const ps::TileSpan s = ps::resolve_tile(w, cursor, t);  // moves the cursor tile_op reads
      if (ps::tile_bulk_copyable(s, ps::tile_op(w, cursor))) return true;
    }
    return false;
  };
  const int movers =
      has_bulk(stash_items, stash_totals.tiles, true) || has_bulk(reload_items, reload_totals.tiles, false) ? 4 : 3;
  for (int mover = 0; mover < movers; ++mover) {
    const bool vectors = mover >= 1;
    const char* const names[] = {"pieces", "vectors", "staged", "bulk"};
    const char* name = names[mover];
    std::memset(ref.device_arena, 0xEE, static_cast<std::size_t>(cfg.device_pages * cfg.page_bytes));
    run(work_for(stash_items, source, true), stash_totals.tiles, mover, vectors);
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(stream.size()); ++p)
      if (*page_byte(p) != stream[static_cast<std::size_t>(p)])
        return std::string(name) + " stash: stream byte " + std::to_string(p) + " is " + std::to_string(*page_byte(p)) +
               ", expected " + std::to_string(stream[static_cast<std::size_t>(p)]);

    // Reload into a poisoned buffer: live runs from the source; dead bytes of each line zero
    // with zero_tail; every other byte keeps its poison.
    std::vector<unsigned char> expected(static_cast<std::size_t>(buffer_bytes));
    for (std::int64_t i = 0; i < buffer_bytes; ++i)
      expected[static_cast<std::size_t>(i)] = dest[i] = static_cast<unsigned char>(rng() | 1);
    for (const ps::Segment& s : c.segments)
      for (std::int64_t l = 0; l < s.lines; ++l) {
        std::memcpy(expected.data() + s.line_offset(l), source + s.line_offset(l), static_cast<std::size_t>(s.live));
        if (c.zero_tail)
          std::memset(expected.data() + s.line_offset(l) + s.live, 0, static_cast<std::size_t>(s.pitch - s.live));
      }
    run(work_for(reload_items, dest, false), reload_totals.tiles, mover, !vectors);
    for (std::int64_t i = 0; i < buffer_bytes; ++i)
      if (dest[i] != expected[static_cast<std::size_t>(i)])
        return std::string(name) + " reload: buffer byte " + std::to_string(i) + " is " + std::to_string(dest[i]) +
               ", expected " + std::to_string(expected[static_cast<std::size_t>(i)]);
    for (int g = 1; g <= 16; ++g)
      if (dest[-g] != 0 || dest[buffer_bytes + g - 1] != 0)
        return std::string(name) + " reload: wrote outside the buffer";
  }
  return "";
}

}  // namespace pagestash_test
