#pragma once
// The GPU tests' bodies, written once over a Backend, so that each also runs on the CPU in
// CI: tests/device/stash_device_test.cpp runs them through the CUDA executor, and
// tests/host/executor_suite_test.cpp through the host executor and the grid emulator
// (suite_backends.hpp). A body whose setup is wrong (a stash that fails where the checks
// after it assume one) fails on the CPU before any GPU runs it.
//
// A Backend is stash_sequence.hpp's (memory, stash / reload / discard / reset, each done
// when it returns; an upload has landed before the next operation reads it, on any stream),
// and also:
//   static void end_step(ps::PagePool&);
//   struct Streams {  // n streams: each runs its operations in order, the streams at once
//     explicit Streams(int n);
//     template <class Tr> void stash(int k, ps::PagePool&, const ps::GroupedView<L>&, ps::StashRecord<Tr>&);
//     template <class Tr> void reload(int k, ps::PagePool&, ps::StashRecord<Tr>&, const ps::GroupedView<L>&,
//                                     bool zero_tail);
//     void synchronize();  // every stream's operations are done
//   };
//   struct Graph {    // operations recorded (captured) from construction, not run
//     template <class Tr> void stash(...); template <class Tr> void reload(...);  // as Streams', no k
//     void instantiate();  // the recording ends
//     void launch();       // every recorded operation runs, in order, as new launches; then returns
//   };

#include "layout_list.hpp"
#include "page_bytes.hpp"
#include "stash_sequence.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

namespace pagestash_test::suite {

using namespace pagestash_test::layouts;

// ---- Random sequences -------------------------------------------------------------------

/// run_stash_sequence in every order, at the round and the odd shape.
template <class Traits, class Backend>
void sequences(std::uint32_t& seed, int ops) {
  for (bool odd : {false, true})
    for (Order order : {Order::lifo, Order::fifo, Order::random})
      CHECK(run_stash_sequence<Traits, Backend>(sequence_shape_of<Traits>(odd), order, ops, ++seed, odd ? 256 : 1024) ==
            ops);
}

/// Every layout's default traits with `layout_ops` operations a sequence, and the
/// non-default traits with `traits_ops`.
template <class Backend>
void every_layout_sequences(int layout_ops, int traits_ops) {
  std::uint32_t seed = 1000;
#define PAGESTASH_SUITE_SEQUENCES(L)                               \
  {                                                                \
    using Layout = PAGESTASH_LAYOUT(L);                            \
    CAPTURE(#L);                                                   \
    sequences<ps::StashTraits<Layout>, Backend>(seed, layout_ops); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SUITE_SEQUENCES)
#undef PAGESTASH_SUITE_SEQUENCES
#define PAGESTASH_SUITE_SEQUENCES_TRAITS(Tr) sequences<Tr, Backend>(seed, traits_ops);
  PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(PAGESTASH_SUITE_SEQUENCES_TRAITS)
#undef PAGESTASH_SUITE_SEQUENCES_TRAITS
}

// ---- Helpers ----------------------------------------------------------------------------

/// Every token live: each group's max_tokens, or the first group's of a packed tensor.
template <class L>
std::vector<std::int32_t> most_tokens(const ps::GroupedView<L>& shape) {
  std::vector<std::int32_t> most(static_cast<std::size_t>(shape.groups), 0);
  for (std::size_t g = 0; g < most.size(); ++g)
    most[g] = static_cast<std::int32_t>(L::placement::packed && g > 0 ? 0 : shape.max_tokens);
  return most;
}

/// Sets the counts and random bytes in every buffer of t (kept in *kept if given).
template <class L, class Backend>
void fill(Tensor<L, Backend>& t, const std::vector<std::int32_t>& counts, std::mt19937& rng,
          std::array<std::vector<std::uint8_t>, 3>* kept = nullptr) {
  t.set_counts(counts);
  for (BufferRole role : all_roles) {
    auto b = random_bytes(static_cast<std::size_t>(t.view.buffer_bytes(role)), rng);
    t.set(role, b);
    if (kept != nullptr) (*kept)[static_cast<std::size_t>(role)] = std::move(b);
  }
}

/// Random bytes in every buffer of t, kept in *kept: a destination to reload into.
template <class L, class Backend>
void poison(Tensor<L, Backend>& t, std::mt19937& rng, std::array<std::vector<std::uint8_t>, 3>& kept) {
  for (BufferRole role : all_roles) {
    kept[static_cast<std::size_t>(role)] = random_bytes(static_cast<std::size_t>(t.view.buffer_bytes(role)), rng);
    t.set(role, kept[static_cast<std::size_t>(role)]);
  }
}

/// Pages of 1 KiB for two of the largest stashes of `shape`.
template <class Tr>
ps::PoolConfig room_for_two(const ps::GroupedView<typename Tr::layout>& shape) {
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 2 * ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  return cfg;
}

/// Whether the free pages of `pool` are every id once.
inline bool free_pages_are_all_ids(const ps::PagePool& pool) {
  std::vector<std::int32_t> ids = ps::free_pages(pool);
  std::sort(ids.begin(), ids.end());
  bool permutation = true;
  for (std::size_t i = 0; i < ids.size(); ++i) permutation = permutation && ids[i] == static_cast<std::int32_t>(i);
  return permutation;
}

// ---- The same pages and bytes as the host executor --------------------------------------

/// The same stash through the host executor and the backend: same page ids (device and
/// spilled host pages), same stream bytes in the pages (the rest of the last page is never
/// written and holds what each allocation held: see page_bytes.hpp), same reloaded bytes.
template <class L, class Backend>
void same_as_host(std::uint32_t seed, int rounds) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(seed % 2 == 1);
  const ps::PoolConfig cfg = spilling_config<Tr>(shape);  // a large stash spills
  ps::PagePool host_pool(cfg, ps::MemorySpace::host), pool(cfg, Backend::space);
  Tensor<L, Backend> src(shape), dest(shape);
  Tensor<L, HostBackend<1>> h_src(shape), h_dest(shape);
  auto h_rec = ps::make_record<Tr>(host_pool, shape);
  auto rec = ps::make_record<Tr>(pool, shape);
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    const auto counts = random_counts(shape, rng);
    std::array<std::vector<std::uint8_t>, 3> bytes, poisoned;
    fill(h_src, counts, rng, &bytes);
    src.set_counts(counts);
    for (BufferRole role : all_roles) src.set(role, bytes[static_cast<std::size_t>(role)]);
    ps::stash(ps::host, host_pool, h_src.view, h_rec);
    REQUIRE(h_rec.status().state == ps::RecordState::stashed);
    Backend::stash(pool, src.view, rec);
    const ps::RecordStatus hs = h_rec.status(), s = rec.status();
    REQUIRE(s.state == ps::RecordState::stashed);
    CHECK(s.pages == hs.pages);
    CHECK(s.device_pages == hs.device_pages);
    CHECK(s.stream_bytes == hs.stream_bytes);
    CHECK(rec.page_ids() == h_rec.page_ids());
    CHECK(stream_bytes_of(pool, rec) == stream_bytes_of(host_pool, h_rec));
    poison(h_dest, rng, poisoned);
    for (BufferRole role : all_roles) dest.set(role, poisoned[static_cast<std::size_t>(role)]);
    ps::reload(ps::host, host_pool, h_rec, h_dest.view, ps::ReloadOptions{round % 2 == 0});
    Backend::reload(pool, rec, dest.view, round % 2 == 0);
    for (BufferRole role : all_roles) CHECK(dest.bytes(role) == h_dest.bytes(role));
    CHECK(ps::free_pages(pool) == ps::free_pages(host_pool));
  }
}

template <class Backend>
void every_layout_same_as_host(int rounds) {
  std::uint32_t seed = 40;
#define PAGESTASH_SUITE_SAME_AS_HOST(L)            \
  {                                                \
    using Layout = PAGESTASH_LAYOUT(L);            \
    CAPTURE(#L);                                   \
    same_as_host<Layout, Backend>(++seed, rounds); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SUITE_SAME_AS_HOST)
#undef PAGESTASH_SUITE_SAME_AS_HOST
}

// ---- A graph replayed with new counts ---------------------------------------------------

/// Stash three tensors and reload them out of order (one with zero_tail), all recorded in
/// one graph; replay it with new counts and data in the same buffers each time. Returns the
/// replays whose every byte was right.
template <class L, class Backend>
int graph_replays(int replays, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 3 * ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, Backend::space);
  std::vector<std::unique_ptr<Tensor<L, Backend>>> src, dest;
  std::vector<std::unique_ptr<ps::StashRecord<Tr>>> recs;
  for (int i = 0; i < 3; ++i) {
    src.push_back(std::make_unique<Tensor<L, Backend>>(shape));
    dest.push_back(std::make_unique<Tensor<L, Backend>>(shape));
    recs.push_back(std::make_unique<ps::StashRecord<Tr>>(pool, shape));
  }
  typename Backend::Graph graph;
  for (int i = 0; i < 3; ++i) graph.stash(pool, src[i]->view, *recs[i]);
  const int order[3] = {2, 0, 1};
  for (int i : order) graph.reload(pool, *recs[i], dest[i]->view, i == 1);
  graph.instantiate();
  for (const auto& r : recs) CHECK(r->status().state == ps::RecordState::empty);  // recorded, not run

  int checked = 0;
  for (int replay = 0; replay < replays; ++replay) {
    CAPTURE(replay);
    std::array<std::vector<std::int32_t>, 3> counts;
    std::array<std::array<std::vector<std::uint8_t>, 3>, 3> bytes, poisoned;
    for (int i = 0; i < 3; ++i) {
      counts[i] = random_counts(shape, rng);
      fill(*src[i], counts[i], rng, &bytes[i]);
      poison(*dest[i], rng, poisoned[i]);
    }
    graph.launch();
    bool all_equal = true;
    for (int i = 0; i < 3; ++i) {
      CHECK(recs[i]->status().state == ps::RecordState::reloaded);
      for (BufferRole role : all_roles) {
        const auto r = static_cast<std::size_t>(role);
        all_equal = all_equal && dest[i]->bytes(role) ==
                                     expected_reload<Tr>(shape, role, counts[i], bytes[i][r], poisoned[i][r], i == 1);
      }
    }
    CHECK(all_equal);
    const ps::PoolStats st = pool.stats();
    CHECK(!st.flags.overflow);
    CHECK(!st.flags.error);
    CHECK(st.device_pages_free == cfg.device_pages);
    checked += all_equal;
  }
  return checked;
}

/// A graph of a stash and a reload captured on a pool a quarter of a full tensor's pages,
/// with a reserve for twice them: a replay at full counts overflows; after grow() the same
/// graph, not captured again, holds them, bit for bit, replay after replay; after a balanced
/// step shrink() gives the memory back and the graph overflows at full counts again.
/// Returns the replays after the grow whose every byte was right.
template <class L, class Backend>
int graph_after_grow(int replays, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  const std::int64_t full = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.device_pages = std::max<std::int64_t>(1, full / 4);
  cfg.device_reserve = 2 * full;
  ps::PagePool pool(cfg, Backend::space);
  Tensor<L, Backend> src(shape), dest(shape);
  ps::StashRecord<Tr> rec(pool, shape);
  typename Backend::Graph graph;
  graph.stash(pool, src.view, rec);
  graph.reload(pool, rec, dest.view, true);
  graph.instantiate();
  const std::vector<std::int32_t> most = most_tokens(shape);
  std::array<std::vector<std::uint8_t>, 3> bytes, poisoned;
  const auto replay = [&](const std::vector<std::int32_t>& counts) {
    fill(src, counts, rng, &bytes);
    poison(dest, rng, poisoned);
    graph.launch();
    bool equal = rec.status().state == ps::RecordState::reloaded;
    for (BufferRole role : all_roles) {
      const auto r = static_cast<std::size_t>(role);
      equal = equal && dest.bytes(role) == expected_reload<Tr>(shape, role, counts, bytes[r], poisoned[r], true);
    }
    return equal;
  };
  CHECK_FALSE(replay(most));  // too many pages for the small pool
  CHECK(pool.stats().flags.overflow);
  Backend::reset(pool);
  Backend::grow(pool, 2 * full, 0);
  int checked = 0;
  for (int k = 0; k < replays; ++k) {
    const bool equal = replay(k % 2 == 0 ? most : random_counts(shape, rng));
    CHECK(equal);
    Backend::end_step(pool);
    const ps::PoolStats st = pool.stats();
    CHECK(!st.flags.overflow);
    CHECK(!st.flags.error);
    CHECK(st.device_pages == 2 * full);
    CHECK(st.device_pages_free == 2 * full);
    checked += equal;
  }
  Backend::shrink(pool, cfg.device_pages, 0);
  CHECK(pool.stats().device_pages == cfg.device_pages);
  CHECK_FALSE(replay(most));
  CHECK(pool.stats().flags.overflow);
  return checked;
}

/// Stashes the whole tensor (every group's most tokens) and reloads it through `into`; whether every byte came back
/// (and in *spilled, whether the stash took host pages).
template <class L, class Backend, class Tr>
bool full_round_trip(ps::PagePool& from, ps::PagePool& into, Tensor<L, Backend>& src, Tensor<L, Backend>& dest,
                     ps::StashRecord<Tr>& rec, std::mt19937& rng, bool* spilled = nullptr) {
  const auto& shape = src.view;
  const std::vector<std::int32_t> most = most_tokens(shape);
  std::array<std::vector<std::uint8_t>, 3> bytes, poisoned;
  fill(src, most, rng, &bytes);
  poison(dest, rng, poisoned);
  Backend::stash(from, src.view, rec);
  const ps::RecordStatus stashed = rec.status();
  if (spilled != nullptr) *spilled = stashed.host_pages > 0;
  if (stashed.state != ps::RecordState::stashed) return false;
  Backend::reload(into, rec, dest.view, true);
  bool equal = rec.status().state == ps::RecordState::reloaded;
  for (BufferRole role : all_roles) {
    const auto r = static_cast<std::size_t>(role);
    equal = equal && dest.bytes(role) == expected_reload<Tr>(shape, role, most, bytes[r], poisoned[r], true);
  }
  return equal;
}

/// A pool attached over a growable pool's memory (a framework's per-call object, the reserve as its pages) neither
/// grows nor shrinks it: both refused before anything runs, the owner's pages, free ids and config as they were, and a
/// whole tensor still overflows the owner (no id past its pages was handed out). The owner's grow then shows through
/// the attached pool at once, and a stash through either reloads through the other. Returns the round trips that came
/// back whole (2).
template <class L, class Backend>
int attached_pool_is_not_resized(std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  const std::int64_t full = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.device_pages = std::max<std::int64_t>(1, full / 4);
  cfg.device_reserve = 2 * full;
  ps::PagePool owner(cfg, Backend::space);
  ps::PoolConfig whole = cfg;
  whole.device_pages = cfg.device_reserve;
  whole.device_reserve = 0;
  ps::PagePool attached = ps::PagePool::attach(whole, Backend::space, owner.memory());
  CHECK_THROWS_AS(Backend::grow(attached, whole.device_pages, 0), std::invalid_argument);
  CHECK_THROWS_AS(Backend::shrink(attached, 0, 0), std::invalid_argument);
  const ps::PoolStats after = owner.stats();
  CHECK(after.device_pages == cfg.device_pages);
  CHECK(after.device_pages_free == cfg.device_pages);
  CHECK(owner.config().device_pages == cfg.device_pages);
  Tensor<L, Backend> src(shape), dest(shape);
  ps::StashRecord<Tr> rec(owner, shape);
  CHECK_FALSE(full_round_trip(owner, owner, src, dest, rec, rng));
  CHECK(owner.stats().flags.overflow);
  Backend::reset(owner);
  Backend::grow(owner, 2 * full, 0);
  CHECK(attached.stats().device_pages == 2 * full);
  int whole_trips = 0;
  whole_trips += full_round_trip(attached, owner, src, dest, rec, rng);
  whole_trips += full_round_trip(owner, attached, src, dest, rec, rng);
  Backend::end_step(owner);
  CHECK(owner.stats().device_pages_free == 2 * full);
  return whole_trips;
}

/// A pool whose spill grows (host_reserve): a page of each memory at first, so a whole tensor overflows; grown to a
/// spill that holds it, it spills and comes back whole; shrunk to no spill it overflows again; grown once more (the
/// memory given back and taken again) it comes back whole. Returns the round trips that came back whole (2).
template <class L, class Backend>
int spill_grows_and_shrinks(std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  const std::int64_t full = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.device_pages = 1;
  cfg.host_pages = 1;
  cfg.host_reserve = 2 * full;
  ps::PagePool pool(cfg, Backend::space);
  Tensor<L, Backend> src(shape), dest(shape);
  ps::StashRecord<Tr> rec(pool, shape);
  CHECK_FALSE(full_round_trip(pool, pool, src, dest, rec, rng));
  Backend::reset(pool);
  int whole_trips = 0;
  for (int round = 0; round < 2; ++round) {
    Backend::grow(pool, 1, 2 * full);
    bool spilled = false;
    const bool whole = full_round_trip(pool, pool, src, dest, rec, rng, &spilled);
    CHECK(whole);
    CHECK(spilled);
    whole_trips += whole;
    Backend::end_step(pool);
    const ps::PoolStats st = pool.stats();
    CHECK_FALSE(st.flags.overflow);
    CHECK_FALSE(st.flags.error);
    CHECK(st.host_pages == 2 * full);
    CHECK(st.host_pages_free == 2 * full);
    Backend::shrink(pool, 1, 0);
    CHECK(pool.stats().host_pages == 0);
    // A device pool keeps its spill's first chunk registered: where a pool attached over its memory finds the alias.
    CHECK(pool.memory_use().host_backed == (Backend::space == ps::MemorySpace::device ? std::size_t{2} << 20 : 0));
    CHECK_FALSE(full_round_trip(pool, pool, src, dest, rec, rng));
    Backend::reset(pool);
  }
  return whole_trips;
}

// ---- Concurrent streams -----------------------------------------------------------------

/// Streams run interleaved stashes and reloads of their own records, all at once, against
/// one pool; then every destination is checked and every page is back.
template <class L, class Backend>
void concurrent_streams(int streams, int rounds, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  constexpr int per_stream = 4;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  cfg.device_pages = streams * 3 * ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.host_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, Backend::space);
  const int n = streams * per_stream;
  std::vector<std::unique_ptr<Tensor<L, Backend>>> src, dest;
  std::vector<std::unique_ptr<ps::StashRecord<Tr>>> recs;
  for (int i = 0; i < n; ++i) {
    src.push_back(std::make_unique<Tensor<L, Backend>>(shape));
    dest.push_back(std::make_unique<Tensor<L, Backend>>(shape));
    recs.push_back(std::make_unique<ps::StashRecord<Tr>>(pool, shape));
  }
  typename Backend::Streams s(streams);

  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    std::vector<std::vector<std::int32_t>> counts(static_cast<std::size_t>(n));
    std::vector<std::array<std::vector<std::uint8_t>, 3>> bytes(static_cast<std::size_t>(n)),
        poisoned(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      counts[i] = random_counts(shape, rng);
      fill(*src[i], counts[i], rng, &bytes[i]);
      poison(*dest[i], rng, poisoned[i]);
    }
    // Per stream: stash 0, stash 1, reload 0, stash 2, reload 2, stash 3, reload 1, reload 3;
    // the streams' steps are enqueued round-robin so that they overlap.
    const int steps[8][2] = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 2}, {0, 3}, {1, 1}, {1, 3}};
    for (const auto& step : steps) {
      for (int k = 0; k < streams; ++k) {
        const int i = k * per_stream + step[1];
        if (step[0] == 0) s.stash(k, pool, src[i]->view, *recs[i]);
        else s.reload(k, pool, *recs[i], dest[i]->view, (i + round) % 2 == 0);
      }
    }
    s.synchronize();
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      wrong += recs[i]->status().state != ps::RecordState::reloaded;
      for (BufferRole role : all_roles) {
        const auto r = static_cast<std::size_t>(role);
        wrong += dest[i]->bytes(role) !=
                 expected_reload<Tr>(shape, role, counts[i], bytes[i][r], poisoned[i][r], (i + round) % 2 == 0);
      }
    }
    CHECK(wrong == 0);
    const ps::PoolStats st = pool.stats();
    CHECK(!st.flags.overflow);
    CHECK(!st.flags.error);
    CHECK(st.device_pages_free == cfg.device_pages);
    CHECK(st.host_pages_free == cfg.host_pages);
    CHECK(free_pages_are_all_ids(pool));
  }
}

/// One stream, no synchronisation: each stash reads the tensor that the reload just before it wrote, and each reload
/// writes a tensor that only the stash after it reads (the live bytes hop from tensor to tensor through two records;
/// every tensor starts with bytes of its own). A kernel that read before the one before it ended (a programmatic
/// launch without its wait: execution/cuda.cuh) would stash a tensor's first bytes: every tensor is checked.
template <class L, class Backend>
void chained_hops(int hops, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PagePool pool(room_for_two<Tr>(shape), Backend::space);
  const auto counts = most_tokens(shape);
  std::vector<std::unique_ptr<Tensor<L, Backend>>> t;
  std::vector<std::array<std::vector<std::uint8_t>, 3>> expected(static_cast<std::size_t>(hops) + 1);
  for (std::size_t k = 0; k <= static_cast<std::size_t>(hops); ++k) {
    t.push_back(std::make_unique<Tensor<L, Backend>>(shape));
    if (k == 0) {
      fill(*t[0], counts, rng, &expected[0]);
      continue;
    }
    std::array<std::vector<std::uint8_t>, 3> first;
    t[k]->set_counts(counts);
    poison(*t[k], rng, first);
    for (BufferRole role : all_roles) {
      const auto r = static_cast<std::size_t>(role);
      expected[k][r] = ps::handling_of<Tr>(role) == ps::Handling::kept
                           ? first[r]  // a reload leaves it
                           : expected_reload<Tr>(shape, role, counts, expected[k - 1][r], first[r], false);
    }
  }
  ps::StashRecord<Tr> recs[2] = {ps::StashRecord<Tr>(pool, shape), ps::StashRecord<Tr>(pool, shape)};
  typename Backend::Streams s(1);
  for (std::size_t k = 0; k < static_cast<std::size_t>(hops); ++k) {
    s.stash(0, pool, t[k]->view, recs[k % 2]);
    s.reload(0, pool, recs[k % 2], t[k + 1]->view, false);
  }
  s.synchronize();
  int wrong = 0;
  for (std::size_t k = 0; k <= static_cast<std::size_t>(hops); ++k)
    for (BufferRole role : all_roles) wrong += t[k]->bytes(role) != expected[k][static_cast<std::size_t>(role)];
  CHECK(wrong == 0);
  for (const auto& rec : recs) CHECK(rec.status().state == ps::RecordState::reloaded);
  CHECK(pool.stats().device_pages_free == room_for_two<Tr>(shape).device_pages);
}

// ---- Buffers of exactly their size ------------------------------------------------------

/// Counts that reach the end of every buffer: each group full (capacity-padded), or the
/// groups' shares adding up to max_tokens (packed), at the count alignment.
template <class L>
std::vector<std::int32_t> full_counts(const ps::GroupedView<L>& v) {
  const std::int64_t align = v.count_alignment();
  std::vector<std::int32_t> c(static_cast<std::size_t>(v.groups),
                              static_cast<std::int32_t>(v.max_tokens / align * align));
  if constexpr (L::placement::packed) {
    std::int64_t left = v.max_tokens / align * align;
    for (std::size_t g = 0; g < c.size(); ++g) {
      const std::int64_t share = g + 1 == c.size() ? left : v.max_tokens / v.groups / align * align;
      c[g] = static_cast<std::int32_t>(share);
      left -= share;
    }
  }
  return c;
}

/// The smallest shape the layout takes, with an odd hidden where it allows one (3, for the
/// layouts without scales: rows of 6 or 12 bytes) and more than one group unless Plain.
template <class L>
ps::GroupedView<L> smallest_shape() {
  ps::GroupedView<L> v;
  v.groups = std::is_same_v<L, ps::Plain<typename L::data_type>> ? 1 : 3;
  v.hidden = L::hidden_multiple == 1 ? 3 : L::hidden_multiple;
  v.max_tokens = v.granule() == 1 ? 5 : v.granule();
  return v;
}

/// Stashed and reloaded into a poisoned destination, with and without zero_tail, from full
/// and random counts, with host spill, every buffer (and the counts) in the backend's
/// memory: allocated to the exact byte where the backend does so (std::vector on the host:
/// ASan sees past the end; cudaMalloc of exactly the bytes on the device: compute-sanitizer
/// memcheck does). Returns the rounds.
template <class L, class Backend>
int exact_buffers(const ps::GroupedView<L>& shape, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  ps::validate_shape(shape);
  const ps::PoolConfig cfg = spilling_config<Tr>(shape);  // a large stash spills
  ps::PagePool pool(cfg, Backend::space);
  Tensor<L, Backend> src(shape), dest(shape);
  auto rec = ps::make_record<Tr>(pool, shape);
  int rounds = 0;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    const bool zero_tail = round % 2 == 1;
    const auto counts = round < 2 ? full_counts(shape) : random_counts(shape, rng);
    std::array<std::vector<std::uint8_t>, 3> bytes, poisoned;
    fill(src, counts, rng, &bytes);
    poison(dest, rng, poisoned);
    Backend::stash(pool, src.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
    Backend::reload(pool, rec, dest.view, zero_tail);
    CHECK(rec.status().state == ps::RecordState::reloaded);
    for (BufferRole role : all_roles) {
      CAPTURE(ps::name_of(role));
      const auto r = static_cast<std::size_t>(role);
      CHECK(dest.bytes(role) == expected_reload<Tr>(shape, role, counts, bytes[r], poisoned[r], zero_tail));
    }
    const ps::PoolStats st = pool.stats();
    CHECK(!st.flags.overflow);
    CHECK(!st.flags.error);
    CHECK(st.device_pages_free == cfg.device_pages);
    ++rounds;
  }
  return rounds;
}

/// exact_buffers for every layout at its odd sequence shape and its smallest shape.
template <class Backend>
void every_layout_exact_buffers() {
  std::uint32_t seed = 90;
  int layouts = 0, rounds = 0;
#define PAGESTASH_SUITE_EXACT_SIZE(L)                                               \
  {                                                                                 \
    using Layout = PAGESTASH_LAYOUT(L);                                             \
    CAPTURE(#L);                                                                    \
    ++layouts;                                                                      \
    rounds += exact_buffers<Layout, Backend>(sequence_shape<Layout>(true), ++seed); \
    rounds += exact_buffers<Layout, Backend>(smallest_shape<Layout>(), ++seed);     \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SUITE_EXACT_SIZE)
#undef PAGESTASH_SUITE_EXACT_SIZE
  CHECK(rounds == layouts * 2 * 4);
}

// ---- end_step ---------------------------------------------------------------------------

/// A clean step (one record reloaded, one discarded) is balanced; a step that leaves a
/// record stashed raises unbalanced, with the pages it holds. Packed, with counts that fill
/// the packed total (so each stash holds pages, and two fit the pool).
template <class Backend>
void end_step_balance() {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  ps::PagePool pool(room_for_two<Tr>(shape), Backend::space);
  auto a = ps::make_record<Tr>(pool, shape), b = ps::make_record<Tr>(pool, shape);
  std::mt19937 rng(73);
  Tensor<L, Backend> src(shape), dst(shape);
  src.set(BufferRole::data, random_bytes(static_cast<std::size_t>(shape.buffer_bytes(BufferRole::data)), rng));
  src.set_counts(full_counts(shape));
  const auto stash = [&](ps::StashRecord<Tr>& rec) {
    Backend::stash(pool, src.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
    REQUIRE(rec.status().pages > 0);
  };

  stash(a);
  stash(b);
  Backend::reload(pool, a, dst.view, false);
  Backend::discard(pool, b);
  Backend::end_step(pool);
  ps::PoolStats s = pool.stats();
  CHECK(s.flags.unbalanced == 0);
  CHECK(s.flags.error == 0);
  CHECK(s.pages_held_at_step_end == 0);

  stash(a);
  stash(b);
  Backend::reload(pool, a, dst.view, false);  // b is forgotten
  Backend::end_step(pool);
  s = pool.stats();
  REQUIRE(b.status().state == ps::RecordState::stashed);
  CHECK(s.pages_held_at_step_end == b.status().pages);
  CHECK(s.flags.unbalanced == 1);
  CHECK(s.flags.error == 1);
}

// ---- A reload that does not restore poisons its destination ----------------------------

/// Each way a reload of a record can fail to restore (its stash overflowed, its stash's
/// counts failed, a double reload, a stash before a reset) leaves every paged and kept byte
/// of the destination 0xFF (poison: NaN in every float format) and the dropped ones as they
/// were; with poison off, the destination as it was. Returns the failed reloads checked.
template <class Tr, class Backend>
int failed_reload_poisons(std::uint32_t seed) {
  using L = typename Tr::layout;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape_of<Tr>(seed % 2 == 1);
  ps::PoolConfig cfg;  // one full stash, no two
  cfg.page_bytes = 256;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, Backend::space);
  Tensor<L, Backend> src(shape), dest(shape), scratch(shape);
  auto rec = ps::make_record<Tr>(pool, shape), other = ps::make_record<Tr>(pool, shape);
  const auto stashed = [&](ps::StashRecord<Tr>& r, const std::vector<std::int32_t>& counts) {
    fill(src, counts, rng);
    Backend::stash(pool, src.view, r);
    return r.status().state;
  };
  const std::pair<const char*, std::function<void()>> failures[] = {
      {"the stash overflowed",
       [&] {
         REQUIRE(stashed(other, full_counts(shape)) == ps::RecordState::stashed);
         REQUIRE(stashed(rec, full_counts(shape)) == ps::RecordState::overflowed);
       }},
      {"the stash's counts failed", [&] { REQUIRE(stashed(rec, bad_counts(shape, rng)) == ps::RecordState::failed); }},
      {"a double reload",
       [&] {
         REQUIRE(stashed(rec, random_counts(shape, rng)) == ps::RecordState::stashed);
         Backend::reload(pool, rec, scratch.view, false);
         REQUIRE(rec.status().state == ps::RecordState::reloaded);
       }},
      {"a stash before a reset",
       [&] {
         REQUIRE(stashed(rec, random_counts(shape, rng)) == ps::RecordState::stashed);
         Backend::reset(pool);
       }},
  };
  int checked = 0;
  for (const auto& [why, fail] : failures) {
    for (bool poison_on : {true, false}) {
      CAPTURE(why);
      CAPTURE(poison_on);
      fail();
      std::array<std::vector<std::uint8_t>, 3> before;
      poison(dest, rng, before);
      const ps::RecordState state = rec.status().state;
      Backend::reload(pool, rec, dest.view, seed % 2 == 0, poison_on);
      CHECK(rec.status().state == state);  // nothing restored, nothing returned
      for (BufferRole role : all_roles) {
        CAPTURE(ps::name_of(role));
        const auto r = static_cast<std::size_t>(role);
        CHECK(dest.bytes(role) == (poison_on ? expected_unrestored<Tr>(role, before[r]) : before[r]));
      }
      Backend::reset(pool);
      checked += 1;
    }
  }
  return checked;
}

/// failed_reload_poisons for every layout's default traits and the non-default ones.
template <class Backend>
void every_layout_failed_reloads() {
  std::uint32_t seed = 500;
#define PAGESTASH_SUITE_FAILED_RELOADS(L)                                        \
  {                                                                              \
    using Layout = PAGESTASH_LAYOUT(L);                                          \
    CAPTURE(#L);                                                                 \
    CHECK(failed_reload_poisons<ps::StashTraits<Layout>, Backend>(++seed) == 8); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SUITE_FAILED_RELOADS)
#undef PAGESTASH_SUITE_FAILED_RELOADS
#define PAGESTASH_SUITE_FAILED_RELOADS_TRAITS(Tr) CHECK(failed_reload_poisons<Tr, Backend>(++seed) == 8);
  PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(PAGESTASH_SUITE_FAILED_RELOADS_TRAITS)
#undef PAGESTASH_SUITE_FAILED_RELOADS_TRAITS
}

// ---- Refused before a launch, and in memory ---------------------------------------------

/// A stash the host checks refuse (a record of another pool) throws before anything runs
/// and leaves both records empty; `more(pool, view, rec)` adds the backend's own refusals
/// (the CUDA executor's: a null stream, a pool of the other memory space).
template <class Backend, class More>
void refused_before_launch(More&& more) {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 8;
  ps::PagePool pool(cfg, Backend::space), other(cfg, Backend::space);
  const auto shape = sequence_shape<L>(false);
  Tensor<L, Backend> t(shape);
  t.set_counts(std::vector<std::int32_t>(static_cast<std::size_t>(shape.groups), 8));  // one count a group
  auto rec = ps::make_record<Tr>(pool, shape);
  auto theirs = ps::make_record<Tr>(other, shape);
  CHECK_THROWS_WITH_AS(Backend::stash(pool, t.view, theirs), doctest::Contains("another pool"), std::invalid_argument);
  more(pool, t.view, rec);
  CHECK(rec.status().state == ps::RecordState::empty);
  CHECK(theirs.status().state == ps::RecordState::empty);
  CHECK(pool.stats().errors == 0);
}

/// Random counts and data bytes in `src`, stashed into `rec`: (counts, data bytes).
template <class Backend, class L, class Tr>
std::pair<std::vector<std::int32_t>, std::vector<std::uint8_t>> stash_random(ps::PagePool& pool,
                                                                             Tensor<L, Backend>& src,
                                                                             ps::StashRecord<Tr>& rec,
                                                                             std::mt19937& rng) {
  std::vector<std::int32_t> counts = random_counts(src.view, rng);
  std::vector<std::uint8_t> source =
      random_bytes(static_cast<std::size_t>(src.view.buffer_bytes(BufferRole::data)), rng);
  src.set(BufferRole::data, source);
  src.set_counts(counts);
  Backend::stash(pool, src.view, rec);
  REQUIRE(rec.status().state == ps::RecordState::stashed);
  return {std::move(counts), std::move(source)};
}

/// Pool A's record used with pool B where the host cannot tell (attached device objects
/// carry no ids): `refuse(pool_b, src, dst, rec_a)` runs a stash, a reload (zero_tail) and a
/// discard of A's record on B past the host checks. The steps refuse it in memory: B
/// counts three errors and changes nothing else, A's record stays as it was, the refused
/// reload poisons the destination, and the record still reloads on A.
template <class Backend, class Refuse>
void foreign_record_refused(Refuse&& refuse) {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for_two<Tr>(shape);
  ps::PagePool pool_a(cfg, Backend::space), pool_b(cfg, Backend::space);
  CHECK(pool_a.id() != pool_b.id());
  auto rec_a = ps::make_record<Tr>(pool_a, shape);
  std::mt19937 rng(71);
  Tensor<L, Backend> src(shape), dst(shape);
  const auto stashed = stash_random<Backend>(pool_a, src, rec_a, rng);
  const std::vector<std::int32_t>& counts = stashed.first;
  const std::vector<std::uint8_t>& source = stashed.second;
  const std::vector<std::uint8_t> poisoned = random_bytes(source.size(), rng);
  dst.set(BufferRole::data, poisoned);
  const std::vector<std::int32_t> held = rec_a.page_ids();

  refuse(pool_b, src.view, dst.view, rec_a);
  const ps::PoolStats s = pool_b.stats();
  CHECK(s.flags.foreign_record == 1);
  CHECK(s.flags.error == 1);
  CHECK(s.errors == 3);
  CHECK(s.stashes == 0);
  CHECK(s.reloads == 0);
  CHECK(s.device_pages_free == cfg.device_pages);
  CHECK(free_pages_are_all_ids(pool_b));
  CHECK(rec_a.status().error == ps::Flag::foreign_record);
  CHECK(rec_a.status().state == ps::RecordState::stashed);
  CHECK(rec_a.page_ids() == held);
  // The refused reload did not restore: it poisoned its destination.
  const std::vector<std::uint8_t> unrestored = dst.bytes(BufferRole::data);
  CHECK(unrestored == expected_unrestored<Tr>(BufferRole::data, poisoned));

  // A's record is intact: it reloads on its own pool.
  Backend::reload(pool_a, rec_a, dst.view, false);
  CHECK(dst.bytes(BufferRole::data) == expected_reload<Tr>(shape, BufferRole::data, counts, source, unrestored, false));
  CHECK(pool_a.stats().flags.error == 0);
}

/// A view of layout L2 with `s`'s shape (a record used as another kind).
template <class L2, class Shape>
ps::GroupedView<L2> shape_as(const Shape& s) {
  ps::GroupedView<L2> v;
  v.groups = s.groups;
  v.max_tokens = s.max_tokens;
  v.hidden = s.hidden;
  return v;
}

/// The kinds a RuBf16 record of `shape` is used as, each a subcase calling as(traits, shape): FP16 (the same bytes),
/// compressed, half the hidden.
template <class As>
void as_each_other_kind(const As& as, const ps::GroupedView<RuBf16>& shape) {
  SUBCASE("as FP16 (the same bytes)") { as(ps::StashTraits<RuFp16>{}, shape); }
  SUBCASE("compressed") { as(ps::CompressedTraits<RuBf16, ps::MXFP8_E4M3>{}, shape); }
  SUBCASE("half the hidden") {
    auto half = shape;
    half.hidden /= 2;
    as(ps::StashTraits<RuBf16>{}, half);
  }
}

/// A record used as what it was not made for: with other traits of the same bytes (FP16 for a BF16 record), with a
/// compression it was made without, with another shape (half the hidden). A reload and a discard of a stashed one,
/// past the host checks (attached as that kind, as Python's raw ops attach), are refused as record_mismatch:
/// counted, the record as it was, the refused reload's destination poisoned; and the record still reloads as its own
/// kind. A stash into a host record of another kind is refused by the host before it runs.
template <class Backend>
void mismatched_record_refused() {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  auto shape = sequence_shape<L>(false);
  shape.hidden = 256;  // a multiple of every compression's block
  const ps::PoolConfig cfg = room_for_two<Tr>(shape);
  ps::PagePool pool(cfg, Backend::space);
  auto rec = ps::make_record<Tr>(pool, shape);
  std::mt19937 rng(73);
  Tensor<L, Backend> src(shape), dst(shape);
  const auto stashed = stash_random<Backend>(pool, src, rec, rng);  // (lambdas capture no structured bindings)
  const std::vector<std::int32_t>& counts = stashed.first;
  const std::vector<std::uint8_t>& source = stashed.second;
  const std::vector<std::int32_t> held = rec.page_ids();
  const std::int64_t free_before = pool.stats().device_pages_free;

  int refused = 0;
  const auto as = [&](auto traits, auto as_shape) {
    using Tr2 = decltype(traits);
    using L2 = typename Tr2::layout;
    const auto shape2 = shape_as<L2>(as_shape);
    auto other = ps::StashRecord<Tr2>::attach(pool, shape2, rec.ref().header);
    auto empty = ps::make_record<Tr>(pool, shape);
    auto other_empty = ps::StashRecord<Tr2>::attach(pool, shape2, empty.ref().header);
    Tensor<L2, Backend> src2(shape2), dst2(shape2);
    src2.set_counts(counts);
    const std::vector<std::uint8_t> poisoned =
        random_bytes(static_cast<std::size_t>(shape2.buffer_bytes(BufferRole::data)), rng);
    dst2.set(BufferRole::data, poisoned);
    if constexpr (Backend::space == ps::MemorySpace::host) {  // the host reads a host record's kind before a stash
      CHECK_THROWS_WITH_AS(Backend::stash(pool, src2.view, other_empty), doctest::Contains("made for another kind"),
                           std::invalid_argument);
      CHECK(empty.status().state == ps::RecordState::empty);
    }
    Backend::reload(pool, other, dst2.view, false);
    Backend::discard(pool, other);
    refused += 2;
    CHECK(dst2.bytes(BufferRole::data) == expected_unrestored<Tr2>(BufferRole::data, poisoned));
    CHECK(rec.status().error == ps::Flag::record_mismatch);
  };
  as_each_other_kind(as, shape);
  const ps::PoolStats s = pool.stats();
  CHECK(s.flags.record_mismatch == 1);
  CHECK(s.flags.error == 1);
  CHECK(s.errors == refused);
  CHECK(s.stashes == 1);
  CHECK(s.reloads == 0);
  CHECK(s.device_pages_free == free_before);
  CHECK(rec.status().state == ps::RecordState::stashed);
  CHECK(rec.page_ids() == held);
  Backend::reload(pool, rec, dst.view, false);
  const std::vector<std::uint8_t> before = dst.bytes(BufferRole::data);
  CHECK(before == expected_reload<Tr>(shape, BufferRole::data, counts, source, before, false));
  CHECK(rec.status().state == ps::RecordState::reloaded);
}

/// A stash as another kind than its record was made for, where the host does not read the record's kind (a device
/// record; here `stash_unchecked(pool, view, rec)` runs one past the host checks) into memory of a size that holds it:
/// the stash writes its own kind into the header, so the record is of a piece. A reload as the record's first kind is
/// refused as misuse (record_mismatch, its destination poisoned); one as the stash's kind restores what was stashed.
template <class Backend, class StashUnchecked>
void stash_as_other_kind_is_stamped(StashUnchecked&& stash_unchecked) {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  auto shape = sequence_shape<L>(false);
  shape.hidden = 256;  // a multiple of every compression's block
  std::mt19937 rng(79);
  const auto as = [&](auto traits, auto as_shape) {
    using Tr2 = decltype(traits);
    using L2 = typename Tr2::layout;
    const auto shape2 = shape_as<L2>(as_shape);
    ps::PagePool pool(room_for_two<Tr>(shape), Backend::space);
    auto rec = ps::make_record<Tr>(pool, shape);
    REQUIRE(ps::StashRecord<Tr2>::bytes_needed(pool, shape2) <= rec.bytes());
    auto other = ps::StashRecord<Tr2>::attach(pool, shape2, rec.ref().header);
    Tensor<L2, Backend> src2(shape2), dst2(shape2);
    const std::vector<std::int32_t> counts = random_counts(src2.view, rng);
    const std::vector<std::uint8_t> source =
        random_bytes(static_cast<std::size_t>(shape2.buffer_bytes(BufferRole::data)), rng);
    src2.set(BufferRole::data, source);
    src2.set_counts(counts);
    stash_unchecked(pool, src2.view, other);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
    CHECK(pool.stats().flags.error == 0);

    Tensor<L, Backend> dst(shape);
    const std::vector<std::uint8_t> poisoned =
        random_bytes(static_cast<std::size_t>(shape.buffer_bytes(BufferRole::data)), rng);
    dst.set(BufferRole::data, poisoned);
    dst.set_counts(counts);
    Backend::reload(pool, rec, dst.view, false);
    CHECK(dst.bytes(BufferRole::data) == expected_unrestored<Tr>(BufferRole::data, poisoned));
    CHECK(rec.status().error == ps::Flag::record_mismatch);
    CHECK(rec.status().state == ps::RecordState::stashed);
    CHECK(pool.stats().flags.record_mismatch == 1);

    Backend::reload(pool, other, dst2.view, false);
    const std::vector<std::uint8_t> back = dst2.bytes(BufferRole::data);
    CHECK(back == expected_reload<Tr2>(shape2, BufferRole::data, counts, source, back, false));
    CHECK(other.status().state == ps::RecordState::reloaded);
    CHECK(pool.stats().device_pages_free == pool.config().device_pages);
  };
  as_each_other_kind(as, shape);
}

}  // namespace pagestash_test::suite
