// A stash's look-ahead (stash/look_ahead.hpp) on the grid emulator: what each warp prefetches before the verdict,
// against what it then loads. Counts drawn from several distributions (uniform, skewed, every group full, bad ones),
// buffers of the exact byte size (ASan sees a range past the end).

#include <pagestash/pagestash.hpp>

#include <doctest/doctest.h>

#include "../common/grid_emulator.hpp"
#include "../common/host_tensor.hpp"
#include "../common/stash_sequence.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace {

using namespace pagestash_test;

/// Each warp's prefetches, and the bytes it loads in the spans of its first claim (block b's warp w: claim b x warps +
/// w, its first chunk's), through the vector observer.
class LookAheadRecorder {
 public:
  struct Range {
    std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  };
  struct Warp {
    std::vector<Range> prefetched;
    Range first_claim;  ///< the hull of its loads there
  };
  using Warps = std::map<std::pair<std::int64_t, int>, Warp>;

  explicit LookAheadRecorder(int warps_per_block) : warps_per_block_(warps_per_block) {
    ps::vector_observer().set(&LookAheadRecorder::observe, this);
  }
  ~LookAheadRecorder() { ps::vector_observer().clear(); }
  LookAheadRecorder(const LookAheadRecorder&) = delete;
  LookAheadRecorder& operator=(const LookAheadRecorder&) = delete;

  Warps warps() const {
    std::lock_guard<std::mutex> lock(m_);
    return warps_;
  }

 private:
  static void observe(const void* address, int bytes, ps::VectorAccess access, void* context) {
    EmulatedThread& t = emulated_thread();
    if (t.block < 0) return;
    auto* self = static_cast<LookAheadRecorder*>(context);
    if (access == ps::VectorAccess::tile) return begin_span(t, bytes);
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    const auto end = a + static_cast<std::uintptr_t>(bytes);
    std::lock_guard<std::mutex> lock(self->m_);
    Warp& w = self->warps_[{t.block, t.warp}];
    if (access == ps::VectorAccess::prefetch) {
      w.prefetched.push_back(Range{a, end});
    } else if (access == ps::VectorAccess::load && address != nullptr &&
               t.claim == t.block * self->warps_per_block_ + t.warp) {
      w.first_claim.lo = std::min(w.first_claim.lo, a);
      w.first_claim.hi = std::max(w.first_claim.hi, end);
    }
  }

  int warps_per_block_;
  mutable std::mutex m_;
  Warps warps_;
};

enum class Counts { uniform, skewed, full, bad };

template <class L>
std::vector<std::int32_t> draw_counts(const ps::GroupedView<L>& v, Counts kind, std::mt19937& rng) {
  if (kind == Counts::bad) return bad_counts(v, rng);
  std::vector<std::int32_t> c = random_counts(v, rng);
  if (kind == Counts::full) {
    const std::int64_t per = L::placement::packed ? v.max_tokens / v.groups : v.max_tokens;
    const std::int64_t align = v.count_alignment();
    std::fill(c.begin(), c.end(), static_cast<std::int32_t>(per / align * align));
  } else if (kind == Counts::skewed) {  // most groups empty, a few carry everything (a hot expert)
    for (auto& m : c)
      if (rng() % 4 != 0) m = 0;
  }
  return c;
}

/// Stashes of L at `hidden` x `max_tokens` x `groups` on 6 blocks of 4 warps: every prefetch is of 16-byte sectors
/// inside a paged buffer; with counts the stash accepts, inside the bytes its warp then loads in its first claim
/// (widened to 16) and overlapping them, and in every block but the owner every warp but the first (the leader's)
/// that loads there prefetched first.
template <class L>
void check_look_ahead(std::int64_t hidden, std::int64_t max_tokens, int groups, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  ps::GroupedView<L> shape;
  shape.hidden = hidden;
  shape.max_tokens = max_tokens;
  shape.groups = groups;
  REQUIRE(ps::looks_ahead<Tr>(shape));
  ps::PoolConfig cfg;
  cfg.page_bytes = 1 << 16;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Tr>(pool, shape);
  LaunchShape grid;
  grid.blocks = 6;
  grid.threads = 128;
  grid.slots = 2;
  grid.seed = seed;
  grid.random_delays = false;
  grid.fibers = true;
  for (const Counts kind : {Counts::uniform, Counts::skewed, Counts::full, Counts::bad, Counts::uniform}) {
    HostTensor<L> in(max_tokens, hidden, groups, draw_counts(shape, kind, rng));
    for (auto* buf : {&in.data, &in.scales})
      for (auto& b : *buf) b = static_cast<std::uint8_t>(rng());
    LookAheadRecorder::Warps warps;
    std::set<std::int64_t> unprefetched, prefetching, loading;  // blocks
    {
      LookAheadRecorder recorder(grid.threads / 32);
      Emulator{grid}.stash(pool, in.view, rec);
      warps = recorder.warps();
    }
    const bool accepted = kind != Counts::bad;
    INFO("counts " << static_cast<int>(kind) << ", seed " << seed);
    REQUIRE(rec.status().state == (accepted ? ps::RecordState::stashed : ps::RecordState::failed));
    const auto inside = [&](const LookAheadRecorder::Range& r) {
      for (const BufferRole role : {BufferRole::data, BufferRole::scales}) {
        const auto first = reinterpret_cast<std::uintptr_t>(in.view.buffer(role));
        if (first != 0 && r.lo >= first && r.hi <= first + static_cast<std::uintptr_t>(in.view.buffer_bytes(role)))
          return true;
      }
      return false;
    };
    for (const auto& [where, w] : warps) {
      CAPTURE(where.first);
      CAPTURE(where.second);
      for (const auto& r : w.prefetched) {
        CHECK(r.lo % 16 == 0);
        CHECK(r.hi % 16 == 0);
        CHECK(r.hi > r.lo);
        CHECK(inside(r));
        if (!accepted) continue;
        REQUIRE(w.first_claim.hi > 0);  // it prefetched for a claim it then copied
        CHECK(r.lo >= w.first_claim.lo / 16 * 16);
        CHECK(r.hi <= (w.first_claim.hi + 15) / 16 * 16);
        CHECK(r.lo < w.first_claim.hi);
        CHECK(r.hi > w.first_claim.lo);
      }
      if (accepted && where.second != 0 && w.first_claim.hi > 0 && w.prefetched.empty())
        unprefetched.insert(where.first);
      if (!w.prefetched.empty()) prefetching.insert(where.first);
      if (where.second != 0 && w.first_claim.hi > 0) loading.insert(where.first);
    }
    // Every block but the owner (which makes the plan meanwhile) looked ahead in each warp that then loaded.
    CHECK(unprefetched.size() <= 1);
    for (const std::int64_t block : unprefetched) CHECK(prefetching.count(block) == 0);
    if (accepted) CHECK(prefetching.size() + 1 >= loading.size());
    if (accepted) ps::discard(ps::host, pool, rec);
  }
}

}  // namespace

TEST_CASE(
    "look-ahead: a stash's warps prefetch, before the verdict, inside the buffers and the bytes their first claim "
    "loads, for counts drawn several ways") {
  std::uint32_t seed = 1;
  SUBCASE("rowwise BF16, capacity-padded: lines of 2 KiB, two a tile") {
    check_look_ahead<ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>>(1024, 64, 24, seed);
  }
  SUBCASE("rowwise BF16, packed: one segment") {
    check_look_ahead<ps::RowwiseUnquantized<ps::BF16, ps::Packed>>(1000, 1536, 24, seed + 1);
  }
  SUBCASE("columnwise MXFP8, capacity-padded, compact scales: short lines, the staged mover's") {
    check_look_ahead<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::CapacityPadded, ps::CompactScales>>(512, 128, 20,
                                                                                                     seed + 2);
  }
  SUBCASE("rowwise NVFP4, capacity-padded, swizzled scales") {
    check_look_ahead<ps::RowwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>>(2048, 128, 16, seed + 3);
  }
  SUBCASE("plain FP32: one group, one line") { check_look_ahead<ps::Plain<float>>(3000, 700, 1, seed + 4); }
}
