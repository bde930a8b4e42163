// The launch protocol (execution/operation.hpp) explored exhaustively at small scope: a few
// launches of one or two blocks on one record, every interleaving of their blocks' accesses
// to the record's launch words with at most `bound` preemptions (a switch away from a block
// that could go on; switches from a block that finished or waits in a spin are free). Each
// block is one host thread running the kernel body with a team and lanes of one thread (as
// the host executor's), and each schedule's outcome is checked against the serial orders of
// tests/common/overlap.hpp.
//
// Built with PAGESTASH_REMEMBERED_LAUNCHES=2: the bound on remembered refusals is reached by
// four launches. A schedule that refuses more launches than that is beyond the bound the
// protocol states (docs/design.md): there it must be loud (the record left held), never a
// silent mix. A schedule in which every unfinished block waits in a spin is a hang: the
// explorer prints it and exits.
//
// PAGESTASH_EXPLORER_BOUND=<n> explores every configuration with bound n (by hand: a larger one).

#include <pagestash/pagestash.hpp>

#include <doctest/doctest.h>

#include "../common/layout_list.hpp"
#include "../common/overlap.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

static_assert(PAGESTASH_REMEMBERED_LAUNCHES == 2, "the explorer's configurations are sized for 2 remembered launches");

namespace {

using namespace pagestash_test;

/// One decision of a schedule: the blocks that could run, the one that ran last, the one chosen.
struct Decision {
  std::vector<int> enabled;
  int current;
  int chosen;
  bool preempts(int c) const {
    return c != current && std::find(enabled.begin(), enabled.end(), current) != enabled.end();
  }
  /// The choices in the order the search tries them: the default first (the block that ran
  /// last, else the lowest), then the others.
  std::vector<int> alternatives() const {
    std::vector<int> alt;
    const bool goes_on = std::find(enabled.begin(), enabled.end(), current) != enabled.end();
    alt.push_back(goes_on ? current : enabled.front());
    for (int e : enabled)
      if (e != alt.front()) alt.push_back(e);
    return alt;
  }
};

/// The process's atomic observer while a schedule runs: each block's leader is a process,
/// which stops before each of its accesses to the launch words until the schedule picks
/// it. Decisions are taken when every process stands at such a point or has finished.
class Scheduler {
 public:
  /// `watched`: the words a block stops before (each [begin, end) of bytes); `refused`: the
  /// count a refused block adds to.
  /// `owner`: the word a taker publishes its id in; with `first_holds`, the schedule starts once
  /// launch 0 has published it (split()), launch 0's first block alone running until then.
  Scheduler(std::vector<int> prefix, std::vector<int> first_process,
            std::vector<std::pair<const void*, std::size_t>> watched, const void* refused, const void* owner,
            bool first_holds)
      : prefix_(std::move(prefix)), first_(std::move(first_process)), watched_(std::move(watched)),
        refused_word_(refused), owner_word_(owner), split_(first_holds ? -1 : 0),
        count_(static_cast<std::size_t>(first_.back())), procs_(new Process[count_]) {
    refused_launch_.assign(first_.size() - 1, false);
    ps::atomic_observer().set(&Scheduler::observe, this);
  }
  ~Scheduler() { ps::atomic_observer().clear(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Block `block` of launch `launch` runs `body` as a process of the schedule.
  template <class Body>
  void run_block(int launch, int block, const Body& body) {
    enter(first_[static_cast<std::size_t>(launch)] + block);
    body();
    leave();
  }

  const std::vector<Decision>& trace() const { return trace_; }
  /// The decisions before this one are not part of the search (launch 0 taking the record).
  int split() const { return split_ < 0 ? static_cast<int>(trace_.size()) : split_; }
  bool diverged() const { return diverged_; }
  int refused_launches() const {
    return static_cast<int>(std::count(refused_launch_.begin(), refused_launch_.end(), true));
  }
  /// The schedule as the blocks chosen, "launch.block" each.
  std::string describe() const {
    std::ostringstream os;
    int last = -1;
    for (const Decision& d : trace_) {
      if (d.chosen == last) continue;
      last = d.chosen;
      os << name(d.chosen) << (d.preempts(d.chosen) ? "! " : " ");
    }
    return os.str();
  }

 private:
  struct Process {
    bool started = false, fresh = true, waiting = false, spinning = false, writes = false, finished = false;
    /// Writes by any block when this one started its current poll (its first access since it last paused).
    std::uint64_t since = 0;
    bool polling = false;
    std::condition_variable go;  ///< chosen
  };

  static thread_local int self_;

  std::string name(int pid) const {
    const int launch = launch_of(pid);
    return std::to_string(launch) + "." + std::to_string(pid - first_[static_cast<std::size_t>(launch)]);
  }

  static void observe(const void* address, ps::AtomicAccess access, void* context) {
    auto* s = static_cast<Scheduler*>(context);
    if (self_ < 0) return;  // not a block's leader
    if (address == s->refused_word_) {
      std::lock_guard<std::mutex> lock(s->m_);
      s->refused_launch_[static_cast<std::size_t>(s->launch_of(self_))] = true;
      return;  // a count only the host reads
    }
    const char* a = static_cast<const char*>(address);
    bool watched = access == ps::AtomicAccess::pause;
    for (const auto& [begin, bytes] : s->watched_)
      watched = watched || (a >= static_cast<const char*>(begin) && a < static_cast<const char*>(begin) + bytes);
    if (watched) {
      if (s->split_ < 0 && address == s->owner_word_ && access == ps::AtomicAccess::store) {
        std::lock_guard<std::mutex> lock(s->m_);
        s->split_ = static_cast<int>(s->trace_.size()) + 1;  // after this store's decision
      }
      return s->point(access);
    }
    std::lock_guard<std::mutex> lock(s->m_);
    s->poll(s->procs_[static_cast<std::size_t>(self_)]);
    if (access == ps::AtomicAccess::store || access == ps::AtomicAccess::rmw) s->wrote();
  }
  /// An access of a block's (but a pause): the first since it paused starts a poll.
  void poll(Process& p) const {
    if (p.polling) return;
    p.polling = true;
    p.since = writes_;
  }
  /// A write may bring what a spinning block waits for: it can run again.
  void wrote() {
    ++writes_;
    for (std::size_t k = 0; k < count_; ++k) procs_[k].spinning = false;
  }
  int launch_of(int pid) const {
    int launch = 0;
    while (first_[static_cast<std::size_t>(launch) + 1] <= pid) ++launch;
    return launch;
  }

  void enter(int pid) {
    self_ = pid;
    std::unique_lock<std::mutex> lock(m_);
    procs_[static_cast<std::size_t>(pid)].started = true;
  }
  void leave() {
    std::unique_lock<std::mutex> lock(m_);
    procs_[static_cast<std::size_t>(self_)].finished = true;
    self_ = -1;
    if (quiescent()) decide();
  }
  void point(ps::AtomicAccess access) {
    std::unique_lock<std::mutex> lock(m_);
    Process& p = procs_[static_cast<std::size_t>(self_)];
    p.waiting = true;
    // A pause waits for a write after the loads of its poll: one before it may already have brought the change.
    p.spinning = access == ps::AtomicAccess::pause && p.polling && writes_ == p.since;
    if (access == ps::AtomicAccess::pause) p.polling = false;
    p.writes = access == ps::AtomicAccess::store || access == ps::AtomicAccess::rmw;
    if (quiescent()) decide();
    p.go.wait(lock, [&] { return chosen_ == self_; });
    chosen_ = -1;
    p.waiting = false;
    p.fresh = false;
    if (access != ps::AtomicAccess::pause) poll(p);
  }
  bool quiescent() const {
    if (chosen_ >= 0) return false;
    for (std::size_t k = 0; k < count_; ++k)
      if (!procs_[k].finished && !(procs_[k].started && procs_[k].waiting)) return false;
    return true;
  }
  void decide() {
    std::vector<int> enabled;
    bool all_finished = true;
    std::vector<int> fresh_launches;  // blocks of one launch that have not started are alike: one stands for all
    for (std::size_t k = 0; k < count_; ++k) {
      const Process& p = procs_[k];
      all_finished = all_finished && p.finished;
      if (p.finished || p.spinning) continue;
      if (p.fresh) {
        const int launch = launch_of(static_cast<int>(k));
        if (std::count(fresh_launches.begin(), fresh_launches.end(), launch) != 0) continue;
        fresh_launches.push_back(launch);
      }
      enabled.push_back(static_cast<int>(k));
    }
    if (all_finished) return;
    if (enabled.empty() || trace_.size() > 100000) {
      std::fprintf(stderr, "launch explorer: %s after the schedule %s\n",
                   enabled.empty() ? "every unfinished block waits for another (a hang)" : "no end in 100000 steps",
                   describe().c_str());
      std::_Exit(1);  // the blocks would wait for ever
    }
    Decision d{enabled, current_, -1};
    const std::size_t step = trace_.size();
    if (step < prefix_.size() && std::find(enabled.begin(), enabled.end(), prefix_[step]) != enabled.end())
      d.chosen = prefix_[step];
    else {
      diverged_ = diverged_ || step < prefix_.size();
      d.chosen = d.alternatives().front();
    }
    trace_.push_back(d);
    if (procs_[static_cast<std::size_t>(d.chosen)].writes) wrote();
    current_ = chosen_ = d.chosen;
    procs_[static_cast<std::size_t>(d.chosen)].go.notify_one();
  }

  std::vector<int> prefix_, first_;
  std::vector<std::pair<const void*, std::size_t>> watched_;
  const void* refused_word_;
  const void* owner_word_;
  int split_;
  std::mutex m_;
  std::size_t count_;
  std::unique_ptr<Process[]> procs_;
  std::vector<bool> refused_launch_;
  std::vector<Decision> trace_;
  int current_ = -1, chosen_ = -1;
  std::uint64_t writes_ = 0;
  bool diverged_ = false;
};
thread_local int Scheduler::self_ = -1;

/// A configuration: launches on one record, and the record's state before them.
struct Config {
  const char* name;
  bool stashed_before;
  std::vector<OverlapLaunch> launches;
  std::uint64_t first_launch_id = 0;  ///< 0: new ids; else this one, then the next ones
  /// Launch 0 (one block) takes the record before any other block moves; the search starts there.
  bool first_holds = false;
};

OverlapLaunch launch_of(LaunchOp op, int blocks) {
  OverlapLaunch l;
  l.op = op;
  l.zero_tail = true;
  l.shape.blocks = blocks;
  return l;
}

/// The operations with the executors' host checks, then one launch whose blocks are each one
/// host thread running the kernel body alone (a block's team and a warp's lanes of one
/// thread, as the host executor's), each a process of the schedule.
struct ExploredLaunch {
  Scheduler* scheduler;
  int launch;
  int blocks;
  std::uint64_t id;

  template <class Tr>
  void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) const {
    ps::check_stash(ps::MemorySpace::host, pool, v, rec);
    run<Tr, ps::Operation::stash>(pool, v, rec, {});
  }
  template <class Tr>
  void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
              bool zero_tail) const {
    ps::check_reload(ps::MemorySpace::host, pool, rec, dest);
    run<Tr, ps::Operation::reload>(pool, dest, rec, ps::ReloadOptions{zero_tail, true});
  }
  template <class Tr>
  void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) const {
    ps::check_pool_and_record("discard", ps::MemorySpace::host, pool, rec);
    run<Tr, ps::Operation::discard>(pool, rec.shape(), rec, {});
  }
  template <class Tr, ps::Operation Op>
  void run(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec,
           ps::ReloadOptions options) const {
    std::vector<std::thread> threads;
    for (int b = 0; b < blocks; ++b)
      threads.emplace_back([&, b] {
        scheduler->run_block(launch, b, [&] {
          const ps::GridContext<ps::SerialTeam, ps::SerialTeam> ctx{{}, {}, b, blocks, 0, 1, id};
          ps::run_operation<Tr, Op>(ctx, pool.ref(), v, rec.ref(), options);
        });
      });
    for (std::thread& t : threads) t.join();
  }
};

struct Explored {
  long schedules = 0, beyond_bound = 0, max_steps = 0;
  std::string failure;
};

/// Every schedule of `config` with at most `bound` preemptions, each checked.
template <class Traits>
Explored explore(const Config& config, int bound) {
  using L = typename Traits::layout;
  ps::GroupedView<L> shape;
  shape.groups = 2;
  shape.max_tokens = 4;
  shape.hidden = 64;
  std::mt19937 rng(5);
  const OverlapData<L> d(shape, rng, config.launches.size());
  const ps::PoolConfig cfg = room_for<Traits>(d.shape, 256, 2);
  std::vector<int> first{0};
  for (const OverlapLaunch& l : config.launches) first.push_back(first.back() + l.shape.blocks);

  const auto orders = serial_outcomes<Traits>(config.launches, config.stashed_before, d, cfg, true);
  Explored result;
  std::vector<int> prefix;
  for (;;) {
    std::vector<Decision> trace;
    int split = 0;
    std::string schedule;
    int refused_launches = 0;
    bool diverged = false, in_flight = true, next_refused = true;
    std::int32_t refused_blocks = -1;
    const Outcome<L> seen = play<Traits>(
        config.stashed_before, d, cfg,
        [&](ps::PagePool& pool, ps::StashRecord<Traits>& rec, std::vector<Buffers<L>>& out) {
          {
            auto& w = rec.ref().header->launch;
            // The words that decide a launch's fate and release the record; a launch's own verdict and tile
            // claims are read and written by its blocks alone once it holds the record.
            Scheduler s(prefix, first,
                        {{&w.arrival, sizeof w.arrival},
                         {&w.owner, sizeof w.owner},
                         {&w.generation, sizeof w.generation},
                         {&w.finished, sizeof w.finished},
                         {&w.next_remembered, sizeof w.next_remembered},
                         {&w.remembered, sizeof w.remembered}},
                        &w.refused, &w.owner, config.first_holds);
            std::vector<std::future<void>> running;
            for (std::size_t k = 0; k < config.launches.size(); ++k) {
              const OverlapLaunch& l = config.launches[k];
              const std::uint64_t id = config.first_launch_id != 0 ? config.first_launch_id + k : next_grid_id();
              const ExploredLaunch exec{&s, static_cast<int>(k), l.shape.blocks, id};
              running.push_back(std::async(std::launch::async,
                                           [&, exec, k] { apply(exec, l.op, l.zero_tail, pool, rec, d, out[k]); }));
            }
            for (auto& f : running) f.get();
            trace = s.trace();
            split = s.split();
            schedule = s.describe();
            refused_launches = s.refused_launches();
            diverged = s.diverged();
          }
          const ps::RecordStatus st = rec.status();
          refused_blocks = st.refused_blocks;
          in_flight = st.launch_in_flight;
          // The record is free again: a later launch is not refused (the serial orders run it too).
          const ps::GridContext<ps::SerialTeam, ps::SerialTeam> one{{}, {}, 0, 1, 0, 1, next_grid_id()};
          ps::check_reload(ps::MemorySpace::host, pool, rec, out[0].view);
          ps::run_operation<Traits, ps::Operation::reload>(one, pool.ref(), out[0].view, rec.ref(),
                                                           ps::ReloadOptions{config.launches[0].zero_tail, true});
          next_refused = rec.status().refused_blocks != refused_blocks;
        });
    ++result.schedules;
    result.max_steps = std::max(result.max_steps, static_cast<long>(trace.size()));
    if (diverged) {
      result.failure = "a replay did not follow its schedule (a decision depends on more than the schedule)";
      return result;
    }
    const bool serial = matches_a_serial_order(orders, seen, refused_blocks);
    std::string why;
    if (refused_launches <= PAGESTASH_REMEMBERED_LAUNCHES) {
      if (in_flight) why += "the record is still held after every launch ended; ";
      if (next_refused) why += "a later launch was refused; ";
      if (!serial) why += "no serial order of the launches that ran leaves the same record, pool and bytes; ";
    } else {
      ++result.beyond_bound;
      if (!serial && !in_flight) why += "beyond the bound, a silent mix (the record is free, no serial order); ";
    }
    if (!why.empty()) {
      result.failure = why + std::to_string(refused_blocks) + " blocks refused, schedule " + schedule +
                       "(launch.block; ! a preemption)";
      return result;
    }
    // The next schedule: the deepest decision with an untried choice within the bound.
    std::vector<int> preemptions(trace.size() + 1, 0);
    for (std::size_t i = 0; i < trace.size(); ++i)
      preemptions[i + 1] = preemptions[i] + (trace[i].preempts(trace[i].chosen) ? 1 : 0);
    bool found = false;
    for (std::size_t i = trace.size(); i-- > static_cast<std::size_t>(split) && !found;) {
      const std::vector<int> alt = trace[i].alternatives();
      const auto at = std::find(alt.begin(), alt.end(), trace[i].chosen);
      for (auto it = at + 1; it != alt.end() && !found; ++it) {
        if (preemptions[i] + (trace[i].preempts(*it) ? 1 : 0) > bound) continue;
        prefix.clear();
        for (std::size_t k = 0; k < i; ++k) prefix.push_back(trace[k].chosen);
        prefix.push_back(*it);
        found = true;
      }
    }
    if (!found) return result;
  }
}

/// The test's bound, or PAGESTASH_EXPLORER_BOUND's (a larger one by hand).
int preemption_bound(int bound) {
  const char* b = std::getenv("PAGESTASH_EXPLORER_BOUND");
  return b ? std::atoi(b) : bound;
}

void run(const Config& config, int default_bound) {
  using Traits = ps::StashTraits<layouts::RuBf16Cap>;
  const int bound = preemption_bound(default_bound);
  const auto t0 = std::chrono::steady_clock::now();
  const Explored e = explore<Traits>(config, bound);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(std::string(config.name) << ": " << e.schedules << " schedules (" << e.beyond_bound << " beyond the bound of "
                                   << PAGESTASH_REMEMBERED_LAUNCHES << " remembered refusals), at most " << e.max_steps
                                   << " decisions, preemption bound " << bound << ", " << s << " s");
  CHECK_MESSAGE(e.failure.empty(), std::string(config.name) << ": " << e.failure);
}

}  // namespace

TEST_CASE("launch explorer: two launches of two blocks, every pair of operations") {
  const LaunchOp ops[] = {LaunchOp::stash_first, LaunchOp::reload, LaunchOp::discard};
  for (const bool before : {false, true})
    for (const LaunchOp a : ops)
      for (const LaunchOp b : ops) {
        const std::string name =
            std::string(before ? "stashed, " : "empty, ") + name_of(a) + " x2 | " + name_of(b) + " x2";
        run(Config{name.c_str(), before, {launch_of(a, 2), launch_of(b, 2)}}, 1);
      }
}

TEST_CASE("launch explorer: launch ids at the top of the 64-bit range") {
  run(Config{"stash x2 | reload x2, ids from 2^62 + 5",
             false,
             {launch_of(LaunchOp::stash_first, 2), launch_of(LaunchOp::reload, 2)},
             0x4000000000000005ull},
      1);
}

TEST_CASE("launch explorer: four launches, the remembered refusals at their bound") {
  run(Config{"stashed, reload x1 | reload x2 | discard x1 | reload x1",
             true,
             {launch_of(LaunchOp::reload, 1), launch_of(LaunchOp::reload, 2), launch_of(LaunchOp::discard, 1),
              launch_of(LaunchOp::reload, 1)}},
      1);
}

// Without the wait before the word moves off a refused launch (docs/design.md), this finds the refused launch's late
// block taking the record: `0.0 2.0 1.0! 2.0! 3.0 1.1 1.0`.
TEST_CASE("launch explorer: a launch holds the record, three arrive, one of them straddling it") {
  Config c{"stashed, reload x1 holds | reload x2 | discard x1 | reload x1",
           true,
           {launch_of(LaunchOp::reload, 1), launch_of(LaunchOp::reload, 2), launch_of(LaunchOp::discard, 1),
            launch_of(LaunchOp::reload, 1)}};
  c.first_holds = true;
  run(c, 2);
}
