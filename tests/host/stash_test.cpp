// The page pool, stash records and the host reference executor: randomised sequences for
// every layout, the failure paths, the host-side argument checks, and host threads running
// stashes and reloads of different records against one pool at once.

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/reference.hpp>

#include <doctest/doctest.h>

#include "../common/layout_list.hpp"
#include "../common/page_bytes.hpp"
#include "../common/stash_sequence.hpp"

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace ps = pagestash;
using namespace pagestash_test;

template <class Traits, class Backend = HostBackend<1>>
int run_orders(std::uint32_t& seed, int ops) {
  int checked = 0;
  for (bool odd : {false, true}) {
    for (Order order : {Order::lifo, Order::fifo, Order::random}) {
      const auto shape = sequence_shape_of<Traits>(odd);
      checked += run_stash_sequence<Traits, Backend>(shape, order, ops, ++seed, odd ? 256 : 1024);
    }
  }
  return checked;
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("every layout: random stash / reload / discard sequences match a byte-for-byte copy") {
  std::uint32_t seed = 1000;
  int plain = 0, rowwise_unquantized = 0, columnwise = 0, rowwise_quantized = 0;
  std::set<std::string> sequenced;  // the layouts' names
#define PAGESTASH_SEQUENCES(L)                                                \
  {                                                                           \
    using Layout = PAGESTASH_LAYOUT(L);                                       \
    CAPTURE(Layout::name);                                                    \
    const int n = run_orders<ps::StashTraits<Layout>>(seed, 200);             \
    sequenced.insert(Layout::name);                                           \
    if (ps::Recipe<Layout>::plain) plain += n;                                \
    else if (!Layout::has(BufferRole::scales)) rowwise_unquantized += n;      \
    else if (std::string(Layout::name).rfind("Col", 0) == 0) columnwise += n; \
    else rowwise_quantized += n;                                              \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SEQUENCES)
#undef PAGESTASH_SEQUENCES
  // Every recipe of the registry is sequence-tested (adding one there is all it takes), where
  // the tests cover every layout.
  if (!few_layouts)
    ps::for_each_recipe([&](auto r) { CHECK_MESSAGE(sequenced.count(decltype(r)::layout::name) == 1, r.name()); });
  CHECK(sequenced.size() == static_cast<std::size_t>(layout_count));  // the names tell the layouts apart
  // At least 1,000 checked operations per layout family.
  CHECK(plain >= 1000);
  CHECK(rowwise_unquantized >= 1000);
  CHECK(columnwise >= 1000);
  CHECK(rowwise_quantized >= 1000);
}

TEST_CASE("compressed stash: random sequences reload the reference's dequantize(quantize(x)) bit for bit") {
  std::uint32_t seed = 5000;
  int checked = 0, traits = 0;
#define PAGESTASH_COMPRESSED_SEQUENCES(T)                    \
  {                                                          \
    using Traits = PAGESTASH_LAYOUT(T);                      \
    CAPTURE(Traits::layout::name);                           \
    CAPTURE(Traits::compression::name);                      \
    checked += run_orders<Traits>(seed, 60);                 \
    checked += run_orders<Traits, HostBackend<3>>(seed, 20); \
    ++traits;                                                \
  }
  PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(PAGESTASH_COMPRESSED_SEQUENCES)
#undef PAGESTASH_COMPRESSED_SEQUENCES
  CHECK(traits == (few_layouts ? 3 : 15));  // 16-bit layouts x 3 formats
  CHECK(checked == traits * 6 * 80);
}

TEST_CASE("non-default StashTraits: only data, only scales (amax kept), amax dropped") {
  std::uint32_t seed = 5000;
  using DataOnly = ps::BufferSelection<ColNv4CapCo, ps::Handling::paged>;
  using ScalesOnly = ps::BufferSelection<ColNv4PackSw, ps::Handling::dropped, ps::Handling::paged, ps::Handling::kept>;
  using NoAmax = ps::BufferSelection<RowNv4CapSw, ps::Handling::paged, ps::Handling::paged, ps::Handling::dropped>;
  using MxScales = ps::BufferSelection<RowMx4PackCo, ps::Handling::dropped, ps::Handling::paged>;
  CHECK(run_orders<DataOnly>(seed, 60) > 0);
  CHECK(run_orders<ScalesOnly>(seed, 60) > 0);
  CHECK(run_orders<NoAmax>(seed, 60) > 0);
  CHECK(run_orders<MxScales>(seed, 60) > 0);
}

TEST_CASE("the host executor copies with several threads the same bytes as with one") {
  std::uint32_t seed = 7000;
  CHECK(run_orders<ps::StashTraits<ColNv4CapSw>, HostBackend<4>>(seed, 40) > 0);
  CHECK(run_orders<ps::StashTraits<RuBf16Cap>, HostBackend<3>>(seed, 40) > 0);
}

namespace {

/// The host analogue of the GPU test that compares a device pool's pages with a host
/// pool's: two host pools whose arenas start as different bytes (0x00, 0xA5) take the same
/// stashes. They agree on page ids and stream bytes; whole pages differ wherever the last
/// page is not full (its rest is never written), so a whole-page comparison cannot be used.
/// Returns the stashes whose last page was part-filled (the whole-page check had a case).
template <class L>
int check_stream_bytes_not_pages(std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(seed % 2 == 1);
  const ps::PoolConfig cfg = spilling_config<Tr>(shape);  // a large stash spills
  ps::PagePool zeros(cfg, ps::MemorySpace::host), filled(cfg, ps::MemorySpace::host);
  const auto arena = static_cast<std::size_t>(cfg.device_pages * cfg.page_bytes);
  Tensor<L, HostBackend<1>> src(shape);
  auto a = ps::make_record<Tr>(zeros, shape), b = ps::make_record<Tr>(filled, shape);
  int part_filled = 0;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    // Every round: the pages an earlier round wrote would otherwise hold the same bytes.
    for (auto [pool, byte] : {std::pair{&zeros, 0x00}, std::pair{&filled, 0xA5}}) {
      std::memset(pool->ref().device_arena, byte, arena);
      std::memset(pool->ref().host_arena, byte, arena);
    }
    src.set_counts(random_counts(shape, rng));
    for (BufferRole role : all_roles)
      src.set(role, random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng));
    ps::stash(ps::host, zeros, src.view, a);
    ps::stash(ps::host, filled, src.view, b);
    const ps::RecordStatus sa = a.status(), sb = b.status();
    REQUIRE(sa.state == ps::RecordState::stashed);
    REQUIRE(sb.state == ps::RecordState::stashed);
    CHECK(sb.pages == sa.pages);
    CHECK(sb.stream_bytes == sa.stream_bytes);
    CHECK(b.page_ids() == a.page_ids());
    CHECK(stream_bytes_of(filled, b) == stream_bytes_of(zeros, a));
    if (sa.stream_bytes % cfg.page_bytes != 0) {
      CHECK(whole_pages_of(filled, b.page_ids()) != whole_pages_of(zeros, a.page_ids()));
      ++part_filled;
    }
    ps::discard(ps::host, zeros, a);
    ps::discard(ps::host, filled, b);
  }
  return part_filled;
}

}  // namespace

TEST_CASE("pools whose arenas start different agree on a stash's stream bytes, not on its whole pages") {
  std::uint32_t seed = 8000;
  int part_filled = 0;
#define PAGESTASH_STREAM_BYTES(L)                                \
  {                                                              \
    using Layout = PAGESTASH_LAYOUT(L);                          \
    CAPTURE(#L);                                                 \
    part_filled += check_stream_bytes_not_pages<Layout>(++seed); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_STREAM_BYTES)
#undef PAGESTASH_STREAM_BYTES
  // The whole-page comparison was shown to differ, often (4 rounds a layout).
  CHECK(part_filled > (few_layouts ? 8 : 40));
}

namespace {

using Nv = ColNv4CapCo;
using NvTraits = ps::StashTraits<Nv>;
using Host = Tensor<Nv, HostBackend<1>>;

ps::GroupedView<Nv> nv_shape() { return sequence_shape<Nv>(false); }

std::vector<std::int32_t> half_counts(const ps::GroupedView<Nv>& v) {
  return std::vector<std::int32_t>(static_cast<std::size_t>(v.groups), static_cast<std::int32_t>(v.max_tokens / 2));
}

}  // namespace

TEST_CASE("a double reload, a reload of an overflowed stash and a stash over a held record are reported no-ops") {
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  // Room for exactly one stash of these counts: a second one overflows.
  cfg.device_pages = expected_pages<NvTraits>(nv_shape(), half_counts(nv_shape()), cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  Host src(nv_shape()), dest(nv_shape());
  std::mt19937 rng(3);
  src.set_counts(half_counts(src.view));
  for (BufferRole role : all_roles)
    src.set(role, random_bytes(static_cast<std::size_t>(src.view.buffer_bytes(role)), rng));
  auto a = ps::make_record<NvTraits>(pool, src.view);
  auto b = ps::make_record<NvTraits>(pool, src.view);
  CHECK(a.status().state == ps::RecordState::empty);

  ps::stash(ps::host, pool, src.view, a);
  REQUIRE(a.status().state == ps::RecordState::stashed);
  const auto held = a.page_ids();

  SUBCASE("stash over a record that holds pages") {
    ps::stash(ps::host, pool, src.view, a);
    CHECK(a.status().state == ps::RecordState::stashed);
    CHECK(a.status().error == ps::Flag::still_stashed);
    CHECK(a.page_ids() == held);
    CHECK(pool.stats().flags.error);  // misuse, not capacity
    CHECK(pool.stats().flags.still_stashed == 1);
    CHECK(!pool.stats().flags.overflow);
  }
  SUBCASE("double reload") {
    ps::reload(ps::host, pool, a, dest.view);
    CHECK(a.status().state == ps::RecordState::reloaded);
    CHECK(!pool.stats().flags.overflow);
    const auto first = dest.bytes(BufferRole::data);
    dest.set(BufferRole::data, std::vector<std::uint8_t>(first.size(), 0x77));
    ps::reload(ps::host, pool, a, dest.view, ps::ReloadOptions{false, /*poison=*/false});
    CHECK(a.status().error == ps::Flag::not_stashed);
    CHECK(dest.bytes(BufferRole::data) == std::vector<std::uint8_t>(first.size(), 0x77));
    ps::reload(ps::host, pool, a, dest.view);  // poisons what it did not restore
    CHECK(dest.bytes(BufferRole::data) == std::vector<std::uint8_t>(first.size(), 0xFF));
    CHECK(pool.stats().flags.error);
    CHECK(pool.stats().flags.not_stashed == 1);
    CHECK(!pool.stats().flags.overflow);
    CHECK(pool.stats().device_pages_free == cfg.device_pages);
  }
  SUBCASE("the pool is full: overflow, and later stashes do nothing until reset") {
    ps::stash(ps::host, pool, src.view, b);  // needs as many pages again: only one stash's worth exists
    CHECK(b.status().state == ps::RecordState::overflowed);
    CHECK(b.status().error == ps::Flag::overflow);
    CHECK(pool.stats().flags.overflow);
    CHECK(!pool.stats().flags.error);
    CHECK(a.page_ids() == held);               // earlier stashes stay intact
    ps::reload(ps::host, pool, b, dest.view);  // does nothing; the first cause stays, no new flag
    CHECK(b.status().error == ps::Flag::overflow);
    CHECK(!pool.stats().flags.error);
    ps::reload(ps::host, pool, a, dest.view);  // still works
    CHECK(a.status().state == ps::RecordState::reloaded);
    ps::stash(ps::host, pool, src.view, b);  // pages are free again, but overflow is sticky
    CHECK(b.status().state == ps::RecordState::overflowed);
    ps::reset(ps::host, pool);
    ps::stash(ps::host, pool, src.view, b);
    CHECK(b.status().state == ps::RecordState::stashed);
    CHECK(pool.stats().generation == 1);
  }
  SUBCASE("after a reset, status(pool) says stale where status() still says stashed") {
    ps::reset(ps::host, pool);
    CHECK(a.status().state == ps::RecordState::stashed);
    CHECK(a.status(pool).state == ps::RecordState::stale);
    CHECK(a.status(pool).generation == 0);
    CHECK(pool.stats().generation == 1);
    ps::stash(ps::host, pool, src.view, a);  // a stale record may be stashed again
    CHECK(a.status(pool).state == ps::RecordState::stashed);
  }
  SUBCASE("discard returns the pages; a second discard does nothing and raises nothing") {
    ps::discard(ps::host, pool, a);
    CHECK(a.status().state == ps::RecordState::discarded);
    ps::discard(ps::host, pool, a);
    CHECK(a.status().error == ps::Flag::not_stashed);
    CHECK(!pool.stats().flags.overflow);
    CHECK(!pool.stats().flags.error);
    CHECK(pool.stats().device_pages_free == cfg.device_pages);
  }
}

TEST_CASE("bad input is rejected on the host before anything runs") {
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 64;
  ps::PagePool pool(cfg, ps::MemorySpace::host), other(cfg, ps::MemorySpace::host);
  Host src(nv_shape());
  src.set_counts(half_counts(src.view));
  auto rec = ps::make_record<NvTraits>(pool, src.view);

  CHECK_THROWS_WITH_AS(ps::stash(ps::host, other, src.view, rec), doctest::Contains("another pool"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::reload(ps::host, other, rec, src.view), doctest::Contains("another pool"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::discard(ps::host, other, rec), doctest::Contains("another pool"), std::invalid_argument);

  auto wrong_shape = src.view;
  wrong_shape.hidden = 128;
  CHECK_THROWS_WITH_AS(ps::stash(ps::host, pool, wrong_shape, rec), doctest::Contains("differs from the record"),
                       std::invalid_argument);
  auto small = src.view;
  small.max_tokens /= 2;
  CHECK_THROWS_WITH_AS(ps::reload(ps::host, pool, rec, small), doctest::Contains("too small"), std::invalid_argument);
  auto no_scales = src.view;
  no_scales.scales = nullptr;
  CHECK_THROWS_WITH_AS(ps::stash(ps::host, pool, no_scales, rec), doctest::Contains("scales is null"),
                       std::invalid_argument);
  auto no_counts = src.view;
  no_counts.counts = nullptr;
  CHECK_THROWS_WITH_AS(ps::stash(ps::host, pool, no_counts, rec), doctest::Contains("counts is null"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::on(nullptr), doctest::Contains("null"), std::invalid_argument);

  ps::PoolConfig bad = cfg;
  bad.page_bytes = 1000;
  CHECK_THROWS_WITH_AS(ps::PagePool(bad, ps::MemorySpace::host), doctest::Contains("power of two"),
                       std::invalid_argument);
  ps::PoolConfig empty = cfg;
  empty.device_pages = 0;
  CHECK_THROWS_WITH_AS(ps::PagePool(empty, ps::MemorySpace::host), doctest::Contains("a pool of no pages"),
                       std::invalid_argument);
  empty.host_pages = 4;  // spill only: accepted
  CHECK(ps::PagePool(empty, ps::MemorySpace::host).stats().host_pages_free == 4);
  CHECK_THROWS_WITH_AS(ps::report(ps::host, pool, nullptr), doctest::Contains("dst is null"), std::invalid_argument);
  // Nothing ran: the record is still empty and the pool untouched.
  CHECK(rec.status().state == ps::RecordState::empty);
  CHECK(pool.stats().device_pages_free == 64);
}

TEST_CASE("reload into a larger destination, and the zero tail reaches its end") {
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  cfg.device_pages = 256;
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  std::mt19937 rng(11);
  Tensor<RuBf16Cap, HostBackend<1>> src(sequence_shape<RuBf16Cap>(false));
  auto big_shape = src.view;
  big_shape.max_tokens *= 2;
  Tensor<RuBf16Cap, HostBackend<1>> dest(big_shape);
  const std::vector<std::int32_t> counts = {5, 0, 48};
  src.set_counts(counts);
  const auto source = random_bytes(static_cast<std::size_t>(src.view.buffer_bytes(BufferRole::data)), rng);
  src.set(BufferRole::data, source);
  dest.set(BufferRole::data, random_bytes(static_cast<std::size_t>(dest.view.buffer_bytes(BufferRole::data)), rng));
  auto rec = ps::make_record<ps::StashTraits<RuBf16Cap>>(pool, src.view);
  ps::stash(ps::host, pool, src.view, rec);
  ps::reload(ps::host, pool, rec, dest.view, ps::ReloadOptions{true});
  const auto out = dest.bytes(BufferRole::data);
  const std::int64_t row = src.view.hidden * 2;
  std::vector<std::uint8_t> expected(out.size(), 0);
  for (std::size_t g = 0; g < counts.size(); ++g)
    std::copy_n(source.begin() + static_cast<std::ptrdiff_t>(g) * src.view.max_tokens * row, counts[g] * row,
                expected.begin() + static_cast<std::ptrdiff_t>(g) * big_shape.max_tokens * row);
  CHECK(out == expected);
}

TEST_CASE("the sizing helper turns an observed peak into a pool") {
  ps::PoolStats observed{};
  observed.config.page_bytes = 4096;
  observed.peak_pages_held = 1000;
  const ps::PoolConfig c = ps::size_from_peak(observed);
  CHECK(c.page_bytes == 4096);
  CHECK(c.device_pages == 1100);
  CHECK(c.host_pages == 0);
  CHECK(ps::size_from_peak(observed, 1.0, 0.5).host_pages == 500);
  CHECK(ps::pages_for(4097, 4096) == 2);
  CHECK_THROWS_AS(ps::size_from_peak(observed, -1.0), std::invalid_argument);

  // An eager step with a generous pool observes the peak; the sized pool then holds it.
  ps::PoolConfig generous;
  generous.page_bytes = 1024;
  generous.device_pages = 4096;
  ps::PagePool big(generous, ps::MemorySpace::host);
  Host a(nv_shape()), b(nv_shape());
  a.set_counts(half_counts(a.view));
  b.set_counts(std::vector<std::int32_t>(3, static_cast<std::int32_t>(b.view.max_tokens)));
  auto ra = ps::make_record<NvTraits>(big, a.view);
  auto rb = ps::make_record<NvTraits>(big, b.view);
  ps::stash(ps::host, big, a.view, ra);
  ps::stash(ps::host, big, b.view, rb);
  const std::int64_t pages_a = ra.status().pages;
  ps::reload(ps::host, big, ra, a.view);
  const ps::PoolStats seen = big.stats();
  CHECK(seen.peak_pages_held == pages_a + rb.status().pages);
  CHECK(seen.peak_live_bytes == ra.status().stream_bytes + rb.status().stream_bytes);
  CHECK(seen.live_bytes == rb.status().stream_bytes);

  ps::PagePool sized(ps::size_from_peak(seen, 1.0), ps::MemorySpace::host);
  auto sa = ps::make_record<NvTraits>(sized, a.view);
  auto sb = ps::make_record<NvTraits>(sized, b.view);
  ps::stash(ps::host, sized, a.view, sa);
  ps::stash(ps::host, sized, b.view, sb);
  CHECK(sb.status().state == ps::RecordState::stashed);
  CHECK(sized.stats().device_pages_free == 0);
}

namespace {

/// One host thread's share of the concurrency test: its own tensors and records, random
/// stashes and reloads against the shared pool, every reload checked against the oracle.
void thread_sequence(ps::PagePool& pool, std::uint32_t seed, int ops, std::atomic<int>& bad_reloads,
                     std::atomic<int>& reloads) {
  std::mt19937 rng(seed);
  using Tr = NvTraits;
  const auto shape = nv_shape();
  Host work(shape), dest(shape);
  std::vector<ps::StashRecord<Tr>> records;
  for (int i = 0; i < 3; ++i) records.push_back(ps::make_record<Tr>(pool, shape));
  std::vector<std::vector<std::int32_t>> counts(3);
  std::vector<std::array<std::vector<std::uint8_t>, 3>> saved(3);
  std::vector<bool> held(3, false);
  const ps::HostExecutor ex{seed % 2 == 0 ? 1u : 2u};
  for (int op = 0; op < ops; ++op) {
    const auto r = std::uniform_int_distribution<std::size_t>(0, 2)(rng);
    if (!held[r]) {
      counts[r] = random_counts(shape, rng);
      work.set_counts(counts[r]);
      for (BufferRole role : all_roles) {
        saved[r][static_cast<std::size_t>(role)] =
            random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
        work.set(role, saved[r][static_cast<std::size_t>(role)]);
      }
      ps::stash(ex, pool, work.view, records[r]);
      held[r] = records[r].status().state == ps::RecordState::stashed;
    } else {
      std::array<std::vector<std::uint8_t>, 3> poisoned;
      for (BufferRole role : all_roles) {
        poisoned[static_cast<std::size_t>(role)] =
            random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
        dest.set(role, poisoned[static_cast<std::size_t>(role)]);
      }
      ps::reload(ex, pool, records[r], dest.view);
      held[r] = false;
      ++reloads;
      for (BufferRole role : all_roles) {
        const auto i = static_cast<std::size_t>(role);
        if (dest.bytes(role) != expected_reload<Tr>(shape, role, counts[r], saved[r][i], poisoned[i], false))
          ++bad_reloads;
      }
    }
  }
  for (std::size_t r = 0; r < 3; ++r)
    if (held[r]) ps::discard(ex, pool, records[r]);
}

}  // namespace

TEST_CASE("concurrent stashes and reloads of different records on host threads share one pool") {
  const std::int64_t full = ps::work_bounds<NvTraits>(nv_shape()).stream_bytes;
  for (bool roomy : {true, false}) {
    CAPTURE(roomy);
    ps::PoolConfig cfg;
    cfg.page_bytes = 256;
    // Roomy: every record of every thread fits at once. Tight: overflow will happen, and
    // must still leave every held record intact and every page accounted for.
    cfg.device_pages = (roomy ? 4 * 3 : 3) * ps::pages_for(full, cfg.page_bytes);
    cfg.host_pages = ps::pages_for(full, cfg.page_bytes);
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    std::atomic<int> bad_reloads{0}, reloads{0};
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < 4; ++t)
      threads.emplace_back(thread_sequence, std::ref(pool), 900 + t, 60, std::ref(bad_reloads), std::ref(reloads));
    for (auto& t : threads) t.join();
    CHECK(reloads.load() > 0);
    CHECK(bad_reloads.load() == 0);
    const ps::PoolStats st = pool.stats();
    if (roomy) CHECK(!st.flags.overflow);
    CHECK(st.device_pages_free == cfg.device_pages);
    CHECK(st.host_pages_free == cfg.host_pages);
    CHECK(st.live_bytes == 0);
    std::vector<std::int32_t> ids = ps::free_pages(pool);
    std::sort(ids.begin(), ids.end());
    std::vector<std::int32_t> all(ids.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int32_t>(i);
    CHECK(ids == all);
  }
}

TEST_CASE("compressed stash: page bytes per live byte of a DeepSeek-V3 layer (docs/benchmarks.md)") {
  // hidden 7168, 32 experts of 32-256 tokens: every format keeps 0.516 of the BF16 stream, (1 + 1/32) / 2 and the
  // 128-byte alignment of each group's segment.
  using L = RuBf16Cap;
  ps::GroupedView<L> v;
  v.groups = 32;
  v.hidden = 7168;
  v.max_tokens = 256;
  std::mt19937 rng(7);
  std::vector<std::int32_t> counts(32);
  for (auto& c : counts) c = 32 + static_cast<std::int32_t>(rng() % 225);
  const ps::WorkTotals lossless = ps::plan_work<ps::StashTraits<L>>(v, counts.data(), false);
  const auto ratio = [&](auto traits) {
    const ps::WorkTotals t = ps::plan_work<decltype(traits)>(v, counts.data(), false);
    CHECK(t.live_bytes == lossless.live_bytes);
    return static_cast<double>(t.stream_bytes) / static_cast<double>(lossless.stream_bytes);
  };
  const double mx = ratio(ps::CompressedTraits<L, ps::MXFP8_E4M3>{});
  const double block128 = ratio(ps::CompressedTraits<L, ps::FP8Block128>{});
  MESSAGE("compressed / lossless stream bytes: mxfp8 ", mx, ", fp8_1x128 ", block128);
  CHECK(lossless.stream_bytes == lossless.live_bytes);
  CHECK(mx == doctest::Approx(33.0 / 64).epsilon(1e-4));
  CHECK(block128 == doctest::Approx(33.0 / 64).epsilon(1e-4));
}

TEST_CASE("compressed stash: a hidden that is not whole blocks is refused on the host before anything runs") {
  using Tr = ps::CompressedTraits<RuBf16, ps::FP8Block128>;
  ps::PagePool pool(ps::PoolConfig{1024, 64, 0}, ps::MemorySpace::host);
  ps::GroupedView<RuBf16> v;
  v.groups = 2;
  v.hidden = 96;  // whole MXFP8 blocks, not whole 128-value blocks
  v.max_tokens = 8;
  CHECK_THROWS_WITH_AS(ps::StashRecord<Tr>(pool, v),
                       doctest::Contains("hidden = 96 must be a multiple of 128 (the block of compression "
                                         "'fp8_1x128'): pad hidden to 128"),
                       std::invalid_argument);
  CHECK_NOTHROW(ps::StashRecord<ps::CompressedTraits<RuBf16, ps::MXFP8_E4M3>>(pool, v));
}

TEST_CASE("written once: the compression rule (compression_refusal) for every format of the list") {
  CHECK(ps::compression_refusal<ps::Lossless>(7).empty());
  int formats = 0;
#define PAGESTASH_TEST_FORMAT(F)                                                                                   \
  {                                                                                                                \
    ++formats;                                                                                                     \
    using C = ps::Compressed<F>;                                                                                   \
    static_assert(ps::compression_format<F>);                                                                      \
    CAPTURE(C::name);                                                                                              \
    for (std::int64_t hidden : {8, 32, 96, 128, 136, 7168}) {                                                      \
      const std::string refusal = ps::compression_refusal<C>(hidden);                                              \
      CHECK(refusal.empty() == (hidden % C::block == 0));                                                          \
      if (!refusal.empty())                                                                                        \
        CHECK(refusal == "must be a multiple of " + std::to_string(C::block) + " (the block of compression '" +    \
                             C::name + "'): pad hidden to " + std::to_string((hidden / C::block + 1) * C::block)); \
    }                                                                                                              \
  }
  PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_TEST_FORMAT)
#undef PAGESTASH_TEST_FORMAT
  CHECK(formats == 3);
  CHECK(ps::compression_names() == std::vector<std::string>{"lossless", "mxfp8", "mxfp8_e5m2", "fp8_1x128"});
  static_assert(!ps::compression_format<ps::NVFP4> && !ps::compression_format<ps::BF16>);
  // The record's check says the same, after its own name for hidden.
  using E5M2 = ps::CompressedTraits<RuBf16, ps::MXFP8_E5M2>;
  ps::PagePool pool(ps::PoolConfig{1024, 64, 0}, ps::MemorySpace::host);
  ps::GroupedView<RuBf16> v;
  v.groups = 1, v.hidden = 40, v.max_tokens = 8;
  const std::string said = "hidden = 40 " + ps::compression_refusal<ps::Compressed<ps::MXFP8_E5M2>>(40);
  CHECK_THROWS_WITH_AS(ps::StashRecord<E5M2>(pool, v), doctest::Contains(said.c_str()), std::invalid_argument);
}

TEST_CASE("written once: a pool in the other memory space is refused with one message, either way round") {
  // What every front door of both executors calls (host.hpp, cuda.cuh, nccl.cuh's agree): host code, checked here.
  CHECK_THROWS_WITH_AS(ps::check_memory_space("stash", ps::MemorySpace::device, ps::MemorySpace::host),
                       "pagestash::stash: the pool is in host memory, the executor runs on device memory "
                       "(pagestash::host takes a host pool, pagestash::on(stream) a device pool)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::check_memory_space("grow", ps::MemorySpace::host, ps::MemorySpace::device),
                       "pagestash::grow: the pool is in device memory, the executor runs on host memory "
                       "(pagestash::host takes a host pool, pagestash::on(stream) a device pool)",
                       std::invalid_argument);
  CHECK_NOTHROW(ps::check_memory_space("reset", ps::MemorySpace::host, ps::MemorySpace::host));
  CHECK_NOTHROW(ps::check_memory_space("reset", ps::MemorySpace::device, ps::MemorySpace::device));
  // The host executor's front doors go through it: a host pool passes, and report's own check follows it.
  ps::PagePool pool(ps::PoolConfig{1024, 8, 0}, ps::MemorySpace::host);
  CHECK_NOTHROW(ps::reset(ps::host, pool));
  CHECK_NOTHROW(ps::end_step(ps::host, pool));
  CHECK_THROWS_WITH_AS(ps::report(ps::host, pool, nullptr), "pagestash::report: dst is null", std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::check_report(ps::MemorySpace::device, pool, nullptr),
                       doctest::Contains("pagestash::report: the pool is in host memory, the executor runs on device"),
                       std::invalid_argument);
}
