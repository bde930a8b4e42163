#pragma once
// The CPU backends of the executor suite (executor_suite.hpp): the host executor and the
// grid emulator, each with the suite's extras. Streams are host threads, each running its
// stream's operations in order, all streams at once; a graph is a recorded list of
// operations, replayed in order (on the emulator each replay's operations are new emulated
// launches, with new launch ids, as a graph replay's are on a GPU).

#include "grid_emulator.hpp"
#include "stash_sequence.hpp"

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace pagestash_test {

/// Streams of a CPU backend `Ops`: operations queued per stream, run by synchronize() on
/// one host thread per stream, all at once.
template <class Ops>
class HostStreams {
 public:
  explicit HostStreams(int n) : queues_(static_cast<std::size_t>(n)) {}
  template <class Tr>
  void stash(int k, ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    queues_[static_cast<std::size_t>(k)].push_back([&pool, v, &rec] { Ops::stash(pool, v, rec); });
  }
  template <class Tr>
  void reload(int k, ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
              bool zero_tail) {
    queues_[static_cast<std::size_t>(k)].push_back(
        [&pool, &rec, dest, zero_tail] { Ops::reload(pool, rec, dest, zero_tail); });
  }
  void synchronize() {
    std::vector<std::thread> threads;
    for (auto& q : queues_)
      threads.emplace_back([&q] {
        for (auto& op : q) op();
      });
    for (auto& t : threads) t.join();
    for (auto& q : queues_) q.clear();
  }

 private:
  std::vector<std::vector<std::function<void()>>> queues_;
};

/// A graph of a CPU backend `Ops`: operations recorded with their arguments (views by
/// value, as kernel arguments are captured), run in order by every launch().
template <class Ops>
class HostGraph {
 public:
  template <class Tr>
  void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    record([&pool, v, &rec] { Ops::stash(pool, v, rec); });
  }
  template <class Tr>
  void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
              bool zero_tail) {
    record([&pool, &rec, dest, zero_tail] { Ops::reload(pool, rec, dest, zero_tail); });
  }
  void instantiate() { instantiated_ = true; }
  void launch() {
    REQUIRE(instantiated_);
    for (auto& op : ops_) op();
  }

 private:
  void record(std::function<void()> op) {
    REQUIRE(!instantiated_);
    ops_.push_back(std::move(op));
  }
  std::vector<std::function<void()>> ops_;
  bool instantiated_ = false;
};

/// The host executor (Threads copying threads) with the suite's extras.
template <unsigned Threads>
struct HostExecutorBackend : HostBackend<Threads> {
  static void end_step(ps::PagePool& pool) { ps::end_step(HostBackend<Threads>::executor, pool); }
  using Streams = HostStreams<HostExecutorBackend>;
  using Graph = HostGraph<HostExecutorBackend>;
};

/// The sequence suite's and the executor suite's backend on the grid emulator: host
/// memory, operations through the emulator with Blocks x Threads (Slots resident), a new
/// start order for every launch.
template <int Blocks, int Threads, int Slots>
struct EmulatorBackend : HostBackend<1> {
  static Emulator emulator() {
    static std::atomic<std::uint32_t> launches{0};
    LaunchShape s;
    s.blocks = Blocks;
    s.threads = Threads;
    s.slots = Slots;
    s.seed = ++launches;
    return Emulator{s};
  }
  template <class Tr>
  static void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    emulator().stash(pool, v, rec);
  }
  template <class Tr>
  static void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                     bool zero_tail, bool poison = true) {
    emulator().reload(pool, rec, dest, zero_tail, poison);
  }
  template <class Tr>
  static void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) {
    emulator().discard(pool, rec);
  }
  static void reset(ps::PagePool& pool) { emulator().reset(pool); }
  static void end_step(ps::PagePool& pool) { emulator().end_step(pool); }
  using Streams = HostStreams<EmulatorBackend>;
  using Graph = HostGraph<EmulatorBackend>;
};

}  // namespace pagestash_test
