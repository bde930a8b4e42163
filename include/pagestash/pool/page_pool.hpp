#pragma once
// PagePool: owns the page arenas (device memory, plus optional pinned device-mapped host memory for spill) and the
// free-page state. Made up front; stash, reload, discard and reset never allocate. A pool with a reserve
// (PoolConfig) holds it as address space and grows or shrinks between steps (grow, shrink: execution/). Move-only.

#include <pagestash/detail/team.hpp>
#include <pagestash/pool/allocation.hpp>
#include <pagestash/pool/flags.hpp>
#include <pagestash/pool/pool_config.hpp>
#include <pagestash/pool/reserved_memory.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN

/// A snapshot of a pool's counters, flags and config: what PagePool::stats() reads back and report() writes, in CUDA
/// stream order, into the caller's memory (pinned, mapped or device).
struct PoolStats : PoolCounters {
  PoolConfig config;
  PoolFlags flags;  ///< as PagePool::flags() holds them (`overflow`: rerun the step; `error`: a bug)
  PAGESTASH_HOST_DEVICE cuda::std::int64_t failures() const { return overflows + errors; }  ///< did nothing
};

namespace detail {
/// The pool's state, in its memory, the flags first (their address is API). The flags, `lock`, `counters.generation`,
/// `.overflows` and `.errors` are atomic; `id` (nonzero, random, kept by reset and byte copies: a record carries its
/// pool's) is written once; the rest under `lock`. `counters.device_pages` and `.host_pages` are the pages the pool
/// has now (grow and shrink change them; reset keeps them).
struct PoolState {
  PoolFlags flags;
  cuda::std::int32_t lock;
  cuda::std::uint64_t id;
  PoolCounters counters;       ///< `generation` is bumped by reset (a record stashed before it is stale)
  cuda::std::int32_t resized;  ///< the last shrink's outcome: 1 done, 0 refused (pages were held)
};
}  // namespace detail

/// A trivially copyable handle on a pool, passed by value to kernels.
struct PoolRef {
  detail::PoolState* state = nullptr;
  cuda::std::int32_t* device_stack = nullptr;
  cuda::std::int32_t* host_stack = nullptr;
  unsigned char* device_arena = nullptr;
  unsigned char* host_arena = nullptr;  ///< as the executor sees it (device-mapped for kernels)
  cuda::std::int64_t page_bytes = 0;
  cuda::std::int32_t page_shift = 0;  ///< log2(page_bytes)
  /// Page ids [0, reserved_device_pages) are device pages, the next reserved_host_pages host pages: the reserve's
  /// (PoolConfig::reserved_device_pages), so that no id or address moves as the pool grows. The pages the pool has
  /// now are its state's counters.
  cuda::std::int32_t reserved_device_pages = 0;
  cuda::std::int32_t reserved_host_pages = 0;

  PAGESTASH_HOST_DEVICE unsigned char* page(cuda::std::int32_t id) const {
    return id < reserved_device_pages ? device_arena + (cuda::std::int64_t{id} << page_shift)
                                      : host_arena + (cuda::std::int64_t{id - reserved_device_pages} << page_shift);
  }
};

namespace detail {
/// The free stacks hold every page the pool has, in id order: ids [0, device_pages) and the host ids after the
/// reserve's device ids.
template <class Team>
PAGESTASH_HOST_DEVICE void fill_free_stacks(const Team& team, const PoolRef& pool, cuda::std::int64_t device_pages,
                                            cuda::std::int64_t host_pages) {
  for (cuda::std::int64_t i = team.rank(); i < device_pages; i += team.size())
    pool.device_stack[i] = static_cast<cuda::std::int32_t>(i);
  for (cuda::std::int64_t i = team.rank(); i < host_pages; i += team.size())
    pool.host_stack[i] = static_cast<cuda::std::int32_t>(pool.reserved_device_pages + i);
}
}  // namespace detail

/// Every page free, flags and statistics cleared, generation bumped, the id kept; no allocation, so a graph may contain
/// it. Nothing may run on the pool meanwhile.
template <class Team>
PAGESTASH_HOST_DEVICE void reset_pool(const Team& team, const PoolRef& pool) {
  const cuda::std::int64_t device_pages = pool.state->counters.device_pages,
                           host_pages = pool.state->counters.host_pages;
  detail::fill_free_stacks(team, pool, device_pages, host_pages);
  team.sync();  // every thread read the counters before the leader rewrites them
  if (team.leader()) {
    // Every word but the id, which is never written: an operation that overlaps the reset
    // (misuse) sees the pool's own id, never a false foreign_record.
    detail::PoolState& s = *pool.state;
    PoolCounters counters{};
    counters.generation = s.counters.generation + 1;
    counters.device_pages_free = device_pages;
    counters.host_pages_free = host_pages;
    counters.device_pages = device_pages;
    counters.host_pages = host_pages;
    s.flags = PoolFlags{};
    s.lock = 0;
    s.counters = counters;
  }
  team.sync();
}

/// What a pool's caller-owned memory must hold: bytes of each part (PagePool::bytes_needed).
struct PoolMemorySizes {
  std::size_t control = 0;       ///< flags, counters and the free-page stacks (for the reserve)
  std::size_t device_arena = 0;  ///< reserved_device_pages() * page_bytes
  std::size_t host_arena = 0;    ///< reserved_host_pages() * page_bytes
};

/// Caller-owned memory for a pool (a framework's allocator, e.g. PyTorch's caching allocator, so that its accounting
/// sees the pool): each part at least bytes_needed()'s size and aligned to 16 bytes (borrowed_alignment), in the pool's
/// memory space: device memory for a device pool's control and device arena, and pinned host memory mapped into the
/// device (cudaHostAlloc with cudaHostAllocMapped, or cudaHostRegister with cudaHostRegisterMapped) for its host arena;
/// plain host memory for a host pool. The pool uses it, never frees it, and must not outlive it.
struct PoolMemory {
  void* control = nullptr;
  void* device_arena = nullptr;
  void* host_arena = nullptr;  ///< may be null when host_pages = 0
};

/// What a pool's memory costs (PagePool::memory_use): physical bytes (a reserve's backed in whole granules, 2 MiB)
/// and the address space its arenas hold, backed or not. A framework's allocator sees none of a pool it did not give.
struct PoolMemoryUse {
  std::size_t control = 0;
  std::size_t device_backed = 0, host_backed = 0;
  std::size_t device_reserved = 0, host_reserved = 0;
};

namespace detail {
struct PoolResize;
}  // namespace detail

class PagePool {
 public:
  /// A pool in `space`: MemorySpace::device for pagestash::on(stream), MemorySpace::host for the host executor (then
  /// every "device" page is host memory too), with memory it allocates (cudaMalloc, cudaHostAlloc) and frees. A device
  /// pool lives on the current device. Throws std::invalid_argument for a bad config, pagestash::CudaError if
  /// allocation fails.
  explicit PagePool(const PoolConfig& config, MemorySpace space = MemorySpace::device)
      : PagePool(config, space, nullptr) {}

  /// A pool in caller-owned memory (see PoolMemory); it allocates nothing. Throws std::invalid_argument for a null or
  /// misaligned part.
  PagePool(const PoolConfig& config, MemorySpace space, const PoolMemory& memory) : PagePool(config, space, &memory) {}

  /// A pool over caller-owned memory that already holds one: memory a pool of the same config and space was made in
  /// (the constructor above), or a byte copy of such memory. Writes nothing and synchronises nothing; the pool's state
  /// is the memory's. For frameworks that keep a pool's state in their own tensors and make the host-side object per
  /// call (examples/torch). Same checks as the constructor.
  static PagePool attach(const PoolConfig& config, MemorySpace space, const PoolMemory& memory) {
    return PagePool(config, space, &memory, false);
  }

  /// Bytes of each part of a pool's memory for `config`.
  static PoolMemorySizes bytes_needed(const PoolConfig& config) {
    validate(config);
    const auto d = static_cast<std::size_t>(config.reserved_device_pages());
    const auto h = static_cast<std::size_t>(config.reserved_host_pages());
    const auto page = static_cast<std::size_t>(config.page_bytes);
    return {control_offset + (d + h) * sizeof(std::int32_t), d * page, h * page};
  }

  PagePool(PagePool&&) noexcept = default;
  PagePool& operator=(PagePool&&) noexcept = default;

  /// The pool's config, its pages as grow and shrink left them.
  const PoolConfig& config() const { return config_; }
  MemorySpace space() const { return space_; }
  /// The CUDA device a device pool lives on (the current one when it was made); -1 for a host pool. Operations on a
  /// CUDA stream of another device are refused on the host.
  int device() const { return device_; }

  /// The pool's identity (detail::PoolState::id, in its memory), which its records carry: known for a pool made here
  /// and for an attached host pool; 0 (unknown) for an attached device pool, since attach reads no device memory (it
  /// runs per operation and must not synchronise). Where the host cannot compare ids, the operations still refuse a
  /// record of another pool on the device (foreign_record).
  std::uint64_t id() const { return id_; }
  /// The handle executors pass to their steps.
  const PoolRef& ref() const { return ref_; }
  /// The pool's flags where the operations write them (device memory for a device pool), for the caller's kernels,
  /// collectives or conditional graph nodes: flag_count int32 words, each 0 or 1, sticky until reset (pool/flags.hpp).
  /// Read them in stream order after the step's operations; writing 1 to a field (as an all-reduce does) raises it.
  PoolFlags* flags() const { return &ref_.state->flags; }

  /// The pool's memory as attach() takes it (the host arena as the host sees it), for a framework that keeps the
  /// pool's parts in its own tensors: attached with the reserve as its pages (PoolConfig::reserved_device_pages), as
  /// every kernel sees the pool. The pool must outlive it.
  PoolMemory memory() const {
    return {control_.get(), ref_.device_arena, host_reserved_.get() ? host_reserved_.get() : host_arena_.get()};
  }
  PoolMemoryUse memory_use() const {
    PoolMemoryUse u;
    u.control = control_.bytes();
    const auto reserved = [](const detail::ReservedMemory& r, const detail::Allocation& a, std::size_t& backed,
                             std::size_t& address_space) {
      backed = r.get() ? r.backed() : a.bytes();
      address_space = r.get() ? r.reserved() : a.bytes();
    };
    reserved(device_reserved_, device_arena_, u.device_backed, u.device_reserved);
    reserved(host_reserved_, host_arena_, u.host_backed, u.host_reserved);
    return u;
  }

  /// Reads the flags and counters back. For a device pool this synchronises the whole device first
  /// (cudaDeviceSynchronize); for a host pool no operation may be in flight.
  PoolStats stats() const {
    const detail::PoolState state = read_state();
    PoolStats s{};
    static_cast<PoolCounters&>(s) = state.counters;
    s.config = config_;
    s.flags = state.flags;
    return s;
  }

 private:
  PagePool(const PoolConfig& config, MemorySpace space, const PoolMemory* memory, bool initialize = true)
      : config_(config), space_(space), id_(initialize ? new_id() : 0),
        holds_(!initialize         ? Holding::attached
               : memory != nullptr ? Holding::borrowed
               : config.growable() ? Holding::reserve
                                   : Holding::allocated) {
    const PoolMemorySizes sizes = bytes_needed(config);
    const bool device = space == MemorySpace::device;
    if (device) PAGESTASH_CUDA_TRY(cudaGetDevice(&device_));
    const auto kind = device ? detail::MemoryKind::device : detail::MemoryKind::host;
    const auto host_kind = device ? detail::MemoryKind::mapped_host : detail::MemoryKind::host;
    if (config.growable()) {
      if (memory != nullptr)
        detail::throw_invalid("PagePool", "a pool with a reserve maps its own memory as it grows: no PoolMemory");
      control_ = detail::Allocation(kind, sizes.control);
      device_reserved_ = detail::ReservedMemory(kind, sizes.device_arena, device_);
      device_reserved_.back(static_cast<std::size_t>(config.device_bytes()));
      if (device && config.reserved_host_pages() == config.host_pages) {  // a fixed spill: no registration per chunk
        host_arena_ = detail::Allocation(host_kind, sizes.host_arena);
      } else {
        host_reserved_ = detail::ReservedMemory(host_kind, sizes.host_arena, device_);
        host_reserved_.back(static_cast<std::size_t>(config.host_bytes()));
      }
    } else if (memory != nullptr) {
      control_ = detail::Allocation::borrow(kind, memory->control, sizes.control, "PoolMemory::control");
      device_arena_ =
          detail::Allocation::borrow(kind, memory->device_arena, sizes.device_arena, "PoolMemory::device_arena");
      host_arena_ =
          detail::Allocation::borrow(host_kind, memory->host_arena, sizes.host_arena, "PoolMemory::host_arena");
    } else {
      control_ = detail::Allocation(kind, sizes.control);
      device_arena_ = detail::Allocation(kind, sizes.device_arena);
      host_arena_ = detail::Allocation(host_kind, sizes.host_arena);
    }
    ref_ = make_ref();
    if (!initialize) {
      if (!device) id_ = ref_.state->id;  // host memory: read at no cost
      return;
    }
    // The initial state is the reset state, built on the host and copied once.
    const auto d = static_cast<std::size_t>(config.reserved_device_pages());
    std::vector<unsigned char> image(control_.bytes());
    PoolRef staging = ref_;
    staging.state = reinterpret_cast<detail::PoolState*>(image.data());
    staging.device_stack = reinterpret_cast<std::int32_t*>(image.data() + control_offset);
    staging.host_stack = staging.device_stack + d;
    *staging.state = detail::PoolState{};
    staging.state->counters.generation = -1;
    staging.state->counters.device_pages = config.device_pages;
    staging.state->counters.host_pages = config.host_pages;
    staging.state->id = id_;
    reset_pool(SerialTeam{}, staging);
    detail::copy_bytes(space, control_.get(), image.data(), image.size(), false);
  }

  static constexpr std::size_t control_offset = 256;  // the PoolState, then the stacks
  static_assert(sizeof(detail::PoolState) <= control_offset);

  /// The state, after synchronising the device for a device pool.
  detail::PoolState read_state() const {
    if (space_ == MemorySpace::device) PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    detail::PoolState s{};
    detail::copy_bytes(space_, &s, ref_.state, sizeof(s), true);
    return s;
  }

  /// A new pool's id, never 0: a process counter through a bijective mix (splitmix64's) keyed by std::random_device
  /// once per process, so that ids differ within a process and, almost surely, across processes (whose pools may meet
  /// in a framework's tensors).
  static std::uint64_t new_id() {
    static const std::uint64_t key = [] {
      std::random_device entropy;
      return (std::uint64_t{entropy()} << 32) ^ entropy();
    }();
    static std::atomic<std::uint64_t> counter{0};
    for (;;) {
      std::uint64_t x = key + ++counter * 0x9E3779B97F4A7C15ull;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      x ^= x >> 31;
      if (x != 0) return x;
    }
  }

  PoolRef make_ref() const {
    PoolRef r;
    auto* control = static_cast<unsigned char*>(control_.get());
    r.state = reinterpret_cast<detail::PoolState*>(control);
    r.device_stack = reinterpret_cast<std::int32_t*>(control + control_offset);
    r.host_stack = r.device_stack + config_.reserved_device_pages();
    r.device_arena = static_cast<unsigned char*>(device_reserved_.get() ? device_reserved_.get() : device_arena_.get());
    r.host_arena = static_cast<unsigned char*>(host_reserved_.get() ? host_reserved_.get() : host_arena_.device_view());
    r.page_bytes = config_.page_bytes;
    while ((std::int64_t{1} << r.page_shift) < config_.page_bytes) ++r.page_shift;
    r.reserved_device_pages = static_cast<std::int32_t>(config_.reserved_device_pages());
    r.reserved_host_pages = static_cast<std::int32_t>(config_.reserved_host_pages());
    return r;
  }

  /// Where the pool's memory comes from, which says whether it may grow and shrink.
  enum class Holding {
    allocated,  ///< its own, of a fixed size
    borrowed,   ///< the caller's (PoolMemory), fixed
    attached,   ///< another pool's (attach): only that pool resizes it
    reserve,    ///< a reserve it maps as it grows
  };

  PoolConfig config_;
  MemorySpace space_;
  std::uint64_t id_;
  Holding holds_;
  int device_ = -1;
  detail::Allocation control_, device_arena_, host_arena_;
  detail::ReservedMemory device_reserved_, host_reserved_;  ///< a pool with a reserve's arenas
  PoolRef ref_;

  friend struct detail::PoolResize;
};

namespace detail {
/// The host's half of grow and shrink (execution/host.hpp, cuda.cuh): the checks, the memory, the pool's config.
struct PoolResize {
  /// Throws unless the pool maps a reserve of its own and (device_pages, host_pages) lie between the pages it has (at
  /// least, grow; at most, shrink) and the reserve. A pool may shrink to no pages, as it may start with none.
  static void check(const char* op, const PagePool& pool, std::int64_t device_pages, std::int64_t host_pages,
                    bool growing) {
    if (pool.holds_ == PagePool::Holding::attached)
      throw_invalid(op,
                    "an attached pool (PagePool::attach) does not own its memory, which only the pool that made it "
                    "backs: resize the owner, not an attached pool");
    if (pool.holds_ != PagePool::Holding::reserve)
      throw_invalid(op,
                    "a fixed pool (no reserve: PoolConfig::device_reserve, host_reserve) neither grows nor "
                    "shrinks: make the pool with a reserve");
    const PoolConfig& c = pool.config_;
    const bool in_reserve = device_pages <= c.reserved_device_pages() && host_pages <= c.reserved_host_pages();
    const bool ordered =
        growing ? device_pages >= c.device_pages && host_pages >= c.host_pages
                : device_pages <= c.device_pages && host_pages <= c.host_pages && device_pages >= 0 && host_pages >= 0;
    if (!in_reserve || !ordered)
      throw_invalid(op, "device_pages = " + std::to_string(device_pages) +
                            ", host_pages = " + std::to_string(host_pages) + ": the pool has " +
                            std::to_string(c.device_pages) + " and " + std::to_string(c.host_pages) + ", its reserve " +
                            std::to_string(c.reserved_device_pages()) + " and " +
                            std::to_string(c.reserved_host_pages()) + (growing ? "; grow takes" : "; shrink takes") +
                            " no fewer (grow) or no more (shrink) pages than it has, and none beyond the reserve");
  }
  /// Backs the memory of the pool's first device_pages and host_pages (out of memory: throws, nothing changed).
  static void back(PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    const auto page = static_cast<std::size_t>(pool.config_.page_bytes);
    if (pool.device_reserved_.get()) pool.device_reserved_.back(static_cast<std::size_t>(device_pages) * page);
    if (pool.host_reserved_.get()) pool.host_reserved_.back(static_cast<std::size_t>(host_pages) * page);
  }
  /// Gives back the memory past them, and takes them as the pool's pages.
  static void give_back(PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    const auto page = static_cast<std::size_t>(pool.config_.page_bytes);
    if (pool.device_reserved_.get()) pool.device_reserved_.give_back(static_cast<std::size_t>(device_pages) * page);
    if (pool.host_reserved_.get()) pool.host_reserved_.give_back(static_cast<std::size_t>(host_pages) * page);
    set(pool, device_pages, host_pages);
  }
  /// grow on either executor: checked, the memory backed, the new pages' ids added (`add`: the executor's grow_pages),
  /// the pool's config set.
  template <class Add>
  static void grow(PagePool& pool, std::int64_t device_pages, std::int64_t host_pages, Add&& add) {
    check("pagestash::grow", pool, device_pages, host_pages, true);
    back(pool, device_pages, host_pages);
    add();
    set(pool, device_pages, host_pages);
  }
  /// shrink on either executor: checked, the pages taken (`take`: the executor's shrink_pages, returning the state's
  /// `resized` word), refused unless they were, the memory past them given back.
  template <class Take>
  static void shrink(PagePool& pool, std::int64_t device_pages, std::int64_t host_pages, Take&& take) {
    check("pagestash::shrink", pool, device_pages, host_pages, false);
    if (take() != 1)
      throw_invalid("pagestash::shrink", "refused: records hold pages (shrink after a balanced end_step)");
    give_back(pool, device_pages, host_pages);
  }
  static void set(PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    pool.config_.device_reserve = pool.config_.reserved_device_pages();  // kept as the pages change
    pool.config_.host_reserve = pool.config_.reserved_host_pages();
    pool.config_.device_pages = device_pages;
    pool.config_.host_pages = host_pages;
  }
};
}  // namespace detail

/// A pool sized from an observed step (typically an eager step run with a generous pool): the peak number of pages held
/// at once, times a safety factor for each memory. Pages already include the rounding of each stash to whole pages, so
/// the factor only covers step-to-step variation. The observed pool's page size is kept.
inline PoolConfig size_from_peak(const PoolStats& observed, double device_factor = 1.10, double host_factor = 0.0) {
  if (!(device_factor >= 0.0) || !(host_factor >= 0.0))
    detail::throw_invalid("size_from_peak", "factors must be non-negative");
  PoolConfig c;
  c.page_bytes = observed.config.page_bytes;
  const double peak = static_cast<double>(observed.peak_pages_held);
  c.device_pages = static_cast<std::int64_t>(std::ceil(peak * device_factor));
  c.host_pages = static_cast<std::int64_t>(std::ceil(peak * host_factor));
  return c;
}

PAGESTASH_NAMESPACE_END
