// The bulk mover (stash/bulk_copy.hpp) through its host twin: on hand-made segments against the other movers and a
// byte-for-byte oracle (engine_check.hpp), and in the kernel body on the grid emulator against the vector mover, with
// the vector observer seeing its copies (one access a bulk copy, more than a vector).

#include <doctest/doctest.h>

#include "../common/engine_check.hpp"
#include "../common/layout_list.hpp"
#include "../common/overlap.hpp"
#include "../common/stash_sequence.hpp"

#include <atomic>

namespace {

namespace ps = pagestash;
using namespace pagestash_test;
using Segments = std::vector<ps::Segment>;

/// Counts the accesses of more than 16 bytes (only bulk copies make them) and their bytes, loads and stores.
class BulkAccesses {
 public:
  BulkAccesses() { ps::vector_observer().set(&BulkAccesses::observe, this); }
  ~BulkAccesses() { ps::vector_observer().clear(); }
  BulkAccesses(const BulkAccesses&) = delete;
  BulkAccesses& operator=(const BulkAccesses&) = delete;
  std::int64_t loads() const { return loads_.load(); }
  std::int64_t stores() const { return stores_.load(); }
  std::int64_t bytes() const { return bytes_.load(); }

 private:
  static void observe(const void* address, int bytes, ps::VectorAccess access, void* context) {
    auto* self = static_cast<BulkAccesses*>(context);
    if (bytes <= 16 || (access != ps::VectorAccess::load && access != ps::VectorAccess::store)) return;
    // A bulk copy's address and size are multiples of 16 bytes.
    if (reinterpret_cast<std::uintptr_t>(address) % 16 != 0 || bytes % 16 != 0) self->misaligned_.store(true);
    (access == ps::VectorAccess::load ? self->loads_ : self->stores_).fetch_add(1);
    self->bytes_.fetch_add(bytes);
  }

 public:
  std::atomic<bool> misaligned_{false};

 private:
  std::atomic<std::int64_t> loads_{0}, stores_{0}, bytes_{0};
};

}  // namespace

TEST_CASE("bulk mover: aligned runs of 16 B to 5 KiB at 16-byte offsets move the bytes of a plain copy") {
  // Runs of whole vectors at every 16-byte offset class that cuts windows and pages differently, dense (pitch = run:
  // one piece a window) or with dead rests; pages of 256 B (tiles cut inside a run) to 64 KiB; empty segments beside.
  int cases = 0, bulk_cases = 0;
  for (int page_shift : {8, 12, 16}) {
    for (std::int64_t run : {16, 128, 144, 1024, 1040, 5136}) {
      for (std::int64_t offset : {0, 16, 240, 496}) {
        for (std::int64_t dead : {0, 16, 48}) {
          EngineCase c;
          c.page_shift = page_shift;
          c.zero_tail = dead == 16;
          const std::int64_t pitch = run + dead, lines = std::max<std::int64_t>(2, 6000 / pitch);
          c.segments = Segments{{offset, 0, 16, 0},
                                {offset, lines, pitch, run},
                                {offset + lines * pitch, 3, 32, 0},
                                {offset + lines * pitch + 96, 1, 2064, 2064}};
          c.seed = static_cast<std::uint32_t>(page_shift * 100000 + run * 10 + offset + dead);
          BulkAccesses bulk;
          INFO("page_shift " << page_shift << ", run " << run << ", offset " << offset << ", dead " << dead);
          REQUIRE(check_engine(c) == "");
          CHECK_FALSE(bulk.misaligned_.load());
          // Runs of at least bulk_min_run, or dense ones, are bulk-copied (both directions); shorter ones with dead
          // rests only where a tile ends inside one run.
          if (run >= ps::StashPolicy::bulk_min_run || dead == 0) {
            CHECK(bulk.loads() > 0);
            CHECK(bulk.stores() > 0);
            ++bulk_cases;
          }
          ++cases;
        }
      }
    }
  }
  MESSAGE("bulk cases: " << bulk_cases << " of " << cases);
  CHECK(bulk_cases >= cases * 3 / 4);
}

TEST_CASE("bulk mover: tiles not aligned alike, or not whole vectors, fall back to the other movers") {
  // Offsets off 16 bytes, runs not multiples of 16: no bulk copy, the same bytes as a plain copy.
  for (std::int64_t offset : {1, 8, 15}) {
    for (std::int64_t run : {15, 136, 1000, 4100}) {
      EngineCase c;
      c.page_shift = 12;
      // The second segment as misaligned as the first.
      c.segments = Segments{{offset, 9, run + 16, run}, {offset + (9 * (run + 16) + 31) / 16 * 16, 4, 512, 256}};
      c.seed = static_cast<std::uint32_t>(offset * 10000 + run);
      BulkAccesses bulk;
      INFO("offset " << offset << ", run " << run);
      REQUIRE(check_engine(c) == "");
      CHECK(bulk.loads() == 0);
      CHECK(bulk.stores() == 0);
    }
  }
  // Aligned, but a tile of a partial vector (a single line of 100 bytes: the stream's padding) and a zero item.
  EngineCase c;
  c.zero_tail = true;
  c.segments = Segments{{0, 1, 112, 100}, {128, 6, 160, 96}};
  BulkAccesses bulk;
  REQUIRE(check_engine(c) == "");
  ps::TileSpan s{};
  unsigned char buffer[64] = {};
  s.stream = s.head = s.body = buffer;
  s.bytes = s.head_bytes = 48;
  s.run = 48;
  s.pitch = 48;
  CHECK(ps::tile_bulk_copyable(s, ps::TileOp::stash));
  CHECK(ps::tile_bulk_copyable(s, ps::TileOp::reload));
  CHECK_FALSE(ps::tile_bulk_copyable(s, ps::TileOp::zero));
  s.bytes = s.head_bytes = 40;
  CHECK_FALSE(ps::tile_bulk_copyable(s, ps::TileOp::stash));
}

namespace {

/// Stashes and reloads through the emulator with Traits and with BulkCopy<Traits> (the same seeds): the same page ids,
/// page bytes and reloaded bytes; returns the bulk copies' bytes.
template <class Traits>
std::int64_t check_bulk_matches_vectors(std::uint32_t seed) {
  using L = typename Traits::layout;
  using Bulk = ps::BulkCopy<Traits>;
  static_assert(ps::bulk_copy_of<Bulk> && ps::bulk_copy_of<Traits> == ps::StashPolicy::bulk);
  std::int64_t bulk_bytes = 0;
  for (bool odd : {false, true}) {
    std::mt19937 rng(seed + odd);
    const auto shape = sequence_shape<L>(odd);
    const ps::PoolConfig cfg = room_for<Traits>(shape, 1024, 2);
    ps::PagePool vector_pool(cfg, ps::MemorySpace::host), bulk_pool(cfg, ps::MemorySpace::host);
    same_arenas(cfg, {&vector_pool, &bulk_pool});
    auto vector_rec = ps::make_record<Traits>(vector_pool, shape);
    auto bulk_rec = ps::make_record<Bulk>(bulk_pool, shape);
    LaunchShape grid;
    grid.seed = seed;
    Buffers<L> in(shape, rng);
    Emulator{grid}.stash(vector_pool, in.view, vector_rec);
    {
      BulkAccesses bulk;
      Emulator{grid}.stash(bulk_pool, in.view, bulk_rec);
      bulk_bytes += bulk.bytes();
      CHECK_FALSE(bulk.misaligned_.load());
    }
    REQUIRE(bulk_rec.status().state == ps::RecordState::stashed);
    check_same_pages(vector_pool, vector_rec, bulk_pool, bulk_rec);
    Buffers<L> out_vector(shape, rng);  // random bytes: a byte not restored differs from the stashed one
    Buffers<L> out_bulk = out_vector;
    Emulator{grid}.reload(vector_pool, vector_rec, out_vector.view, odd);
    {
      BulkAccesses bulk;
      Emulator{grid}.reload(bulk_pool, bulk_rec, out_bulk.view, odd);
      bulk_bytes += bulk.bytes();
    }
    CHECK(out_bulk.bytes == out_vector.bytes);
  }
  return bulk_bytes;
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("emulated grid: the bulk mover's stash and reload equal the vector mover's, every layout") {
  std::uint32_t seed = 5300;
  std::int64_t bulk_bytes = 0;
#define PAGESTASH_BULK_LAYOUT(L)                                                                \
  {                                                                                             \
    CAPTURE(#L);                                                                                \
    bulk_bytes += check_bulk_matches_vectors<ps::StashTraits<PAGESTASH_LAYOUT(L)>>(seed += 10); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_BULK_LAYOUT)
#undef PAGESTASH_BULK_LAYOUT
  MESSAGE("bytes bulk-copied: " << bulk_bytes);
  CHECK(bulk_bytes > 0);
}

TEST_CASE("emulated grid: the sector counter sees the bulk mover's copies, the same bytes in whole sectors") {
  // BF16 rows of 320 bytes: aligned runs the bulk mover takes whole.
  using Tr = ps::StashTraits<RuBf16>;
  const auto shape = sequence_shape<RuBf16>(false);
  std::mt19937 rng(53);
  Buffers<RuBf16> in(shape, rng);
  Buffers<RuBf16> out(shape, rng);
  ps::PagePool pool(room_for<Tr>(shape, 4096, 2), ps::MemorySpace::host);
  const auto vectors = count_sectors<Tr>(pool, in.view, out.view);
  const auto bulk = count_sectors<ps::BulkCopy<Tr>>(pool, in.view, out.view);
  // [stash loads, stash stores, reload loads, reload stores]: the pages' side (1, 2) starts on 4 KiB, the buffers' (0,
  // 3) where malloc puts them (16 bytes: a row may straddle a sector there, for either mover).
  for (int k = 0; k < 4; ++k) {
    CAPTURE(k);
    CHECK(bulk[k].bytes == vectors[k].bytes);  // the same bytes, observed
    CHECK(bulk[k].sectors <= vectors[k].sectors);
    if (k == 1 || k == 2) CHECK(bulk[k].sector_use() == doctest::Approx(1.0));
    CHECK(bulk[k].requests > 0);
  }
}
