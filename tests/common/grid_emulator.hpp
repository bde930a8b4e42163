#pragma once
// A host grid emulator: runs one "launch" of the kernel body (execution/operation.hpp) as
// B blocks x T threads on host threads, so that what depends on several blocks, several
// threads per block and 32 lanes a warp runs without a GPU, under ThreadSanitizer too.
//
//   - a block is a team of T host threads with a real barrier for sync() / publish() /
//     share(); its warps are 32 emulated lanes each (one host thread per lane, as SIMT);
//     where the launch counts rather than explores (LaunchShape::fibers), the T threads are
//     fibers of one host thread, switched at the block's barriers (FiberBlock);
//   - `slots` blocks are resident at once (one team of T threads each); the B blocks start
//     in a shuffled order, slot after slot, so there may be more blocks than resident ones
//     and some start late (optionally after a random delay, or after a caller's hook);
//   - an adversarial schedule (PreemptAtAtomics, LaunchShape::before_start) preempts
//     threads at the library's device atomics and fences and holds blocks back until
//     another launch has finished, so that block orders a GPU can produce and a plain run
//     rarely does (a launch's blocks straddling another launch) are tried under many seeds;
//   - the body reads the device policy of host code (stash/policy.hpp, StashPolicy: sm_90's
//     tiles, claims and loads in flight), as a GPU's kernel reads its architecture's; B and
//     T are the LaunchShape's.
//
// What it cannot show: the CUDA memory model itself (host atomics and a mutex barrier are
// stronger than fences and bar.sync), warp-synchronous behaviour, and timing. What it can
// count, exactly, is what a launch costs on the device besides its copies (LaunchCost):
// atomics on each 128-byte line, fences and barriers.

#include <pagestash/pagestash.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__linux__)
#  include <linux/futex.h>
#  include <sys/mman.h>
#  include <sys/syscall.h>
#  include <ucontext.h>
#  include <unistd.h>
#endif

#if defined(__SANITIZE_THREAD__)
#  define PAGESTASH_TEST_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#  define PAGESTASH_TEST_ASAN 1
#endif
#if defined(__has_feature)
#  if __has_feature(thread_sanitizer)
#    define PAGESTASH_TEST_TSAN 1
#  endif
#  if __has_feature(address_sanitizer)
#    define PAGESTASH_TEST_ASAN 1
#  endif
#endif
#if defined(PAGESTASH_TEST_ASAN)
#  include <sanitizer/asan_interface.h>
#  include <sanitizer/common_interface_defs.h>
#endif

namespace pagestash_test {

namespace ps = pagestash;

/// Which emulated block, warp and lane the calling host thread (or fiber) runs, and where its lane is in
/// its sequence of accesses (SectorCounter's key): set when the thread starts a block.
struct EmulatedThread {
  std::int64_t block = -1;
  int warp = 0;
  std::int64_t tile = 0;             ///< spans begun by this lane in this block
  std::int64_t claim = 0;            ///< the warp claim of its span (its first tile / tiles_per_warp_claim)
  std::int64_t ordinal[2][17] = {};  ///< [store][bytes]: accesses of that kind in this tile
  std::int64_t rounds = 0;           ///< dependent rounds of this lane in this tile (RoundCounter)
  bool loading = false;              ///< loads since the last round ended
  // CriticalPath's: this thread's path so far (after the block's barriers joined it), its barriers in this block.
  std::int64_t path_accesses = 0, path_fences = 0;
  std::int64_t syncs = 0;
  bool polling = false;     ///< paused in a poll: its further loads are the same wait
  int round = 0;            ///< in a OneRound: 1, and 2 once its first access is counted
  bool loaded = false;      ///< has made a data load in this block
  bool data_round = false;  ///< data loads issued since this lane last used any (the launch's chain)
  // SectorCounter's: the counter (by serial number) this thread last kept its accesses for, and its list there.
  std::uint64_t sector_counter = 0;
  void* sector_list = nullptr;
};

/// Whether a launch may run each block's threads as fibers of one host thread (LaunchShape::fibers): on Linux, and not
/// under ThreadSanitizer (which must see the threads as threads). AddressSanitizer is told of each switch.
#if defined(__linux__) && !defined(PAGESTASH_TEST_TSAN)
inline constexpr bool fibers_available = true;
#else
inline constexpr bool fibers_available = false;
#endif

/// The threads of one emulated block as fibers of the calling host thread (ucontext), run one at a time: a fiber runs
/// until it waits at a barrier (HostBarrier yields to the next), so a barrier of n threads costs n switches in the
/// process, not n sleeps and wakes of host threads. The counting tools run on it (a warp's 32 lanes as 32 host
/// threads on two cores spent most of their time in the kernel's scheduler), and so does the launch explorer, which
/// picks each next fiber itself (yield_to, end_to). The adversarial schedules (PreemptAtAtomics), and anything under
/// ThreadSanitizer, keep host threads.
class FiberBlock {
 public:
  static constexpr std::size_t stack_bytes = 256 * 1024;

  /// The fiber block the calling host thread runs (null: none, a plain host thread).
  static FiberBlock*& current() {
    thread_local FiberBlock* running = nullptr;
    return running;
  }

#if defined(__linux__)
  FiberBlock(int n, std::function<void(int)> body) : body_(std::move(body)), fibers_(static_cast<std::size_t>(n)) {}
  ~FiberBlock() {
    for (Fiber& f : fibers_)
      if (f.stack != nullptr) Stacks::mine().put(f.stack);
  }
  FiberBlock(const FiberBlock&) = delete;
  FiberBlock& operator=(const FiberBlock&) = delete;

  /// Runs body(0), ..., body(n - 1) to their ends on the calling thread.
  void run() {
    for (Fiber& f : fibers_) {
      f.stack = Stacks::mine().get();
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack;
      f.context.uc_stack.ss_size = stack_bytes;
      f.context.uc_link = nullptr;
      makecontext(&f.context, &FiberBlock::entry, 0);
    }
    alive_ = static_cast<int>(fibers_.size());
    current() = this;
    running_ = 0;
    switch_to(&main_, &main_fake_, fibers_[0]);
    current() = nullptr;
  }

  /// To the next fiber that has not ended (round robin); back here when it is this one's turn again.
  void yield() { yield_to(next_alive(running_)); }
  /// To fiber `k` (one that has not ended), chosen by the caller; back here when a fiber switches to this one.
  void yield_to(int k) {
    const int from = running_;
    if (k == from) return;
    running_ = k;
    Fiber& f = fibers_[static_cast<std::size_t>(from)];
    switch_to(&f.context, &f.fake_stack, fibers_[static_cast<std::size_t>(k)]);
  }
  /// The fiber to run when the running one's body returns (one that has not ended), instead of the next in turn.
  void end_to(int k) { end_to_ = k; }

  /// The running fiber's emulated-thread state (emulated_thread()).
  EmulatedThread& thread_state() { return fibers_[static_cast<std::size_t>(running_)].state; }

 private:
  struct Fiber {
    ucontext_t context{};
    void* stack = nullptr;
    bool ended = false;
    EmulatedThread state;
    void* fake_stack = nullptr;  ///< AddressSanitizer's, kept while the fiber is switched out
  };

  /// The calling thread's stacks that fibers have ended on, for its next fibers: three system calls fewer a fiber (the
  /// launch explorer starts a few hundred thousand).
  class Stacks {
   public:
    static Stacks& mine() {
      thread_local Stacks stacks;
      return stacks;
    }
    /// A stack with a guard page below it: an overflow faults, never writes into another fiber's stack.
    void* get() {
      if (spare_.empty()) {
        void* s =
            mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (s == MAP_FAILED || mprotect(s, 4096, PROT_NONE) != 0) throw std::runtime_error("FiberBlock: no stack");
        return s;
      }
      void* s = spare_.back();
      spare_.pop_back();
#  if defined(PAGESTASH_TEST_ASAN)
      // The frames of the fiber that ended on it left their redzones poisoned.
      __asan_unpoison_memory_region(static_cast<char*>(s) + 4096, stack_bytes - 4096);
#  endif
      return s;
    }
    void put(void* s) {
      if (spare_.size() < max_spare) spare_.push_back(s);
      else munmap(s, stack_bytes);
    }
    ~Stacks() {
      for (void* s : spare_) munmap(s, stack_bytes);
    }

   private:
    static constexpr std::size_t max_spare = 1024;  ///< two emulated blocks of 512 threads
    std::vector<void*> spare_;
  };

  /// From the running context (`from`; its fake stack kept in *fake) to fiber `to`, until something switches back.
  static void switch_to(ucontext_t* from, void** fake, const Fiber& to) {
#  if defined(PAGESTASH_TEST_ASAN)
    __sanitizer_start_switch_fiber(fake, to.stack, stack_bytes);
#  endif
    swapcontext(from, &to.context);
#  if defined(PAGESTASH_TEST_ASAN)
    __sanitizer_finish_switch_fiber(*fake, nullptr, nullptr);
#  else
    (void)fake;
#  endif
  }
  /// From an ended fiber to `to` (or the caller of run(), its stack [bottom, bottom + size)), for good.
  [[noreturn]] static void leave_for(const ucontext_t* to, const void* bottom, std::size_t size) {
#  if defined(PAGESTASH_TEST_ASAN)
    __sanitizer_start_switch_fiber(nullptr, bottom, size);  // null: the ended fiber's fake stack is freed
#  else
    (void)bottom, (void)size;
#  endif
    setcontext(to);
    std::abort();
  }

  static void entry() {
    FiberBlock& b = *current();
#  if defined(PAGESTASH_TEST_ASAN)
    const void* from_bottom = nullptr;
    std::size_t from_size = 0;
    __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
    if (b.main_bottom_ == nullptr) b.main_bottom_ = from_bottom, b.main_size_ = from_size;  // fiber 0, from run()
#  endif
    const int me = b.running_;
    try {
      b.body_(me);
    } catch (const std::exception& e) {  // as in a host thread: the block's other threads would wait for ever
      std::fprintf(stderr, "FiberBlock: a thread threw: %s\n", e.what());
      std::abort();
    }
    b.fibers_[static_cast<std::size_t>(me)].ended = true;
    if (--b.alive_ == 0) leave_for(&b.main_, b.main_bottom_, b.main_size_);
    b.running_ = b.end_to_ >= 0 ? b.end_to_ : b.next_alive(me);
    b.end_to_ = -1;
    const Fiber& next = b.fibers_[static_cast<std::size_t>(b.running_)];
    leave_for(&next.context, next.stack, stack_bytes);
  }
  int next_alive(int from) const {
    const int n = static_cast<int>(fibers_.size());
    for (int k = 1; k <= n; ++k) {
      const int i = (from + k) % n;
      if (!fibers_[static_cast<std::size_t>(i)].ended) return i;
    }
    return from;
  }

  std::function<void(int)> body_;
  std::vector<Fiber> fibers_;
  ucontext_t main_{};
  void* main_fake_ = nullptr;
  const void* main_bottom_ = nullptr;  ///< the caller's stack (AddressSanitizer's)
  std::size_t main_size_ = 0;
  int running_ = 0, alive_ = 0, end_to_ = -1;
#else
  FiberBlock(int, std::function<void(int)>) { throw std::logic_error("FiberBlock: not on this platform"); }
  void run() {}
  void yield() {}
  void yield_to(int) {}
  void end_to(int) {}
  EmulatedThread& thread_state() { throw std::logic_error("FiberBlock: not on this platform"); }
#endif
};

/// A reusable barrier of n threads (C++17 has no std::barrier). The emulator's blocks are
/// many more threads than cores, and nearly all of a launch's time is spent here: on Linux a
/// waiter sleeps on the phase word itself (one futex wait, one wake for all), where a mutex
/// and condition variable would wake every waiter into the mutex again. The arrival's
/// acq_rel read-modify-write and the phase's release/acquire order the block's memory, as
/// ThreadSanitizer sees (it does not see the futex).
class HostBarrier {
 public:
  explicit HostBarrier(int n) : n_(n) {}
  void wait() {
    const unsigned phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);  // before the phase: no one arrives again before it
      phase_.store(phase + 1, std::memory_order_release);
      wake_all();
      return;
    }
    while (phase_.load(std::memory_order_acquire) == phase) {
      if (FiberBlock* fibers = FiberBlock::current()) fibers->yield();  // a fiber: the block's next thread runs
      else sleep_while(phase);
    }
  }

 private:
#if defined(__linux__)
  // The futex word is the atomic's unsigned: its object representation (static_asserts).
  static_assert(sizeof(std::atomic<unsigned>) == sizeof(unsigned) && std::atomic<unsigned>::is_always_lock_free);
  void sleep_while(unsigned phase) {
    syscall(SYS_futex, reinterpret_cast<unsigned*>(&phase_), FUTEX_WAIT_PRIVATE, phase, nullptr, nullptr, 0);
  }
  void wake_all() {
    syscall(SYS_futex, reinterpret_cast<unsigned*>(&phase_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }
#else
  void sleep_while(unsigned phase) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return phase_.load(std::memory_order_acquire) != phase; });
  }
  void wake_all() {
    { std::lock_guard<std::mutex> lock(m_); }  // a waiter between its check and its sleep sees the phase
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
#endif
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> phase_{0};
};

/// What one launch costs besides its copies, counted as the device would execute it: the
/// device-scope atomics of every thread (per 128-byte line: same-line read-modify-writes
/// serialise in the L2), device-scope fences and block barriers (each counted once per
/// block, as a block executes it once).
struct LaunchCost {
  std::int64_t blocks = 0;
  std::int64_t rmw = 0;               ///< atomic read-modify-writes, all lines
  std::int64_t loads = 0;             ///< atomic loads (polls included)
  std::int64_t stores = 0;            ///< atomic stores
  std::int64_t busiest_line_rmw = 0;  ///< read-modify-writes on the busiest 128-byte line
  std::int64_t fences = 0;            ///< device-scope fences, per block
  std::int64_t barriers = 0;          ///< block barriers, per block

  double per_block(std::int64_t n) const { return blocks ? static_cast<double>(n) / static_cast<double>(blocks) : 0; }
};

/// Counts the atomics and fences of the library's code (through its atomic observer) and
/// the emulated blocks' barriers and publishes, while it lives. One at a time.
class CostCounter {
 public:
  CostCounter() {
    ps::atomic_observer().set(&CostCounter::observe, this);
    active() = this;
  }
  ~CostCounter() {
    ps::atomic_observer().clear();
    active() = nullptr;
  }
  CostCounter(const CostCounter&) = delete;
  CostCounter& operator=(const CostCounter&) = delete;

  /// The counter in use (null: none): the emulated teams count their barriers into it.
  static CostCounter*& active() {
    static CostCounter* counter = nullptr;
    return counter;
  }
  void count_barrier() { barriers_.fetch_add(1, std::memory_order_relaxed); }
  void count_fence() { fences_.fetch_add(1, std::memory_order_relaxed); }
  void count_block() { blocks_.fetch_add(1, std::memory_order_relaxed); }

  LaunchCost cost() const {
    std::lock_guard<std::mutex> lock(m_);
    LaunchCost c = totals_;
    for (const auto& line : line_rmw_) c.busiest_line_rmw = std::max(c.busiest_line_rmw, line.second);
    c.blocks = blocks_.load();
    c.fences += fences_.load();
    c.barriers = barriers_.load();
    return c;
  }

 private:
  static void observe(const void* address, ps::AtomicAccess access, void* context) {
    auto* self = static_cast<CostCounter*>(context);
    std::lock_guard<std::mutex> lock(self->m_);
    switch (access) {
      case ps::AtomicAccess::load: ++self->totals_.loads; break;
      case ps::AtomicAccess::store: ++self->totals_.stores; break;
      case ps::AtomicAccess::fence: ++self->totals_.fences; break;
      case ps::AtomicAccess::pause: break;       // not an access
      case ps::AtomicAccess::plain_load: break;  // not an atomic (CriticalPath counts it)
      case ps::AtomicAccess::round_begin:
      case ps::AtomicAccess::round_end: break;  // not accesses
      case ps::AtomicAccess::rmw:
        ++self->totals_.rmw;
        ++self->line_rmw_[reinterpret_cast<std::uintptr_t>(address) / 128];
        break;
    }
  }

  mutable std::mutex m_;
  LaunchCost totals_;
  std::unordered_map<std::uintptr_t, std::int64_t> line_rmw_;
  std::atomic<std::int64_t> blocks_{0}, fences_{0}, barriers_{0};
};

inline EmulatedThread& emulated_thread() {
  if (FiberBlock* fibers = FiberBlock::current()) return fibers->thread_state();
  thread_local EmulatedThread t;
  return t;
}

/// A lane begins a span whose first tile is `first_tile` (the tile observation's `bytes`): its claim is that tile's.
inline void begin_span(EmulatedThread& t, int first_tile) {
  ++t.tile;
  t.claim = first_tile / ps::StashPolicy::tiles_per_warp_claim;
}

/// A counter of the lanes' vector accesses that does not take the vector observer: another feeds it.
struct Unobserved {};

/// Counts the 32-byte sectors and 128-byte lines each warp-wide access touches (what Nsight
/// Compute calls sectors per request), through the library's vector observer: a warp's lanes
/// make the same accesses in the same order within a tile (one instruction: the n-th load or
/// store of a size by each lane since the tile began; a store the lane was off for counts its
/// place), so the accesses of one instruction are those with the same block, warp, tile, kind,
/// size and n. One at a time.
class SectorCounter {
 public:
  struct Count {
    std::int64_t requests = 0, sectors = 0, lines = 0, bytes = 0;
    double sectors_per_request() const { return ratio(sectors, requests); }
    double lines_per_request() const { return ratio(lines, requests); }
    /// Of each sector touched, the share its request used (1: whole sectors).
    double sector_use() const { return ratio(bytes, 32 * sectors); }
    static double ratio(std::int64_t a, std::int64_t b) {
      return b ? static_cast<double>(a) / static_cast<double>(b) : 0;
    }
  };

  SectorCounter() { ps::vector_observer().set(&SectorCounter::observe, this); }
  /// One that another observer feeds (RoundsAndSectors).
  explicit SectorCounter(Unobserved) : observed_(false) {}
  ~SectorCounter() {
    if (observed_) ps::vector_observer().clear();
  }
  SectorCounter(const SectorCounter&) = delete;
  SectorCounter& operator=(const SectorCounter&) = delete;

  Count loads() const { return counts()[0]; }
  Count stores() const { return counts()[1]; }

  // The observer's steps, for one that feeds several counters: after the lane's tile count steps, and each access.
  void begin_tile(EmulatedThread& t) { std::memset(t.ordinal, 0, sizeof t.ordinal); }
  void access(EmulatedThread& t, const void* address, int bytes, ps::VectorAccess access) {
    if (access == ps::VectorAccess::use) return;
    const bool store = access == ps::VectorAccess::store;
    if (bytes > 16) {  // a bulk copy (stash/bulk_copy.hpp: one lane's, of more than a vector): a request of its own
      std::lock_guard<std::mutex> lock(m_);
      bulk_.push_back(Bulk{store, reinterpret_cast<std::uintptr_t>(address), bytes});
      return;
    }
    const std::int64_t n = t.ordinal[store][bytes]++;
    if (address == nullptr) return;  // the lane off for this instruction: its place in the lane's sequence, no access
    // Each thread keeps its accesses in its own list (no lock but the first time): a row's millions of them.
    if (t.sector_counter != serial_) {
      std::lock_guard<std::mutex> lock(m_);
      lists_.push_back(std::make_unique<std::vector<Access>>());
      t.sector_counter = serial_, t.sector_list = lists_.back().get();
    }
    static_cast<std::vector<Access>*>(t.sector_list)
        ->push_back(
            Access{request(store, t.block, t.warp, t.tile, bytes, n), reinterpret_cast<std::uintptr_t>(address)});
  }

 private:
  /// One lane's access: its instruction (the request: store, block, warp, tile, bytes, n, packed in 64 bits, stores
  /// last) and address. 16 bytes: a row's millions of them are kept until counted.
  struct Access {
    std::uint64_t request;
    std::uintptr_t address;
    bool operator<(const Access& o) const { return request != o.request ? request < o.request : address < o.address; }
  };
  struct Bulk {
    bool store;
    std::uintptr_t address;
    int bytes;
  };
  static std::uint64_t request(bool store, std::int64_t block, int warp, std::int64_t tile, int bytes, std::int64_t n) {
    std::uint64_t key = store;
    const auto field = [&key](std::int64_t value, int bits) {
      if (value < 0 || value >= (std::int64_t{1} << bits)) throw std::runtime_error("SectorCounter: a field overflows");
      key = key << bits | static_cast<std::uint64_t>(value);
    };
    field(block, 19), field(warp, 5), field(tile, 22), field(bytes, 5), field(n, 12);
    return key;
  }

  static void observe(const void* address, int bytes, ps::VectorAccess access, void* context) {
    if (access == ps::VectorAccess::prefetch) return;  // a hint, no request of the copy
    EmulatedThread& t = emulated_thread();
    auto* self = static_cast<SectorCounter*>(context);
    if (access == ps::VectorAccess::tile) {
      begin_span(t, bytes);
      self->begin_tile(t);
    } else {
      self->access(t, address, bytes, access);
    }
  }

  /// The loads' and the stores' counts, made once (call only while no operation runs: the lists are the threads').
  const std::array<Count, 2>& counts() const {
    std::lock_guard<std::mutex> lock(m_);
    if (counted_) return counts_;
    counted_ = true;
    std::vector<Access> all;
    for (const auto& list : lists_) all.insert(all.end(), list->begin(), list->end());
    std::sort(all.begin(), all.end());
    for (std::size_t i = 0; i < all.size();) {
      Count& c = counts_[all[i].request >> 63];
      const auto bytes = static_cast<std::uintptr_t>(all[i].request >> 12 & 31);
      std::uintptr_t last_sector = 0, last_line = 0, last_address = 0;
      ++c.requests;
      // The request's distinct addresses, ascending (lanes that read one address share its bytes): each sector and
      // line once.
      std::size_t j = i;
      for (; j < all.size() && all[j].request == all[i].request; ++j) {
        const std::uintptr_t a = all[j].address;
        if (j > i && a == last_address) continue;
        c.bytes += static_cast<std::int64_t>(bytes);
        for (std::uintptr_t sector = a / 32; sector <= (a + bytes - 1) / 32; ++sector)
          if (j == i || sector > last_sector) ++c.sectors, last_sector = sector;
        for (std::uintptr_t line = a / 128; line <= (a + bytes - 1) / 128; ++line)
          if (j == i || line > last_line) ++c.lines, last_line = line;
        last_address = a;
      }
      i = j;
    }
    for (const Bulk& b : bulk_) {
      Count& c = counts_[b.store];
      ++c.requests;
      c.bytes += b.bytes;
      const auto last = b.address + static_cast<std::uintptr_t>(b.bytes) - 1;
      c.sectors += static_cast<std::int64_t>(last / 32 - b.address / 32 + 1);
      c.lines += static_cast<std::int64_t>(last / 128 - b.address / 128 + 1);
    }
    return counts_;
  }

  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
  }

  bool observed_ = true;
  const std::uint64_t serial_ = next_serial();
  mutable std::mutex m_;
  std::vector<std::unique_ptr<std::vector<Access>>> lists_;
  std::vector<Bulk> bulk_;
  mutable bool counted_ = false;
  mutable std::array<Count, 2> counts_{};
};

/// Counts the dependent rounds of each warp through the library's vector observer (docs/design.md's glossary, "round"):
/// a lane's round is a run of its loads that ends where the lane uses them (a store, or the copy engine's `use` where
/// it merges loaded words before it loads more): loads in one round are in flight together, each round waits a memory
/// latency. A span's rounds (a tile's, or those of a warp's tiles that one span moves: resolve_tile) are its slowest
/// lane's (a warp's lanes run in step); a warp's are the sum over the spans of one claim (StashPolicy::
/// tiles_per_warp_claim consecutive tiles, moved in turn: a warp's whole work when a launch's tiles fit its warps'
/// first claims, as on a GPU a fine-grained stash's do). One at a time (the vector observer).
class RoundCounter {
 public:
  struct Count {
    std::int64_t warps = 0;     ///< warp claims that moved a tile
    std::int64_t spans = 0;     ///< spans moved
    std::int64_t max_warp = 0;  ///< rounds of the slowest warp claim
    std::int64_t max_span = 0;  ///< rounds of the slowest span
    std::int64_t rounds = 0;    ///< of all claims
    double mean_warp() const { return warps ? static_cast<double>(rounds) / static_cast<double>(warps) : 0; }
  };

  RoundCounter() { ps::vector_observer().set(&RoundCounter::observe, this); }
  /// One that another observer feeds (RoundsAndSectors).
  explicit RoundCounter(Unobserved) : observed_(false) {}
  ~RoundCounter() {
    if (observed_) ps::vector_observer().clear();
  }
  RoundCounter(const RoundCounter&) = delete;
  RoundCounter& operator=(const RoundCounter&) = delete;

  Count count() const {
    std::lock_guard<std::mutex> lock(m_);
    Count c;
    // (block, warp, claim): rounds of its spans.
    std::map<Key, std::int64_t> warps;
    for (const auto& [key, span] : spans_) {
      ++c.spans;
      c.max_span = std::max(c.max_span, span.rounds);
      warps[Key{std::get<0>(key), std::get<1>(key), span.claim}] += span.rounds;
    }
    for (const auto& w : warps) {
      ++c.warps;
      c.rounds += w.second;
      c.max_warp = std::max(c.max_warp, w.second);
    }
    return c;
  }

  // The observer's steps, for one that feeds several counters: before and after the lane's tile count steps, and each
  // access.
  void end_tile(EmulatedThread& t) {
    if (t.loading) end_round(t);  // loads never used: a round of the tile they belong to
  }
  void begin_tile(EmulatedThread& t) {
    t.rounds = 0;
    std::lock_guard<std::mutex> lock(m_);
    spans_.emplace(Key{t.block, t.warp, t.tile}, Span{t.claim, 0});  // a span of no loads has none
  }
  void access(EmulatedThread& t, ps::VectorAccess access) {
    if (access == ps::VectorAccess::load) t.loading = true;
    else if (t.loading) end_round(t);
  }

 private:
  using Key = std::tuple<std::int64_t, int, std::int64_t>;  // block, warp, span (or claim)
  struct Span {
    std::int64_t claim, rounds;
  };

  static void observe(const void*, int bytes, ps::VectorAccess access, void* context) {
    if (access == ps::VectorAccess::prefetch) return;  // a hint: nothing waits for it
    EmulatedThread& t = emulated_thread();
    auto* self = static_cast<RoundCounter*>(context);
    if (access == ps::VectorAccess::tile) {
      self->end_tile(t);
      begin_span(t, bytes);
      self->begin_tile(t);
    } else {
      self->access(t, access);
    }
  }
  void end_round(EmulatedThread& t) {
    t.loading = false;
    ++t.rounds;
    std::lock_guard<std::mutex> lock(m_);
    std::int64_t& r = spans_[Key{t.block, t.warp, t.tile}].rounds;
    r = std::max(r, t.rounds);
  }

  bool observed_ = true;
  mutable std::mutex m_;
  std::map<Key, Span> spans_;
};

/// Rounds and sectors counted in one emulated run (the one vector observer feeds both, a lane's tile begun once).
struct RoundsAndSectors {
  RoundCounter rounds{Unobserved{}};
  SectorCounter sectors{Unobserved{}};

  RoundsAndSectors() { ps::vector_observer().set(&RoundsAndSectors::observe, this); }
  ~RoundsAndSectors() { ps::vector_observer().clear(); }
  RoundsAndSectors(const RoundsAndSectors&) = delete;
  RoundsAndSectors& operator=(const RoundsAndSectors&) = delete;

 private:
  static void observe(const void* address, int bytes, ps::VectorAccess access, void* context) {
    if (access == ps::VectorAccess::prefetch) return;  // as each counter
    EmulatedThread& t = emulated_thread();
    auto* self = static_cast<RoundsAndSectors*>(context);
    if (access == ps::VectorAccess::tile) {
      self->rounds.end_tile(t);
      begin_span(t, bytes);
      self->rounds.begin_tile(t);
      self->sectors.begin_tile(t);
    } else {
      self->rounds.access(t, access);
      self->sectors.access(t, address, bytes, access);
    }
  }
};

/// Preemption at every device atomic and fence of the library's code (through its atomic
/// observer): a thread yields or sleeps a few microseconds there, with a seeded chance, as a
/// GPU deschedules a warp at any instruction, so that other blocks and launches run in
/// between. One at a time (it is the process's observer, as CostCounter is).
class PreemptAtAtomics {
 public:
  explicit PreemptAtAtomics(std::uint32_t seed, int percent = 30) : seed_(seed), percent_(percent) {
    ps::atomic_observer().set(&PreemptAtAtomics::observe, this);
  }
  ~PreemptAtAtomics() { ps::atomic_observer().clear(); }
  PreemptAtAtomics(const PreemptAtAtomics&) = delete;
  PreemptAtAtomics& operator=(const PreemptAtAtomics&) = delete;

 private:
  static void observe(const void*, ps::AtomicAccess access, void* context) {
    if (access == ps::AtomicAccess::plain_load || access == ps::AtomicAccess::round_begin ||
        access == ps::AtomicAccess::round_end)
      return;  // not an atomic: no preemption point
    const auto* self = static_cast<const PreemptAtAtomics*>(context);
    // Per thread: the seed, this thread and its count of accesses (splitmix64).
    thread_local std::uint64_t state = 0;
    thread_local std::uint32_t seeded_for = 0;
    if (state == 0 || seeded_for != self->seed_) {
      seeded_for = self->seed_;
      state = (std::uint64_t{self->seed_} << 32) ^ std::hash<std::thread::id>{}(std::this_thread::get_id()) ^ 1;
    }
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const int roll = static_cast<int>(z % 100);
    if (roll >= self->percent_) return;
    if (roll % 2 == 0) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds((z >> 8) % 40));
  }

  std::uint32_t seed_;
  int percent_;
};

/// What the 32 lanes of an emulated warp share: a barrier, each lane's values, for max_over and share, and the warp's
/// stage (its shared memory, stash/copy.hpp's staged mover).
struct EmulatedWarp {
  static constexpr int max_values = 8;
  HostBarrier barrier{32};
  std::uint32_t values[32][max_values] = {};
  std::int64_t path[2] = {};                   ///< lane 0's critical path at a share (CriticalPath)
  std::array<std::int64_t, 2> paths[32] = {};  ///< each lane's at max_over
  alignas(16) unsigned char stage[ps::StashPolicy::stage_bytes] = {};
};

/// What the threads of one resident block share: the barrier, share()'s slot and its warps'.
struct EmulatedBlock {
  explicit EmulatedBlock(int n)
      : threads(n), barrier(n), sums(static_cast<std::size_t>(n)),
        warps(new EmulatedWarp[static_cast<std::size_t>((n + 31) / 32)]) {}
  int threads;
  HostBarrier barrier;
  alignas(16) unsigned char slot[64] = {};
  std::vector<std::int64_t> sums;  ///< one per thread, for exclusive_sum
  std::unique_ptr<EmulatedWarp[]> warps;
  /// CriticalPath's: each thread's path (accesses, fences) at a barrier, alternating between two sets by the barrier's
  /// parity (a thread writes the set of barrier k + 2 only after every thread passed barrier k + 1, so done reading k).
  std::vector<std::array<std::int64_t, 2>> paths[2] = {std::vector<std::array<std::int64_t, 2>>(sums.size()),
                                                       std::vector<std::array<std::int64_t, 2>>(sums.size())};
};

inline std::atomic<bool>& critical_path_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline bool critical_path_active() { return critical_path_flag().load(std::memory_order_relaxed); }

/// A block team of host threads (the Team interface of detail/team.hpp).
struct EmulatedTeam {
  EmulatedBlock* block;
  int r;
  int rank() const { return r; }
  int size() const { return block->threads; }
  bool leader() const { return r == 0; }
  void sync() const {
    if (r == 0 && CostCounter::active() != nullptr) CostCounter::active()->count_barrier();
    const bool path = critical_path_active();
    if (path) path_arrive();
    block->barrier.wait();
    if (path) path_join();
  }
  /// The barrier's mutex orders the block, atomics the rest; on the device a block's publish is a barrier, before the
  /// leader's release.
  void publish() const { sync(); }
  template <class T>
  T share(T x) const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(EmulatedBlock::slot));
    sync();
    if (leader()) std::memcpy(block->slot, &x, sizeof(T));
    sync();
    T y;
    std::memcpy(&y, block->slot, sizeof(T));
    return y;
  }
  /// CriticalPath: at a barrier every thread's path becomes the longest of its block's (they all wait for it).
  void path_arrive() const {
    const EmulatedThread& t = emulated_thread();
    block->paths[t.syncs % 2][static_cast<std::size_t>(r)] = {t.path_accesses, t.path_fences};
  }
  void path_join() const {
    EmulatedThread& t = emulated_thread();
    for (const auto& p : block->paths[t.syncs % 2]) {
      if (p[0] + p[1] > t.path_accesses + t.path_fences) t.path_accesses = p[0], t.path_fences = p[1];
    }
    ++t.syncs;
  }
  std::int64_t exclusive_sum(std::int64_t x, std::int64_t& total) const {
    sync();  // the slots' previous use is over
    block->sums[static_cast<std::size_t>(r)] = x;
    block->barrier.wait();  // the scan's own (the device's second, before the warps' totals are read): not counted
    std::int64_t before = 0;
    total = 0;
    for (int k = 0; k < block->threads; ++k) {
      if (k == r) before = total;
      total += block->sums[static_cast<std::size_t>(k)];
    }
    return before;
  }
};

/// The 32 lanes of an emulated warp. max_over exchanges through the warp's values between
/// two barriers of its 32 threads, as a shuffle makes the warp converge.
struct EmulatedLanes {
  int lane;
  EmulatedWarp* warp;
  int rank() const { return lane; }
  static constexpr int size() { return 32; }
  unsigned char* stage() const { return warp->stage; }
  void sync_lanes() const { warp->barrier.wait(); }
  template <int N>
  void max_over(std::uint32_t (&x)[N], int group) const {
    static_assert(N <= EmulatedWarp::max_values);
    std::copy(x, x + N, warp->values[lane]);
    EmulatedThread& t = emulated_thread();
    warp->paths[lane] = {t.path_accesses, t.path_fences};
    warp->barrier.wait();
    const int first = lane & ~(group - 1);
    for (int k = 0; k < N; ++k)
      for (int j = first; j < first + group; ++j) x[k] = std::max(x[k], warp->values[j][k]);
    for (int j = first; j < first + group; ++j) {  // CriticalPath: the lanes wait for each other
      const auto& p = warp->paths[j];
      if (p[0] + p[1] > t.path_accesses + t.path_fences) t.path_accesses = p[0], t.path_fences = p[1];
    }
    warp->barrier.wait();  // every lane has read before any writes again
  }
  /// The sum of x over the lanes before this one, and over the warp in `total`, through the warp's values (a
  /// shuffle scan on the device); the lanes' critical paths become the longest (they wait for each other).
  std::int64_t exclusive_sum(std::int64_t x, std::int64_t& total) const {
    static_assert(sizeof x <= sizeof(EmulatedWarp::values[0]));
    std::memcpy(warp->values[lane], &x, sizeof x);
    EmulatedThread& t = emulated_thread();
    warp->paths[lane] = {t.path_accesses, t.path_fences};
    warp->barrier.wait();
    std::int64_t before = 0;
    total = 0;
    for (int j = 0; j < 32; ++j) {
      std::int64_t v = 0;
      std::memcpy(&v, warp->values[j], sizeof v);
      if (j == lane) before = total;
      total += v;
      const auto& p = warp->paths[j];
      if (p[0] + p[1] > t.path_accesses + t.path_fences) t.path_accesses = p[0], t.path_fences = p[1];
    }
    warp->barrier.wait();  // every lane has read before any writes again
    return before;
  }
  /// Lane 0's x to every lane, through the warp's values (a shuffle on the device); the lanes' critical paths become
  /// lane 0's where it is longer (they wait for it).
  template <class T>
  T share(T x) const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(EmulatedWarp::values[0]));
    EmulatedThread& t = emulated_thread();
    if (lane == 0) {
      std::memcpy(warp->values[0], &x, sizeof(T));
      warp->path[0] = t.path_accesses, warp->path[1] = t.path_fences;
    }
    warp->barrier.wait();
    std::memcpy(&x, warp->values[0], sizeof(T));
    if (warp->path[0] + warp->path[1] > t.path_accesses + t.path_fences)
      t.path_accesses = warp->path[0], t.path_fences = warp->path[1];
    warp->barrier.wait();  // every lane has read before lane 0 writes again
    return x;
  }
};

using EmulatedContext = ps::GridContext<EmulatedTeam, EmulatedLanes>;

/// The critical path of one launch up to its first copy (issue 53), counted through the library's atomic and vector
/// observers and the emulated barriers: the round trips a thread waits on (dependent global accesses: atomic loads and
/// read-modify-writes, and the plain loads of a launch's bookkeeping that note_load reports: the record's header,
/// counts, items and page ids, the pool's counters and stacks; a poll counts once, however long it spins; stores are
/// posted, not waited on, and cost only at the next fence) and device fences, along the longest chain: a thread's
/// count grows with its own accesses, and at a block barrier every thread's becomes the longest of its block's.
/// Counted:
///   - the owner (the block that publishes the verdict): its path before that store;
///   - every other block: its path up to its first data load (the first, over its threads), a prefetch of the
///     look-ahead's (stash/look_ahead.hpp) or a copy's load, and up to its first copy load;
///   - block barriers between the verdict (its store, or a block's last poll of it) and the block's first copy load;
///   - the whole launch's chain, the copy's data rounds included (a lane's data loads up to where it uses them, one
///     round each, as RoundCounter counts them), and the bytes its lanes load: by Little's law a block keeps on
///     average loaded bytes / chain rounds in flight, one round a memory latency (the copy's duty: docs/benchmarks.md).
/// One at a time (it is the process's atomic and vector observer).
class CriticalPath {
 public:
  struct Path {
    std::int64_t accesses = 0, fences = 0;
    std::int64_t total() const { return accesses + fences; }
  };
  struct Count {
    bool decided = false;              ///< a block published the verdict
    Path owner;                        ///< before the verdict
    std::int64_t owner_barriers = -1;  ///< verdict to the owner's first copy load (-1: it loaded none)
    std::int64_t others = 0;           ///< other blocks that loaded data (a prefetch, or a copy's load)
    Path other;                        ///< the longest, before an other block's first data load
    Path other_copy;                   ///< the longest, before an other block's first copy load
    std::int64_t other_barriers = -1;  ///< the most, between verdict and an other block's first copy load
    std::int64_t chain = 0;            ///< the longest block's whole launch: accesses, fences and data rounds
    std::int64_t loaded_bytes = 0;     ///< of that block's data loads
    std::int64_t loaded_total = 0;     ///< every block's data loads, in bytes
    /// That block's data loads in flight on average, in bytes (one round a latency).
    double bytes_in_flight() const {
      return chain ? static_cast<double>(loaded_bytes) / static_cast<double>(chain) : 0;
    }
  };

  explicit CriticalPath(const void* verdict_word) : verdict_(verdict_word) {
    ps::atomic_observer().set(&CriticalPath::observe_atomic, this);
    ps::vector_observer().set(&CriticalPath::observe_vector, this);
    critical_path_flag().store(true);
  }
  ~CriticalPath() {
    critical_path_flag().store(false);
    ps::atomic_observer().clear();
    ps::vector_observer().clear();
  }
  CriticalPath(const CriticalPath&) = delete;
  CriticalPath& operator=(const CriticalPath&) = delete;

  Count count() const {
    std::lock_guard<std::mutex> lock(m_);
    Count c;
    for (const auto& [block, b] : blocks_) {
      // The owner's other warps may load before its leader's store: no barrier between, then.
      const std::int64_t barriers = std::max<std::int64_t>(0, b.copy_syncs - b.verdict_syncs);
      if (b.owner) {
        c.decided = true;
        c.owner = b.at_verdict;
        if (b.copied) c.owner_barriers = barriers;
      } else if (b.loaded) {
        ++c.others;
        if (b.first_load.total() > c.other.total()) c.other = b.first_load;
        if (b.copied && b.first_copy.total() > c.other_copy.total()) c.other_copy = b.first_copy;
        if (b.copied) c.other_barriers = std::max(c.other_barriers, barriers);
      }
      if (b.chain > c.chain) c.chain = b.chain, c.loaded_bytes = b.loaded_bytes;
      c.loaded_total += b.loaded_bytes;
    }
    return c;
  }

 private:
  struct Block {
    bool owner = false, loaded = false, copied = false;
    Path at_verdict, first_load, first_copy;
    std::int64_t verdict_syncs = 0, copy_syncs = 0;
    std::int64_t chain = 0, loaded_bytes = 0;
  };
  /// A thread's path so far extends its block's chain, its loads the block's bytes (at each access it observes: its
  /// path only grows).
  void extend(EmulatedThread& t, std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(m_);
    Block& b = blocks_[t.block];
    b.chain = std::max(b.chain, t.path_accesses + t.path_fences);
    b.loaded_bytes += bytes;
  }

  static void observe_atomic(const void* address, ps::AtomicAccess access, void* context) {
    EmulatedThread& t = emulated_thread();
    if (t.block < 0) return;  // not an emulated block's thread
    auto* self = static_cast<CriticalPath*>(context);
    const bool poll = t.polling && access == ps::AtomicAccess::load;  // the same wait, spinning
    if (access != ps::AtomicAccess::load) t.polling = false;
    // In a OneRound, only the first access waits.
    const bool together = t.round == 2;
    if (t.round == 1 && access != ps::AtomicAccess::round_end) t.round = 2;
    switch (access) {
      case ps::AtomicAccess::round_begin: t.round = 1; break;
      case ps::AtomicAccess::round_end: t.round = 0; break;
      case ps::AtomicAccess::pause: t.polling = true; break;
      case ps::AtomicAccess::fence: ++t.path_fences; break;
      case ps::AtomicAccess::store:
        if (address == self->verdict_) {
          std::lock_guard<std::mutex> lock(self->m_);
          Block& b = self->blocks_[t.block];
          b.owner = true;
          b.at_verdict = Path{t.path_accesses, t.path_fences};
          b.verdict_syncs = t.syncs;
        }
        break;
      case ps::AtomicAccess::load:
      case ps::AtomicAccess::rmw:
      case ps::AtomicAccess::plain_load:
        if (!poll && !together) ++t.path_accesses;
        if (address == self->verdict_ && access == ps::AtomicAccess::load) {
          std::lock_guard<std::mutex> lock(self->m_);
          self->blocks_[t.block].verdict_syncs = t.syncs;  // the last poll is the one that saw the verdict
        }
        break;
    }
    self->extend(t, 0);
  }
  static void observe_vector(const void*, int bytes, ps::VectorAccess access, void* context) {
    EmulatedThread& t = emulated_thread();
    if (t.block < 0 || access == ps::VectorAccess::tile) return;
    auto* self = static_cast<CriticalPath*>(context);
    if (access == ps::VectorAccess::prefetch) return self->first_data(t, false);  // a hint: no round waits for it
    if (access != ps::VectorAccess::load) {  // a store or a use ends the lane's data round
      if (t.data_round) ++t.path_accesses, t.data_round = false;
      return self->extend(t, 0);
    }
    t.data_round = true;
    if (t.loaded) return self->extend(t, bytes);
    self->extend(t, bytes);
    t.loaded = true;
    self->first_data(t, true);
  }
  /// A thread's first data access, a copy's load or (not `copy`) a prefetch: its path there.
  void first_data(const EmulatedThread& t, bool copy) {
    std::lock_guard<std::mutex> lock(m_);
    Block& b = blocks_[t.block];
    const Path p{t.path_accesses, t.path_fences};
    if (!b.loaded || p.total() < b.first_load.total()) b.first_load = p;
    b.loaded = true;
    if (!copy) return;
    if (!b.copied || p.total() < b.first_copy.total()) b.first_copy = p;
    if (!b.copied) b.copy_syncs = t.syncs;
    b.copied = true;
  }

  const void* verdict_;
  mutable std::mutex m_;
  std::map<std::int64_t, Block> blocks_;
};

/// n host threads kept for the process, that run fn(i), i < n, one call at a time.
/// Creating a thread is the dearest part of a launch (under TSan most of all), so the
/// emulator borrows sets of threads instead (several launches at once borrow several).
class HostThreads {
 public:
  explicit HostThreads(int n) : n_(n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { serve(i); });
  }
  ~HostThreads() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> lock(m_);
    job_ = &fn;
    running_ = n_;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

  /// Borrows a set of n threads (a new one when every set of n is busy) for fn.
  static void borrow(int n, const std::function<void(int)>& fn) {
    static std::mutex m;
    static std::vector<std::unique_ptr<HostThreads>> idle;
    std::unique_ptr<HostThreads> set;
    {
      std::lock_guard<std::mutex> lock(m);
      const auto it = std::find_if(idle.begin(), idle.end(), [n](const auto& s) { return s->n_ == n; });
      if (it != idle.end()) {
        set = std::move(*it);
        idle.erase(it);
      }
    }
    if (!set) set = std::make_unique<HostThreads>(n);
    set->run(fn);
    std::lock_guard<std::mutex> lock(m);
    idle.push_back(std::move(set));
  }

 private:
  void serve(int i) {
    unsigned seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(m_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(i);
      std::lock_guard<std::mutex> lock(m_);
      if (--running_ == 0) done_.notify_one();
    }
  }

  int n_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  unsigned generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
};

/// A new launch id, as %gridid gives each launch on a GPU (never 0).
inline std::uint64_t next_grid_id() {
  static std::atomic<std::uint64_t> ids{0};
  return ++ids;
}

struct LaunchShape {
  int blocks = 4;
  int threads = 64;           ///< per block, a multiple of 32
  int slots = 2;              ///< blocks resident at once
  std::uint32_t seed = 1;     ///< start order and delays
  bool random_delays = true;  ///< some blocks start after a short sleep
  /// Called by a slot's leader before the k-th block to start (k counts starts, 0-based).
  std::function<void(int)> before_start;
  /// The launch's id (GridContext::launch); 0: a new one (next_grid_id), as on a GPU.
  std::uint64_t launch = 0;
  /// Each block's threads as fibers of one host thread (FiberBlock), where fibers_available: the same accesses and
  /// barriers, a block's threads switched only at its barriers. For counting, not for exploring orders.
  bool fibers = false;
};

/// Runs body(ctx) on every thread of every block of one launch; returns when all are done.
template <class Body>
void emulate_launch(const LaunchShape& shape, Body&& body) {
  std::vector<int> order(static_cast<std::size_t>(shape.blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(shape.seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> delay_us(order.size());
  for (int& d : delay_us) d = shape.random_delays && rng() % 3 == 0 ? static_cast<int>(rng() % 200) : 0;

  std::atomic<int> next{0};
  const std::uint64_t launch = shape.launch != 0 ? shape.launch : next_grid_id();
  const int slots = std::max(1, std::min(shape.slots, shape.blocks));
  std::vector<std::unique_ptr<EmulatedBlock>> resident;
  for (int s = 0; s < slots; ++s) resident.push_back(std::make_unique<EmulatedBlock>(shape.threads));
  const auto run_thread = [&](int thread) {
    const int s = thread / shape.threads, r = thread % shape.threads;
    EmulatedBlock& block = *resident[static_cast<std::size_t>(s)];
    const EmulatedTeam team{&block, r};
    for (;;) {
      // The emulator's own barriers (a block's start and end) are not the kernel's: not counted.
      static_assert(sizeof(int) <= sizeof(EmulatedBlock::slot));
      block.barrier.wait();
      if (team.leader()) {
        int k = next.fetch_add(1);
        if (k < shape.blocks) {
          if (shape.before_start) shape.before_start(k);
          if (delay_us[static_cast<std::size_t>(k)] > 0)
            std::this_thread::sleep_for(std::chrono::microseconds(delay_us[static_cast<std::size_t>(k)]));
        }
        std::memcpy(block.slot, &k, sizeof k);
      }
      block.barrier.wait();
      int k = 0;
      std::memcpy(&k, block.slot, sizeof k);
      if (k >= shape.blocks) return;
      const EmulatedContext ctx{team,
                                EmulatedLanes{r % 32, &block.warps[static_cast<std::size_t>(r / 32)]},
                                order[static_cast<std::size_t>(k)],
                                shape.blocks,
                                r / 32,
                                shape.threads / 32,
                                launch};
      if (team.leader() && CostCounter::active() != nullptr) CostCounter::active()->count_block();
      emulated_thread() = EmulatedThread{order[static_cast<std::size_t>(k)], r / 32};
      body(ctx);
      block.barrier.wait();  // the block's threads leave together, as a block does
    }
  };
  if (shape.fibers && fibers_available) {
    HostThreads::borrow(slots, [&](int s) {
      FiberBlock fibers(shape.threads, [&](int r) { run_thread(s * shape.threads + r); });
      fibers.run();
    });
  } else {
    HostThreads::borrow(slots * shape.threads, run_thread);
  }
}

/// The operations through the emulator, on host-memory pools: the same host checks as the
/// executors, then one emulated launch of the kernel body.
struct Emulator {
  LaunchShape shape;

  template <class Tr>
  void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) const {
    ps::check_stash(ps::MemorySpace::host, pool, v, rec);
    launch<Tr, ps::Operation::stash>(pool, v, rec, {});
  }
  template <class Tr>
  void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
              bool zero_tail, bool poison = true) const {
    ps::check_reload(ps::MemorySpace::host, pool, rec, dest);
    launch<Tr, ps::Operation::reload>(pool, dest, rec, ps::ReloadOptions{zero_tail, poison});
  }
  template <class Tr>
  void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) const {
    ps::check_pool_and_record("discard", ps::MemorySpace::host, pool, rec);
    launch<Tr, ps::Operation::discard>(pool, rec.shape(), rec, {});
  }
  /// The report kernel is one block of 32 threads: write_report over its team.
  void report(const ps::PagePool& pool, ps::PoolStats* dst) const {
    LaunchShape one = shape;
    one.blocks = 1;
    one.threads = 32;
    one.slots = 1;
    const ps::PoolRef ref = pool.ref();
    emulate_launch(one, [&](const EmulatedContext& ctx) { ps::write_report(ctx.team, ref, dst); });
  }
  /// The reset kernel is one block: its body is reset_pool over the block's team.
  void end_step(ps::PagePool& pool) const {
    LaunchShape one = shape;
    one.blocks = 1;
    one.threads = 32;
    one.slots = 1;
    const ps::PoolRef ref = pool.ref();
    emulate_launch(one, [&](const EmulatedContext& ctx) { ps::check_balance(ctx.team, ref); });
  }

  void reset(ps::PagePool& pool) const {
    LaunchShape one = shape;
    one.blocks = 1;
    const ps::PoolRef ref = pool.ref();
    emulate_launch(one, [&](const EmulatedContext& ctx) { ps::reset_pool(ctx.team, ref); });
  }

  template <class Tr, ps::Operation Op>
  void launch(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec,
              ps::ReloadOptions options) const {
    launch<Tr, Op>(pool.ref(), v, rec.ref(), options);
  }
  /// One launch on the handles, with no host check: what runs where the host cannot tell
  /// a record of another pool (attached device objects).
  template <class Tr, ps::Operation Op>
  void launch(const ps::PoolRef& pool, const ps::GroupedView<typename Tr::layout>& v, const ps::RecordRef& rec,
              ps::ReloadOptions options) const {
    emulate_launch(shape, [&](const EmulatedContext& ctx) { ps::run_operation<Tr, Op>(ctx, pool, v, rec, options); });
  }
};

/// The sectors of one stash of `in` and one reload into `out` of Tr on the emulator: the
/// stash's loads and stores, then the reload's (SectorCounter).
template <class Tr>
std::array<SectorCounter::Count, 4> count_sectors(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& in,
                                                  const ps::GroupedView<typename Tr::layout>& out) {
  auto rec = ps::make_record<Tr>(pool, in);
  std::array<SectorCounter::Count, 4> c;
  {
    SectorCounter sectors;
    Emulator{LaunchShape{}}.stash(pool, in, rec);
    c[0] = sectors.loads(), c[1] = sectors.stores();
  }
  {
    SectorCounter sectors;
    Emulator{LaunchShape{}}.reload(pool, rec, out, true);
    c[2] = sectors.loads(), c[3] = sectors.stores();
  }
  if (rec.status().state != ps::RecordState::reloaded) throw std::runtime_error("count_sectors: not reloaded");
  return c;
}

/// The critical paths (CriticalPath) of a stash of `in`, a reload of it into `out`, and a discard of a second stash of
/// `in`, each one launch of `grid`, on a new record of Tr in `pool`. The blocks after a launch's first start once it
/// has published its id (`owner`): the count is of a block that arrives while the owner plans or after, whatever the
/// host's timing (one that came between the owner's compare-exchange and its publication would wait for it: a window
/// of one round on a GPU, which a busy host opens at random).
template <class Tr>
std::array<CriticalPath::Count, 3> count_critical_paths(ps::PagePool& pool,
                                                        const ps::GroupedView<typename Tr::layout>& in,
                                                        const ps::GroupedView<typename Tr::layout>& out,
                                                        LaunchShape grid) {
  auto rec = ps::make_record<Tr>(pool, in);
  const void* verdict = &rec.ref().header->launch.verdict;
  const std::uint64_t* owner = &rec.ref().header->launch.owner;  // read past the library's observers
  grid.before_start = [owner, then = grid.before_start](int k) {
    if (then) then(k);
    while (k > 0 && __atomic_load_n(owner, __ATOMIC_ACQUIRE) == 0) std::this_thread::yield();
  };
  std::array<CriticalPath::Count, 3> c;
  const auto expect = [&](ps::RecordState state, const char* what) {
    if (rec.status().state != state) throw std::runtime_error(std::string("count_critical_paths: ") + what);
  };
  {
    CriticalPath path(verdict);
    Emulator{grid}.stash(pool, in, rec);
    c[0] = path.count();
  }
  expect(ps::RecordState::stashed, "not stashed");
  {
    CriticalPath path(verdict);
    Emulator{grid}.reload(pool, rec, out, false);
    c[1] = path.count();
  }
  expect(ps::RecordState::reloaded, "not reloaded");
  Emulator{grid}.stash(pool, in, rec);
  {
    CriticalPath path(verdict);
    Emulator{grid}.discard(pool, rec);
    c[2] = path.count();
  }
  expect(ps::RecordState::discarded, "not discarded");
  return c;
}

}  // namespace pagestash_test
