// The pool's flags as a training loop uses them: capacity (overflow) apart from misuse
// (error and its kinds), the report written into the caller's memory (host executor and
// grid emulator), and a host analogue of ranks agreeing on the flags and rerunning a step
// that overflowed on one of them.
#include <pagestash/reference/reference.hpp>
#include <doctest/doctest.h>

#include "../common/grid_emulator.hpp"
#include "../common/host_tensor.hpp"
#include "../common/layout_list.hpp"
#include "../common/stash_sequence.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

// The library allocates host memory with the aligned operator new (pool/allocation.hpp):
// this binary's replacement counts those calls, so that a test can tell it made none.
static std::atomic<long long> aligned_allocations{0};
// GCC, inlining the library's free_host into a test, pairs this operator delete's std::free
// with the operator new it replaces, not with the std::aligned_alloc inside it.
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t bytes, std::align_val_t align) {
  aligned_allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a + (bytes == 0 ? a : 0))) return p;
  throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace pagestash_test;
using L = layouts::RuBf16Cap;
using Tr = ps::StashTraits<L>;

/// Random bytes into every buffer of t.
void fill(HostTensor<L>& t, std::mt19937& rng) {
  for (BufferRole role : all_roles) {
    const std::vector<std::uint8_t> b = random_bytes(static_cast<std::size_t>(t.view.buffer_bytes(role)), rng);
    std::copy(b.begin(), b.end(), t.bytes(role));
  }
}

/// What each operation did to the flags: through the host executor, or the grid emulator.
struct Ops {
  bool emulated;
  void stash(ps::PagePool& pool, const ps::GroupedView<L>& v, ps::StashRecord<Tr>& rec) const {
    if (emulated) Emulator{}.stash(pool, v, rec);
    else ps::stash(ps::host, pool, v, rec);
  }
  void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<L>& v) const {
    if (emulated) Emulator{}.reload(pool, rec, v, false);
    else ps::reload(ps::host, pool, rec, v);
  }
  ps::PoolStats report(const ps::PagePool& pool) const {
    ps::PoolStats r;
    std::memset(static_cast<void*>(&r), 0xA5, sizeof(r));  // poisoned: every field must be written
    if (emulated) Emulator{}.report(pool, &r);
    else ps::report(ps::host, pool, &r);
    return r;
  }
  void reset(ps::PagePool& pool) const {
    if (emulated) Emulator{}.reset(pool);
    else ps::reset(ps::host, pool);
  }
  void end_step(ps::PagePool& pool) const {
    if (emulated) Emulator{}.end_step(pool);
    else ps::end_step(ps::host, pool);
  }

  // The same past the host checks, on the handles: what runs where the host cannot compare
  // a pool's and a record's ids (attached device objects).
  void unchecked_stash(const ps::PoolRef& pool, const ps::GroupedView<L>& v, const ps::RecordRef& rec) const {
    if (emulated) Emulator{}.launch<Tr, ps::Operation::stash>(pool, v, rec, {});
    else ps::stash_on_host<Tr>(ps::host, pool, v, rec);
  }
  // Poison off: the tests of these check that a refused step writes nothing (the executor
  // suite checks that a refused reload poisons its destination).
  void unchecked_reload(const ps::PoolRef& pool, const ps::RecordRef& rec, const ps::GroupedView<L>& dest) const {
    const ps::ReloadOptions no_poison{true, false};
    if (emulated) Emulator{}.launch<Tr, ps::Operation::reload>(pool, dest, rec, no_poison);
    else ps::reload_on_host<Tr>(ps::host, pool, rec, dest, no_poison);
  }
  void unchecked_discard(const ps::PoolRef& pool, const ps::GroupedView<L>& shape, const ps::RecordRef& rec) const {
    if (emulated) Emulator{}.launch<Tr, ps::Operation::discard>(pool, shape, rec, {});
    else ps::discard_pages(ps::SerialTeam{}, pool, rec, ps::record_kind<Tr>(shape));
  }
};

/// The report against stats(), which reads the same counters another way.
void check_report_matches(const ps::PoolStats& r, const ps::PagePool& pool) {
  const ps::PoolStats s = pool.stats();
  CHECK(std::memcmp(&r.flags, &s.flags, sizeof(ps::PoolFlags)) == 0);
  std::vector<std::pair<std::string, std::int64_t>> reported, read;
  ps::for_each_counter(r, [&](const char* name, std::int64_t v) { reported.emplace_back(name, v); });
  ps::for_each_counter(s, [&](const char* name, std::int64_t v) { read.emplace_back(name, v); });
  CHECK(reported == read);
  CHECK(reported.size() == 14);
  // One snapshot type: the report carries the pool's config as stats() does.
  CHECK(r.config.page_bytes == s.config.page_bytes);
  CHECK(r.config.device_pages == s.config.device_pages);
  CHECK(r.config.host_pages == s.config.host_pages);
  CHECK(r.config.reserved_device_pages() == s.config.reserved_device_pages());
  CHECK(r.config.reserved_host_pages() == s.config.reserved_host_pages());
  CHECK(r.failures() == s.failures());
}

TEST_CASE("end_step: a step whose records all came back is balanced, one left stashed raises unbalanced") {
  for (bool emulated : {false, true}) {
    CAPTURE(emulated);
    const Ops ops{emulated};
    const auto shape = sequence_shape<L>(false);
    std::mt19937 rng(23);
    ps::PagePool probe(ps::PoolConfig{4096, 1, 0}, ps::MemorySpace::host);
    const std::int64_t most = ps::make_record<Tr>(probe, shape).max_pages();
    ps::PagePool pool(ps::PoolConfig{4096, 2 * most, 0}, ps::MemorySpace::host);
    auto a = ps::make_record<Tr>(pool, shape);
    auto b = ps::make_record<Tr>(pool, shape);
    HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, random_counts(shape, rng));
    HostTensor<L> dst(shape.max_tokens, shape.hidden, shape.groups, src.counts);
    fill(src, rng);
    src.counts[0] = static_cast<std::int32_t>(shape.max_tokens);  // at least one page

    // A clean step: one record reloaded, the other discarded.
    ops.stash(pool, src.view, a);
    ops.stash(pool, src.view, b);
    ops.reload(pool, a, dst.view);
    ps::discard(ps::host, pool, b);
    ops.end_step(pool);
    ps::PoolStats r = ops.report(pool);
    CHECK(r.pages_held_at_step_end == 0);
    CHECK(r.flags.unbalanced == 0);
    CHECK(r.flags.error == 0);
    check_report_matches(r, pool);

    // A leaked step: b is stashed and forgotten.
    ops.stash(pool, src.view, a);
    ops.stash(pool, src.view, b);
    ops.reload(pool, a, dst.view);
    ops.end_step(pool);
    r = ops.report(pool);
    const ps::RecordStatus held = b.status();
    REQUIRE(held.state == ps::RecordState::stashed);
    CHECK(held.pages > 0);
    CHECK(r.pages_held_at_step_end == held.pages);
    CHECK(r.flags.unbalanced == 1);
    CHECK(r.flags.error == 1);
    CHECK(r.errors == 1);
    CHECK(ps::decide(r.flags) == ps::StepDecision::report_error);
    check_report_matches(r, pool);
    ps::discard(ps::host, pool, b);  // found and returned: the next check balances, the flag stays
    ops.end_step(pool);
    CHECK(ops.report(pool).pages_held_at_step_end == 0);
    CHECK(pool.stats().flags.unbalanced == 1);
    ops.reset(pool);
    CHECK(pool.stats().flags.unbalanced == 0);
  }
}

TEST_CASE("the flag table: each flag's category decides the step, and Flag::none has no word") {
  // The documented categories (docs/api.md), written out here as the oracle.
  const std::set<std::string> capacity{"overflow"}, info{"host_spill"};
  int misuse = 0;
  for (int k = 0; k < ps::flag_count; ++k) {
    const ps::Flag kind = ps::flag_at(k);
    const std::string name = ps::name_of(kind);
    INFO(name);
    CHECK(ps::word_of(kind) == k);
    const ps::FlagCategory c = capacity.count(name) ? ps::FlagCategory::capacity
                               : info.count(name)   ? ps::FlagCategory::info
                                                    : ps::FlagCategory::misuse;
    CHECK(ps::category_of(kind) == c);
    misuse += c == ps::FlagCategory::misuse;
    ps::PoolFlags f{};
    f[kind] = 1;
    CHECK(&f[kind] == reinterpret_cast<std::int32_t*>(&f) + k);  // the word at its index
    CHECK(ps::decide(f) == (c == ps::FlagCategory::capacity ? ps::StepDecision::rerun_without_paging
                            : c == ps::FlagCategory::misuse ? ps::StepDecision::report_error
                                                            : ps::StepDecision::keep));
    f.overflow = 1;  // misuse outranks capacity
    CHECK(ps::decide(f) ==
          (c == ps::FlagCategory::misuse ? ps::StepDecision::report_error : ps::StepDecision::rerun_without_paging));
  }
  CHECK(misuse == ps::flag_count - 2);
  CHECK(ps::category_of(ps::Flag::none) == ps::FlagCategory::info);
  ps::PoolFlags f{};
  CHECK_THROWS_AS(f[ps::Flag::none], std::logic_error);
  CHECK(f.error == 0);
  CHECK(ps::decide(f) == ps::StepDecision::keep);
}

TEST_CASE("flags: each kind of misuse raises error and its own flag, running out of pages raises overflow only") {
  for (bool emulated : {false, true}) {
    CAPTURE(emulated);
    const Ops ops{emulated};
    const auto shape = sequence_shape<L>(false);
    std::mt19937 rng(5);
    std::vector<std::int32_t> full(static_cast<std::size_t>(shape.groups), static_cast<std::int32_t>(shape.max_tokens));
    HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, full),
        dst(shape.max_tokens, shape.hidden, shape.groups, full);
    fill(src, rng);
    ps::PoolConfig cfg;
    cfg.page_bytes = 1024;
    cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);  // one full stash
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    auto a = ps::make_record<Tr>(pool, shape), b = ps::make_record<Tr>(pool, shape);

    // Each case on a fresh pool (reset), then the flags it raised, and only those.
    auto only = [](ps::Flag kind) {
      ps::PoolFlags f{};
      f[kind] = 1;
      return f;
    };
    auto expect = [&](const char* what, int overflow, ps::PoolFlags kinds) {
      INFO(what);
      ps::PoolStats r = ops.report(pool);
      check_report_matches(r, pool);
      CHECK(r.flags.overflow == overflow);
      int any_kind = 0;
      for (int k = 0; k < ps::flag_count; ++k) {  // the kinds of misuse, as the table says
        const ps::Flag kind = ps::flag_at(k);
        if (ps::category_of(kind) != ps::FlagCategory::misuse || kind == ps::Flag::error) continue;
        INFO(ps::name_of(kind));
        CHECK(r.flags[kind] == kinds[kind]);
        any_kind |= kinds[kind];
      }
      CHECK(r.flags.error == any_kind);
      CHECK(r.overflows == overflow);
      CHECK(r.errors == r.flags.error);
      CHECK(ps::decide(r.flags) == (r.flags.error   ? ps::StepDecision::report_error
                                    : overflow != 0 ? ps::StepDecision::rerun_without_paging
                                                    : ps::StepDecision::keep));
    };

    ops.stash(pool, src.view, a);
    expect("a stash that fits", 0, {});
    ops.stash(pool, src.view, a);
    expect("a stash into a record that holds pages", 0, only(ps::Flag::still_stashed));
    ops.reset(pool);

    ops.stash(pool, src.view, a);
    ops.stash(pool, src.view, b);
    expect("a stash with no room left", 1, {});
    ops.reload(pool, b, dst.view);  // as a captured step does: no new flag, the first cause stays
    expect("the reload of the stash that overflowed", 1, {});
    CHECK(b.status().error == ps::Flag::overflow);
    ops.reset(pool);

    ops.stash(pool, src.view, a);
    ops.reload(pool, a, dst.view);
    ops.reload(pool, a, dst.view);
    expect("a second reload", 0, only(ps::Flag::not_stashed));
    ops.reset(pool);

    ops.stash(pool, src.view, a);
    ops.reset(pool);
    ops.reload(pool, a, dst.view);
    expect("a reload after a reset", 0, only(ps::Flag::stale));
    ops.reset(pool);

    src.counts[1] = static_cast<std::int32_t>(shape.max_tokens + 1);
    ops.stash(pool, src.view, b);
    expect("a count beyond max_tokens", 0, only(ps::Flag::bad_counts));
    src.counts[1] = static_cast<std::int32_t>(shape.max_tokens);
    ops.reset(pool);
    expect("after a reset", 0, {});
    CHECK(ops.report(pool).generation == 6);
  }
}

constexpr std::size_t flag_words = sizeof(ps::PoolFlags) / sizeof(std::int32_t);

/// Ranks as host threads: an all-reduce (max, word by word) of their pools' flags, in place.
class HostRanks {
 public:
  explicit HostRanks(int ranks) : ranks_(ranks) {}
  void agree(ps::PagePool& pool) {
    ps::PoolFlags& mine = *pool.flags();  // a host pool: host memory
    std::unique_lock<std::mutex> lock(m_);
    const int generation = generation_;
    auto* in = reinterpret_cast<const std::int32_t*>(&mine);
    auto* acc = reinterpret_cast<std::int32_t*>(&sum_);
    for (std::size_t k = 0; k < flag_words; ++k) acc[k] = std::max(acc[k], in[k]);
    if (++arrived_ == ranks_) {
      result_ = sum_;
      sum_ = ps::PoolFlags{};
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation_ != generation; });
    }
    mine = result_;
  }

 private:
  int ranks_;
  std::mutex m_;
  std::condition_variable done_;
  int arrived_ = 0, generation_ = 0;
  ps::PoolFlags sum_{}, result_{};
};

TEST_CASE("flags across ranks: 4 host ranks, one overflows at step 3, every rank reruns it and all end bit-exact") {
  constexpr int ranks = 4, steps = 6, layers = 2, overflow_rank = 2, overflow_step = 3;
  const auto shape = sequence_shape<L>(false);
  const std::int32_t half = static_cast<std::int32_t>(shape.max_tokens / 2);

  // Each rank's pool holds its two layers' activations at half capacity; the overflowing
  // rank's step 3 routes every token to full capacity.
  auto counts_for = [&](int rank, int step) {
    std::vector<std::int32_t> c(static_cast<std::size_t>(shape.groups), half);
    if (rank == overflow_rank && step == overflow_step)
      std::fill(c.begin(), c.end(), static_cast<std::int32_t>(shape.max_tokens));
    return c;
  };
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  {
    const std::vector<std::int32_t> c(static_cast<std::size_t>(shape.groups), half);
    cfg.device_pages = layers * expected_pages<Tr>(shape, c, cfg.page_bytes);
  }

  HostRanks world(ranks);
  std::vector<std::vector<ps::StepDecision>> decisions(ranks);
  std::vector<std::vector<ps::PoolFlags>> agreed(ranks);
  std::vector<int> mismatches(ranks, 0), reloaded(ranks, 0);
  auto rank_main = [&](int rank) {
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    std::vector<ps::StashRecord<Tr>> records;
    for (int l = 0; l < layers; ++l) records.push_back(ps::make_record<Tr>(pool, shape));
    for (int step = 0; step < steps; ++step) {
      for (bool paging : {true, false}) {
        // Forward: each layer's activation, from a seed of (rank, step, layer), then its stash.
        std::vector<HostTensor<L>> acts;
        for (int l = 0; l < layers; ++l) {
          if (acts.empty()) acts.reserve(layers);
          acts.emplace_back(shape.max_tokens, shape.hidden, shape.groups, counts_for(rank, step));
          std::mt19937 rng(static_cast<std::uint32_t>(1000 * rank + 10 * step + l));
          fill(acts.back(), rng);
          if (paging) ps::stash(ps::host, pool, acts.back().view, records[static_cast<std::size_t>(l)]);
        }
        if (paging) {
          world.agree(pool);
          const ps::StepDecision d = ps::decide(*pool.flags());
          decisions[static_cast<std::size_t>(rank)].push_back(d);
          agreed[static_cast<std::size_t>(rank)].push_back(*pool.flags());
          if (d != ps::StepDecision::keep) {  // every rank: drop the step's records, rerun it without paging
            ps::reset(ps::host, pool);
            continue;
          }
        }
        // Backward: reload each layer (last first) into a poisoned buffer and compare with
        // what forward made; without paging, the activation is used as it is.
        for (int l = layers - 1; l >= 0; --l) {
          if (!paging) continue;
          HostTensor<L> back(shape.max_tokens, shape.hidden, shape.groups, counts_for(rank, step));
          std::mt19937 poison(77);
          fill(back, poison);
          const std::vector<std::uint8_t> poisoned(back.bytes(BufferRole::data),
                                                   back.bytes(BufferRole::data) + back.data.size());
          ps::reload(ps::host, pool, records[static_cast<std::size_t>(l)], back.view);
          const HostTensor<L>& fwd = acts[static_cast<std::size_t>(l)];
          const std::vector<std::uint8_t> source(fwd.data.begin(), fwd.data.end());
          if (back.data != expected_reload<Tr>(shape, BufferRole::data, fwd.counts, source, poisoned, false))
            ++mismatches[static_cast<std::size_t>(rank)];
          ++reloaded[static_cast<std::size_t>(rank)];
        }
        break;  // the step is kept (paged), or rerun once without paging
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();

  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    REQUIRE(decisions[static_cast<std::size_t>(r)].size() == steps);
    for (int step = 0; step < steps; ++step) {
      CAPTURE(step);
      const ps::StepDecision d = decisions[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)];
      CHECK(d == (step == overflow_step ? ps::StepDecision::rerun_without_paging : ps::StepDecision::keep));
      CHECK(std::memcmp(&agreed[static_cast<std::size_t>(r)][static_cast<std::size_t>(step)],
                        &agreed[0][static_cast<std::size_t>(step)], sizeof(ps::PoolFlags)) == 0);
    }
    CHECK(mismatches[static_cast<std::size_t>(r)] == 0);
    CHECK(reloaded[static_cast<std::size_t>(r)] == (steps - 1) * layers);  // every step paged but the rerun one
  }
  CHECK(agreed[0][overflow_step].overflow == 1);
  CHECK(agreed[0][overflow_step].error == 0);
}

}  // namespace

namespace {

/// Caller-owned memory, as a framework's allocator hands it out: 256-byte aligned blocks,
/// counted.
struct CountingResource {
  std::vector<std::unique_ptr<unsigned char[]>> blocks;
  std::size_t bytes = 0;
  void* allocate(std::size_t n) {
    blocks.emplace_back(new unsigned char[n + 256]);
    bytes += n;
    auto* p = blocks.back().get();
    return p + (256 - reinterpret_cast<std::uintptr_t>(p) % 256) % 256;
  }
};

TEST_CASE("external memory: a pool and records in caller-owned memory allocate nothing else, and work") {
  const auto shape = sequence_shape<L>(true);
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  cfg.device_pages = 2 * ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.host_pages = 3;
  const ps::PoolMemorySizes sizes = ps::PagePool::bytes_needed(cfg);
  CHECK(sizes.device_arena == static_cast<std::size_t>(cfg.device_pages * cfg.page_bytes));
  CHECK(sizes.host_arena == static_cast<std::size_t>(cfg.host_pages * cfg.page_bytes));

  CountingResource resource;
  ps::PoolMemory memory;
  memory.control = resource.allocate(sizes.control);
  memory.device_arena = resource.allocate(sizes.device_arena);
  memory.host_arena = resource.allocate(sizes.host_arena);
  const long long before = aligned_allocations.load();
  ps::PagePool pool(cfg, ps::MemorySpace::host, memory);
  CHECK(pool.ref().device_arena == memory.device_arena);
  const std::size_t record_bytes = ps::StashRecord<Tr>::bytes_needed(pool, shape);
  ps::StashRecord<Tr> rec(pool, shape, resource.allocate(record_bytes));
  CHECK(rec.bytes() == record_bytes);

  std::mt19937 rng(17);
  HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, random_counts(shape, rng));
  HostTensor<L> dst(shape.max_tokens, shape.hidden, shape.groups, src.counts);
  fill(src, rng);
  fill(dst, rng);
  const std::vector<std::uint8_t> poisoned = dst.data, source = src.data;
  ps::stash(ps::host, pool, src.view, rec);
  CHECK(rec.status().state == ps::RecordState::stashed);
  ps::reload(ps::host, pool, rec, dst.view);
  CHECK(dst.data == expected_reload<Tr>(shape, BufferRole::data, src.counts, source, poisoned, false));
  ps::PoolStats r{};
  ps::report(ps::host, pool, &r);
  CHECK(r.stashes == 1);
  CHECK(r.reloads == 1);
  CHECK(aligned_allocations.load() == before);  // nothing but the caller's memory
  CHECK(resource.bytes == sizes.control + sizes.device_arena + sizes.host_arena + record_bytes);

  // Misaligned or missing parts are refused, naming the part.
  ps::PoolMemory bad = memory;
  bad.device_arena = static_cast<unsigned char*>(memory.device_arena) + 8;
  CHECK_THROWS_WITH_AS(ps::PagePool(cfg, ps::MemorySpace::host, bad), doctest::Contains("device_arena is not aligned"),
                       std::invalid_argument);
  bad = memory;
  bad.host_arena = nullptr;
  CHECK_THROWS_WITH_AS(ps::PagePool(cfg, ps::MemorySpace::host, bad), doctest::Contains("host_arena is null"),
                       std::invalid_argument);
}

TEST_CASE("host memory of 2 MiB or more the library allocates starts on 2 MiB (huge pages where offered)") {
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  ps::PoolConfig cfg;
  cfg.page_bytes = 64 << 10;
  cfg.device_pages = 48;  // 3 MiB: not a whole number of 2 MiB pages
  ps::PagePool big(cfg, ps::MemorySpace::host);
  CHECK(address(big.ref().device_arena) % ps::huge_page_bytes == 0);
  cfg.page_bytes = 512;
  cfg.device_pages = 4;
  ps::PagePool small(cfg, ps::MemorySpace::host);
  CHECK(address(small.ref().device_arena) % ps::memory_alignment == 0);
  // Every byte is usable (the sanitizer build checks that it is freed as it was made).
  const std::size_t bytes = ps::huge_page_bytes + 4096 + 16;
  void* a = ps::allocate_host(bytes);
  CHECK(address(a) % ps::huge_page_bytes == 0);
  std::memset(a, 0x5A, bytes);
  CHECK(static_cast<unsigned char*>(a)[bytes - 1] == 0x5A);
  ps::free_host(a, bytes);
}

/// A byte copy of `bytes` bytes at an address that is 16-byte but not 32-byte aligned (as a
/// framework's copy that keeps only the address modulo 16 or 32 may place it).
struct MovedCopy {
  std::vector<unsigned char> storage;
  unsigned char* at = nullptr;
  MovedCopy(const void* from, std::size_t bytes) : storage(bytes + 64) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    at = storage.data() + (32 - base % 32) % 32 + 16;
    std::memcpy(at, from, bytes);
  }
};

TEST_CASE("attach: a pool and a record over memory that holds them, or a byte copy of it, carry on where they were") {
  const auto shape = sequence_shape<L>(true);
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  cfg.device_pages = 2 * ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  const ps::PoolMemorySizes sizes = ps::PagePool::bytes_needed(cfg);
  CountingResource resource;
  ps::PoolMemory memory;
  memory.control = resource.allocate(sizes.control);
  memory.device_arena = resource.allocate(sizes.device_arena);
  ps::PagePool made(cfg, ps::MemorySpace::host, memory);
  const std::size_t record_bytes = ps::StashRecord<Tr>::bytes_needed(made, shape);
  void* record_memory = resource.allocate(record_bytes);
  {
    const ps::StashRecord<Tr> fresh(made, shape, record_memory);  // writes the empty header
  }

  std::mt19937 rng(23);
  HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, random_counts(shape, rng));
  fill(src, rng);
  const std::vector<std::uint8_t> source = src.data;
  {
    // Stash through objects attached for this call only, as a framework's op does.
    ps::PagePool pool = ps::PagePool::attach(cfg, ps::MemorySpace::host, memory);
    auto rec = ps::StashRecord<Tr>::attach(pool, shape, record_memory);
    ps::stash(ps::host, pool, src.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
  }
  const ps::PoolStats stashed = made.stats();
  REQUIRE(stashed.stashes == 1);

  // A byte copy of the whole state, 16-byte aligned only, reloads what the original holds.
  MovedCopy control(memory.control, sizes.control), arena(memory.device_arena, sizes.device_arena),
      record(record_memory, record_bytes);
  ps::PoolMemory copied{control.at, arena.at, nullptr};
  ps::PagePool pool = ps::PagePool::attach(cfg, ps::MemorySpace::host, copied);
  auto rec = ps::StashRecord<Tr>::attach(pool, shape, record.at);
  // The ids are values in the memory: the copy is the pool it was copied from.
  CHECK(pool.id() == made.id());
  CHECK(rec.pool_id() == made.id());
  CHECK(rec.status(pool).state == ps::RecordState::stashed);
  for (int twice = 0; twice < 2; ++twice) {  // the original, then the copy: the same bytes back
    HostTensor<L> dst(shape.max_tokens, shape.hidden, shape.groups, src.counts);
    fill(dst, rng);
    const std::vector<std::uint8_t> poisoned = dst.data;
    if (twice == 0) {
      ps::PagePool original = ps::PagePool::attach(cfg, ps::MemorySpace::host, memory);
      auto original_rec = ps::StashRecord<Tr>::attach(original, shape, record_memory);
      ps::reload(ps::host, original, original_rec, dst.view);
    } else {
      ps::reload(ps::host, pool, rec, dst.view);
    }
    CHECK(dst.data == expected_reload<Tr>(shape, BufferRole::data, src.counts, source, poisoned, false));
  }
  // Each state returned its pages once.
  for (const ps::PagePool* p : {&made, &pool}) {
    const ps::PoolStats s = p->stats();
    CHECK(s.reloads == 1);
    CHECK(s.device_pages_free == cfg.device_pages);
    CHECK(s.flags.error == 0);
  }
  // A record of another pool, attached over this pool's memory, is refused, as a made one is.
  ps::PagePool other(cfg, ps::MemorySpace::host);
  const auto theirs = ps::make_record<Tr>(other, shape);
  auto attached = ps::StashRecord<Tr>::attach(pool, shape, theirs.ref().header);
  CHECK(attached.pool_id() == other.id());
  CHECK_THROWS_WITH_AS(ps::stash(ps::host, pool, src.view, attached), doctest::Contains("another pool"),
                       std::invalid_argument);
}

/// The memory a pool lives in, to attach to.
ps::PoolMemory memory_of(const ps::PagePool& pool) {
  return {pool.ref().state, pool.ref().device_arena, pool.ref().host_arena};
}

TEST_CASE("pool ids: nonzero, different for every pool, in the pool's memory, kept by reset, read back by attach") {
  ps::PoolConfig cfg;
  cfg.page_bytes = 256;
  cfg.device_pages = 4;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 256; ++i) ids.push_back(ps::PagePool(cfg, ps::MemorySpace::host).id());
  CHECK(std::count(ids.begin(), ids.end(), std::uint64_t{0}) == 0);
  std::sort(ids.begin(), ids.end());
  CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
  // Random, not a count: the high bits vary too.
  CHECK(std::count_if(ids.begin(), ids.end(), [](std::uint64_t id) { return id >> 63; }) > 64);

  const auto shape = sequence_shape<L>(false);
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  for (bool emulated : {false, true}) {
    CAPTURE(emulated);
    const Ops ops{emulated};
    ps::PagePool pool(cfg, ps::MemorySpace::host);
    const std::uint64_t id = pool.id();
    CHECK(pool.ref().state->id == id);
    auto rec = ps::make_record<Tr>(pool, shape);
    CHECK(rec.pool_id() == id);
    CHECK(rec.ref().header->pool_id == id);
    CHECK(ps::StashRecord<Tr>::attach(pool, shape, rec.ref().header).pool_id() == id);
    ops.reset(pool);
    ops.reset(pool);
    CHECK(pool.ref().state->id == id);
    const ps::PagePool attached = ps::PagePool::attach(pool.config(), ps::MemorySpace::host, memory_of(pool));
    CHECK(attached.id() == id);
    // A record made through an attached pool carries its id too.
    CHECK(ps::make_record<Tr>(attached, shape).ref().header->pool_id == id);
    // The record made before the resets is still the pool's: it stashes (its state is empty).
    std::mt19937 rng(41);
    HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, random_counts(shape, rng));
    fill(src, rng);
    ops.stash(pool, src.view, rec);
    CHECK(rec.status(pool).state == ps::RecordState::stashed);
    CHECK(pool.stats().flags.error == 0);
  }
}

/// A record's memory, its error and launch words blanked: all that a step refusing it may
/// change (a launch leaves its id in the launch words; the record must be free after it).
std::vector<unsigned char> bytes_but_error(const ps::StashRecord<Tr>& rec) {
  const auto* at = reinterpret_cast<const unsigned char*>(rec.ref().header);
  std::vector<unsigned char> b(at, at + rec.bytes());
  for (const ps::RecordBytes r : {ps::record_error_bytes(), ps::record_launch_bytes()})
    std::fill_n(b.begin() + static_cast<std::ptrdiff_t>(r.offset), r.bytes, 0);
  return b;
}

/// What a step refusing a record may not change in a pool: counters, free list, pages.
struct PoolImage {
  ps::PoolStats stats;
  std::vector<std::int32_t> free;
  std::vector<unsigned char> pages;
  explicit PoolImage(const ps::PagePool& pool) : stats(pool.stats()), free(ps::free_pages(pool)) {
    const ps::PoolRef& r = pool.ref();
    pages.assign(r.device_arena, r.device_arena + r.reserved_device_pages * r.page_bytes);
    pages.insert(pages.end(), r.host_arena, r.host_arena + r.reserved_host_pages * r.page_bytes);
  }
};

/// `pool` as `before`, but for the error flags of `errors` foreign records, and those counted.
void check_refused_foreign(const PoolImage& before, const ps::PagePool& pool, std::int64_t errors) {
  const PoolImage now(pool);
  ps::PoolFlags expected = before.stats.flags;
  expected.error = expected.foreign_record = errors > 0 ? 1 : 0;
  CHECK(std::memcmp(&now.stats.flags, &expected, sizeof(expected)) == 0);
  CHECK(now.stats.errors == before.stats.errors + errors);
  CHECK(now.stats.overflows == before.stats.overflows);
  CHECK(now.stats.stashes == before.stats.stashes);
  CHECK(now.stats.reloads == before.stats.reloads);
  CHECK(now.stats.device_pages_free == before.stats.device_pages_free);
  CHECK(now.stats.host_pages_free == before.stats.host_pages_free);
  CHECK(now.stats.peak_pages_held == before.stats.peak_pages_held);
  CHECK(now.stats.live_bytes == before.stats.live_bytes);
  CHECK(now.stats.peak_live_bytes == before.stats.peak_live_bytes);
  CHECK(now.stats.generation == before.stats.generation);
  CHECK(now.free == before.free);
  CHECK(now.pages == before.pages);
}

TEST_CASE("foreign record: pool A's record over pool B's memory is refused by every step, both left as they were") {
  ps::GroupedView<L> shape;
  shape.max_tokens = 64;
  shape.hidden = 96;
  shape.groups = 4;
  CHECK(offsetof(ps::PoolFlags, foreign_record) == 32);
  CHECK(std::string(ps::flag_names[8]) == "foreign_record");
  CHECK(std::string(ps::flag_names[9]) == "record_mismatch");
  CHECK(std::string(ps::flag_names[10]) == "unbalanced");
  const std::int64_t full = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, 256);
  for (bool emulated : {false, true}) {
    for (bool smaller : {false, true}) {  // B smaller: A's page ids are beyond B's
      CAPTURE(emulated);
      CAPTURE(smaller);
      const Ops ops{emulated};
      ps::PoolConfig cfg_a;
      cfg_a.page_bytes = 256;
      cfg_a.device_pages = 2 * full;
      cfg_a.host_pages = full;
      ps::PoolConfig cfg_b = cfg_a;
      if (smaller) {
        cfg_b.device_pages = full / 4;
        cfg_b.host_pages = 2;
      }
      ps::PagePool pool_a(cfg_a, ps::MemorySpace::host), pool_b(cfg_b, ps::MemorySpace::host);
      std::mt19937 rng(smaller ? 61 : 67);
      std::vector<std::unique_ptr<ps::StashRecord<Tr>>> held_a, held_b;
      held_a.push_back(std::make_unique<ps::StashRecord<Tr>>(pool_a, shape));
      held_b.push_back(std::make_unique<ps::StashRecord<Tr>>(pool_b, shape));
      auto& a_held = *held_a[0];
      auto a_empty = ps::make_record<Tr>(pool_a, shape);

      // A holds a full stash; B a small one of its own (its free list is not the identity).
      const std::vector<std::int32_t> all(4, 64), few = {3, 0, 5, 2};
      HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, all),
          mine(shape.max_tokens, shape.hidden, shape.groups, few);
      fill(src, rng);
      fill(mine, rng);
      ops.stash(pool_a, src.view, a_held);
      ops.stash(pool_b, mine.view, *held_b[0]);
      REQUIRE(a_held.status().state == ps::RecordState::stashed);
      REQUIRE(held_b[0]->status().state == ps::RecordState::stashed);

      // The objects a framework makes per call: B from its memory, A's records over theirs.
      ps::PagePool b = ps::PagePool::attach(cfg_b, ps::MemorySpace::host, memory_of(pool_b));
      auto on_b = ps::StashRecord<Tr>::attach(b, shape, a_held.ref().header);
      // The host knows both ids here, and refuses before anything runs.
      CHECK_THROWS_WITH_AS(ops.stash(b, src.view, on_b), doctest::Contains("another pool"), std::invalid_argument);
      CHECK_THROWS_WITH_AS(ops.reload(b, on_b, src.view), doctest::Contains("another pool"), std::invalid_argument);
      CHECK_THROWS_WITH_AS(on_b.status(b), doctest::Contains("another pool"), std::invalid_argument);

      // Where it cannot (device objects), every step refuses in memory.
      const PoolImage b_before(pool_b), a_before(pool_a);
      HostTensor<L> dst(shape.max_tokens, shape.hidden, shape.groups, all);
      fill(dst, rng);
      const std::vector<std::uint8_t> poisoned = dst.data;
      std::int64_t refused = 0;
      auto refuse = [&](const char* what, ps::StashRecord<Tr>& rec, auto&& op) {
        INFO(what);
        rec.ref().header->summary.error = ps::Flag::none;
        const std::vector<unsigned char> rec_before = bytes_but_error(rec);
        op(b.ref(), rec.ref());
        ++refused;
        CHECK(rec.status().error == ps::Flag::foreign_record);
        CHECK(bytes_but_error(rec) == rec_before);
        CHECK_FALSE(rec.status().launch_in_flight);
        CHECK(dst.data == poisoned);
        check_refused_foreign(b_before, pool_b, refused);
        check_page_invariant<Tr>(pool_b, held_b, {0});
        check_refused_foreign(a_before, pool_a, 0);
      };
      const auto stash = [&](const ps::PoolRef& p, const ps::RecordRef& r) { ops.unchecked_stash(p, src.view, r); };
      const auto reload = [&](const ps::PoolRef& p, const ps::RecordRef& r) { ops.unchecked_reload(p, r, dst.view); };
      const auto discard = [&](const ps::PoolRef& p, const ps::RecordRef& r) { ops.unchecked_discard(p, shape, r); };
      refuse("stash into an empty record", a_empty, stash);
      refuse("stash into a record holding pages", a_held, stash);
      refuse("reload of a record holding pages", a_held, reload);
      refuse("reload of an empty record", a_empty, reload);
      refuse("discard of a record holding pages", a_held, discard);
      refuse("discard of an empty record", a_empty, discard);

      // Both pools carry on: A's record reloads what it stashed, B's its own.
      ops.reload(pool_a, a_held, dst.view);
      CHECK(dst.data == expected_reload<Tr>(shape, BufferRole::data, src.counts, src.data, poisoned, false));
      HostTensor<L> back(shape.max_tokens, shape.hidden, shape.groups, few);
      ops.reload(pool_b, *held_b[0], back.view);
      const std::vector<std::uint8_t> zeros(back.data.size(), 0);
      CHECK(back.data == expected_reload<Tr>(shape, BufferRole::data, few, mine.data, zeros, false));
      CHECK(pool_a.stats().device_pages_free == cfg_a.device_pages);
      CHECK(pool_b.stats().device_pages_free == cfg_b.device_pages);
      CHECK(pool_a.stats().flags.error == 0);
    }
  }
}

}  // namespace
