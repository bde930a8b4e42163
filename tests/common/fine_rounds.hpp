#pragma once
// The dependent rounds per warp (RoundCounter) and the sectors (SectorCounter) of stash_bench's fine-grained rows, one
// driver for the host test that holds the rounds and launch_cost's table (--rounds), which holds both.

#include <pagestash/pagestash.hpp>
#include <pagestash/sizing.hpp>

#include "../../bench/fine_grained.hpp"
#include "grid_emulator.hpp"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace pagestash_test {

/// The most rounds one warp claim may wait on a fine-grained row, issue 54's target: two tiles of the staged mover's
/// one to three rounds (and a round to spare). With the kernels' staging off, two capped tiles of one-byte runs
/// gathered a piece at a time wait 32 (16 a tile).
constexpr std::int64_t fine_rounds_bound = 8;

/// The most sectors a stash or a reload of a fine-grained row may touch, over its sector floor
/// (bench/sector_floor.hpp): today's worst row (NVFP4's reload, Qwen3-MoE compact at a mean of 128: 1.032), rounded
/// up; issue 54's target is 1.3. What is over 1: a line that two tiles share, each touching its sector. A reload that
/// stored a line's last piece by one store for each power of two in its length, on one sector, was 1.810; before the
/// kernels staged, 5.075 (docs/benchmarks.md, "Sector floor").
constexpr double fine_sector_bound = 1.05;

/// One emulated warp: its claims are two consecutive tiles, as on a GPU's grid (whatever the grid, a claim's rounds
/// are its two tiles'), and it emulates far faster than the executor's grid.
inline LaunchShape one_warp() {
  LaunchShape grid;
  grid.blocks = 1;
  grid.threads = 32;
  grid.slots = 1;
  grid.random_delays = false;
  grid.fibers = true;
  return grid;
}

/// The rows of the rounds table: every capacity-padded recipe of both model shapes at means 32-256, but the rowwise
/// ones (whole aligned rows: 4 rounds at every mean) at 32 only. f(shape, mean, recipe) for each.
template <class F>
void for_each_fine_row(F&& f) {
  for (const pagestash::sizing::ModelShape& fs : pagestash::sizing::model_shapes)
    for (std::int64_t mean : {32, 64, 128, 256})
      pagestash::for_each_recipe([&](auto r) {
        using R = decltype(r);
        if (std::string(R::placement) != "capacity") return;
        if (std::string(R::scales).empty() && mean != 32) return;
        f(fs, mean, r);
      });
}

/// What one operation of a fine-grained row is counted: its rounds and (when asked) its lanes' sectors.
struct FineCount {
  RoundCounter::Count rounds;
  SectorCounter::Count loads, stores;
  std::int64_t sectors() const { return loads.sectors + stores.sectors; }
};

/// One stash and one reload (no zero_tail) of a fine-grained row of layout L on `grid`, counted in the same emulated
/// run: rounds, and, with `sectors`, sectors too (slower: every access is kept until counted). The row's tensor and
/// counts (bench/fine_grained.hpp), 64 KiB pages. Zeroed buffers on 256 bytes (cudaMalloc's): the bytes don't matter.
template <class L>
std::array<FineCount, 2> count_fine_row(const pagestash::sizing::ModelShape& fs, std::int64_t mean,
                                        const LaunchShape& grid, bool sectors) {
  namespace ps = pagestash;
  using Tr = ps::StashTraits<L>;
  ps::GroupedView<L> v = pagestash_bench::fine_view<L>(fs, mean);
  const std::vector<std::int32_t> counts = pagestash_bench::fine_counts(fs, mean, v.max_tokens);
  v.counts = counts.data();
  std::vector<std::vector<unsigned char>> memory;
  auto buffers = [&](ps::GroupedView<L>& view) {
    auto aligned = [&](ps::BufferRole role) {
      memory.emplace_back(static_cast<std::size_t>(view.buffer_bytes(role)) + 256);
      const auto at = reinterpret_cast<std::uintptr_t>(memory.back().data());
      return memory.back().data() + (256 - at % 256) % 256;
    };
    view.data = reinterpret_cast<typename L::data_type*>(aligned(ps::BufferRole::data));
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(aligned(ps::BufferRole::scales));
    view.amax = L::has(ps::BufferRole::amax) ? reinterpret_cast<float*>(aligned(ps::BufferRole::amax)) : nullptr;
  };
  ps::GroupedView<L> in = v, out = v;
  buffers(in);
  buffers(out);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(v).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Tr>(pool, v);
  std::array<FineCount, 2> c;
  auto counted = [&](FineCount& into, const auto& operation) {
    if (sectors) {
      RoundsAndSectors count;
      operation();
      into.rounds = count.rounds.count(), into.loads = count.sectors.loads(), into.stores = count.sectors.stores();
    } else {
      RoundCounter rounds;
      operation();
      into.rounds = rounds.count();
    }
  };
  counted(c[0], [&] { Emulator{grid}.stash(pool, in, rec); });
  counted(c[1], [&] { Emulator{grid}.reload(pool, rec, out, false); });
  if (rec.status().state != ps::RecordState::reloaded) throw std::runtime_error("count_fine_row: not reloaded");
  return c;
}

}  // namespace pagestash_test
