// The copy engine on hand-made segments (both movers against a plain copy), and the page
// stream's size for every layout configuration.
#include <doctest/doctest.h>

#include "../common/engine_check.hpp"
#include "../common/layout_list.hpp"

#include <set>

namespace {

namespace ps = pagestash;
using pagestash_test::check_engine;
using pagestash_test::EngineCase;
// Built, then moved in: g++ 12 at -O3 warns (-Wnonnull) on a vector assigned from an
// initializer list while it is still empty.
using Segments = std::vector<ps::Segment>;

TEST_CASE("copy engine: random segments (short, misaligned and long lines, 256 B to 8 KiB pages) match a plain copy") {
  std::mt19937 rng(20261130);
  int cases = 0;
  for (int i = 0; i < 1500; ++i) {
    const EngineCase c = pagestash_test::random_engine_case(rng, 1 + i % 6, i % 10 == 0 ? 20000 : 600);
    const std::string why = check_engine(c);
    INFO("case " << i << ", page_shift " << c.page_shift << ", lanes " << c.lanes);
    REQUIRE(why == "");
    ++cases;
  }
  MESSAGE("engine cases checked: " << cases);
}

TEST_CASE("copy engine: lines shorter than 16 bytes at every buffer alignment") {
  for (unsigned misalign = 0; misalign < 32; ++misalign) {
    for (std::int64_t live = 1; live < 16; ++live) {
      EngineCase c;
      c.base_misalign = misalign;
      c.zero_tail = live % 2 == 0;
      c.segments = Segments{{3, 50, live + (live % 4), live}, {3 + 50 * (live + live % 4) + 1, 37, live + 1, live}};
      c.seed = static_cast<std::uint32_t>(16 * misalign + live);
      INFO("misalign " << misalign << ", live " << live);
      REQUIRE(check_engine(c) == "");
    }
  }
}

TEST_CASE("copy engine: staged short lines on 16-byte line starts, runs of 0-64 bytes and longer, tiles cut anywhere") {
  // Runs packed end to end start at every offset of a stream vector; 256-byte and 4 KiB tiles cut lines at every
  // column; lines start at both halves of a sector (a reload stores the bytes past a line's last sector boundary a
  // byte a lane). The third mover (a warp of threads with a stage) stages these; the oracle is a plain copy.
  for (int page_shift : {8, 12}) {
    for (unsigned half : {0u, 16u}) {
      for (std::int64_t i = 0; i <= 69; ++i) {
        const std::int64_t live = i <= 64 ? i : 64 + 48 * (i - 64);  // and 112, 160, 208, 256 (staged_max_run), 304
        EngineCase c;
        c.page_shift = page_shift;
        c.zero_tail = live % 2 == 0;
        c.base_misalign = half;
        const std::int64_t pitch = (live + 15) / 16 * 16 + 16 * (live % 3);
        const std::int64_t lines = live <= 16 ? 700 : 90;
        c.segments = Segments{{16, lines, std::max<std::int64_t>(pitch, 16), live},
                              {16 + lines * std::max<std::int64_t>(pitch, 16) + 32, 33,
                               std::max<std::int64_t>(live, 64) + 16 * (live % 2), live}};
        c.seed = static_cast<std::uint32_t>(100 * page_shift + live);
        INFO("page_shift " << page_shift << ", live " << live << ", misalign " << half);
        REQUIRE(check_engine(c) == "");
      }
    }
  }
}

TEST_CASE("copy engine: a page boundary falls at every offset of a line, with pages of 256 bytes") {
  // Lines of 17 bytes: 256 = 15 * 17 + 1, so page boundaries walk through every offset.
  for (std::int64_t lead = 0; lead < 256; lead += 16) {
    EngineCase c;
    c.page_shift = 8;
    c.segments = Segments{{0, 1, lead + 1, lead}, {lead + 7, 17 * 17, 19, 17}};
    c.seed = static_cast<std::uint32_t>(lead + 1);
    const std::int64_t start = (lead + 15) / 16 * 16;  // the stream offset of the second segment
    std::set<std::int64_t> offsets;
    for (std::int64_t p = (start / 256 + 1) * 256; p < start + 17 * 17 * 17; p += 256) offsets.insert((p - start) % 17);
    CHECK(offsets.size() == 17);
    INFO("lead " << lead);
    REQUIRE(check_engine(c) == "");
  }
}

TEST_CASE("copy engine: lines whose dead rest is one or two cache lines (the host mover prefetches it)") {
  CHECK(ps::prefetches_dead_lines(64, 128));
  CHECK(ps::prefetches_dead_lines(64, 192));
  CHECK_FALSE(ps::prefetches_dead_lines(65, 128));  // 63 dead bytes
  CHECK_FALSE(ps::prefetches_dead_lines(63, 192));  // 129
  for (int zero_tail = 0; zero_tail < 2; ++zero_tail) {
    EngineCase c;
    c.zero_tail = zero_tail == 1;
    c.segments =
        Segments{{0, 300, 128, 64}, {300 * 128 + 3, 200, 192, 64}, {300 * 128 + 200 * 192 + 64, 150, 200, 100}};
    c.seed = static_cast<std::uint32_t>(7 + zero_tail);
    for (const auto& seg : c.segments)
      CHECK(ps::prefetches_dead_lines(static_cast<std::uint32_t>(seg.live), seg.pitch));
    INFO("zero_tail " << zero_tail);
    REQUIRE(check_engine(c) == "");
  }
}

TEST_CASE("copy engine: one tile covers hundreds of short lines, at most max_tile_lines") {
  EngineCase c;
  c.page_shift = 16;
  c.segments = Segments{{5, 3000, 5, 3}};
  ps::WorkTotals t{};
  const std::vector<ps::WorkItem> items = pagestash_test::engine_items(c, false, t);
  ps::TileWork w{};
  w.items = items.data();
  w.item_count = t.items;
  w.tile_shift = ps::tile_shift_for(c.page_shift, c.executor_tile_shift);
  w.pool.page_bytes = 1 << 16;
  w.pool.page_shift = 16;
  std::vector<unsigned char> fake_arena(1 << 16);
  w.pool.device_arena = fake_arena.data();
  w.pool.reserved_device_pages = 1;
  const std::int32_t page0 = 0;
  w.page_ids = &page0;
  ps::ItemCursor cursor;
  const ps::TileSpan s = ps::resolve_tile(w, cursor, 0);
  // 3-byte runs: 256 lines are 768 bytes, so tiles of 512 (170 lines) where the executor's are 4 KiB (1365).
  CHECK(s.bytes == 512);
  CHECK((s.bytes - s.head_bytes) / s.run > ps::max_tile_lines / 2);
  CHECK((s.bytes + s.run - 1) / s.run <= ps::max_tile_lines);
  c.zero_tail = true;
  REQUIRE(check_engine(c) == "");
}

/// Dirichlet(1) counts of the given mean per group, on the layout's count alignment, that
/// the view holds.
template <class L>
std::vector<std::int32_t> dirichlet(const ps::GroupedView<L>& v, std::int64_t mean, std::mt19937& rng) {
  std::gamma_distribution<double> gamma(1.0, 1.0);
  std::vector<double> w(static_cast<std::size_t>(v.groups));
  double sum = 0;
  for (double& x : w) sum += (x = gamma(rng));
  const std::int64_t align = v.count_alignment();
  const std::int64_t cap = L::placement::packed ? v.max_tokens / v.groups : v.max_tokens;
  std::vector<std::int32_t> counts;
  for (double x : w) {
    const auto m = static_cast<std::int64_t>(x / sum * static_cast<double>(v.groups * mean));
    counts.push_back(static_cast<std::int32_t>(std::min(m / align * align, cap / align * align)));
  }
  return counts;
}

template <class L>
void check_stream_overhead(const char* name) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(7);
  for (std::int64_t mean : {32, 64, 128, 256}) {
    for (std::int64_t hidden : {2048, 7168}) {
      ps::GroupedView<L> v;
      v.groups = 16;
      v.hidden = hidden;
      v.max_tokens = 1;
      const std::int64_t per_group = (4 * mean + v.granule() - 1) / v.granule() * v.granule();
      v.max_tokens = L::placement::packed ? v.groups * per_group : per_group;
      const std::vector<std::int32_t> counts = dirichlet(v, mean, rng);
      REQUIRE(ps::check_counts(v, counts.data()).verdict() == ps::Flag::none);
      const ps::WorkTotals t = ps::plan_work<Tr>(v, counts.data(), false, nullptr);
      INFO(name << ", mean " << mean << ", hidden " << hidden);
      CHECK(static_cast<double>(t.stream_bytes) <= 1.01 * static_cast<double>(t.live_bytes) + 16.0 * t.items);
    }
  }
}

TEST_CASE("page stream: at most 1.01 x the live bytes + 16 bytes per segment, every layout, Dirichlet counts") {
  using namespace pagestash_test::layouts;
#define PAGESTASH_CHECK_OVERHEAD(L) check_stream_overhead<PAGESTASH_LAYOUT(L)>(#L);
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_CHECK_OVERHEAD)
#undef PAGESTASH_CHECK_OVERHEAD
}

}  // namespace
