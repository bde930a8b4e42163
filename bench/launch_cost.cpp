// What one stash launch costs besides its copies, counted without a GPU: the kernel body
// (execution/operation.hpp) runs on the grid emulator (tests/common/grid_emulator.hpp) with
// the grid the CUDA executor launches on an H200 (132 SMs, sm_90), and every device-scope
// atomic, fence and block barrier it executes is counted. Same-line read-modify-writes
// serialise in the L2; for a small stash of a large capacity-padded record (fine-grained
// MoE) they, not bandwidth, decide the time. docs/benchmarks.md keeps the table.
//
//   pagestash_launch_cost [--sms N] [--major M] [--blocks B --threads T] [--json]
//
// --blocks/--threads replace the executor's grid (to count another launch shape).
//
// A second table counts, for each warp-wide load and store of a stash and a reload (lossless
// and compressed), the 32-byte sectors and 128-byte lines its lanes touch (SectorCounter).

#include <pagestash/pagestash.hpp>

#include "../tests/common/grid_emulator.hpp"

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

namespace ps = pagestash;
using pagestash_test::CostCounter;
using pagestash_test::Emulator;
using pagestash_test::LaunchCost;
using pagestash_test::LaunchShape;

// DeepSeek-V3 at 8-way expert parallelism: 32 experts of hidden 7168 on a rank, MXFP8
// columnwise (what the quantized recipes save), capacity-padded to 512 tokens an expert.
using Layout = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>;
using Traits = ps::StashTraits<Layout>;
constexpr std::int64_t kHidden = 7168, kCapacity = 512;
constexpr std::int32_t kExperts = 32;

/// Counts with at least `bytes` of stream (the fewest tokens that give it), spread unevenly
/// over the experts as a Dirichlet(1) router does (seeded), none above the capacity.
std::vector<std::int32_t> counts_for(const ps::GroupedView<Layout>& shape, std::int64_t bytes) {
  std::vector<std::int32_t> counts(kExperts, 0);
  std::mt19937 rng(7);
  std::vector<double> w(kExperts);
  double sum = 0;
  for (double& x : w) sum += (x = std::exponential_distribution<double>(1.0)(rng));
  for (std::int64_t tokens = 0; ps::plan_work<Traits>(shape, counts.data(), false, nullptr).stream_bytes < bytes;
       tokens += 16) {
    for (int g = 0; g < kExperts; ++g) {
      const auto m = static_cast<std::int64_t>(static_cast<double>(tokens) * w[static_cast<std::size_t>(g)] / sum);
      counts[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(m < kCapacity ? m : kCapacity);
    }
  }
  return counts;
}

struct Row {
  std::string name;
  std::int64_t stream_bytes;
  std::int64_t tiles;  ///< of the stash's plan
  LaunchCost cost;
};

/// n per tile of the row's plan ("-" for a plan of no tiles).
std::string per_tile(std::int64_t n, std::int64_t tiles) {
  if (tiles == 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(n) / static_cast<double>(tiles));
  return text;
}

/// 256-byte aligned bytes (as cudaMalloc's), seeded random.
struct AlignedBytes {
  std::vector<std::uint8_t> storage;
  std::uint8_t* data;
  AlignedBytes(std::size_t n, std::uint32_t seed) : storage(n + 256) {
    data = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 255) / 256 * 256);
    std::mt19937 rng(seed);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<std::uint8_t>(rng() & 0x3F);  // finite 16-bit values
  }
};

/// The sectors a warp's accesses touch in one stash and one reload of Tr (rowwise, hidden 7168, 4 experts of 96
/// tokens in all, 24 each): one row per kernel and direction.
template <class Tr>
void print_sector_rows(const char* name) {
  using L = typename Tr::layout;
  ps::GroupedView<L> view;
  view.max_tokens = 96;
  view.hidden = kHidden;
  view.groups = 4;
  std::vector<std::int32_t> counts(4, 24);  // Packed: 96 tokens in all
  const auto bytes = static_cast<std::size_t>(view.buffer_bytes(ps::BufferRole::data));
  AlignedBytes in(bytes, 1), out(bytes, 2);
  view.counts = counts.data();
  auto dest = view;
  view.data = reinterpret_cast<typename L::data_type*>(in.data);
  dest.data = reinterpret_cast<typename L::data_type*>(out.data);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(view).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  const auto c = pagestash_test::count_sectors<Tr>(pool, view, dest);
  const char* what[] = {"stash loads", "stash stores", "reload loads", "reload stores"};
  for (int k = 0; k < 4; ++k)
    std::printf("%-22s %-14s %9lld %10.2f %10.2f %11.3f\n", name, what[k], static_cast<long long>(c[k].requests),
                c[k].sectors_per_request(), c[k].lines_per_request(), c[k].sector_use());
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 132, major = 9, blocks = 0, threads = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sms") && i + 1 < argc) sms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--major") && i + 1 < argc) major = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else {
      std::fprintf(stderr, "usage: %s [--sms N] [--major M] [--blocks B --threads T] [--json]\n", argv[0]);
      return 2;
    }
  }

  ps::GroupedView<Layout> shape;
  shape.max_tokens = kCapacity;
  shape.hidden = kHidden;
  shape.groups = kExperts;
  std::vector<std::uint8_t> data(static_cast<std::size_t>(shape.buffer_bytes(ps::BufferRole::data)), 0x5A);
  std::vector<std::uint8_t> scales(static_cast<std::size_t>(shape.buffer_bytes(ps::BufferRole::scales)), 0x7F);
  ps::GroupedView<Layout> view = shape;
  view.data = reinterpret_cast<ps::E4M3*>(data.data());
  view.scales = reinterpret_cast<ps::E8M0*>(scales.data());

  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Traits>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, shape);

  // The grid the CUDA executor launches for this record with the device's policy
  // (stash/policy.hpp): the kernel's occupancy is min_blocks_per_sm (its launch bound, at
  // <= 64 registers).
  LaunchShape grid;
  ps::with_stash_policy(major, [&](auto policy) {
    using Policy = decltype(policy);
    grid.blocks = static_cast<int>(
        ps::launch_blocks<Policy>(ps::device_blocks<Policy>(sms, Policy::min_blocks_per_sm), 0, rec.max_tiles()));
    grid.threads = Policy::threads_per_block;
  });
  if (blocks > 0) grid.blocks = blocks;
  if (threads > 0) grid.threads = threads;
  grid.slots = 2;
  grid.random_delays = false;

  std::vector<Row> rows;
  for (const auto& [name, bytes] :
       {std::pair<const char*, std::int64_t>{"empty", 0}, {"1 MiB", 1 << 20}, {"64 MiB", std::int64_t{64} << 20}}) {
    std::vector<std::int32_t> counts = counts_for(shape, bytes);
    view.counts = counts.data();
    LaunchCost cost;
    {
      CostCounter counter;
      Emulator{grid}.stash(pool, view, rec);
      cost = counter.cost();
    }
    if (rec.status().state != ps::RecordState::stashed) {
      std::fprintf(stderr, "launch_cost: the %s stash did not complete\n", name);
      return 1;
    }
    rows.push_back({name, rec.status().stream_bytes, rec.ref().header->tiles, cost});
    ps::discard(ps::host, pool, rec);
  }

  if (json) {
    std::printf("{\"sms\": %d, \"major\": %d, \"blocks\": %d, \"threads\": %d, \"rows\": [", sms, major, grid.blocks,
                grid.threads);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const LaunchCost& c = rows[i].cost;
      std::printf(
          "%s{\"stash\": \"%s\", \"stream_bytes\": %lld, \"tiles\": %lld, \"blocks\": %lld, \"rmw\": %lld, "
          "\"busiest_line_rmw\": %lld, \"atomic_loads\": %lld, \"atomic_stores\": %lld, \"fences\": %lld, "
          "\"barriers\": %lld}",
          i ? ", " : "", rows[i].name.c_str(), static_cast<long long>(rows[i].stream_bytes),
          static_cast<long long>(rows[i].tiles), static_cast<long long>(c.blocks), static_cast<long long>(c.rmw),
          static_cast<long long>(c.busiest_line_rmw), static_cast<long long>(c.loads), static_cast<long long>(c.stores),
          static_cast<long long>(c.fences), static_cast<long long>(c.barriers));
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf(
      "Launch cost of a stash (grid emulator, counted): MXFP8 columnwise, capacity-padded, %d experts x %lld "
      "tokens x hidden %lld;\ngrid as on %d SMs of sm_%d0: %d blocks x %d threads (atomic loads: polls, vary with "
      "timing)\n\n",
      kExperts, static_cast<long long>(kCapacity), static_cast<long long>(kHidden), sms, major, grid.blocks,
      grid.threads);
  std::printf("%-8s %12s %6s %7s %12s %10s %10s %8s %12s %14s %11s %13s\n", "stash", "stream bytes", "tiles", "blocks",
              "same-line RMW", "all RMW", "at. loads", "stores", "fences/blk", "barriers/blk", "fences/tile",
              "barriers/tile");
  for (const Row& r : rows) {
    const LaunchCost& c = r.cost;
    std::printf("%-8s %12lld %6lld %7lld %12lld %10lld %10lld %8lld %12.1f %14.1f %11s %13s\n", r.name.c_str(),
                static_cast<long long>(r.stream_bytes), static_cast<long long>(r.tiles),
                static_cast<long long>(c.blocks), static_cast<long long>(c.busiest_line_rmw),
                static_cast<long long>(c.rmw), static_cast<long long>(c.loads), static_cast<long long>(c.stores),
                c.per_block(c.fences), c.per_block(c.barriers), per_tile(c.fences, r.tiles).c_str(),
                per_tile(c.barriers, r.tiles).c_str());
  }
  std::printf(
      "\nSectors a warp's access touches (Nsight Compute's sectors per request), rowwise hidden %lld, 4 experts x 24 "
      "tokens;\nuse: the share of each sector touched that the access reads or writes (1: whole sectors)\n\n",
      static_cast<long long>(kHidden));
  std::printf("%-22s %-14s %9s %10s %10s %11s\n", "traits", "access", "requests", "sectors/rq", "lines/rq",
              "sector use");
  print_sector_rows<ps::StashTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>>>("BF16 lossless");
  print_sector_rows<ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::MXFP8_E4M3>>(
      "BF16 -> MXFP8 E4M3");
  print_sector_rows<ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::FP8Block128>>(
      "BF16 -> FP8 1x128");
  return 0;
}
