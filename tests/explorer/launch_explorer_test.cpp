// The launch protocol (execution/operation.hpp) explored exhaustively at small scope: a few
// launches of one or two blocks on one record, every interleaving of their blocks' accesses
// to the record's launch words with at most `bound` preemptions (a switch away from a block
// that could go on; switches from a block that finished or waits in a spin are free). Each
// block is one fiber of the test's thread (tests/common/grid_emulator.hpp's FiberBlock: the
// schedule picks the next, and a switch wakes no sleeping host thread) running
// the kernel body with a team and lanes of one thread (as the host executor's), and each
// schedule's outcome is checked against the serial orders of tests/common/overlap.hpp.
//
// Built with PAGESTASH_REMEMBERED_LAUNCHES=2: the bound on remembered refusals is reached by
// four launches. A schedule that refuses more launches than that is beyond the bound the
// protocol states (docs/design.md): there it must be loud (the record left held), never a
// silent mix. A schedule in which every unfinished block waits in a spin is a hang: the
// explorer prints it and exits.
//
// The pool configurations (below) explore the pool's lock instead: launches on records of their own and a grow or a
// shrink of the pool at the same time.
//
// PAGESTASH_EXPLORER_BOUND=<n> explores every configuration with bound n (by hand: a larger one).

#include <pagestash/pagestash.hpp>

#include <doctest/doctest.h>

#include "../common/grid_emulator.hpp"
#include "../common/layout_list.hpp"
#include "../common/overlap.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
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

/// The process's atomic observer while a schedule runs: each block's leader is a process (a fiber of the test's
/// thread), which stops before each of its accesses to the launch words until the schedule picks it. Decisions are
/// taken when every process stands at such a point or has finished.
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
        count_(static_cast<std::size_t>(first_.back())), procs_(new Process[count_]), bodies_(count_) {
    refused_launch_.assign(first_.size() - 1, false);
    ps::atomic_observer().set(&Scheduler::observe, this);
  }
  ~Scheduler() { ps::atomic_observer().clear(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Block `block` of launch `launch` will run `body` as a process of the schedule (run()).
  void add_block(int launch, int block, std::function<void()> body) {
    bodies_[static_cast<std::size_t>(first_[static_cast<std::size_t>(launch)] + block)] = std::move(body);
  }
  /// Runs every process to its end, as the schedule picks them, each a fiber of the calling thread.
  void run() {
    if (!fibers_available) throw std::logic_error("the launch explorer's blocks are fibers: Linux, no ThreadSanitizer");
    FiberBlock fibers(static_cast<int>(count_), [this](int pid) {
      enter(pid);
      bodies_[static_cast<std::size_t>(pid)]();
      leave();
    });
    fibers_ = &fibers;
    fibers.run();
    fibers_ = nullptr;
  }

  /// Names launch `launch`'s single block `text` in schedules (a resize's process).
  void label(int launch, std::string text) {
    labels_.resize(first_.size() - 1);
    labels_[static_cast<std::size_t>(launch)] = std::move(text);
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
  };

  std::string name(int pid) const {
    const int launch = launch_of(pid);
    if (static_cast<std::size_t>(launch) < labels_.size() && !labels_[static_cast<std::size_t>(launch)].empty())
      return labels_[static_cast<std::size_t>(launch)];
    return std::to_string(launch) + "." + std::to_string(pid - first_[static_cast<std::size_t>(launch)]);
  }

  static void observe(const void* address, ps::AtomicAccess access, void* context) {
    auto* s = static_cast<Scheduler*>(context);
    if (s->self_ < 0) return;  // not a block's leader
    if (access == ps::AtomicAccess::plain_load || access == ps::AtomicAccess::round_begin ||
        access == ps::AtomicAccess::round_end)
      return;  // a plain load, or where a round of loads begins or ends: no scheduling point, no write
    if (address == s->refused_word_) {
      s->refused_launch_[static_cast<std::size_t>(s->launch_of(s->self_))] = true;
      return;  // a count only the host reads
    }
    const char* a = static_cast<const char*>(address);
    bool watched = access == ps::AtomicAccess::pause;
    for (const auto& [begin, bytes] : s->watched_)
      watched = watched || (a >= static_cast<const char*>(begin) && a < static_cast<const char*>(begin) + bytes);
    if (watched) {
      if (s->split_ < 0 && address == s->owner_word_ && access == ps::AtomicAccess::store)
        s->split_ = static_cast<int>(s->trace_.size()) + 1;  // after this store's decision
      return s->point(access);
    }
    s->poll(s->procs_[static_cast<std::size_t>(s->self_)]);
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
    procs_[static_cast<std::size_t>(pid)].started = true;
  }
  /// The process that runs next: the one chosen, once every process stands at a point; until then one not started.
  int next_process() {
    if (quiescent()) decide();
    if (chosen_ >= 0) return chosen_;
    for (std::size_t k = 0; k < count_; ++k)
      if (!procs_[k].started) return static_cast<int>(k);
    return -1;  // every process finished
  }
  void leave() {
    procs_[static_cast<std::size_t>(self_)].finished = true;
    self_ = -1;
    const int next = next_process();
    if (next >= 0) fibers_->end_to(next);
  }
  void point(ps::AtomicAccess access) {
    const int me = self_;
    Process& p = procs_[static_cast<std::size_t>(me)];
    p.waiting = true;
    // A pause waits for a write after the loads of its poll: one before it may already have brought the change.
    p.spinning = access == ps::AtomicAccess::pause && p.polling && writes_ == p.since;
    if (access == ps::AtomicAccess::pause) p.polling = false;
    p.writes = access == ps::AtomicAccess::store || access == ps::AtomicAccess::rmw;
    while (chosen_ != me) {  // the other processes run until the schedule picks this one (decide())
      fibers_->yield_to(next_process());
      self_ = me;
    }
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
  }

  std::vector<int> prefix_, first_;
  std::vector<std::string> labels_;
  std::vector<std::pair<const void*, std::size_t>> watched_;
  const void* refused_word_;
  const void* owner_word_;
  int split_;
  std::size_t count_;
  std::unique_ptr<Process[]> procs_;
  std::vector<std::function<void()>> bodies_;
  FiberBlock* fibers_ = nullptr;
  int self_ = -1;  ///< the process running (-1: none, the test's own code)
  std::vector<bool> refused_launch_;
  std::vector<Decision> trace_;
  int current_ = -1, chosen_ = -1;
  std::uint64_t writes_ = 0;
  bool diverged_ = false;
};

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

/// The operations with the executors' host checks, then one launch whose blocks each run the kernel body alone (a
/// block's team and a warp's lanes of one thread, as the host executor's), each a process of the schedule: added to
/// it here, run by Scheduler::run once every launch is.
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
    for (int b = 0; b < blocks; ++b)
      scheduler->add_block(launch, b, [&pool, v, &rec, options, b, n = blocks, id = id] {
        const ps::GridContext<ps::SerialTeam, ps::SerialTeam> ctx{{}, {}, b, n, 0, 1, id};
        ps::run_operation<Tr, Op>(ctx, pool.ref(), v, rec.ref(), options);
      });
  }
};

struct Explored {
  long schedules = 0, beyond_bound = 0, max_steps = 0;
  std::string failure;
  long outcomes = 0, serial_outcomes = 0;  ///< pool configurations: the serial orders' outcomes reached, of all
};

/// The next schedule to replay (its prefix of choices): the deepest decision after `split` with an untried choice
/// within the bound. False when none is left.
bool next_schedule(const std::vector<Decision>& trace, int split, int bound, std::vector<int>& prefix) {
  std::vector<int> preemptions(trace.size() + 1, 0);
  for (std::size_t i = 0; i < trace.size(); ++i)
    preemptions[i + 1] = preemptions[i] + (trace[i].preempts(trace[i].chosen) ? 1 : 0);
  for (std::size_t i = trace.size(); i-- > static_cast<std::size_t>(split);) {
    const std::vector<int> alt = trace[i].alternatives();
    const auto at = std::find(alt.begin(), alt.end(), trace[i].chosen);
    for (auto it = at + 1; it != alt.end(); ++it) {
      if (preemptions[i] + (trace[i].preempts(*it) ? 1 : 0) > bound) continue;
      prefix.clear();
      for (std::size_t k = 0; k < i; ++k) prefix.push_back(trace[k].chosen);
      prefix.push_back(*it);
      return true;
    }
  }
  return false;
}

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
            for (std::size_t k = 0; k < config.launches.size(); ++k) {
              const OverlapLaunch& l = config.launches[k];
              const std::uint64_t id = config.first_launch_id != 0 ? config.first_launch_id + k : next_grid_id();
              apply(ExploredLaunch{&s, static_cast<int>(k), l.shape.blocks, id}, l.op, l.zero_tail, pool, rec, d,
                    out[k]);
            }
            s.run();
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
    if (!next_schedule(trace, split, bound, prefix)) return result;
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

// A pool that grows or shrinks while launches take and return pages (docs/design.md, "A pool that grows"): launches
// of one block, each on a record of its own, and a resize (the host executor's grow or shrink) as one more process,
// each stopped before every access to the pool's lock and flags (all that take_pages, return_pages and the resize
// steps touch atomically). Each takes the lock once, so every order of the lock acquisitions, and the contention on
// it, is explored at the bound. Checked after each schedule: the pages balance, free and held ids are the pool's pages
// once each, every reload gives the stashed bytes (a stash holds its bytes or overflowed), a shrink is done or refused
// with nothing changed, and one serial order of the processes leaves the same (tests/common/overlap.hpp's idea).
// Plain code between two watched accesses runs as one step: a write moved past the unlock, with no atomic access
// after it, is no other interleaving here.

/// A launch on a record of its own: a stash of `tokens` per group into an empty record, or a reload or discard of a
/// record that holds a stash of `tokens` per group from before.
struct PoolLaunch {
  LaunchOp op;
  std::int32_t tokens;
};

/// A pool with a reserve, launches on it, and a resize to (`device_pages`, `host_pages`) at the same time.
struct ResizeConfig {
  const char* name;
  ps::PoolConfig pool;
  std::vector<PoolLaunch> launches;
  bool grow;
  std::int64_t device_pages, host_pages;
};

using PoolTraits = ps::StashTraits<layouts::RuBf16Cap>;
using PoolLayout = PoolTraits::layout;

/// A group's token is one line of 128 bytes: t tokens per group are t pages of 256 bytes.
ps::GroupedView<PoolLayout> pool_shape() {
  ps::GroupedView<PoolLayout> v;
  v.groups = 2;
  v.max_tokens = 4;
  v.hidden = 64;
  return v;
}

/// Each launch's tensor (what it stashes, or what was stashed before it) and its reload's destination.
struct ResizeData {
  std::vector<Buffers<PoolLayout>> in, dest;
  ResizeData(const ResizeConfig& c, std::mt19937& rng) {
    for (const PoolLaunch& l : c.launches) {
      in.emplace_back(pool_shape(), rng);
      in.back().counts.assign(2, l.tokens);
      dest.emplace_back(pool_shape(), rng);
    }
  }
};

/// What a schedule or a serial order left.
struct PoolOutcome {
  std::vector<ps::RecordState> states;
  std::vector<std::vector<std::int32_t>> held;  ///< each record's page ids
  std::vector<std::int64_t> held_device;        ///< how many of them are device pages
  std::vector<std::int64_t> counters;           ///< every PoolCounters field, then every flag
  std::int64_t pages = 0, host_pages = 0, device_free_count = 0, host_free_count = 0;  ///< of them, what is checked
  std::int32_t overflow = 0;
  std::vector<std::int32_t> device_free, host_free;  ///< the free stacks, bottom first
  std::int32_t resized = 0;
  bool refused = false;                             ///< the shrink was refused (threw)
  std::int64_t config_device = 0, config_host = 0;  ///< PagePool::config() after the resize
  std::vector<std::int32_t> refused_blocks;
  std::vector<std::array<std::vector<std::uint8_t>, 3>> reloaded;  ///< each reload launch's destination
  std::vector<std::array<std::vector<std::uint8_t>, 3>> restored;  ///< each record still stashed, reloaded after
  bool balanced_after = false;                                     ///< every page back once those were reloaded
  bool operator==(const PoolOutcome& o) const {
    return states == o.states && held == o.held && held_device == o.held_device && counters == o.counters &&
           device_free == o.device_free && host_free == o.host_free && resized == o.resized && refused == o.refused &&
           config_device == o.config_device && config_host == o.config_host && refused_blocks == o.refused_blocks &&
           reloaded == o.reloaded && restored == o.restored && balanced_after == o.balanced_after;
  }
};

/// The pool's pages and ids, for a failure's message.
std::string describe(const PoolOutcome& o) {
  const auto list = [](const std::vector<std::int32_t>& ids) {
    std::string t = "[";
    for (const std::int32_t id : ids) t += (t.size() > 1 ? " " : "") + std::to_string(id);
    return t + "]";
  };
  std::string t = std::to_string(o.pages) + " + " + std::to_string(o.host_pages) + " pages, free " +
                  list(o.device_free) + " + " + list(o.host_free) + ", held";
  for (const auto& ids : o.held) t += " " + list(ids);
  return t;
}

/// Makes the pool and records (stashing what reloads and discards find), runs `run(pool, recs, dest)`, which returns
/// whether a shrink was refused, and reads back what it left.
template <class Run>
PoolOutcome play_pool(const ResizeConfig& c, const ResizeData& d, const Run& run) {
  ps::PagePool pool(c.pool, ps::MemorySpace::host);
  std::vector<ps::StashRecord<PoolTraits>> recs;
  for (std::size_t k = 0; k < c.launches.size(); ++k) {
    recs.push_back(ps::make_record<PoolTraits>(pool, pool_shape()));
    if (c.launches[k].op == LaunchOp::stash_first) continue;
    ps::stash(ps::host, pool, d.in[k].view, recs.back());
    REQUIRE(recs.back().status().state == ps::RecordState::stashed);
  }
  std::vector<Buffers<PoolLayout>> dest(d.dest);
  PoolOutcome o;
  o.refused = run(pool, recs, dest);
  const ps::PoolStats st = pool.stats();
#define PAGESTASH_EXPLORER_COUNTER(type, name, meaning) o.counters.push_back(st.name);
  PAGESTASH_POOL_COUNTERS(PAGESTASH_EXPLORER_COUNTER)
#undef PAGESTASH_EXPLORER_COUNTER
#define PAGESTASH_EXPLORER_FLAG(name, category, meaning) o.counters.push_back(st.flags.name);
  PAGESTASH_POOL_FLAGS(PAGESTASH_EXPLORER_FLAG)
#undef PAGESTASH_EXPLORER_FLAG
  o.pages = st.device_pages;
  o.host_pages = st.host_pages;
  o.device_free_count = st.device_pages_free;
  o.host_free_count = st.host_pages_free;
  o.overflow = st.flags.overflow;
  const ps::PoolRef& ref = pool.ref();
  o.device_free.assign(ref.device_stack, ref.device_stack + st.device_pages_free);
  o.host_free.assign(ref.host_stack, ref.host_stack + st.host_pages_free);
  o.resized = ref.state->resized;
  o.config_device = pool.config().device_pages;
  o.config_host = pool.config().host_pages;
  for (std::size_t k = 0; k < recs.size(); ++k) {
    const ps::RecordStatus rs = recs[k].status();
    o.states.push_back(rs.state);
    o.held.push_back(recs[k].page_ids());
    o.held_device.push_back(rs.device_pages);
    o.refused_blocks.push_back(rs.refused_blocks);
    if (c.launches[k].op == LaunchOp::reload) o.reloaded.push_back(dest[k].bytes);
    if (rs.state != ps::RecordState::stashed) continue;
    Buffers<PoolLayout> back(d.dest[k]);
    ps::reload(ps::host, pool, recs[k], back.view, ps::ReloadOptions{true, true});
    o.restored.push_back(back.bytes);
  }
  const ps::PoolStats end = pool.stats();
  o.balanced_after = end.device_pages_free == end.device_pages && end.host_pages_free == end.host_pages;
  return o;
}

/// Every serial order of the launches and the resize on the host executor.
std::vector<PoolOutcome> serial_pool_outcomes(const ResizeConfig& c, const ResizeData& d) {
  std::vector<int> order(c.launches.size() + 1);
  std::iota(order.begin(), order.end(), 0);
  std::vector<PoolOutcome> all;
  do {
    all.push_back(play_pool(c, d, [&](ps::PagePool& pool, auto& recs, std::vector<Buffers<PoolLayout>>& dest) {
      bool refused = false;
      for (const int k : order) {
        const auto i = static_cast<std::size_t>(k);
        if (i == c.launches.size()) {
          if (c.grow) ps::grow(ps::host, pool, c.device_pages, c.host_pages);
          else try {
              ps::shrink(ps::host, pool, c.device_pages, c.host_pages);
            } catch (const std::invalid_argument&) { refused = true; }
          continue;
        }
        switch (c.launches[i].op) {
          case LaunchOp::stash_first: ps::stash(ps::host, pool, d.in[i].view, recs[i]); break;
          case LaunchOp::reload: ps::reload(ps::host, pool, recs[i], dest[i].view, {true, true}); break;
          default: ps::discard(ps::host, pool, recs[i]); break;
        }
      }
      return refused;
    }));
  } while (std::next_permutation(order.begin(), order.end()));
  return all;
}

/// What must hold after any schedule, whatever its order (the serial orders run the same steps, so a step wrong in
/// every order is found here, not by them). Empty: all holds.
std::string check_pool(const ResizeConfig& c, const ResizeData& d, const PoolOutcome& o) {
  std::string why;
  const std::int64_t pages = o.pages, host_pages = o.host_pages, device_free = o.device_free_count,
                     host_free = o.host_free_count;
  // Balance: every page the pool has is free or held, once.
  std::int64_t held = 0;
  std::vector<std::int32_t> ids(o.device_free.begin(), o.device_free.end());
  ids.insert(ids.end(), o.host_free.begin(), o.host_free.end());
  const std::int64_t first_host = c.pool.reserved_device_pages();
  const auto valid = [&](std::int32_t id, bool device) {
    return device ? id >= 0 && id < pages : id >= first_host && id < first_host + host_pages;
  };
  bool in_range = true;
  for (const std::int32_t id : o.device_free) in_range = in_range && valid(id, true);
  for (const std::int32_t id : o.host_free) in_range = in_range && valid(id, false);
  for (std::size_t k = 0; k < o.held.size(); ++k) {
    held += static_cast<std::int64_t>(o.held[k].size());
    for (std::size_t i = 0; i < o.held[k].size(); ++i)
      in_range = in_range && valid(o.held[k][i], static_cast<std::int64_t>(i) < o.held_device[k]);
    ids.insert(ids.end(), o.held[k].begin(), o.held[k].end());
  }
  if (device_free + host_free + held != pages + host_pages)
    why += "unbalanced: " + std::to_string(device_free) + " + " + std::to_string(host_free) + " free and " +
           std::to_string(held) + " held of " + std::to_string(pages) + " + " + std::to_string(host_pages) + " pages; ";
  if (!in_range) why += "a free or held page id is not one of the pool's pages; ";
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) why += "a page id is free or held twice; ";
  if (!o.balanced_after) why += "pages missing once every record was reloaded; ";
  // Bytes: each reload restores what was stashed; each stash holds its bytes, or overflowed.
  std::size_t reload = 0, restored = 0;
  for (std::size_t k = 0; k < c.launches.size(); ++k) {
    const Buffers<PoolLayout>& in = d.in[k];
    const auto expected = [&](std::size_t role) {
      return expected_reload<PoolTraits>(in.view, all_roles[role], in.counts, in.bytes[role], d.dest[k].bytes[role],
                                         true);
    };
    const ps::RecordState st = o.states[k];
    if (o.refused_blocks[k] != 0) why += "launch " + std::to_string(k) + " refused; ";
    switch (c.launches[k].op) {
      case LaunchOp::reload:
        if (st != ps::RecordState::reloaded) why += "launch " + std::to_string(k) + " did not reload; ";
        for (std::size_t r = 0; r < 3; ++r)
          if (o.reloaded[reload][r] != expected(r)) why += "launch " + std::to_string(k) + " reloaded other bytes; ";
        ++reload;
        break;
      case LaunchOp::stash_first:
        if (st == ps::RecordState::stashed) {
          for (std::size_t r = 0; r < 3; ++r)
            if (o.restored[restored][r] != expected(r))
              why += "launch " + std::to_string(k) + "'s stash reloads other bytes; ";
          ++restored;
        } else if (st != ps::RecordState::overflowed || o.overflow == 0) {
          why += "launch " + std::to_string(k) + "'s stash neither holds its bytes nor overflowed; ";
        }
        break;
      default:
        if (st != ps::RecordState::discarded) why += "launch " + std::to_string(k) + " did not discard; ";
    }
  }
  // The resize: a grow is done; a shrink is done (`resized` 1) or refused with nothing changed.
  const bool done = c.grow || !o.refused;
  if (!c.grow && o.resized != (o.refused ? 0 : 1))
    why += "the shrink was " + std::string(o.refused ? "refused" : "done") + " but `resized` says " +
           std::to_string(o.resized) + "; ";
  const std::int64_t want_d = done ? c.device_pages : c.pool.device_pages,
                     want_h = done ? c.host_pages : c.pool.host_pages;
  if (pages != want_d || host_pages != want_h || o.config_device != want_d || o.config_host != want_h)
    why += "the pool has " + std::to_string(pages) + " + " + std::to_string(host_pages) + " pages (its config " +
           std::to_string(o.config_device) + " + " + std::to_string(o.config_host) + "), not " +
           std::to_string(want_d) + " + " + std::to_string(want_h) + "; ";
  return why;
}

/// Every schedule of `c` with at most `bound` preemptions, each checked.
Explored explore_pool(const ResizeConfig& c, int bound) {
  std::mt19937 rng(7);
  const ResizeData d(c, rng);
  std::vector<PoolOutcome> orders;  // the serial orders' distinct outcomes
  for (PoolOutcome& o : serial_pool_outcomes(c, d))
    if (std::find(orders.begin(), orders.end(), o) == orders.end()) orders.push_back(std::move(o));
  std::vector<bool> reached(orders.size(), false);
  Explored result;
  result.serial_outcomes = static_cast<long>(orders.size());
  for (const PoolOutcome& o : orders) {  // the oracle itself
    const std::string why = check_pool(c, d, o);
    if (!why.empty()) return Explored{0, 0, 0, "a serial order: " + why + describe(o), 0, 0};
  }
  const int n = static_cast<int>(c.launches.size());
  std::vector<int> first(static_cast<std::size_t>(n) + 2);
  std::iota(first.begin(), first.end(), 0);  // a block per launch, then the resize's process
  std::vector<int> prefix;
  for (;;) {
    std::vector<Decision> trace;
    std::string schedule;
    bool diverged = false;
    const PoolOutcome seen =
        play_pool(c, d, [&](ps::PagePool& pool, std::vector<ps::StashRecord<PoolTraits>>& recs, auto& dest) {
          bool refused = false;
          {
            // The words take_pages, return_pages and the resize steps touch atomically: the lock and the flags
            // (overflow, host_spill). The counters' atomics (a generation no one writes here, counts only added to)
            // commute with every other access.
            const auto& state = *pool.ref().state;
            Scheduler s(prefix, first, {{&state.lock, sizeof state.lock}, {&state.flags, sizeof state.flags}},
                        &recs[0].ref().header->launch.refused, nullptr, false);
            s.label(n, c.grow ? "grow" : "shrink");
            std::vector<std::uint64_t> ids;
            for (int k = 0; k < n; ++k) ids.push_back(next_grid_id());
            for (int k = 0; k < n; ++k) {
              const auto i = static_cast<std::size_t>(k);
              const ExploredLaunch exec{&s, k, 1, ids[i]};
              switch (c.launches[i].op) {
                case LaunchOp::stash_first: exec.stash(pool, d.in[i].view, recs[i]); break;
                case LaunchOp::reload: exec.reload(pool, recs[i], dest[i].view, true); break;
                default: exec.discard(pool, recs[i]); break;
              }
            }
            s.add_block(n, 0, [&] {
              if (c.grow) ps::grow(ps::host, pool, c.device_pages, c.host_pages);
              else try {
                  ps::shrink(ps::host, pool, c.device_pages, c.host_pages);
                } catch (const std::invalid_argument&) { refused = true; }
            });
            s.run();
            trace = s.trace();
            schedule = s.describe();
            diverged = s.diverged();
          }
          return refused;
        });
    ++result.schedules;
    result.max_steps = std::max(result.max_steps, static_cast<long>(trace.size()));
    if (diverged) {
      result.failure = "a replay did not follow its schedule (a decision depends on more than the schedule)";
      return result;
    }
    std::string why = check_pool(c, d, seen);
    const auto match = std::find(orders.begin(), orders.end(), seen);
    if (why.empty() && match == orders.end())
      why = "no serial order of the launches and the resize leaves the same pool, records and bytes; ";
    else if (match != orders.end()) reached[static_cast<std::size_t>(match - orders.begin())] = true;
    result.outcomes = std::count(reached.begin(), reached.end(), true);
    if (!why.empty()) {
      result.failure = why + describe(seen) + "; schedule " + schedule + "(launch.block; ! a preemption)";
      return result;
    }
    if (!next_schedule(trace, 0, bound, prefix)) return result;
  }
}

void run_pool(const ResizeConfig& c, int default_bound) {
  const int bound = preemption_bound(default_bound);
  const auto t0 = std::chrono::steady_clock::now();
  const Explored e = explore_pool(c, bound);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(std::string(c.name) << ": " << e.schedules << " schedules reaching " << e.outcomes << " of the "
                              << e.serial_outcomes << " outcomes of serial orders, at most " << e.max_steps
                              << " decisions, preemption bound " << bound << ", " << s << " s");
  CHECK_MESSAGE(e.failure.empty(), std::string(c.name) << ": " << e.failure);
}

/// 256-byte pages: `device_pages` and `host_pages` to start with, a reserve of `device_reserve` and `host_reserve`.
ps::PoolConfig small_pool(std::int64_t device_pages, std::int64_t host_pages, std::int64_t device_reserve,
                          std::int64_t host_reserve) {
  ps::PoolConfig p;
  p.page_bytes = 256;
  p.device_pages = device_pages;
  p.host_pages = host_pages;
  p.device_reserve = device_reserve;
  p.host_reserve = host_reserve;
  return p;
}

}  // namespace

TEST_CASE("launch explorer: two launches of two blocks, every pair of operations") {
  const LaunchOp ops[] = {LaunchOp::stash_first, LaunchOp::reload, LaunchOp::discard};
  for (const bool before : {false, true})
    for (const LaunchOp a : ops)
      for (const LaunchOp b : ops) {
        const std::string name =
            std::string(before ? "stashed, " : "empty, ") + name_of(a) + " x2 | " + name_of(b) + " x2";
        run(Config{name.c_str(), before, {launch_of(a, 2), launch_of(b, 2)}}, 2);
      }
}

TEST_CASE("launch explorer: launch ids at the top of the 64-bit range") {
  run(Config{"stash x2 | reload x2, ids from 2^62 + 5",
             false,
             {launch_of(LaunchOp::stash_first, 2), launch_of(LaunchOp::reload, 2)},
             0x4000000000000005ull},
      2);
}

// Bound 1: bound 2 takes three and a half minutes on two cores (PAGESTASH_EXPLORER_BOUND=2, by hand).
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

// By the order of the lock: a stash before the grow and the reload overflows (1 device + 1 host page free), after
// the reload alone it spills to the host page, after the grow it takes the new pages.
TEST_CASE("launch explorer: a pool grows while a reload returns pages and a stash takes them") {
  run_pool(ResizeConfig{"2 + 1 pages (reserve 5 + 2), 2 held: reload (2 pages) | stash (3) | grow to 5 + 2",
                        small_pool(2, 1, 5, 2),
                        {{LaunchOp::reload, 2}, {LaunchOp::stash_first, 3}},
                        true,
                        5,
                        2},
           2);
}

TEST_CASE("launch explorer: a pool grows while a discard returns pages and two stashes take them") {
  run_pool(ResizeConfig{"2 + 1 pages (reserve 5 + 2), 2 held: discard | stash (2) | stash (2) | grow to 5 + 2",
                        small_pool(2, 1, 5, 2),
                        {{LaunchOp::discard, 2}, {LaunchOp::stash_first, 2}, {LaunchOp::stash_first, 2}},
                        true,
                        5,
                        2},
           2);
}

// A shrink is done only where every page is back (after the reload, before the stash; before both stashes), else
// refused with nothing changed; a stash after it finds fewer pages.
TEST_CASE("launch explorer: a pool shrinks while a reload returns pages and stashes take them") {
  run_pool(ResizeConfig{"4 + 1 pages (reserve 6 + 2), 2 held: reload (2) | stash (2) | shrink to 2 + 1",
                        small_pool(4, 1, 6, 2),
                        {{LaunchOp::reload, 2}, {LaunchOp::stash_first, 2}},
                        false,
                        2,
                        1},
           2);
  run_pool(ResizeConfig{"4 + 1 pages (reserve 6 + 2), empty: stash (2) | stash (2) | shrink to 2 + 1",
                        small_pool(4, 1, 6, 2),
                        {{LaunchOp::stash_first, 2}, {LaunchOp::stash_first, 2}},
                        false,
                        2,
                        1},
           2);
}
