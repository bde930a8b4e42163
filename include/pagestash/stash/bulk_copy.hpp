#pragma once
// The bulk mover: a third mover beside the copy engine's two (stash/copy.hpp), for a tile whose runs are aligned
// (tile_bulk_copyable). One lane of the warp (rank 0) moves it by TMA bulk copies (cp.async.bulk, sm_90 and newer)
// through the warp's stage (the staged mover's shared memory), a ring of StashPolicy::bulk_stages windows of the
// stream: a window's loads land in its slot (its mbarrier counts their bytes: complete_tx), its stores leave from it
// (a bulk group each), and a slot is loaded again once the store before has read it. A stash loads each run piece of
// a window into its place in the slot and stores the slot as one stream copy; a reload loads the window's stream bytes
// as one copy and stores each piece to its run. Loads evict first from L2 (read once); stores to pages evict first
// (read much later), to a reloaded buffer last (read soon). The other lanes wait at the warp's barrier.
//
// Host code (the grid emulator, the tests) runs the same lane's same steps over a twin of the async proxy (BulkProxy):
// the same copies, addresses and sizes, each reported to the vector observer as one access of its bytes; a window's
// loads land when its slot is waited on, a group's stores when a wait retires it (the latest a GPU may), so a slot
// reused early moves the wrong bytes; a wait on a phase whose bytes never arrive (a hang on a GPU) aborts.
// Traits choose it (BulkCopy; StashPolicy::bulk is the default); elsewhere the other movers.

#include <pagestash/stash/copy.hpp>

#if defined(__CUDACC__)
#  include <cuda/annotated_ptr>
#  include <cuda/ptx>
#endif
#if !defined(__CUDA_ARCH__)
#  include <cstdio>
#  include <cstdlib>
#  include <vector>
#endif

// Whether the code being compiled has bulk copies: host code (the twin) and sm_90 and newer.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#  define PAGESTASH_HAS_BULK_COPY 1
#else
#  define PAGESTASH_HAS_BULK_COPY 0
#endif

PAGESTASH_NAMESPACE_BEGIN

/// Traits whose kernels move aligned tiles by the bulk mover on sm_90 and newer: Traits with a `bulk_copy` member.
template <class Traits>
struct BulkCopy : Traits {
  static constexpr bool bulk_copy = true;
};

namespace detail {
template <class Traits, class = void>
struct bulk_copy_member : cuda::std::bool_constant<StashPolicy::bulk> {};
template <class Traits>
struct bulk_copy_member<Traits, cuda::std::void_t<decltype(Traits::bulk_copy)>>
    : cuda::std::bool_constant<Traits::bulk_copy> {};
}  // namespace detail

/// Whether the kernels of Traits use the bulk mover: its `bulk_copy` member, or StashPolicy::bulk without one.
template <class Traits>
inline constexpr bool bulk_copy_of = detail::bulk_copy_member<Traits>::value;

/// Whether copy_tile_bulk can move the tile: a stash or reload whose every piece is a bulk copy (tile_aligned: 16-byte
/// addresses alike, runs of whole vectors; a tile of whole vectors, so no stream padding to write), of runs of at
/// least StashPolicy::bulk_min_run bytes or dense lines (pitch = run: one piece).
PAGESTASH_HOST_DEVICE inline bool tile_bulk_copyable(const TileSpan& s, TileOp op) {
  if (op == TileOp::zero || s.bytes % 16 != 0 || !detail::tile_aligned(s)) return false;
  return s.head_bytes == s.bytes || s.run >= StashPolicy::bulk_min_run || s.pitch == s.run;
}

namespace detail {

/// The warp's bulk_stages mbarriers (shared memory on the device; the host's twin keeps its own).
template <class Lanes>
PAGESTASH_HOST_DEVICE cuda::std::uint64_t* bulk_barriers_of(const Lanes& lanes) {
  (void)lanes;
#if defined(__CUDA_ARCH__)
  __shared__ cuda::std::uint64_t barriers[StashPolicy::warps_per_block][StashPolicy::bulk_stages];
  return barriers[threadIdx.x / 32];
#else
  return nullptr;
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// The async proxy of one lane: its slots' mbarriers and its bulk groups (the PTX, through CCCL's cuda::ptx; the two
/// copies are written out for their L2 cache hint, which cuda::ptx::cp_async_bulk lacks).
class BulkProxy {
 public:
  __device__ explicit BulkProxy(cuda::std::uint64_t* barriers) : bar_(barriers) {
    namespace ptx = cuda::ptx;
    for (cuda::std::uint32_t k = 0; k < StashPolicy::bulk_stages; ++k) ptx::mbarrier_init(&bar_[k], 1);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // the barriers, before the copies see them
    ptx::fence_proxy_async(ptx::space_shared);  // the stage's earlier generic accesses, before the copies'
  }
  /// The slot's next phase completes when `bytes` have landed.
  __device__ void expect(cuda::std::uint32_t slot, cuda::std::uint32_t bytes) {
    namespace ptx = cuda::ptx;
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar_[slot], bytes);
  }
  __device__ void load(unsigned char* stage, const unsigned char* src, cuda::std::uint32_t bytes,
                       cuda::std::uint32_t slot) {
    constexpr auto evict_first =
        static_cast<cuda::std::uint64_t>(cuda::access_property(cuda::access_property::streaming{}));
    asm volatile(
        "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            static_cast<cuda::std::uint32_t>(__cvta_generic_to_shared(stage))),
        "l"(__cvta_generic_to_global(src)), "r"(bytes),
        "r"(static_cast<cuda::std::uint32_t>(__cvta_generic_to_shared(&bar_[slot]))), "l"(evict_first)
        : "memory");
  }
  __device__ void wait(cuda::std::uint32_t slot, cuda::std::uint32_t parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(&bar_[slot], parity)) {}
  }
  __device__ static void store(unsigned char* dst, const unsigned char* stage, cuda::std::uint32_t bytes,
                               bool read_soon) {
    constexpr auto evict_first =
        static_cast<cuda::std::uint64_t>(cuda::access_property(cuda::access_property::streaming{}));
    constexpr auto evict_last =
        static_cast<cuda::std::uint64_t>(cuda::access_property(cuda::access_property::persisting{}));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(
                     __cvta_generic_to_global(dst)),
                 "r"(static_cast<cuda::std::uint32_t>(__cvta_generic_to_shared(stage))), "r"(bytes),
                 "l"(read_soon ? evict_last : evict_first)
                 : "memory");
  }
  __device__ static void commit() { cuda::ptx::cp_async_bulk_commit_group(); }
  /// Every group but the newest has read its stage bytes.
  __device__ static void wait_read_all_but_newest() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{}); }
  /// Every store done; the barriers invalidated (the next tile initialises them anew).
  __device__ void finish() {
    cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
    for (cuda::std::uint32_t k = 0; k < StashPolicy::bulk_stages; ++k)
      asm volatile(
          "mbarrier.inval.shared.b64 [%0];" ::"r"(static_cast<cuda::std::uint32_t>(__cvta_generic_to_shared(&bar_[k])))
          : "memory");
  }

 private:
  cuda::std::uint64_t* bar_;
};
#elif !defined(__CUDA_ARCH__)
/// The host's twin of the async proxy (see the top of this file): copies wait in their slot or group until a wait
/// lands them; each is observed as one access of its bytes when issued.
class BulkProxy {
 public:
  explicit BulkProxy(cuda::std::uint64_t*) : slots_(StashPolicy::bulk_stages) {}
  void expect(cuda::std::uint32_t slot, cuda::std::uint32_t bytes) {
    Slot& s = slots_[slot];
    if (s.armed) fail("a slot's phase is armed twice");
    s.armed = true;
    s.expected = bytes;
  }
  void load(unsigned char* stage, const unsigned char* src, cuda::std::uint32_t bytes, cuda::std::uint32_t slot) {
    observe_vector(src, static_cast<int>(bytes), VectorAccess::load);
    slots_[slot].loads.push_back({stage, src, bytes});
  }
  void wait(cuda::std::uint32_t slot, cuda::std::uint32_t parity) {
    Slot& s = slots_[slot];
    cuda::std::uint32_t landed = 0;
    for (const Copy& c : s.loads) landed += land(c);
    s.loads.clear();
    if (!s.armed || landed != s.expected || parity != s.phase % 2)
      fail("a wait on a phase whose bytes never all arrive (a GPU would hang)");
    observe_vector(nullptr, 0, VectorAccess::use);
    s.armed = false;
    ++s.phase;
  }
  void store(unsigned char* dst, const unsigned char* stage, cuda::std::uint32_t bytes, bool) {
    observe_vector(dst, static_cast<int>(bytes), VectorAccess::store);
    open_.push_back({dst, stage, bytes});
  }
  void commit() {
    groups_.push_back(open_);
    open_.clear();
  }
  void wait_read_all_but_newest() { retire(1); }
  void finish() {
    if (!open_.empty()) fail("stores never committed");
    retire(0);
    for (const Slot& s : slots_)
      if (s.armed || !s.loads.empty()) fail("loads never waited on");
  }

 private:
  struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    cuda::std::uint32_t bytes;
  };
  struct Slot {
    std::vector<Copy> loads;
    cuda::std::uint32_t expected = 0, phase = 0;
    bool armed = false;
  };
  static cuda::std::uint32_t land(const Copy& c) {
    std::memcpy(c.dst, c.src, c.bytes);
    return c.bytes;
  }
  void retire(std::size_t keep) {
    for (; groups_.size() > keep; groups_.erase(groups_.begin()))
      for (const Copy& c : groups_.front()) land(c);
  }
  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "pagestash bulk mover: %s\n", what);
    std::abort();
  }
  std::vector<Slot> slots_;
  std::vector<Copy> open_;
  std::vector<std::vector<Copy>> groups_;
};
#endif

}  // namespace detail

/// Lane 0 of a warp moves a bulk-copyable tile (tile_bulk_copyable) by bulk copies through the warp's stage; the other
/// lanes wait for it (see the top of this file). Below sm_90, the vector mover.
template <class Lanes>
PAGESTASH_HOST_DEVICE void copy_tile_bulk(const Lanes& lanes, const TileSpan& s, TileOp op) {
#if PAGESTASH_HAS_BULK_COPY
  using namespace detail;
  using u32 = cuda::std::uint32_t;
  constexpr u32 stages = StashPolicy::bulk_stages, window = StashPolicy::stage_bytes / stages;
  static_assert(window % 16 == 0 && window > 0);
  if (lanes.rank() == 0) {
    unsigned char* const stage = stage_of(lanes);
    BulkProxy proxy(bulk_barriers_of(lanes));
    const u32 bytes = s.bytes, windows = (bytes + window - 1) / window;
    const bool stash = op == TileOp::stash;
    const auto size_of = [&](u32 k) { return bytes - k * window < window ? bytes - k * window : window; };
    // fn(buffer address, offset in the window, bytes) for the buffer pieces of window k: one where lines are dense.
    const auto pieces = [&](u32 k, const auto& fn) {
      const u32 q = k * window;
      const Piece first = locate(s, q);
      if (s.pitch == s.run) return fn(first.at, 0u, size_of(k));
      for_each_run_piece(s, q, size_of(k), first, fn);
    };
    const auto issue_load = [&](u32 k) {
      unsigned char* const slot = stage + (k % stages) * window;
      proxy.expect(k % stages, size_of(k));
      if (stash) pieces(k, [&](unsigned char* at, u32 off, u32 m) { proxy.load(slot + off, at, m, k % stages); });
      else proxy.load(slot, s.stream + k * window, size_of(k), k % stages);
    };
    for (u32 k = 0; k < windows && k < stages; ++k) issue_load(k);
    for (u32 k = 0; k < windows; ++k) {
      unsigned char* const slot = stage + (k % stages) * window;
      proxy.wait(k % stages, (k / stages) % 2);
      if (stash) proxy.store(s.stream + k * window, slot, size_of(k), false);
      else pieces(k, [&](unsigned char* at, u32 off, u32 m) { proxy.store(at, slot + off, m, true); });
      proxy.commit();
      if (k >= 1 && k - 1 + stages < windows) {
        proxy.wait_read_all_but_newest();  // the store of window k - 1 has left its slot
        issue_load(k - 1 + stages);
      }
    }
    proxy.finish();
  }
  lanes.sync_lanes();  // the stage is free again
#else
  copy_tile_vectors(lanes, s, op);
#endif
}

/// A tile by the bulk mover where Traits has it (bulk_copy_of) and the tile is bulk-copyable, else by
/// copy_tile_vectors: run_tile's copy. Lanes without a stage (sync_lanes) never bulk-copy.
template <class Traits, class Lanes>
PAGESTASH_HOST_DEVICE void copy_tile(const Lanes& lanes, const TileSpan& s, TileOp op) {
  if constexpr (bulk_copy_of<Traits> && detail::Stages<Lanes>::value && PAGESTASH_HAS_BULK_COPY)
    if (tile_bulk_copyable(s, op)) return copy_tile_bulk(lanes, s, op);
  copy_tile_vectors(lanes, s, op);
}

PAGESTASH_NAMESPACE_END
