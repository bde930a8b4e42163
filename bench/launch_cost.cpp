// What one stash launch costs besides its copies, counted without a GPU: the kernel body
// (execution/operation.hpp) runs on the grid emulator (tests/common/grid_emulator.hpp) with
// the grid the CUDA executor launches on an H200 (132 SMs, sm_90), and every device-scope
// atomic, fence and block barrier it executes is counted. Same-line read-modify-writes
// serialise in the L2; for a small stash of a large capacity-padded record (fine-grained
// MoE) they, not bandwidth, decide the time. docs/benchmarks.md keeps the table.
//
//   pagestash_launch_cost [--sms N] [--major M] [--blocks B --threads T]
//                         [--json | --rounds | --critical-path [--mib N]]
//
// --blocks/--threads replace the executor's grid (to count another launch shape).
//
// A second table counts, for each warp-wide load and store of a stash and a reload (lossless
// and compressed), the 32-byte sectors and 128-byte lines its lanes touch (SectorCounter).
//
// A third (--rounds: only it) counts the dependent rounds of each warp (RoundCounter; docs/design.md's glossary) in a
// stash and a reload of stash_bench's fine-grained rows: its shapes, means, recipes and counts, on one warp (or the
// --blocks and --threads given), and, in the same emulated run, the sectors its lanes touch against the row's sector
// floor (bench/sector_floor.hpp); it fails if a warp claim waits more than fine_rounds_bound or a row touches more than
// fine_sector_bound x its floor (a ctest holds both).
//
// A fourth (--critical-path: only it) counts each kernel family's critical path up to its first copy (CriticalPath):
// the owner's dependent global accesses and fences before its verdict, any other block's before its first data load
// (a stash's look-ahead prefetch, or a copy's load) and before its first copy load, and the block barriers between
// verdict and first copy load, for a 1 MiB stash (--mib N: N MiB) of a BF16, an MXFP8 and an
// NVFP4 layout; and the longest block's whole launch, the copy's data rounds included, with the bytes it keeps in
// flight on average (loaded bytes over that chain of rounds: Little's law, one round a memory latency).

#include <pagestash/pagestash.hpp>
#include <pagestash/sizing.hpp>

#include "../tests/common/fine_rounds.hpp"
#include "../tests/common/grid_emulator.hpp"
#include "fine_grained.hpp"
#include "sector_floor.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
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
template <class L = Layout>
std::vector<std::int32_t> counts_for(const ps::GroupedView<L>& shape, std::int64_t bytes) {
  using Tr = ps::StashTraits<L>;
  std::vector<std::int32_t> counts(kExperts, 0);
  std::mt19937 rng(7);
  std::vector<double> w(kExperts);
  double sum = 0;
  for (double& x : w) sum += (x = std::exponential_distribution<double>(1.0)(rng));
  for (std::int64_t tokens = 0; ps::plan_work<Tr>(shape, counts.data(), false, nullptr).stream_bytes < bytes;
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

/// 256-byte aligned bytes (as cudaMalloc's), seeded random: bytes below 0x40, so that 16-bit values are finite.
struct AlignedBytes {
  std::vector<std::uint8_t> storage;
  std::uint8_t* data;
  AlignedBytes(std::size_t n, std::uint32_t seed) : storage(n + 256) {
    data = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 255) / 256 * 256);
    std::mt19937 rng(seed);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<std::uint8_t>(rng() & 0x3F);
  }
};

/// A view of L's every buffer, each on its own aligned bytes.
template <class L>
struct AlignedTensor {
  std::vector<AlignedBytes> buffers;
  ps::GroupedView<L> view;
  AlignedTensor(const ps::GroupedView<L>& shape, std::uint32_t seed) : view(shape) {
    for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales, ps::BufferRole::amax})
      buffers.emplace_back(static_cast<std::size_t>(shape.buffer_bytes(role)), seed++);
    view.data = reinterpret_cast<typename L::data_type*>(buffers[0].data);
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(buffers[1].data);
    view.amax = L::has(ps::BufferRole::amax) ? reinterpret_cast<float*>(buffers[2].data) : nullptr;
  }
};

/// One row: the sectors a warp's accesses touch in one stash and one reload of Tr (hidden 7168, two experts of 40 and
/// 88 tokens, rounded up to the layout's count alignment; a plain tensor's 88).
template <class Tr>
void print_sector_row(const char* name) {
  using L = typename Tr::layout;
  ps::GroupedView<L> shape;
  shape.hidden = kHidden;
  const bool one_group = std::is_same_v<L, ps::Plain<typename L::data_type>>;
  shape.groups = one_group ? 1 : 2;
  const std::int64_t align = shape.count_alignment();
  std::vector<std::int32_t> counts;
  for (std::int64_t m : {40, 88}) counts.push_back(static_cast<std::int32_t>((m + align - 1) / align * align));
  if (one_group) counts = {counts[1]};
  shape.max_tokens = ((L::placement::packed && !one_group ? counts[0] + counts[1] : counts.back()) + 127) / 128 * 128;
  shape.counts = counts.data();
  AlignedTensor<L> in(shape, 1), out(shape, 4);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  const auto c = pagestash_test::count_sectors<Tr>(pool, in.view, out.view);
  std::printf("%-36s", name);
  for (const auto& k : c) std::printf("  %6.2f %5.3f", k.sectors_per_request(), k.sector_use());
  std::printf("\n");
}

/// The grid the CUDA executor launches for a record of `max_tiles` tiles with the device's policy (stash/policy.hpp):
/// the kernel's occupancy is min_blocks_per_sm (its launch bound, at <= 64 registers); two blocks resident at a time,
/// started in order.
LaunchShape executor_grid(std::int64_t max_tiles, int sms, int major) {
  LaunchShape grid;
  ps::with_stash_policy(major, [&](auto policy) {
    using Policy = decltype(policy);
    grid.blocks = static_cast<int>(
        ps::launch_blocks<Policy>(ps::device_blocks<Policy>(sms, Policy::min_blocks_per_sm), 0, max_tiles));
    grid.threads = Policy::threads_per_block;
  });
  grid.slots = 2;
  grid.random_delays = false;
  grid.fibers = true;  // counted, not explored: a block on one host thread
  return grid;
}

/// One row of the critical-path table: a 1 MiB stash of L (capacity-padded, kExperts x kCapacity x kHidden), its
/// reload and a discard, on the executor's grid.
template <class L>
void print_critical_path_row(const char* name, int sms, int major, int mib, int blocks, int threads) {
  using Tr = ps::StashTraits<L>;
  ps::GroupedView<L> v;
  v.max_tokens = kCapacity;
  v.hidden = kHidden;
  v.groups = kExperts;
  const std::vector<std::int32_t> counts = counts_for(v, std::int64_t{mib} << 20);
  v.counts = counts.data();
  AlignedTensor<L> in(v, 21), out(v, 22);
  in.view.counts = out.view.counts = counts.data();
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = 2 * ps::pages_for(ps::work_bounds<Tr>(v).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  // The executor's blocks and threads, but 4 blocks at most: every block's path is the same whatever the grid (a
  // block of a larger grid only waits longer), and 4 blocks of 512 threads emulate quickly.
  LaunchShape grid = executor_grid(ps::make_record<Tr>(pool, v).max_tiles(), sms, major);
  grid.blocks = std::min(grid.blocks, 4);
  if (blocks > 0) grid.blocks = blocks;
  if (threads > 0) grid.threads = threads;
  const auto c = pagestash_test::count_critical_paths<Tr>(pool, in.view, out.view, grid);
  const char* family[] = {"stash", "reload", "discard"};
  for (int f = 0; f < 3; ++f) {
    const auto& k = c[static_cast<std::size_t>(f)];
    char barriers[2][16], other[32], other_copy[32];
    std::snprintf(barriers[0], sizeof barriers[0], "%lld", static_cast<long long>(k.owner_barriers));
    std::snprintf(barriers[1], sizeof barriers[1], "%lld", static_cast<long long>(k.other_barriers));
    std::snprintf(other, sizeof other, "%lld + %lld", static_cast<long long>(k.other.accesses),
                  static_cast<long long>(k.other.fences));
    std::snprintf(other_copy, sizeof other_copy, "%lld + %lld", static_cast<long long>(k.other_copy.accesses),
                  static_cast<long long>(k.other_copy.fences));
    // The copy's loads in flight, by Little's law one round a latency: the longest block's loaded bytes over its
    // chain of rounds, against the peak its lanes' loads_in_flight vectors hold (duty: the share of the chain's rounds
    // that carry the peak).
    const double peak = 16.0 * ps::StashPolicy::loads_in_flight * grid.threads;
    char chain[64] = "-";
    if (f < 2)
      std::snprintf(chain, sizeof chain, "%6lld %8.1f %6.2f", static_cast<long long>(k.chain),
                    k.bytes_in_flight() / 1024, k.bytes_in_flight() / peak);
    std::printf("%-26s %-8s %5d %12lld + %-5lld %8s %7lld %15s %15s %8s   %s\n", name, family[f], grid.blocks,
                static_cast<long long>(k.owner.accesses), static_cast<long long>(k.owner.fences),
                k.owner_barriers < 0 ? "-" : barriers[0], static_cast<long long>(k.others), k.others ? other : "-",
                k.others ? other_copy : "-", k.others ? barriers[1] : "-", chain);
  }
}

/// The critical-path table (CriticalPath, tests/common/grid_emulator.hpp).
void print_critical_paths(int sms, int major, int mib, int blocks, int threads) {
  std::printf(
      "Critical path to the first copy (grid emulator, counted: dependent global accesses + device fences; a barrier "
      "joins\na block's threads), a %d MiB stash of %d experts x %lld tokens x hidden %lld, capacity-padded, its "
      "reload and a\ndiscard; blocks of the executor's threads as on %d SMs of sm_%d0 (4 of its blocks, or --blocks "
      "and\n--threads; which block gets tiles varies with timing, the longest path is given). Then the whole launch of "
      "the\nlongest block: its chain of rounds (the copy's data rounds too), the KiB it keeps in flight on average\n"
      "(loaded bytes / chain), and that over the peak of its lanes' loads in flight (duty)\n\n",
      mib, kExperts, static_cast<long long>(kCapacity), static_cast<long long>(kHidden), sms, major);
  std::printf("%-26s %-8s %5s %20s %8s %7s %15s %15s %8s   %6s %8s %6s\n", "layout", "kernel", "grid",
              "owner to verdict", "barriers", "others", "to first load", "to first copy", "barriers", "chain", "KiB",
              "duty");
  print_critical_path_row<ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>>("rowwise BF16", sms, major, mib, blocks,
                                                                                threads);
  print_critical_path_row<Layout>("columnwise MXFP8, compact", sms, major, mib, blocks, threads);
  print_critical_path_row<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>>(
      "rowwise NVFP4, swizzled", sms, major, mib, blocks, threads);
}

/// The rounds table (tests/common/fine_rounds.hpp's rows) on `grid`, with each row's sectors against its sector floor
/// (bench/sector_floor.hpp); false if a row waits more than at_most rounds or touches more than floor_bound x its
/// floor.
bool print_rounds(const LaunchShape& grid, std::int64_t at_most, double floor_bound) {
  std::printf(
      "Dependent rounds per warp (grid emulator, counted: a round is a lane's loads up to where it uses them; a span's "
      "are\nits slowest lane's, a warp's the sum over the spans of one claim), stash_bench's fine-grained rows, %d "
      "block(s) of %d threads;\nfloor: the row's sector floor (32-byte sectors of the live bytes' buffers and stream, "
      "read + written), thousands;\nx: the sectors the lanes' loads and stores touch (each warp access's), over the "
      "floor (a row whose observed stores fall short of its live bytes, a counting gap, is marked * and fails)\n\n",
      grid.blocks, grid.threads);
  std::printf("%-12s %-28s %5s %6s %10s %10s %10s %10s %9s %8s %8s\n", "shape", "recipe", "mean", "spans", "stash max",
              "stash mean", "reload max", "reload mean", "floor k", "stash x", "reload x");
  std::int64_t most = 0;
  double worst = 0;
  bool complete = true;
  std::string worst_row;
  pagestash_test::for_each_fine_row([&](const ps::sizing::ModelShape& fs, std::int64_t mean, auto r) {
    using R = decltype(r);
    using L = typename R::layout;
    const auto c = pagestash_test::count_fine_row<L>(fs, mean, grid, true);
    const ps::GroupedView<L> v = pagestash_bench::fine_view<L>(fs, mean);
    const auto counts = pagestash_bench::fine_counts(fs, mean, v.max_tokens);
    const pagestash_bench::SectorFloor floor = pagestash_bench::sector_floor<ps::StashTraits<L>>(v, counts.data());
    double x[2];
    bool seen[2];  // every live byte's store observed: else the count misses sectors
    for (int k = 0; k < 2; ++k) {
      x[k] = static_cast<double>(c[k].sectors()) / static_cast<double>(floor.sectors());
      seen[k] = c[k].stores.bytes >= floor.live_bytes;
    }
    std::printf("%-12s %-28s %5lld %6lld %10lld %10.1f %10lld %10.1f %9.1f %7.3f%s %7.3f%s\n", fs.name,
                R::name().c_str(), static_cast<long long>(mean), static_cast<long long>(c[0].rounds.spans),
                static_cast<long long>(c[0].rounds.max_warp), c[0].rounds.mean_warp(),
                static_cast<long long>(c[1].rounds.max_warp), c[1].rounds.mean_warp(),
                static_cast<double>(floor.sectors()) / 1e3, x[0], seen[0] ? " " : "*", x[1], seen[1] ? " " : "*");
    std::fflush(stdout);
    most = std::max({most, c[0].rounds.max_warp, c[1].rounds.max_warp});
    for (int k = 0; k < 2; ++k) {
      complete = complete && seen[k];
      if (x[k] > worst) {
        worst = x[k];
        worst_row = std::string(fs.name) + " " + R::name() + " " + std::to_string(mean) + (k ? " reload" : " stash");
      }
    }
  });
  std::printf("\nthe slowest warp claim: %lld dependent rounds (at most %lld)\n", static_cast<long long>(most),
              static_cast<long long>(at_most));
  std::printf("the most sectors over the floor: %.3f x, %s (at most %.2f)\n", worst, worst_row.c_str(), floor_bound);
  if (!complete) std::printf("a row's observed stores fall short of its live bytes (*)\n");
  return most <= at_most && worst <= floor_bound && complete;
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 132, major = 9, blocks = 0, threads = 0, mib = 1;
  bool json = false, rounds = false, critical = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sms") && i + 1 < argc) sms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--major") && i + 1 < argc) major = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) blocks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--rounds")) rounds = true;
    else if (!std::strcmp(argv[i], "--critical-path")) critical = true;
    else if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(
          stderr,
          "usage: %s [--sms N] [--major M] [--blocks B --threads T] [--json | --rounds | --critical-path [--mib N]]\n",
          argv[0]);
      return 2;
    }
  }
  if (rounds) {
    // One warp (its claims are the grid's: two consecutive tiles), or the blocks and threads given.
    LaunchShape grid = pagestash_test::one_warp();
    if (blocks > 0) grid.blocks = blocks;
    if (threads > 0) grid.threads = threads;
    return print_rounds(grid, pagestash_test::fine_rounds_bound, pagestash_test::fine_sector_bound) ? 0 : 1;
  }
  if (critical) {
    print_critical_paths(sms, major, mib, blocks, threads);
    return 0;
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

  LaunchShape grid = executor_grid(rec.max_tiles(), sms, major);
  if (blocks > 0) grid.blocks = blocks;
  if (threads > 0) grid.threads = threads;

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
      "\nSectors a warp's access touches (Nsight Compute's sectors per request) and the share of each it uses (1: "
      "whole\nsectors), hidden %lld, two experts of 40 and 88 tokens (rounded up to the layout's count alignment)\n\n",
      static_cast<long long>(kHidden));
  std::printf("%-36s  %-12s  %-12s  %-12s  %-12s\n", "traits", "stash loads", "stash stores", "reload loads",
              "reload stores");
  print_sector_row<ps::StashTraits<ps::Plain<ps::BF16>>>("plain BF16");
  print_sector_row<ps::StashTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>>>("rowwise BF16, packed");
  print_sector_row<ps::StashTraits<ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>>>("rowwise FP16, capacity");
  print_sector_row<ps::StashTraits<ps::RowwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::SwizzledScales>>>(
      "rowwise MXFP8, packed, swizzled");
  print_sector_row<ps::StashTraits<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>>>(
      "rowwise NVFP4, capacity, swizzled");
  print_sector_row<Traits>("columnwise MXFP8, capacity, compact");
  print_sector_row<ps::StashTraits<ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::SwizzledScales>>>(
      "columnwise NVFP4, packed, swizzled");
  print_sector_row<ps::CompressedTraits<ps::RowwiseUnquantized<ps::BF16, ps::Packed>, ps::MXFP8_E4M3>>(
      "BF16 -> MXFP8 E4M3 (compressed)");
  print_sector_row<ps::CompressedTraits<ps::RowwiseUnquantized<ps::FP16, ps::CapacityPadded>, ps::FP8Block128>>(
      "FP16 cap. -> FP8 1x128 (compressed)");
  return 0;
}
