// A pool with a reserve (PoolConfig::device_reserve, host_reserve) that grows and shrinks
// between steps, on the host executor and the grid emulator: the bytes a byte-for-byte copy
// gives, every page back at each step's end, page addresses kept across a grow; bad
// resizes refused with the pool as it was; the steps' team code (what the device's resize
// kernel runs) equal to the serial one.

#include <pagestash/pagestash.hpp>

#include <doctest/doctest.h>

#include "../common/grid_emulator.hpp"
#include "../common/layout_list.hpp"
#include "../common/overlap.hpp"
#include "../common/stash_sequence.hpp"
#include "../common/suite_backends.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using namespace pagestash_test;
using namespace pagestash_test::layouts;
using Traits = ps::StashTraits<RuBf16>;

ps::GroupedView<RuBf16> grow_shape() {
  ps::GroupedView<RuBf16> v;
  v.max_tokens = 64;
  v.hidden = 256;
  v.groups = 4;
  return v;
}

ps::PoolConfig small_config() {
  ps::PoolConfig c;
  c.page_bytes = 4096;
  c.device_pages = 2;
  c.host_pages = 1;
  c.device_reserve = 48;
  c.host_reserve = 8;
  return c;
}

/// The pool's pages and free ids agree with its config at a step's end (every page back).
void check_balanced(const ps::PagePool& pool) {
  const ps::PoolStats s = pool.stats();
  CHECK(s.device_pages == pool.config().device_pages);
  CHECK(s.host_pages == pool.config().host_pages);
  CHECK(s.device_pages_free == s.device_pages);
  CHECK(s.host_pages_free == s.host_pages);
  CHECK(s.config.device_pages == pool.config().device_pages);
}

/// Steps of two stashes and two reloads with random counts; a step that overflows is rerun
/// after a reset and a grow (as a trainer reruns it), and between steps the pool grows or
/// shrinks at random. Returns the steps whose reloads matched the copy.
template <class Backend>
int grow_and_shrink_steps(std::uint32_t seed, int steps) {
  const auto shape = grow_shape();
  std::mt19937 rng(seed);
  ps::PagePool pool(small_config(), ps::MemorySpace::host);
  const ps::PoolConfig reserve = pool.config();
  unsigned char* const first_page = pool.ref().page(0);
  int exact = 0, grew = 0, shrank = 0;
  for (int step = 0; step < steps; ++step) {
    Buffers<RuBf16> a(shape, rng), b(shape, rng), out_a(shape, rng), out_b(shape, rng);
    for (int attempt = 0;; ++attempt) {
      REQUIRE(attempt < 8);
      auto rec_a = ps::make_record<Traits>(pool, shape), rec_b = ps::make_record<Traits>(pool, shape);
      Backend::stash(pool, a.view, rec_a);
      Backend::stash(pool, b.view, rec_b);
      if (pool.stats().flags.overflow) {  // rerun: reset, grow by half the reserve's room or to the reserve
        Backend::reset(pool);
        const ps::PoolConfig now = pool.config();
        ps::grow(ps::host, pool, std::min(reserve.device_reserve, now.device_pages * 2 + 1),
                 std::min(reserve.host_reserve, now.host_pages + 1));
        CHECK(pool.ref().page(0) == first_page);  // no address moves
        ++grew;
        continue;
      }
      Backend::reload(pool, rec_b, out_b.view, true);
      Backend::reload(pool, rec_a, out_a.view, true);
      Backend::end_step(pool);
      break;
    }
    bool same = true;
    for (BufferRole role : all_roles) {
      const auto k = static_cast<std::size_t>(role);
      const std::vector<std::uint8_t> none(a.bytes[k].size(), 0);
      same = same && out_a.bytes[k] == expected_reload<Traits>(shape, role, a.counts, a.bytes[k], none, true);
      same = same && out_b.bytes[k] == expected_reload<Traits>(shape, role, b.counts, b.bytes[k], none, true);
    }
    exact += same;
    check_balanced(pool);
    if (rng() % 3 == 0) {  // shrink to a random size at the step's end: every page is back
      const ps::PoolConfig now = pool.config();
      const auto d = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(now.device_pages + 1));
      ps::shrink(ps::host, pool, d, now.host_pages > 0 ? 1 : 0);
      CHECK(pool.config().device_pages == d);
      check_balanced(pool);
      ++shrank;
    }
  }
  CHECK(grew > 0);
  CHECK(shrank > 0);
  return exact;
}

}  // namespace

TEST_CASE("a pool with a reserve grows and shrinks between steps: host executor and emulated grid match a copy") {
  CHECK(grow_and_shrink_steps<HostExecutorBackend<1>>(1, 24) == 24);
  CHECK(grow_and_shrink_steps<EmulatorBackend<4, 64, 2>>(2, 12) == 12);
}

TEST_CASE("a pool with a reserve: bad resizes are refused and leave the pool as it was") {
  const auto shape = grow_shape();
  std::mt19937 rng(3);
  ps::PagePool pool(small_config(), ps::MemorySpace::host);
  CHECK_THROWS_AS(ps::grow(ps::host, pool, 49, 1), std::invalid_argument);    // beyond the reserve
  CHECK_THROWS_AS(ps::grow(ps::host, pool, 1, 1), std::invalid_argument);     // fewer pages than it has
  CHECK_THROWS_AS(ps::shrink(ps::host, pool, 3, 1), std::invalid_argument);   // more pages than it has
  CHECK_THROWS_AS(ps::shrink(ps::host, pool, -1, 0), std::invalid_argument);  // fewer than none
  ps::grow(ps::host, pool, 40, 4);
  Buffers<RuBf16> a(shape, rng), out(shape, rng);
  a.counts.assign(4, 16);
  auto rec = ps::make_record<Traits>(pool, shape);
  ps::stash(ps::host, pool, a.view, rec);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  REQUIRE(rec.status().pages > 0);
  // A record holds pages: refused, and the pool keeps its pages, free ids and the record's bytes.
  const ps::PoolStats before = pool.stats();
  CHECK_THROWS_AS(ps::shrink(ps::host, pool, 1, 0), std::invalid_argument);
  const ps::PoolStats after = pool.stats();
  CHECK(pool.config().device_pages == 40);
  CHECK(after.device_pages == 40);
  CHECK(after.device_pages_free == before.device_pages_free);
  CHECK(after.host_pages_free == before.host_pages_free);
  ps::reload(ps::host, pool, rec, out.view);
  CHECK(out.bytes[0] == expected_reload<Traits>(shape, BufferRole::data, a.counts, a.bytes[0],
                                                std::vector<std::uint8_t>(a.bytes[0].size(), 0), true));
  ps::shrink(ps::host, pool, 1, 0);
  check_balanced(pool);
  // No pages at all, as a pool may start: all the memory given back; then it grows again.
  ps::shrink(ps::host, pool, 0, 0);
  check_balanced(pool);
  CHECK(pool.memory_use().device_backed == 0);
  CHECK(pool.memory_use().host_backed == 0);
  auto none = ps::make_record<Traits>(pool, shape);
  ps::stash(ps::host, pool, a.view, none);
  CHECK(none.status().state == ps::RecordState::overflowed);
  ps::reset(ps::host, pool);
  ps::grow(ps::host, pool, 40, 0);
  auto again = ps::make_record<Traits>(pool, shape);
  ps::stash(ps::host, pool, a.view, again);
  ps::reload(ps::host, pool, again, out.view);
  CHECK(out.bytes[0] == a.bytes[0]);
  check_balanced(pool);
}

TEST_CASE("a fixed pool, allocated or in caller-owned memory, neither grows nor shrinks") {
  // Not even to the pages it has; its config stays without a reserve and its pages all free.
  ps::PoolConfig fixed;
  fixed.page_bytes = 4096;
  fixed.device_pages = 4;
  ps::PagePool fixed_pool(fixed, ps::MemorySpace::host);
  std::vector<unsigned char> fixed_control(ps::PagePool::bytes_needed(fixed).control),
      fixed_arena(ps::PagePool::bytes_needed(fixed).device_arena);
  ps::PagePool borrowed(fixed, ps::MemorySpace::host, ps::PoolMemory{fixed_control.data(), fixed_arena.data()});
  for (ps::PagePool* p : {&fixed_pool, &borrowed}) {
    CHECK_THROWS_AS(ps::grow(ps::host, *p, 5, 0), std::invalid_argument);
    CHECK_THROWS_AS(ps::grow(ps::host, *p, 4, 0), std::invalid_argument);
    CHECK_THROWS_AS(ps::shrink(ps::host, *p, 2, 0), std::invalid_argument);
    CHECK_THROWS_AS(ps::shrink(ps::host, *p, 4, 0), std::invalid_argument);
    CHECK(p->config().device_pages == 4);
    CHECK(p->config().device_reserve == 0);
    CHECK_FALSE(p->config().growable());
    CHECK(p->stats().device_pages_free == 4);
  }
}

TEST_CASE("a pool with a reserve: in caller-owned memory, or a reserve below its pages, refused") {
  ps::PoolConfig bad = small_config();
  bad.device_reserve = 1;
  CHECK_THROWS_AS(ps::PagePool(bad, ps::MemorySpace::host), std::invalid_argument);
  std::vector<unsigned char> control(1 << 16), arena(1 << 20);
  ps::PoolMemory memory{control.data(), arena.data(), arena.data()};
  CHECK_THROWS_AS(ps::PagePool(small_config(), ps::MemorySpace::host, memory), std::invalid_argument);
}

TEST_CASE("a pool with a reserve: memory_use counts whole granules, and attached over memory() it is the same pool") {
  constexpr std::size_t granule = std::size_t{2} << 20;
  ps::PoolConfig c = small_config();
  c.device_reserve = 1024;  // 4 MiB of pages of 4 KiB
  ps::PagePool pool(c, ps::MemorySpace::host);
  ps::PoolMemoryUse use = pool.memory_use();
  CHECK(use.control == ps::PagePool::bytes_needed(c).control);
  CHECK(use.device_backed == granule);  // 2 pages: one granule
  CHECK(use.device_reserved == 2 * granule);
  CHECK(use.host_backed == granule);
  CHECK(use.host_reserved == granule);
  ps::grow(ps::host, pool, 600, 1);  // 2.3 MiB
  CHECK(pool.memory_use().device_backed == 2 * granule);
  // What the Python package does: a pool per operation over the memory, the reserve as its pages.
  ps::PoolConfig whole = c;
  whole.device_pages = c.device_reserve;
  whole.host_pages = c.host_reserve;
  whole.device_reserve = whole.host_reserve = 0;
  ps::PagePool attached = ps::PagePool::attach(whole, ps::MemorySpace::host, pool.memory());
  CHECK(attached.id() == pool.id());
  CHECK(attached.ref().page(599) == pool.ref().page(599));
  CHECK(attached.stats().device_pages == 600);  // the pages it has come from its memory
  const auto shape = grow_shape();
  std::mt19937 rng(9);
  Buffers<RuBf16> a(shape, rng), out(shape, rng);
  a.counts.assign(4, 16);  // packed: every token live
  auto rec = ps::make_record<Traits>(attached, shape);
  ps::stash(ps::host, attached, a.view, rec);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  ps::reload(ps::host, pool, rec, out.view);  // the owner reloads what the attached one stashed
  CHECK(out.bytes[0] == a.bytes[0]);
  ps::shrink(ps::host, pool, 2, 1);
  check_balanced(pool);
  CHECK(pool.memory_use().device_backed == granule);
}

TEST_CASE("a pool with a reserve: the resize steps by a block of 64 emulated threads equal the serial ones") {
  std::mt19937 rng(9);
  for (int round = 0; round < 20; ++round) {
    ps::PagePool serial(small_config(), ps::MemorySpace::host), teamed(small_config(), ps::MemorySpace::host);
    // The same shuffled free stacks in both (as pages come back in any order).
    for (ps::PagePool* p : {&serial, &teamed}) ps::grow(ps::host, *p, 30, 5);
    std::vector<std::int32_t> ids(30);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (ps::PagePool* p : {&serial, &teamed}) std::copy(ids.begin(), ids.end(), p->ref().device_stack);
    const std::int64_t d = 30 + static_cast<std::int64_t>(rng() % 19), h = 5 + static_cast<std::int64_t>(rng() % 4);
    const bool growing = round % 2 == 0;
    const std::int64_t to_d = growing ? d : static_cast<std::int64_t>(rng() % 31);
    const std::int64_t to_h = growing ? h : static_cast<std::int64_t>(rng() % 6);
    if (growing) ps::grow_pages(ps::SerialTeam{}, serial.ref(), to_d, to_h);
    else ps::shrink_pages(ps::SerialTeam{}, serial.ref(), to_d, to_h);
    LaunchShape one;
    one.blocks = 1;
    one.threads = 64;
    one.slots = 1;
    emulate_launch(one, [&](const EmulatedContext& ctx) {
      if (growing) ps::grow_pages(ctx.team, teamed.ref(), to_d, to_h);
      else ps::shrink_pages(ctx.team, teamed.ref(), to_d, to_h);
    });
    const ps::PoolStats a = serial.stats(), b = teamed.stats();
    CHECK(a.device_pages == b.device_pages);
    CHECK(a.host_pages == b.host_pages);
    CHECK(a.device_pages_free == b.device_pages_free);
    CHECK(a.host_pages_free == b.host_pages_free);
    CHECK(a.device_pages == to_d);
    CHECK(std::equal(serial.ref().device_stack, serial.ref().device_stack + a.device_pages_free,
                     teamed.ref().device_stack));
    CHECK(std::equal(serial.ref().host_stack, serial.ref().host_stack + a.host_pages_free, teamed.ref().host_stack));
    // The free ids are each page the pool has, once.
    std::vector<std::int32_t> free_ids(serial.ref().device_stack, serial.ref().device_stack + a.device_pages_free);
    std::sort(free_ids.begin(), free_ids.end());
    for (std::int64_t i = 0; i < a.device_pages; ++i) CHECK(free_ids[static_cast<std::size_t>(i)] == i);
  }
}

TEST_CASE("a pool with a reserve grows while emulated launches on other threads stash and reload (adversarial)") {
  const auto shape = grow_shape();
  ps::PoolConfig cfg = small_config();
  cfg.device_pages = 24;  // room for the three threads' stashes at once: no overflow
  cfg.host_pages = 0;
  cfg.host_reserve = 0;
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  std::atomic<int> exact{0};
  {
    PreemptAtAtomics preempt(17);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<std::uint32_t>(100 + t));
        for (int round = 0; round < 4; ++round) {
          Buffers<RuBf16> in(shape, rng), out(shape, rng);
          in.counts.assign(4, 4);  // 16 tokens: 2 pages
          auto rec = ps::make_record<Traits>(pool, shape);
          LaunchShape launch;
          launch.blocks = 2;
          launch.threads = 32;
          launch.seed = static_cast<std::uint32_t>(round);
          Emulator{launch}.stash(pool, in.view, rec);
          Emulator{launch}.reload(pool, rec, out.view, true);
          const std::vector<std::uint8_t> none(in.bytes[0].size(), 0);
          exact += out.bytes[0] == expected_reload<Traits>(shape, BufferRole::data, in.counts, in.bytes[0], none, true);
        }
      });
    }
    for (std::int64_t d = 25; d <= cfg.device_reserve; d += 3) {  // meanwhile
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ps::grow(ps::host, pool, d, 0);
    }
    for (auto& th : threads) th.join();
  }
  CHECK(exact == 12);
  check_balanced(pool);
  // Every id the pool has is on the free stack once.
  const ps::PoolStats s = pool.stats();
  std::vector<std::int32_t> ids(pool.ref().device_stack, pool.ref().device_stack + s.device_pages_free);
  std::sort(ids.begin(), ids.end());
  for (std::int64_t i = 0; i < s.device_pages; ++i) CHECK(ids[static_cast<std::size_t>(i)] == i);
}
