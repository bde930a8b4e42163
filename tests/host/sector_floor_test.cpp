// The sector floor (bench/sector_floor.hpp) against a brute-force count of what a stash and a reload write: the
// sectors of the pages a host stash changes, and of the buffers its reload restores.

#include <pagestash/pagestash.hpp>

#include "../../bench/sector_floor.hpp"
#include "../common/fine_rounds.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace ps = pagestash;
using ps::BufferRole;

constexpr unsigned char poison = 0xFF;

/// Buffers of a view's shape, each on 256 bytes (cudaMalloc's), filled with `fill` (a random byte other than the poison
/// when negative).
template <class L>
struct AlignedTensor {
  ps::GroupedView<L> view;
  std::vector<std::vector<unsigned char>> memory;

  AlignedTensor(const ps::GroupedView<L>& shape, const std::vector<std::int32_t>& counts, int fill, std::mt19937& rng)
      : view(shape) {
    auto buffer = [&](BufferRole role) {
      const auto bytes = static_cast<std::size_t>(view.buffer_bytes(role));
      memory.emplace_back(bytes + 256);
      unsigned char* at = memory.back().data();
      at += (256 - reinterpret_cast<std::uintptr_t>(at) % 256) % 256;
      std::uniform_int_distribution<int> byte(0, poison - 1);
      for (std::size_t i = 0; i < bytes; ++i) at[i] = static_cast<unsigned char>(fill < 0 ? byte(rng) : fill);
      return at;
    };
    view.data = reinterpret_cast<typename L::data_type*>(buffer(BufferRole::data));
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(buffer(BufferRole::scales));
    view.amax = L::has(BufferRole::amax) ? reinterpret_cast<float*>(buffer(BufferRole::amax)) : nullptr;
    view.counts = counts.data();
  }
};

/// 32-byte sectors of [at, at + bytes) holding a byte other than the poison, and those bytes.
std::int64_t written_sectors(const unsigned char* at, std::int64_t bytes, std::int64_t* written) {
  std::int64_t sectors = 0;
  for (std::int64_t s = 0; s < bytes; s += 32) {
    std::int64_t here = 0;
    for (std::int64_t i = s; i < s + 32 && i < bytes; ++i) here += at[i] != poison;
    sectors += here > 0;
    *written += here;
  }
  return sectors;
}

/// A stash of random bytes into poisoned pages, and its reload into poisoned buffers, on the host executor: the
/// sectors each wrote (brute force: every byte looked at), against the floor. Returns the floor.
template <class L>
pagestash_bench::SectorFloor check_floor(const ps::GroupedView<L>& shape, const std::vector<std::int32_t>& counts,
                                         std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  AlignedTensor<L> src(shape, counts, -1, rng), dst(shape, counts, poison, rng);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  for (std::int32_t id = 0; id < cfg.device_pages; ++id) std::memset(pool.ref().page(id), poison, cfg.page_bytes);
  auto rec = ps::make_record<Tr>(pool, shape);
  ps::stash(ps::host, pool, src.view, rec);
  std::int64_t stream_bytes = 0, stream_sectors = 0;
  for (std::int32_t id = 0; id < cfg.device_pages; ++id)
    stream_sectors += written_sectors(pool.ref().page(id), cfg.page_bytes, &stream_bytes);
  ps::reload(ps::host, pool, rec, dst.view);
  REQUIRE(rec.status().state == ps::RecordState::reloaded);
  std::int64_t live_bytes = 0, buffer_sectors = 0;
  for (BufferRole role : {BufferRole::data, BufferRole::scales, BufferRole::amax})
    if (ps::handling_of<Tr>(role) == ps::Handling::paged)
      buffer_sectors += written_sectors(static_cast<const unsigned char*>(dst.view.buffer(role)),
                                        dst.view.buffer_bytes(role), &live_bytes);
  const pagestash_bench::SectorFloor floor = pagestash_bench::sector_floor<Tr>(shape, counts.data());
  const std::string layout = L::name;
  CAPTURE(layout);
  CAPTURE(stream_bytes);
  CHECK(floor.live_bytes == live_bytes);
  CHECK(floor.buffer_sectors == buffer_sectors);
  CHECK(floor.stream_sectors == stream_sectors);
  CHECK(floor.live_bytes > 0);
  return floor;
}

/// Sectors of a stash that reads each line of the paged buffers whole (live or not, up to the pitch) and writes the
/// stream: a wasteful copy.
template <class L>
std::int64_t whole_line_sectors(const ps::GroupedView<L>& v, const std::vector<std::int32_t>& counts,
                                const pagestash_bench::SectorFloor& floor) {
  std::int64_t sectors = floor.stream_sectors;
  for (BufferRole role : {BufferRole::data, BufferRole::scales}) {
    const ps::BufferGeometry geo = v.geometry(role);
    pagestash_bench::SectorSpan span;
    for (std::int32_t s = 0; s < geo.segment_count(); ++s) {
      const ps::Segment seg = geo.segment(s, counts.data());
      for (std::int64_t l = 0; seg.live > 0 && l < seg.lines; ++l) span.add(seg.line_offset(l), seg.pitch);
    }
    sectors += span.sectors();
  }
  return sectors;
}

/// A shape of `groups` groups of capacity `tokens` (rounded up to the granule), and counts from `pick` (aligned).
template <class L>
ps::GroupedView<L> small_shape(std::int32_t groups, std::int64_t tokens, std::int64_t hidden) {
  ps::GroupedView<L> v;
  v.groups = groups;
  v.hidden = hidden;
  v.max_tokens = 1;
  v.max_tokens = (tokens + v.granule() - 1) / v.granule() * v.granule();
  return v;
}

template <class L>
std::vector<std::int32_t> aligned_counts(const ps::GroupedView<L>& v, std::vector<std::int32_t> counts) {
  for (std::int32_t& m : counts) m = static_cast<std::int32_t>(m / v.count_alignment() * v.count_alignment());
  return counts;
}

}  // namespace

TEST_CASE("sector floor: the sectors a host stash writes and its reload restores (every byte looked at)") {
  using Bf16 = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
  using Mx8 = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>;
  using Nv4Co = ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::CompactScales>;
  using Nv4Sw = ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>;
  using Nv4Packed = ps::ColumnwiseQuantized<ps::NVFP4, ps::Packed, ps::SwizzledScales>;
  // Experts of 0-4 tokens (1-2-byte NVFP4 runs: a sector holds one run of the buffer, the stream several), full ones,
  // and between; rows and segments of bytes not a multiple of 32 (hidden 40, 48, 96 / 32 MXFP8 scale lines), so that
  // the stream's segments and the buffers' rows share sectors.
  const std::vector<std::int32_t> counts{0, 1, 2, 3, 4, 37, 64, 128};
  const auto bf16 = small_shape<Bf16>(8, 128, 40);
  check_floor(bf16, aligned_counts(bf16, counts), 1);
  const auto mx8 = small_shape<Mx8>(8, 128, 96);
  check_floor(mx8, aligned_counts(mx8, counts), 2);
  const auto packed = small_shape<Nv4Packed>(8, 512, 48);
  check_floor(packed, aligned_counts(packed, counts), 3);
  const auto sw = small_shape<Nv4Sw>(8, 128, 48);
  check_floor(sw, aligned_counts(sw, counts), 4);
  const auto co = small_shape<Nv4Co>(8, 2048, 48);
  check_floor(co, aligned_counts(co, counts), 5);
  // Experts of 0-4 tokens only: a copy that reads whole lines (the pitch, 1 KiB, where the live runs are 0-2 bytes) is
  // past the bound launch_cost holds: the floor tells it from one that reads the live runs.
  const std::vector<std::int32_t> c = aligned_counts(co, {0, 1, 2, 3, 4, 1, 2, 4});
  const pagestash_bench::SectorFloor floor = check_floor(co, c, 6);
  const std::int64_t wasteful = whole_line_sectors(co, c, floor);
  CAPTURE(wasteful);
  CAPTURE(floor.sectors());
  CHECK(static_cast<double>(wasteful) > pagestash_test::fine_sector_bound * static_cast<double>(floor.sectors()));
}

TEST_CASE("sector floor: ranges sharing a sector count it once") {
  pagestash_bench::SectorSpan span;
  span.add(0, 1);     // sector 0
  span.add(1, 1);     // sector 0 again
  span.add(31, 2);    // sectors 0, 1
  span.add(64, 0);    // nothing
  span.add(100, 64);  // sectors 3, 4, 5
  CHECK(span.sectors() == 5);
}
