#pragma once
// Launches that overlap on one record, and their oracle: every serial order of the launches
// that ran, on the host executor, must leave exactly what the overlapping launches left (the
// record, the pool, each reload's destination, and what a reload of the record gives after
// them), every block of the launches that did not run refused and a refused reload's
// destination poisoned. The emulator's adversarial schedules (tests/host/emulator_test.cpp)
// and the exhaustive explorer (tests/explorer) both check against it.

#include <pagestash/pagestash.hpp>

#include "grid_emulator.hpp"
#include "stash_sequence.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace pagestash_test {

/// Host memory of one buffer-set, filled with random bytes; a view of it with counts.
template <class L>
struct Buffers {
  std::array<std::vector<std::uint8_t>, 3> bytes;
  std::vector<std::int32_t> counts;
  ps::GroupedView<L> view;
  Buffers(const ps::GroupedView<L>& shape, std::mt19937& rng) : view(shape) {
    for (BufferRole role : all_roles)
      bytes[static_cast<std::size_t>(role)] = random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
    counts = random_counts(shape, rng);
    point();
  }
  /// A copy of the bytes and counts, its view on the copy.
  Buffers(const Buffers& other) : bytes(other.bytes), counts(other.counts), view(other.view) { point(); }
  Buffers& operator=(const Buffers&) = delete;

 private:
  void point() {
    view.data = reinterpret_cast<typename L::data_type*>(bytes[0].data());
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(bytes[1].data());
    view.amax = L::has(BufferRole::amax) ? reinterpret_cast<float*>(bytes[2].data()) : nullptr;
    view.counts = counts.data();
  }
};

/// A host pool with room for `stashes` of the largest stash of `shape`.
template <class Traits>
ps::PoolConfig room_for(const ps::GroupedView<typename Traits::layout>& shape, std::int64_t page_bytes,
                        std::int64_t stashes) {
  ps::PoolConfig cfg;
  cfg.page_bytes = page_bytes;
  cfg.device_pages = stashes * ps::pages_for(ps::work_bounds<Traits>(shape).stream_bytes, page_bytes);
  return cfg;
}

/// What a launch on the record does.
enum class LaunchOp { stash_first, stash_second, reload, discard };

inline const char* name_of(LaunchOp op) {
  switch (op) {
    case LaunchOp::stash_first: return "stash(x)";
    case LaunchOp::stash_second: return "stash(y)";
    case LaunchOp::reload: return "reload";
    case LaunchOp::discard: return "discard";
  }
  return "?";
}

/// One of the launches on the record: what it does, and its grid.
struct OverlapLaunch {
  LaunchOp op = LaunchOp::stash_first;
  bool zero_tail = false;
  LaunchShape shape;
};

/// What the launches left: the record, the pool, each reload's destination, and what a
/// reload of the record gives after them.
template <class L>
struct Outcome {
  ps::RecordState state{};
  std::int64_t pages = 0;
  std::vector<std::int32_t> page_ids;
  std::int64_t device_pages_free = 0;
  std::vector<std::array<std::vector<std::uint8_t>, 3>> reloaded;
  std::array<std::vector<std::uint8_t>, 3> restored;
  bool operator==(const Outcome& o) const {
    return state == o.state && pages == o.pages && page_ids == o.page_ids && device_pages_free == o.device_pages_free &&
           reloaded == o.reloaded && restored == o.restored;
  }
};

/// The data of one case: the stash before, the two stashes' inputs, a poisoned destination
/// for each launch, and one for the reload after them.
template <class L>
struct OverlapData {
  ps::GroupedView<L> shape;
  Buffers<L> before, x, y, poison;
  std::vector<Buffers<L>> out;
  OverlapData(const ps::GroupedView<L>& s, std::mt19937& rng, std::size_t launches = 2)
      : shape(s), before(s, rng), x(s, rng), y(s, rng), poison(s, rng) {
    for (std::size_t k = 0; k < launches; ++k) out.emplace_back(s, rng);
  }
};

/// What a reload that did not restore leaves in `b`: its destination poisoned.
template <class Traits>
void poison_as_unrestored(Buffers<typename Traits::layout>& b) {
  for (BufferRole role : all_roles) {
    std::vector<std::uint8_t>& bytes = b.bytes[static_cast<std::size_t>(role)];
    const std::vector<std::uint8_t> unrestored = expected_unrestored<Traits>(role, bytes);
    std::copy(unrestored.begin(), unrestored.end(), bytes.begin());
  }
}

/// Runs `run(pool, rec, out)` (the launches, writing into copies of d.out) on a new pool and
/// record (holding a stash of d.before if `stashed_before`); returns what they left.
template <class Traits, class Run>
Outcome<typename Traits::layout> play(bool stashed_before, const OverlapData<typename Traits::layout>& d,
                                      const ps::PoolConfig& cfg, const Run& run) {
  using L = typename Traits::layout;
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  std::memset(pool.ref().device_arena, 0x5C, static_cast<std::size_t>(cfg.device_pages * cfg.page_bytes));
  auto rec = ps::make_record<Traits>(pool, d.shape);
  if (stashed_before) {
    ps::stash(ps::host, pool, d.before.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
  }
  std::vector<Buffers<L>> out(d.out);
  run(pool, rec, out);
  Outcome<L> o;
  const ps::RecordStatus st = rec.status();
  o.state = st.state;
  o.pages = st.pages;
  o.device_pages_free = pool.stats().device_pages_free;
  if (st.state == ps::RecordState::stashed) {
    o.page_ids = rec.page_ids();
    Buffers<L> back = d.poison;
    ps::reload(ps::host, pool, rec, back.view, ps::ReloadOptions{true});
    o.restored = back.bytes;
  }
  for (const Buffers<L>& b : out) o.reloaded.push_back(b.bytes);
  return o;
}

/// One operation on the host executor (the serial oracle) or the emulator.
template <class Traits, class Exec>
void apply(const Exec& exec, LaunchOp op, bool zero_tail, ps::PagePool& pool, ps::StashRecord<Traits>& rec,
           const OverlapData<typename Traits::layout>& d, Buffers<typename Traits::layout>& dest) {
  switch (op) {
    case LaunchOp::stash_first: exec.stash(pool, d.x.view, rec); break;
    case LaunchOp::stash_second: exec.stash(pool, d.y.view, rec); break;
    case LaunchOp::reload: exec.reload(pool, rec, dest.view, zero_tail); break;
    case LaunchOp::discard: exec.discard(pool, rec); break;
  }
}

/// The serial oracle: the host executor.
using SerialOracle = HostBackend<1>;

/// Calls f(order) for every ordered selection of distinct launches out of n (the empty one too).
template <class F>
void for_each_serial_order(int n, const F& f, std::vector<int>& order) {
  f(order);
  for (int k = 0; k < n; ++k) {
    if (std::find(order.begin(), order.end(), k) != order.end()) continue;
    order.push_back(k);
    for_each_serial_order(n, f, order);
    order.pop_back();
  }
}

/// What each serial order of the launches that ran leaves (then a host reload of the record
/// into out[0] if `reload_after`: what the overlapping run did after them), with the blocks
/// of the launches that did not run (all refused), whose reloads poisoned their destinations.
template <class L>
struct SerialOutcome {
  std::int32_t refused_blocks;
  Outcome<L> outcome;
};

template <class Traits>
std::vector<SerialOutcome<typename Traits::layout>> serial_outcomes(const std::vector<OverlapLaunch>& launches,
                                                                    bool stashed_before,
                                                                    const OverlapData<typename Traits::layout>& d,
                                                                    const ps::PoolConfig& cfg, bool reload_after) {
  using L = typename Traits::layout;
  const int n = static_cast<int>(launches.size());
  std::vector<SerialOutcome<L>> all;
  std::vector<int> order;
  for_each_serial_order(
      n,
      [&](const std::vector<int>& ran) {
        const auto did_run = [&](int k) { return std::count(ran.begin(), ran.end(), k) != 0; };
        std::int32_t unrun_blocks = 0;
        for (int k = 0; k < n; ++k)
          if (!did_run(k)) unrun_blocks += launches[static_cast<std::size_t>(k)].shape.blocks;
        all.push_back(
            {unrun_blocks,
             play<Traits>(stashed_before, d, cfg, [&](ps::PagePool& pool, ps::StashRecord<Traits>& rec, auto& out) {
               for (int k : ran) {
                 const OverlapLaunch& l = launches[static_cast<std::size_t>(k)];
                 apply(SerialOracle{}, l.op, l.zero_tail, pool, rec, d, out[static_cast<std::size_t>(k)]);
               }
               for (int k = 0; k < n; ++k) {
                 if (launches[static_cast<std::size_t>(k)].op != LaunchOp::reload || did_run(k)) continue;
                 poison_as_unrestored<Traits>(out[static_cast<std::size_t>(k)]);
               }
               if (reload_after) SerialOracle{}.reload(pool, rec, out[0].view, launches[0].zero_tail);
             })});
      },
      order);
  return all;
}

/// Whether `seen`, with `refused_blocks` refused, is what one of the serial orders leaves.
template <class L>
bool matches_a_serial_order(const std::vector<SerialOutcome<L>>& serial, const Outcome<L>& seen,
                            std::int32_t refused_blocks) {
  return std::any_of(serial.begin(), serial.end(), [&](const SerialOutcome<L>& s) {
    return s.refused_blocks == refused_blocks && s.outcome == seen;
  });
}

}  // namespace pagestash_test
