// The kernel body on the grid emulator (tests/common/grid_emulator.hpp): several blocks of
// several warps, shuffled and late block starts, against host pools. Every layout's random
// sequences, page-for-page agreement with the host executor, concurrent launches on one
// pool, a record relaunched with new counts as a graph replay does, and launches that
// overlap or never finished reported instead of hanging. CI runs these under TSan too.

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/record_words.hpp>
#include <pagestash/reference/serial_plan.hpp>
#include <pagestash/sizing.hpp>

#include <cuda/atomic>
#include <doctest/doctest.h>

#include "../common/fine_rounds.hpp"
#include "../common/grid_emulator.hpp"
#include "../common/layout_list.hpp"
#include "../common/overlap.hpp"
#include "../common/stash_sequence.hpp"
#include "../common/suite_backends.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

namespace {

using namespace pagestash_test;

using FourByTwoWarps = EmulatorBackend<4, 64, 2>;

/// A launch of 4 blocks x 64 threads, one resident at a time, whose second block starts only
/// once `release` is set: the first block runs alone, and the launch stays in flight.
struct HeldLaunch {
  std::promise<void> release;
  LaunchShape shape;
  HeldLaunch() {
    std::shared_future<void> released = release.get_future().share();
    shape.blocks = 4;
    shape.threads = 64;
    shape.slots = 1;
    shape.random_delays = false;
    shape.before_start = [released](int k) {
      if (k == 1) released.wait();
    };
  }
};

/// Waits until `blocks` blocks of the launch on `rec` have finished (acquiring their writes).
template <class Tr>
void wait_finished(const ps::StashRecord<Tr>& rec, std::int32_t blocks) {
  cuda::atomic_ref<std::int32_t, cuda::thread_scope_device> finished(rec.ref().header->launch.finished);
  while (finished.load(cuda::std::memory_order_acquire) != blocks) std::this_thread::yield();
}

/// The same stashes through the host executor and the emulator, into two pools: the same
/// page ids, the same page bytes, the same bytes reloaded.
template <class Traits>
int check_pages_match_host_executor(std::uint32_t seed) {
  using L = typename Traits::layout;
  std::mt19937 rng(seed);
  int compared = 0;
  for (bool odd : {false, true}) {
    const auto shape = sequence_shape<L>(odd);
    const ps::PoolConfig cfg = room_for<Traits>(shape, 256, 4);
    ps::PagePool host_pool(cfg, ps::MemorySpace::host), emulated_pool(cfg, ps::MemorySpace::host);
    same_arenas(cfg, {&host_pool, &emulated_pool});
    auto host_rec = ps::make_record<Traits>(host_pool, shape);
    auto emulated_rec = ps::make_record<Traits>(emulated_pool, shape);
    for (int i = 0; i < 3; ++i) {
      Buffers<L> in(shape, rng);
      ps::stash(ps::host, host_pool, in.view, host_rec);
      FourByTwoWarps::stash(emulated_pool, in.view, emulated_rec);
      const ps::RecordStatus a = host_rec.status(), b = emulated_rec.status();
      CHECK(b.state == a.state);
      CHECK(b.stream_bytes == a.stream_bytes);
      check_same_pages(host_pool, host_rec, emulated_pool, emulated_rec);
      Buffers<L> out_a(shape, rng);
      Buffers<L> out_b = out_a;
      const bool zero_tail = i % 2 == 1;
      ps::reload(ps::host, host_pool, host_rec, out_a.view, ps::ReloadOptions{zero_tail});
      FourByTwoWarps::reload(emulated_pool, emulated_rec, out_b.view, zero_tail);
      CHECK(out_a.bytes == out_b.bytes);
      CHECK(emulated_pool.stats().device_pages_free == host_pool.stats().device_pages_free);
      ++compared;
    }
  }
  return compared;
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("emulated grid of 4 blocks x 64 threads: every layout's sequences match a byte-for-byte copy") {
  std::uint32_t seed = 9000;
  int checked = 0;
#define PAGESTASH_EMULATED_SEQUENCES(L)                                                                              \
  {                                                                                                                  \
    using Layout = PAGESTASH_LAYOUT(L);                                                                              \
    CAPTURE(#L);                                                                                                     \
    for (Order order : {Order::lifo, Order::fifo, Order::random}) {                                                  \
      const bool odd = (seed % 2) == 0;                                                                              \
      checked += run_stash_sequence<ps::StashTraits<Layout>, FourByTwoWarps>(sequence_shape<Layout>(odd), order, 16, \
                                                                             ++seed, odd ? 256 : 1024);              \
    }                                                                                                                \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_EMULATED_SEQUENCES)
#undef PAGESTASH_EMULATED_SEQUENCES
  MESSAGE("emulated operations checked: " << checked);
  CHECK(checked >= layout_count * 3 * 16);
}

TEST_CASE("emulated grid: the same page ids and page bytes as the host executor, for every layout") {
  std::uint32_t seed = 9500;
  int compared = 0;
#define PAGESTASH_EMULATED_PAGES(L) \
  compared += check_pages_match_host_executor<ps::StashTraits<PAGESTASH_LAYOUT(L)>>(++seed);
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_EMULATED_PAGES)
#undef PAGESTASH_EMULATED_PAGES
  CHECK(compared == layout_count * 6);
}

namespace {

/// An odd shape whose buffers end in a partial 4-byte word where the layout allows it
/// (unquantized rows of 5 elements, 7 tokens, 3 groups: 210 bytes), and counts whose last
/// group fills its capacity (or the packed total), so that the last run ends on the
/// buffer's last byte.
template <class L>
std::pair<ps::GroupedView<L>, std::vector<std::int32_t>> ending_at_last_byte(std::mt19937& rng) {
  ps::GroupedView<L> v = sequence_shape<L>(true);
  if constexpr (!L::has(BufferRole::scales)) {
    if (!std::is_same_v<L, ps::Plain<typename L::data_type>>) v.groups = 3;
  }
  std::vector<std::int32_t> counts = random_counts(v, rng);
  if (L::placement::packed) {
    std::int64_t before = 0;
    for (std::size_t g = 0; g + 1 < counts.size(); ++g) before += counts[g];
    counts.back() = static_cast<std::int32_t>(v.max_tokens - before);
  } else {
    counts.back() = static_cast<std::int32_t>(v.max_tokens);
  }
  return {v, counts};
}

/// Stash and reload (with and without zero_tail) through the emulator, every buffer in a
/// heap block of exactly its size (a std::vector's), so that ASan reports any byte read or
/// written past one. Returns whether the data buffer ends in a partial word.
template <class Traits>
bool check_exact_size_buffers(std::uint32_t seed) {
  using L = typename Traits::layout;
  std::mt19937 rng(seed);
  auto [shape, counts] = ending_at_last_byte<L>(rng);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 256, 1);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, shape);
  for (bool zero_tail : {false, true}) {
    Buffers<L> in(shape, rng), out(shape, rng);
    in.counts = counts;
    in.view.counts = in.counts.data();
    const std::array<std::vector<std::uint8_t>, 3> poison = out.bytes;
    FourByTwoWarps::stash(pool, in.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
    FourByTwoWarps::reload(pool, rec, out.view, zero_tail);
    for (BufferRole role : all_roles) {
      const auto k = static_cast<std::size_t>(role);
      CHECK(out.bytes[k] == expected_reload<Traits>(shape, role, in.counts, in.bytes[k], poison[k], zero_tail));
      CHECK(out.bytes[k].capacity() == static_cast<std::size_t>(shape.buffer_bytes(role)));  // exact, as ASan sees it
    }
  }
  return shape.buffer_bytes(BufferRole::data) % 4 != 0;
}

}  // namespace

TEST_CASE(
    "emulated grid: every layout at odd shapes, buffers allocated to the exact byte (ASan sees past-the-end access)") {
  std::uint32_t seed = 60;
  int partial_word_ends = 0;
#define PAGESTASH_EXACT_SIZE(L)                                                     \
  {                                                                                 \
    using Layout = PAGESTASH_LAYOUT(L);                                             \
    CAPTURE(#L);                                                                    \
    partial_word_ends += check_exact_size_buffers<ps::StashTraits<Layout>>(++seed); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_EXACT_SIZE)
#undef PAGESTASH_EXACT_SIZE
  // Plain and rowwise BF16/FP16 buffers end in a partial word: a word load there reads past.
  CHECK(partial_word_ends >= 3);
}

TEST_CASE("emulated grid: concurrent launches of different records on host threads share one pool") {
  using L = ColNv4PadSw;
  using Traits = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 512, 3);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  constexpr int workers = 3, rounds = 6;
  std::atomic<int> mismatches{0}, done{0};
  std::vector<std::thread> threads;
  const PreemptAtAtomics preempt(71, 20);  // the lock, the stacks and the counters, preempted anywhere
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(static_cast<std::uint32_t>(70 + w));
      auto rec = ps::make_record<Traits>(pool, shape);
      LaunchShape launch;
      launch.blocks = 3;
      launch.threads = 32;
      launch.slots = 2;
      for (int i = 0; i < rounds; ++i) {
        launch.seed = static_cast<std::uint32_t>(w * 100 + i);
        const Emulator em{launch};
        Buffers<L> in(shape, rng), out(shape, rng);
        em.stash(pool, in.view, rec);
        em.reload(pool, rec, out.view, true);
        for (BufferRole role : all_roles) {
          const auto k = static_cast<std::size_t>(role);
          const std::vector<std::uint8_t> zeros(in.bytes[k].size(), 0);
          if (out.bytes[k] != expected_reload<Traits>(shape, role, in.counts, in.bytes[k], zeros, true)) ++mismatches;
        }
        ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(done == workers * rounds);
  CHECK(mismatches == 0);
  const ps::PoolStats st = pool.stats();
  CHECK_FALSE(st.flags.overflow);
  CHECK(st.device_pages_free == cfg.device_pages);
}

TEST_CASE("emulated grid: one record relaunched with new counts, as a graph replays the same launches") {
  using L = ColMx4CapSw;
  using Traits = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(true);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 1024, 1);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, shape);
  // A captured graph holds one stash and one reload launch with fixed arguments; every
  // replay reruns them (each a new grid, with a new id) with the counts of the moment.
  std::mt19937 rng(5);
  Buffers<L> in(shape, rng), out(shape, rng);
  LaunchShape launch;
  launch.blocks = 5;
  launch.threads = 64;
  launch.slots = 2;
  int exact = 0;
  constexpr int replays = 40;
  for (int replay = 0; replay < replays; ++replay) {
    in.counts = random_counts(shape, rng);  // new counts in the same buffer...
    in.view.counts = in.counts.data();
    for (auto& b : in.bytes) std::generate(b.begin(), b.end(), [&] { return static_cast<std::uint8_t>(rng()); });
    launch.seed = static_cast<std::uint32_t>(replay);
    emulate_launch(launch, [&](const EmulatedContext& ctx) {
      ps::run_operation<Traits, ps::Operation::stash>(ctx, pool.ref(), in.view, rec.ref(), {});
    });
    emulate_launch(launch, [&](const EmulatedContext& ctx) {
      ps::run_operation<Traits, ps::Operation::reload>(ctx, pool.ref(), out.view, rec.ref(), ps::ReloadOptions{true});
    });
    bool same = rec.status().state == ps::RecordState::reloaded;
    for (BufferRole role : all_roles) {
      const auto k = static_cast<std::size_t>(role);
      const std::vector<std::uint8_t> zeros(in.bytes[k].size(), 0);
      same = same && out.bytes[k] == expected_reload<Traits>(shape, role, in.counts, in.bytes[k], zeros, true);
    }
    exact += same;
  }
  CHECK(exact == replays);
  CHECK_FALSE(rec.status().launch_in_flight);
  CHECK(pool.stats().device_pages_free == cfg.device_pages);
}

TEST_CASE("emulated grid: a launch on a record whose launch is still in flight is refused and reported, not hung") {
  using L = RuBf16Cap;
  using Traits = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 1024, 2);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, shape);
  std::mt19937 rng(8);
  Buffers<L> first(shape, rng), second(shape, rng), out(shape, rng);

  // The first launch's second block starts only after the overlapping launch has ended;
  // once its first block has finished, it holds the record.
  HeldLaunch held;
  std::thread in_flight([&] { Emulator{held.shape}.stash(pool, first.view, rec); });
  wait_finished(rec, 1);
  LaunchShape overlap;
  overlap.blocks = 3;
  overlap.threads = 32;
  auto second_launch = std::async(std::launch::async, [&] { Emulator{overlap}.stash(pool, second.view, rec); });
  const bool ended = second_launch.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  REQUIRE_MESSAGE(ended, "the overlapping launch hung");
  const ps::RecordStatus during = rec.status();
  CHECK(during.refused_blocks == 3);
  CHECK(during.launch_in_flight);
  CHECK(pool.stats().flags.error);
  CHECK(pool.stats().flags.refused_launch == 1);
  CHECK(!pool.stats().flags.overflow);
  held.release.set_value();
  in_flight.join();

  // The first launch completed normally: the record holds the first tensor's bytes.
  CHECK_FALSE(rec.status().launch_in_flight);
  CHECK(rec.status().state == ps::RecordState::stashed);
  Emulator{}.reload(pool, rec, out.view, true);
  const std::vector<std::uint8_t> zeros(first.bytes[0].size(), 0);
  CHECK(out.bytes[0] == expected_reload<Traits>(shape, BufferRole::data, first.counts, first.bytes[0], zeros, true));
}

/// Two launches of `op` on one record with the same arguments (what two executables of one
/// captured graph, or two copies of the library, enqueue), the second while the first is in
/// flight, with its own launch id (a grid's own): the second is refused.
template <class Traits>
void overlap_same_arguments() {
  using L = typename Traits::layout;
  const auto shape = sequence_shape<L>(true);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 256, 2);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  std::vector<std::unique_ptr<ps::StashRecord<Traits>>> recs;
  recs.push_back(std::make_unique<ps::StashRecord<Traits>>(pool, shape));
  ps::StashRecord<Traits>& rec = *recs[0];
  std::mt19937 rng(21);
  Buffers<L> in(shape, rng), out(shape, rng);
  const std::int64_t pages = expected_pages<Traits>(shape, in.counts, cfg.page_bytes);

  for (const auto op : {ps::Operation::stash, ps::Operation::reload}) {
    CAPTURE(static_cast<int>(op));
    HeldLaunch held;
    held.shape.launch = next_grid_id();
    LaunchShape twin = held.shape;
    twin.before_start = nullptr;
    twin.slots = 2;
    twin.launch = next_grid_id();
    auto run = [&](const LaunchShape& launch) {
      emulate_launch(launch, [&](const EmulatedContext& ctx) {
        if (op == ps::Operation::stash)
          ps::run_operation<Traits, ps::Operation::stash>(ctx, pool.ref(), in.view, rec.ref(), {});
        else  // poison off: the refused twin would poison the destination both write
          ps::run_operation<Traits, ps::Operation::reload>(ctx, pool.ref(), out.view, rec.ref(),
                                                           ps::ReloadOptions{true, false});
      });
    };
    const std::int64_t errors_before = pool.stats().errors;
    std::thread first([&] { run(held.shape); });
    wait_finished(rec, 1);
    auto second = std::async(std::launch::async, [&] { run(twin); });
    const bool ended = second.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    held.release.set_value();
    first.join();
    REQUIRE_MESSAGE(ended, "the second launch hung");
    second.get();

    // The second launch was refused as a whole and counted once; the first did its work once.
    const ps::RecordStatus st = rec.status();
    CHECK_FALSE(st.launch_in_flight);
    CHECK(pool.stats().flags.refused_launch == 1);
    CHECK(pool.stats().errors == errors_before + 1);
    if (op == ps::Operation::stash) {
      CHECK(st.state == ps::RecordState::stashed);
      CHECK(st.pages == pages);
      CHECK(pool.stats().device_pages_free == cfg.device_pages - pages);
      check_page_invariant(pool, recs, {0});
    } else {
      CHECK(st.state == ps::RecordState::reloaded);
      CHECK(pool.stats().device_pages_free == cfg.device_pages);
      check_page_invariant(pool, recs, {});
      for (BufferRole role : all_roles) {
        const auto k = static_cast<std::size_t>(role);
        const std::vector<std::uint8_t> zeros(in.bytes[k].size(), 0);
        CHECK(out.bytes[k] == expected_reload<Traits>(shape, role, in.counts, in.bytes[k], zeros, true));
      }
    }
  }
}

TEST_CASE("emulated grid: two overlapping launches with the same arguments on one record: the second is refused") {
  overlap_same_arguments<ps::StashTraits<RuBf16Cap>>();
  overlap_same_arguments<ps::StashTraits<ColNv4CapCo>>();
}

namespace {

/// Two launches on one record, and how their blocks are scheduled.
struct OverlapCase {
  bool stashed_before = false;  ///< the record holds a stash of `before` when they start
  std::vector<OverlapLaunch> launches = std::vector<OverlapLaunch>(2);
  /// Blocks (by start, k) of launch 1 that start only once launch 0 has finished: a launch
  /// that straddles another one.
  std::vector<bool> held_back;
};

/// The two launches of `c` at once on the emulator, launch 1's held-back blocks after launch
/// 0 has finished, threads preempted at the library's atomics; then the record's launch
/// words are checked and one serial order of the launches that ran must leave exactly what
/// they left (tests/common/overlap.hpp). Returns an empty string, or what went wrong.
template <class Traits>
std::string check_overlap(const OverlapCase& c, std::uint32_t seed) {
  using L = typename Traits::layout;
  std::mt19937 rng(seed);
  const OverlapData<L> d(sequence_shape<L>(seed % 2 == 1), rng);
  const ps::PoolConfig cfg = room_for<Traits>(d.shape, 256, 2);
  const OverlapLaunch& first = c.launches[0];
  const OverlapLaunch& other = c.launches[1];
  std::int32_t refused = -1;
  bool in_flight = true, next_refused = true, hung = false;
  const Outcome<L> seen = play<Traits>(
      c.stashed_before, d, cfg, [&](ps::PagePool& pool, ps::StashRecord<Traits>& rec, std::vector<Buffers<L>>& out) {
        std::promise<void> first_done;
        std::shared_future<void> done = first_done.get_future().share();
        LaunchShape second = other.shape;
        second.before_start = [&c, done](int k) {
          if (c.held_back[static_cast<std::size_t>(k)]) done.wait();
        };
        {
          PreemptAtAtomics preempt(seed);
          auto a = std::async(std::launch::async, [&] {
            apply(Emulator{first.shape}, first.op, first.zero_tail, pool, rec, d, out[0]);
            first_done.set_value();
          });
          auto b = std::async(std::launch::async,
                              [&] { apply(Emulator{second}, other.op, other.zero_tail, pool, rec, d, out[1]); });
          for (auto* f : {&a, &b}) hung = hung || f->wait_for(std::chrono::seconds(30)) != std::future_status::ready;
          if (hung) {
            std::fprintf(stderr, "emulated launches hung: seed %u\n", seed);
            std::abort();  // the futures would wait for ever
          }
        }
        refused = rec.status().refused_blocks;
        in_flight = rec.status().launch_in_flight;
        // The record is free again: a later launch is not refused (the serial orders run this reload too).
        Emulator{first.shape}.reload(pool, rec, out[0].view, first.zero_tail);
        next_refused = rec.status().refused_blocks != refused;
      });
  std::ostringstream why;
  if (in_flight) why << "the record is still held after both launches; ";
  if (next_refused) why << "a later launch was refused; ";
  if (!matches_a_serial_order(serial_outcomes<Traits>(c.launches, c.stashed_before, d, cfg, true), seen, refused))
    why << refused << " blocks refused (launches of " << first.shape.blocks << " and " << other.shape.blocks
        << "), and no serial order of the launches that ran leaves the same record, pool and bytes; ";
  return why.str();
}

/// A seeded case: random operations, grids, start orders and blocks held back.
OverlapCase random_case(std::mt19937& rng, std::uint32_t seed) {
  OverlapCase c;
  c.stashed_before = rng() % 2 == 0;
  const LaunchOp ops[] = {LaunchOp::stash_first, LaunchOp::stash_second, LaunchOp::reload, LaunchOp::discard};
  for (int k = 0; k < 2; ++k) {
    OverlapLaunch& l = c.launches[static_cast<std::size_t>(k)];
    l.op = ops[rng() % 4];
    l.zero_tail = rng() % 2 == 0;
    LaunchShape& s = l.shape;
    s.blocks = 1 + static_cast<int>(rng() % 4);
    s.threads = rng() % 2 == 0 ? 32 : 64;
    s.slots = 1 + static_cast<int>(rng() % 2);
    s.seed = seed * 2 + static_cast<std::uint32_t>(k);
    s.random_delays = rng() % 2 == 0;
  }
  for (int k = 0; k < c.launches[1].shape.blocks; ++k) c.held_back.push_back(rng() % 2 == 0);
  return c;
}

template <class Traits>
int run_adversarial_schedules(std::uint32_t first_seed, int cases) {
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const std::uint32_t seed = first_seed + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    const OverlapCase c = random_case(rng, seed);
    const std::string why = check_overlap<Traits>(c, seed);
    if (!why.empty()) {
      ++failures;
      FAIL_CHECK("seed " << seed << ": " << std::string(name_of(c.launches[0].op)) << " (" << c.launches[0].shape.blocks
                         << " blocks) and " << std::string(name_of(c.launches[1].op)) << " ("
                         << c.launches[1].shape.blocks << " blocks), stashed before: " << c.stashed_before << ": "
                         << why);
    }
  }
  return failures;
}

}  // namespace

TEST_CASE("emulated grid, adversarial schedules: two launches on one record are each done or refused as a whole") {
  // Seeds are printed on failure; PAGESTASH_SCHEDULE_SEED=<n> reruns one.
  const char* one = std::getenv("PAGESTASH_SCHEDULE_SEED");
  const std::uint32_t first = one ? static_cast<std::uint32_t>(std::strtoul(one, nullptr, 10)) : 1;
  const int cases = one ? 1 : 120;
  CHECK(run_adversarial_schedules<ps::StashTraits<RuBf16Cap>>(first, cases) == 0);
  CHECK(run_adversarial_schedules<ps::StashTraits<ColNv4CapCo>>(first + 100000, cases) == 0);
}

TEST_CASE("emulated grid: a launch straddling another (refused blocks first, later blocks after it) is refused whole") {
  using L = RuBf16Cap;
  using Traits = ps::StashTraits<L>;
  for (const LaunchOp second : {LaunchOp::reload, LaunchOp::discard, LaunchOp::stash_second}) {
    CAPTURE(std::string(name_of(second)));
    // The stash's launch holds the record until the second launch's first block is refused.
    std::mt19937 rng(77);
    const OverlapData<L> d(sequence_shape<L>(false), rng);
    const ps::PoolConfig cfg = room_for<Traits>(d.shape, 256, 2);
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    auto rec = ps::make_record<Traits>(pool, d.shape);
    Buffers<L> out = d.out[1];
    const std::vector<std::uint8_t> untouched = out.bytes[0];
    HeldLaunch first;  // its second block waits for `release`
    std::promise<void> first_done;
    std::shared_future<void> done = first_done.get_future().share();
    std::thread a([&] {
      Emulator{first.shape}.stash(pool, d.x.view, rec);
      first_done.set_value();
    });
    wait_finished(rec, 1);  // the stash holds the record
    LaunchShape straddling = first.shape;
    straddling.before_start = [&, done](int k) {
      if (k == 1) {
        first.release.set_value();  // the first block was refused: let the stash finish
        done.wait();
      }
    };
    apply(Emulator{straddling}, second, true, pool, rec, d, out);
    a.join();
    const ps::RecordStatus st = rec.status();
    CHECK(st.refused_blocks == 4);
    CHECK_FALSE(st.launch_in_flight);
    CHECK(st.state == ps::RecordState::stashed);
    CHECK(pool.stats().flags.refused_launch == 1);
    CHECK(pool.stats().errors == 1);
    // A refused reload did not restore: it poisoned its destination.
    CHECK(out.bytes[0] ==
          (second == LaunchOp::reload ? expected_unrestored<Traits>(BufferRole::data, untouched) : untouched));
    const std::int64_t pages = expected_pages<Traits>(d.shape, d.x.counts, cfg.page_bytes);
    CHECK(st.pages == pages);
    CHECK(pool.stats().device_pages_free == cfg.device_pages - pages);
    // The record is free: the stash reloads whole.
    Buffers<L> back = d.poison;
    Emulator{}.reload(pool, rec, back.view, true);
    CHECK(rec.status().refused_blocks == 4);
    CHECK(rec.status().state == ps::RecordState::reloaded);
    const std::vector<std::uint8_t> zeros(back.bytes[0].size(), 0);
    CHECK(back.bytes[0] == expected_reload<Traits>(d.shape, BufferRole::data, d.x.counts, d.x.bytes[0], zeros, true));
    CHECK(pool.stats().device_pages_free == cfg.device_pages);
  }
}

namespace {

/// Runs `ops` under a deadline: blocks that hang cannot be joined, so a hang is reported and the process exits.
template <class F>
void within_a_minute(const std::string& what, F&& ops) {
  auto done = std::async(std::launch::async, std::forward<F>(ops));
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "%s: a block never joined its launch (hung)\n", what.c_str());
    std::_Exit(1);
  }
  done.get();
}

/// The record's last reload restored d.x whole into `back`, returned every page, and nothing was refused.
template <class Traits>
void check_reloaded_whole(const ps::StashRecord<Traits>& rec, const ps::PagePool& pool,
                          const Buffers<typename Traits::layout>& back, const OverlapData<typename Traits::layout>& d,
                          const ps::PoolConfig& cfg) {
  CHECK(rec.status().state == ps::RecordState::reloaded);
  CHECK_FALSE(rec.status().launch_in_flight);
  CHECK(rec.status().refused_blocks == 0);
  CHECK(pool.stats().flags.error == 0);
  const std::vector<std::uint8_t> zeros(back.bytes[0].size(), 0);
  CHECK(back.bytes[0] == expected_reload<Traits>(d.shape, BufferRole::data, d.x.counts, d.x.bytes[0], zeros, true));
  CHECK(pool.stats().device_pages_free == cfg.device_pages);
}

}  // namespace

TEST_CASE("emulated grid: launch ids at the top of the 64-bit range: every block of a launch joins its owner") {
  // %gridid is 64 bits; the launch words keep 62 of them. Ids whose top bits are set (and one whose low 62 bits are 0)
  // must still make one launch of all its blocks: a block comparing a kept id with a full one would wait for ever,
  // so each launch runs under a deadline.
  using L = RuBf16Cap;
  using Traits = ps::StashTraits<L>;
  std::mt19937 rng(91);
  const OverlapData<L> d(sequence_shape<L>(false), rng);
  const ps::PoolConfig cfg = room_for<Traits>(d.shape, 256, 2);
  for (const std::uint64_t id : {0x4000000000000005ull, 0x8000000000000001ull, 0xC000000000000000ull, ~0ull}) {
    CAPTURE(id);
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    auto rec = ps::make_record<Traits>(pool, d.shape);
    Buffers<L> back = d.poison;
    LaunchShape shape;
    shape.blocks = 4;
    shape.slots = 2;
    shape.launch = id;
    within_a_minute("launch id " + std::to_string(id), [&] {
      Emulator{shape}.stash(pool, d.x.view, rec);
      shape.launch = id ^ 0x10;  // the reload: another launch, top bits as set
      Emulator{shape}.reload(pool, rec, back.view, true);
    });
    check_reloaded_whole(rec, pool, back, d, cfg);
  }
}

TEST_CASE("emulated grid: a graph replay's launches repeat their ids: a launch with the last holder's id takes anew") {
  // A graph's replays repeat their kernel nodes' %gridid. A launch whose id is the one of the launch that last held
  // the record must not let its blocks join before its taker has reset the launch words (the release clears `owner`).
  using L = RuBf16Cap;
  using Traits = ps::StashTraits<L>;
  std::mt19937 rng(29);
  const OverlapData<L> d(sequence_shape<L>(false), rng);
  const ps::PoolConfig cfg = room_for<Traits>(d.shape, 256, 2);
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    CAPTURE(seed);
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    auto rec = ps::make_record<Traits>(pool, d.shape);
    Buffers<L> back = d.poison;
    LaunchShape shape;
    shape.blocks = 4;
    shape.threads = 32;
    shape.slots = 4;
    shape.seed = seed;
    shape.launch = next_grid_id();  // one node, replayed: stash, reload, stash again, reload again
    within_a_minute("replayed launch ids, seed " + std::to_string(seed), [&] {
      PreemptAtAtomics preempt(seed, 50);
      for (int replay = 0; replay < 2; ++replay) {
        Emulator{shape}.stash(pool, d.x.view, rec);
        Emulator{shape}.reload(pool, rec, back.view, true);
      }
    });
    check_reloaded_whole(rec, pool, back, d, cfg);
  }
}

TEST_CASE("emulated grid: a pool reset frees a record left held by a launch that never finished") {
  using L = RuBf16Cap;
  using Traits = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 1024, 1);
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, shape);
  std::mt19937 rng(19);
  Buffers<L> in(shape, rng), out(shape, rng);
  // A launch that took the record and died: held, its id published, this generation.
  ps::forge_held_launch(rec.ref(), next_grid_id(), pool.stats().generation, 2, 1000);
  Emulator{}.stash(pool, in.view, rec);
  CHECK(rec.status().refused_blocks == LaunchShape{}.blocks);
  CHECK(rec.status().launch_in_flight);
  CHECK(rec.status().state == ps::RecordState::empty);

  Emulator{}.reset(pool);
  Emulator{}.stash(pool, in.view, rec);
  CHECK(rec.status().refused_blocks == LaunchShape{}.blocks);  // no more refused
  CHECK_FALSE(rec.status().launch_in_flight);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  Emulator{}.reload(pool, rec, out.view, true);
  const std::vector<std::uint8_t> zeros(in.bytes[0].size(), 0);
  CHECK(out.bytes[0] == expected_reload<Traits>(shape, BufferRole::data, in.counts, in.bytes[0], zeros, true));
  CHECK(pool.stats().device_pages_free == cfg.device_pages);
  CHECK(pool.stats().flags.error == 0);
}

TEST_CASE(
    "emulated grid: blocks claim tiles as they come, so the first block does all the work of late ones but "
    "their own first chunks") {
  // Block 0 runs alone while the others are held back: past the grid's first chunks (block b's own: chunk b, so that
  // no block claims before its first tile) tiles are claimed from a counter, so it copies every tile but the three
  // late blocks' first chunks before any of them starts (a static split would leave 3/4 to them).
  using L = ColNv4CapCo;
  using Traits = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for<Traits>(shape, 256, 1);
  ps::PagePool reference_pool(cfg, ps::MemorySpace::host), pool(cfg, ps::MemorySpace::host);
  same_arenas(cfg, {&reference_pool, &pool});
  auto reference = ps::make_record<Traits>(reference_pool, shape);
  auto rec = ps::make_record<Traits>(pool, shape);
  std::mt19937 rng(11);
  Buffers<L> in(shape, rng);
  in.counts.assign(in.counts.size(), static_cast<std::int32_t>(shape.max_tokens));  // many tiles
  ps::stash(ps::host, reference_pool, in.view, reference);
  REQUIRE(reference.status().state == ps::RecordState::stashed);

  HeldLaunch held;
  std::thread launch([&] { Emulator{held.shape}.stash(pool, in.view, rec); });
  wait_finished(rec, 1);
  const std::int64_t bytes = cfg.device_pages * cfg.page_bytes;
  // What is left to the late blocks: their first chunks (2 warps x 2 tiles each), at most.
  const std::int64_t tile_bytes = std::int64_t{1} << rec.ref().header->tile_shift;
  const std::int64_t left =
      std::inner_product(pool.ref().device_arena, pool.ref().device_arena + bytes, reference_pool.ref().device_arena,
                         std::int64_t{0}, std::plus<>(), std::not_equal_to<>());
  CHECK(rec.ref().header->tiles > 4 * 4 * 4);  // many chunks beyond the first four
  CHECK(left > 0);
  CHECK(left <= 3 * 4 * tile_bytes);
  held.release.set_value();
  launch.join();
  CHECK(rec.page_ids() == reference.page_ids());
  CHECK(std::equal(pool.ref().device_arena, pool.ref().device_arena + bytes, reference_pool.ref().device_arena));
}

namespace {

/// The count check and the plan by a block of 64 emulated threads (more groups than threads:
/// several chunks) against the serial oracles (reference/serial_plan.hpp), item for item.
template <class L>
void check_team_plan(const char* name) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(31);
  for (int round = 0; round < 6; ++round) {
    ps::GroupedView<L> v = sequence_shape<L>(round % 2 == 1);
    if constexpr (!std::is_same_v<L, ps::Plain<typename L::data_type>>) {
      v.groups = round < 2 ? 3 : 150;
      if (L::placement::packed) v.max_tokens = v.max_tokens / v.granule() * v.granule() * 8;
    }
    std::vector<std::int32_t> counts = round == 5 ? bad_counts(v, rng) : random_counts(v, rng);
    const bool zero_tail = round % 3 == 0;
    const int tile_shift = 8 + round;
    const ps::CountCheck serial_check = ps::plan_groups(v, counts.data(), nullptr);
    std::vector<ps::WorkItem> serial(static_cast<std::size_t>(ps::max_work_items(v.groups)));
    const ps::WorkTotals st = ps::serial_plan_work<Tr>(v, counts.data(), zero_tail, serial.data(), tile_shift);
    // The one-thread plan of the host executor is the team code too.
    std::vector<ps::WorkItem> one_thread(serial.size());
    REQUIRE(ps::plan_work<Tr>(v, counts.data(), zero_tail, one_thread.data(), tile_shift).tiles == st.tiles);
    REQUIRE(std::memcmp(one_thread.data(), serial.data(), static_cast<std::size_t>(st.items) * sizeof(ps::WorkItem)) ==
            0);
    REQUIRE(ps::check_counts(v, counts.data()).first_bad_group == serial_check.first_bad_group);

    std::vector<ps::WorkItem> team_items(serial.size());
    std::vector<ps::CountCheck> checks(64, ps::CountCheck{-7});
    std::vector<ps::WorkTotals> totals(64), warp_totals(64);
    // Each warp's plan on its lanes (a stash's look-ahead, stash/look_ahead.hpp), items handed to a callable with their
    // tiles, on the thread that planned them: poisoned first, then every item and its tiles as the serial plan's.
    std::vector<ps::WorkItem> warp_items(2 * serial.size());
    std::memset(static_cast<void*>(warp_items.data()), 0xA5, warp_items.size() * sizeof(ps::WorkItem));
    std::vector<std::int64_t> warp_tiles(warp_items.size(), -1);
    LaunchShape one;
    one.blocks = 1;
    one.threads = 64;
    one.slots = 1;
    emulate_launch(one, [&](const EmulatedContext& ctx) {
      const int r = ctx.team.rank();
      checks[static_cast<std::size_t>(r)] = ps::check_counts(ctx.team, v, counts.data());
      totals[static_cast<std::size_t>(r)] = ps::plan_work_on_team<Tr>(ctx.team, v, ps::SegmentsAt{counts.data()},
                                                                      zero_tail, tile_shift, team_items.data());
      const std::size_t base = static_cast<std::size_t>(ctx.warp) * serial.size();
      warp_totals[static_cast<std::size_t>(r)] =
          ps::plan_work_on_team<Tr>(ctx.lanes, v, ps::SegmentsAt{counts.data(), false}, zero_tail, tile_shift,
                                    [&](std::int32_t i, const ps::WorkItem& item, std::int64_t tiles) {
                                      warp_items[base + static_cast<std::size_t>(i)] = item;
                                      warp_tiles[base + static_cast<std::size_t>(i)] = tiles;
                                    });
    });
    INFO(name << ", round " << round << ", groups " << v.groups);
    for (int r = 0; r < 64; ++r) {
      REQUIRE(checks[static_cast<std::size_t>(r)].verdict() == serial_check.verdict());
      REQUIRE(checks[static_cast<std::size_t>(r)].first_bad_group == serial_check.first_bad_group);
      const ps::WorkTotals& tt = totals[static_cast<std::size_t>(r)];
      REQUIRE(tt.items == st.items);
      REQUIRE(tt.tiles == st.tiles);
      REQUIRE(tt.stream_bytes == st.stream_bytes);
      REQUIRE(tt.live_bytes == st.live_bytes);
      const ps::WorkTotals& wt = warp_totals[static_cast<std::size_t>(r)];
      REQUIRE(wt.items == st.items);
      REQUIRE(wt.tiles == st.tiles);
      REQUIRE(wt.stream_bytes == st.stream_bytes);
      REQUIRE(wt.live_bytes == st.live_bytes);
    }
    REQUIRE(std::memcmp(team_items.data(), serial.data(), static_cast<std::size_t>(st.items) * sizeof(ps::WorkItem)) ==
            0);
    for (std::size_t warp = 0; warp < 2; ++warp) {
      const std::size_t base = warp * serial.size();
      REQUIRE(std::memcmp(warp_items.data() + base, serial.data(),
                          static_cast<std::size_t>(st.items) * sizeof(ps::WorkItem)) == 0);
      for (std::int32_t i = 0; i < st.items; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const std::int64_t end = i + 1 < st.items ? serial[k + 1].first_tile : st.tiles;
        REQUIRE(warp_tiles[base + k] == end - serial[k].first_tile);
      }
    }
  }
}

TEST_CASE(
    "emulated block plan: the count check and the plan by 64 threads, and the plan by each warp's lanes, equal the "
    "serial ones, every layout") {
  using namespace pagestash_test::layouts;
#define PAGESTASH_CHECK_TEAM_PLAN(L) check_team_plan<PAGESTASH_LAYOUT(L)>(#L);
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_CHECK_TEAM_PLAN)
#undef PAGESTASH_CHECK_TEAM_PLAN
}

TEST_CASE("emulated warp: the warp's item search finds every tile's item and grid, as a search over first tiles does") {
  // Plans of 1 to 3,000 items (one round, the last round's two items a lane, two and three rounds), a third of them
  // empty (sharing their first tile with the next item), searched by the 32 lanes of one emulated warp; the oracle is
  // std::upper_bound over the items' first tiles.
  std::mt19937 rng(23);
  for (const int n : {1, 2, 3, 31, 32, 33, 63, 64, 65, 100, 1000, 2047, 2048, 2049, 3000}) {
    std::vector<ps::WorkItem> items(static_cast<std::size_t>(n));
    std::vector<std::int64_t> firsts(items.size());
    std::int64_t tiles = 0;
    for (std::size_t k = 0; k < items.size(); ++k) {
      items[k].first_tile = firsts[k] = tiles;
      // A zero item's grid, or a copy item's of a stream offset past 4 GiB (both words handed on).
      const auto stream = (std::int64_t{1} << 40) + 16 * static_cast<std::int64_t>(rng() % 100000);
      const int shift = 8 + static_cast<int>(rng() % 9);
      items[k].grid = rng() % 4 == 0 ? -1 : (stream >> shift) * 64 + shift;  // WorkItem::grid: its cell and shift
      tiles += rng() % 3 == 0 ? 0 : 1 + rng() % 4;
    }
    if (tiles == 0) tiles = 1;  // every item empty: the last one holds the one tile
    ps::TileWork w{};
    w.items = items.data();
    w.item_count = n;
    std::vector<std::int32_t> probe;
    for (std::int64_t t = 0; t < tiles; t += 1 + static_cast<std::int64_t>(rng() % 3))
      probe.push_back(static_cast<std::int32_t>(t));
    probe.push_back(static_cast<std::int32_t>(tiles - 1));
    std::vector<int> wrong(32, 0);
    LaunchShape one;
    one.blocks = 1;
    one.threads = 32;
    one.slots = 1;
    emulate_launch(one, [&](const EmulatedContext& ctx) {
      for (const std::int32_t t : probe) {
        ps::ItemCursor c;
        ps::seek_item_on_warp(ctx.lanes, w, c, t);
        const auto k = std::upper_bound(firsts.begin(), firsts.end(), t) - firsts.begin() - 1;
        const std::int64_t end =
            k + 1 < n ? firsts[static_cast<std::size_t>(k + 1)] : static_cast<std::int64_t>(ps::max_plan_tiles);
        if (c.item != k || c.first != firsts[static_cast<std::size_t>(k)] || c.end != end ||
            c.grid != items[static_cast<std::size_t>(k)].grid)
          ++wrong[static_cast<std::size_t>(ctx.lanes.rank())];
      }
    });
    CAPTURE(n);
    CHECK(std::accumulate(wrong.begin(), wrong.end(), 0) == 0);
  }
}

TEST_CASE("emulated grid: a launch cuts tiles of the device policy's size, the host executor of the host policy's") {
  using L = ps::Plain<float>;
  using Traits = ps::StashTraits<L>;
  ps::GroupedView<L> v;
  v.hidden = 4096;
  v.max_tokens = 64;  // 1 MiB: 256 tiles of 4 KiB, 16 of 64 KiB
  std::vector<float> data(static_cast<std::size_t>(v.hidden * v.max_tokens), 1.0f);
  std::vector<std::int32_t> counts{64};
  v.data = data.data();
  v.counts = counts.data();
  const std::int64_t page_bytes = std::int64_t{1} << ps::HostPolicy::tile_shift;  // no tile clipped
  ps::PagePool pool(room_for<Traits>(v, page_bytes, 1), ps::MemorySpace::host);
  auto rec = ps::make_record<Traits>(pool, v);
  const auto tiles_of = [&](int tile_shift) {
    return ps::plan_work<Traits>(v, counts.data(), false, nullptr, tile_shift).tiles;
  };
  REQUIRE(tiles_of(ps::StashPolicy::tile_shift) != tiles_of(ps::HostPolicy::tile_shift));
  FourByTwoWarps::stash(pool, v, rec);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  CHECK(rec.ref().header->tiles == tiles_of(ps::StashPolicy::tile_shift));
  ps::discard(ps::host, pool, rec);
  ps::stash(ps::host, pool, v, rec);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  CHECK(rec.ref().header->tiles == tiles_of(ps::HostPolicy::tile_shift));
}

TEST_CASE("launch shape: the policy of a device's compute capability sizes its grid") {
  static_assert(std::is_same_v<ps::StashPolicy, ps::StashPolicy90>, "host code runs sm_90's policy");
  const auto blocks_on = [](int sms, int compute_major, int resident_per_sm) {
    return ps::with_stash_policy(
        compute_major, [&](auto policy) { return ps::device_blocks<decltype(policy)>(sms, resident_per_sm); });
  };
  CHECK(blocks_on(132, 9, 2) == 132);   // H200: one block per SM
  CHECK(blocks_on(148, 10, 2) == 296);  // B200: two
  CHECK(blocks_on(148, 10, 1) == 148);  // no more than fit
  CHECK(blocks_on(108, 8, 0) == 108);   // before sm_90: sm_90's; no occupancy known: one per SM
  CHECK(blocks_on(100, 12, 2) == 200);  // after sm_100: sm_100's

  using P = ps::StashPolicy90;
  constexpr std::int64_t claim = P::warps_per_block * P::tiles_per_warp_claim;  // a block's tiles per claim
  CHECK(ps::launch_blocks<P>(132, 0, 0) == 1);
  CHECK(ps::launch_blocks<P>(132, 0, 10 * claim + 1) == 11);  // one claim per block
  CHECK(ps::launch_blocks<P>(132, 0, 1000 * claim) == 132);
  CHECK(ps::launch_blocks<P>(132, 7, 1000 * claim) == 7);  // max_blocks
}

}  // namespace

namespace {
/// One stash and one reload of Tr on the emulator (hidden 7168, random counts and bytes): the
/// loads and stores of each, in sectors (SectorCounter).
template <class Tr>
std::array<SectorCounter::Count, 4> sector_counts(std::uint32_t seed) {
  using L = typename Tr::layout;
  auto shape = sequence_shape_of<Tr>(false);
  shape.hidden = 7168;
  shape.max_tokens = 96;
  shape.groups = 4;
  std::mt19937 rng(seed);
  Buffers<L> in(shape, rng), out(shape, rng);
  // On 256 bytes, as cudaMalloc's buffers are (a vector's are on 16): a sector's share is the kernel's, not the heap's.
  const auto bytes = static_cast<std::size_t>(shape.buffer_bytes(BufferRole::data));
  std::vector<std::uint8_t> storage(2 * bytes + 512);
  auto* first = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 255) / 256 * 256);
  auto* second = first + (bytes + 255) / 256 * 256;
  std::memcpy(first, in.bytes[0].data(), bytes);
  in.view.data = reinterpret_cast<typename L::data_type*>(first);
  out.view.data = reinterpret_cast<typename L::data_type*>(second);
  ps::PagePool pool(room_for<Tr>(shape, 1 << 16, 1), ps::MemorySpace::host);
  return count_sectors<Tr>(pool, in.view, out.view);
}
}  // namespace

TEST_CASE("emulated grid: a compressed stash's warp accesses use their sectors within 1.25x as the lossless copy's") {
  const std::string what[] = {"stash loads", "stash stores", "reload loads", "reload stores"};
  const auto check = [&](const auto& lossless, const auto& coded) {
    for (std::size_t k = 0; k < 4; ++k) {
      CAPTURE(what[k]);
      CAPTURE(lossless[k].sector_use());
      CAPTURE(coded[k].sector_use());
      CAPTURE(coded[k].sectors_per_request());
      CHECK(lossless[k].requests > 0);
      CHECK(coded[k].requests > 0);
      CHECK(coded[k].sector_use() * 1.25 >= lossless[k].sector_use());
    }
  };
  check(sector_counts<ps::StashTraits<RuBf16>>(3), sector_counts<traits::Bf16Mx4>(3));
  check(sector_counts<ps::StashTraits<RuFp16Cap>>(4), sector_counts<traits::Fp16CapB128>(4));
}

namespace {
/// One stash and one reload (no zero_tail) of Tr on the emulator, one group of `count` tokens, hidden 4096, capacity
/// 128, on pages of 2^page_shift bytes: the dependent rounds of each (RoundCounter).
template <class Tr>
std::array<RoundCounter::Count, 2> round_counts(std::int32_t count, int page_shift) {
  using L = typename Tr::layout;
  ps::GroupedView<L> shape;
  shape.groups = 1;
  shape.hidden = 4096;
  shape.max_tokens = 128;
  std::mt19937 rng(5);
  Buffers<L> in(shape, rng), out(shape, rng);
  in.counts[0] = out.counts[0] = count;
  ps::PagePool pool(room_for<Tr>(shape, std::int64_t{1} << page_shift, 1), ps::MemorySpace::host);
  auto rec = ps::make_record<Tr>(pool, shape);
  std::array<RoundCounter::Count, 2> c;
  {
    RoundCounter rounds;
    Emulator{LaunchShape{}}.stash(pool, in.view, rec);
    c[0] = rounds.count();
  }
  {
    RoundCounter rounds;
    Emulator{LaunchShape{}}.reload(pool, rec, out.view, false);
    c[1] = rounds.count();
  }
  REQUIRE(rec.status().state == ps::RecordState::reloaded);
  return c;
}
}  // namespace

TEST_CASE("emulated grid: dependent rounds, one a batch of aligned vectors and one a staged round") {
  // BF16 rows of 2 tokens: 16 KiB of aligned lines, 4 tiles of 8 vectors a lane, 4 loads in flight: 2 rounds a tile.
  // On 64 KiB pages a warp's claim of 2 tiles is one span (in one item, on one page): 4 rounds; on 4 KiB pages, two.
  for (const int page_shift : {16, 12}) {
    CAPTURE(page_shift);
    const auto bf16 = round_counts<ps::StashTraits<RuBf16Cap>>(2, page_shift);
    for (const auto& c : bf16) {
      CHECK(c.spans == (page_shift == 16 ? 2 : 4));
      CHECK(c.max_span == (page_shift == 16 ? 4 : 2));
      CHECK(c.max_warp == 4);  // a claim of 2 tiles
      CHECK(c.rounds == 8);
    }
  }
  // NVFP4 columnwise of 2 tokens: its data (a 64-byte pitch) and compact scales (8) are each 4096 lines of 1-byte
  // runs, 16 tiles of 256 lines each (max_tile_lines), a span each (short lines: resolve_tile). Staged
  // (StashPolicy::staged): a lane loads its 8 chunks (data: one from each line's start; scales: the aligned chunks over
  // the dense lines) in one round, and a reload's its stream vectors: one round a tile, 2 a claim. Gathered: lanes 0-15
  // each gather a vector of 16 one-byte run pieces, a round a piece: 16 a tile, 32 a claim; a reload's lane loads its
  // vector once and scatters it: 1 and 2. (Before the cap, 4 KiB tiles: 128 and 256, the reload 8 and 16.)
  const auto nvfp4 = round_counts<ps::StashTraits<ColNv4CapCo>>(2, 16);
  CHECK(nvfp4[0].spans == 32);
  CHECK(nvfp4[0].max_span == (ps::StashPolicy::staged ? 1 : 16));
  CHECK(nvfp4[0].max_warp == (ps::StashPolicy::staged ? 2 : 32));
  CHECK(nvfp4[1].max_span == 1);
  CHECK(nvfp4[1].max_warp == 2);
}

TEST_CASE("fine-grained rows on one emulated warp: at most 8 dependent rounds a warp claim") {
  // A claim is two tiles, a tile of short lines at most 256 of them (max_tile_lines) in one to three rounds of the
  // staged mover. Before it, an NVFP4 stash's slowest claim waited 192-256 rounds (docs/benchmarks.md, "Dependent
  // rounds per warp"); with the kernels' staging off (StashPolicy::staged), the capped tiles alone wait 32 (a claim of
  // two 256-line tiles of one-byte runs, gathered a piece at a time), and this fails.
  // Every row (tests/common/fine_rounds.hpp) is held by the ctest "bench: dependent rounds per warp" (Release, step 1
  // of the test command); here, where one warp of 32 threads emulates a row in 5-20 s under the sanitizers, the rows
  // that waited longest before the staged mover (NVFP4, both scale layouts) and an MXFP8 one of each shape.
  std::int64_t most = 0;
  pagestash_test::for_each_fine_row([&](const ps::sizing::ModelShape& fs, std::int64_t mean, auto r) {
    using R = decltype(r);
    const std::string name = R::name();
    const bool nvfp4 = name.rfind("nvfp4/", 0) == 0, mxfp8 = name == "mxfp8/capacity/compact";
    if (!((nvfp4 && mean == (fs.hidden > 4096 ? 32 : 128)) || (mxfp8 && mean == 64))) return;
    const auto f = pagestash_test::count_fine_row<typename R::layout>(fs, mean, pagestash_test::one_warp(), false);
    const RoundCounter::Count c[2] = {f[0].rounds, f[1].rounds};
    INFO(fs.name << ", " << name << ", mean " << mean << ": stash " << c[0].max_warp << ", reload " << c[1].max_warp);
    CHECK(c[0].spans > 0);
    CHECK(c[0].max_warp <= pagestash_test::fine_rounds_bound);
    CHECK(c[1].max_warp <= pagestash_test::fine_rounds_bound);
    most = std::max({most, c[0].max_warp, c[1].max_warp});
  });
  MESSAGE("the slowest warp claim of a fine-grained row: " << most << " dependent rounds");
}
