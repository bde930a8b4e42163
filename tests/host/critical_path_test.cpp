// The launch's critical path up to its first copy (issue 53), counted on the grid emulator (CriticalPath,
// tests/common/grid_emulator.hpp) for each kernel family, and held: a change that lengthens it fails here.
// docs/benchmarks.md ("Critical path") keeps the table, bench/launch_cost.cpp (--critical-path) prints it.

#include "../common/grid_emulator.hpp"
#include "../common/host_tensor.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <type_traits>

namespace {

using namespace pagestash_test;

// The most each path may be (accesses + fences, barriers), as reached. Issue 53's targets: the owner's <= 8, an other
// block's <= 2 (a stash's: its look-ahead's prefetch, after the counts read beside the arrival), barriers between
// verdict and first copy load 0.
struct Held {
  std::int64_t owner[3];    ///< stash, reload, discard: before the verdict
  std::int64_t other[2];    ///< stash, reload: an other block, before its first data load (a prefetch or a copy's load)
  std::int64_t other_copy;  ///< an other block, before its first copy load
  std::int64_t barriers;    ///< between verdict and first copy load, any block
};
constexpr Held held{{8, 7, 7}, {2, 6}, 6, 0};

/// A seeded tensor of L: 32 experts of hidden 7168, capacity 512, 4-20 tokens each (a few MiB: every block of the grid
/// finds tiles), random bytes.
template <class L>
HostTensor<L> tensor(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> counts(32);
  for (auto& c : counts) c = static_cast<std::int32_t>(4 + rng() % 17);
  HostTensor<L> t(512, 7168, 32, counts);
  for (auto* buf : {&t.data, &t.scales})
    for (auto& b : *buf) b = static_cast<std::uint8_t>(rng() & 0x3F);
  return t;
}

/// The critical paths of a stash of `in`, its reload into `out` and a discard (count_critical_paths), on `blocks`
/// blocks of `threads`, `slots` at a time, no random delays, in a pool of 64 KiB pages that holds two stashes of `in`.
template <class L>
std::array<CriticalPath::Count, 3> paths_of(const HostTensor<L>& in, const HostTensor<L>& out, int blocks, int threads,
                                            int slots, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = 2 * ps::pages_for(ps::work_bounds<Tr>(in.view).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  LaunchShape grid;
  grid.blocks = blocks;
  grid.threads = threads;
  grid.slots = slots;
  grid.seed = seed;
  grid.random_delays = false;
  grid.fibers = true;  // counted, not explored: a block on one host thread
  return count_critical_paths<Tr>(pool, in.view, out.view, grid);
}

template <class L>
void check_paths(std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  HostTensor<L> in = tensor<L>(seed), out = tensor<L>(seed + 1);
  out.counts = in.counts;
  out.view.counts = out.counts.data();
  constexpr int blocks = 4, threads = ps::StashPolicy::threads_per_block;
  const auto c = paths_of(in, out, blocks, threads, 2, seed);
  // The reload restored the stash's bytes: the data of every live row (rowwise, capacity-padded: rows of hidden
  // values).
  if constexpr (L::placement::packed == false &&
                !std::is_same_v<L, ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>>) {
    const std::int64_t row = in.view.buffer_bytes(ps::BufferRole::data) / (512 * 32);
    for (int g = 0; g < 32; ++g)
      CHECK(std::memcmp(in.data.data() + g * 512 * row, out.data.data() + g * 512 * row,
                        static_cast<std::size_t>(in.counts[static_cast<std::size_t>(g)] * row)) == 0);
  }
  const std::int64_t live = ps::plan_work<Tr>(in.view, in.counts.data(), false).live_bytes;
  const char* family[] = {"stash", "reload", "discard"};
  for (int f = 0; f < 3; ++f) {
    const CriticalPath::Count& k = c[static_cast<std::size_t>(f)];
    CAPTURE(family[f]);
    CAPTURE(k.owner.accesses);
    CAPTURE(k.owner.fences);
    CAPTURE(k.other.accesses);
    CAPTURE(k.other.fences);
    REQUIRE(k.decided);
    CHECK(k.owner.total() <= held.owner[f]);
    CHECK(k.owner.total() > 0);  // counted at all
    if (f == 2) {
      CHECK(k.others == 0);  // a discard copies nothing
      continue;
    }
    CHECK(k.owner_barriers <= held.barriers);
    // The whole launch's chain, the copy's data rounds counted: longer than the owner's path to its verdict, every live
    // byte loaded (an aligned copy of BF16 rows loads each once), and no block with more in flight than its lanes'
    // batches (a vector's 5 words in the gather) hold, one round each.
    CHECK(k.chain > k.owner.total());
    CHECK(k.loaded_total >= live);
    if constexpr (std::is_same_v<L, ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>>)
      CHECK(k.loaded_total == live);
    const double lane_most = std::max(16.0 * ps::StashPolicy::loads_in_flight, 20.0 * ps::StashPolicy::gather_vectors);
    CHECK(k.bytes_in_flight() > 0);
    CHECK(k.bytes_in_flight() <= lane_most * threads);
    if (k.others > 0) {
      CAPTURE(k.other_copy.accesses);
      CAPTURE(k.other_copy.fences);
      CHECK(k.other.total() <= held.other[f]);
      CHECK(k.other.total() <= k.other_copy.total());
      CHECK(k.other_copy.total() <= held.other_copy);
      CHECK(k.other_barriers <= held.barriers);
    }
  }
  // Other blocks copied in the stash and the reload (4 blocks, two at a time, ~100 tiles each).
  CHECK(c[0].others > 0);
  CHECK(c[1].others > 0);
}

}  // namespace

TEST_CASE(
    "critical path: the owner's path to its verdict, an other block's to its first copy, and the barriers "
    "between, held for stash, reload and discard") {
  SUBCASE("rowwise BF16, capacity-padded") { check_paths<ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>>(3); }
  SUBCASE("columnwise MXFP8, capacity-padded, compact scales") {
    check_paths<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>>(5);
  }
  SUBCASE("rowwise NVFP4, capacity-padded, swizzled scales") {
    check_paths<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>>(7);
  }
}

namespace {

/// The whole launch's chain of a stash of two experts of `rows` BF16 rows of hidden 7168 each (28 whole 4 KiB tiles
/// per 8 rows, aligned), on one block of `threads` threads.
std::int64_t two_item_chain(std::int32_t rows, int threads) {
  using L = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
  HostTensor<L> in(rows, 7168, 2, {rows, rows}), out(rows, 7168, 2, {rows, rows});
  std::mt19937 rng(11);
  for (auto& b : in.data) b = static_cast<std::uint8_t>(rng());
  const auto c = paths_of(in, out, 1, threads, 1, 0);
  CHECK(in.data == out.data);
  REQUIRE(c[0].decided);
  return c[0].chain;
}

}  // namespace

TEST_CASE("critical path: a block's whole launch, round by round: 8 rounds a chunk of two whole tiles a warp") {
  // One block takes every chunk in turn, so its chain is exact. A chunk more (two tiles a warp) adds, on the longest
  // warp: the leader's claim (a load of the counter, then its read-modify-write), the warp's search for the chunk's
  // item (one round over up to 64 items, each lane's and the next read together; none with the binary search of
  // run_tile's seek, as each warp's tiles stay in one item), the item and its page id read together (the search hands
  // on the item's place on the stream's grid), and the two tiles' data as one span (both in one item, on one 64 KiB
  // page): 8 KiB, 32 lanes x 4 vectors of 16 bytes, four times. A round missed or counted twice anywhere in that loop
  // moves it; a tile looked up apart (two data rounds after an item round and a page round) adds 2.
  constexpr std::int64_t per_chunk = 2 + 1 + (1 + 4);
  for (const int warps : {1, 16}) {
    CAPTURE(warps);
    const std::int32_t rows = 8 * warps;  // 56 tiles a warp: 28 chunks
    const std::int64_t one = two_item_chain(rows, 32 * warps), two = two_item_chain(2 * rows, 32 * warps);
    CAPTURE(one);
    CHECK(two - one == 28 * per_chunk);
  }
}
