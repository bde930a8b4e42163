#pragma once
// A team is the threads that run one step of an algorithm together: one CPU thread on the host, a thread block or a
// warp on the device. The pool and stash steps are written once against it, so the host executor runs the very code
// the kernels run. Not public API, but for SerialTeam (the host's team).
//
//   rank(), size()   this thread's index in the team, and the team's size
//   leader()         rank() == 0: does the serial parts
//   sync()           barrier; every write before it is visible to the team after it
//   publish()        sync(), before a release by the leader: every write of the team before it
//                    is visible to another team that acquires what the leader releases after
//                    it (a release store or acq_rel read-modify-write at device scope; no fence:
//                    docs/design.md, "Memory ordering")
//   share(x)         the leader's x, handed to every thread of the team (includes sync())
//   exclusive_sum(x, total)
//                    the sum of x over the threads ranked before this one; total gets the
//                    sum over the team (includes sync())
// The lanes of a warp (the team that moves one tile) have rank() and size(), and
//   max_over(x, group)  each x[k] the largest over the aligned group of lanes this one is in
//                    (a shuffle on the device; every lane of the warp calls it)
//   share(x)         lane 0's x, handed to every lane (every lane of the warp calls it); what lane 0
//                    read before it, the lanes read after it as lane 0 does (__syncwarp orders them)
//   sync_lanes()     the warp's barrier over its stage (shared memory, stash/copy.hpp); lanes
//                    without it (a test's lanes run one after another) never stage
//   exclusive_sum(x, total)
//                    as a team's (a warp's look-ahead plans on its lanes, stash/look_ahead.hpp)

#include <pagestash/detail/atomics.hpp>

#include <cuda/std/cstdint>
#if defined(__CUDACC__)
#  include <cub/warp/warp_scan.cuh>
#endif

PAGESTASH_NAMESPACE_BEGIN

/// One thread alone (the host executor, or one device thread).
struct SerialTeam {
  PAGESTASH_HOST_DEVICE static constexpr int rank() { return 0; }
  PAGESTASH_HOST_DEVICE static constexpr int size() { return 1; }
  PAGESTASH_HOST_DEVICE static constexpr bool leader() { return true; }
  PAGESTASH_HOST_DEVICE static void sync() {}
  PAGESTASH_HOST_DEVICE static void publish() {}
  template <class T>
  PAGESTASH_HOST_DEVICE static T share(T x) {
    return x;
  }
  PAGESTASH_HOST_DEVICE static cuda::std::int64_t exclusive_sum(cuda::std::int64_t x, cuda::std::int64_t& total) {
    total = x;
    return 0;
  }
};

namespace detail {

#if defined(__CUDACC__)
/// The threads of one block, BlockThreads of them (the kernels launch StashPolicy::threads_per_block).
template <int BlockThreads>
struct BlockTeam {
  static_assert(BlockThreads % 32 == 0 && BlockThreads <= 32 * 32, "whole warps, whose totals one warp scans");
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int size() { return static_cast<int>(blockDim.x); }
  __device__ static bool leader() { return threadIdx.x == 0; }
  __device__ static void sync() { __syncthreads(); }
  /// The barrier orders every thread's writes before the leader's next release, and a release is cumulative (PTX
  /// memory model): the leader's release store or acq_rel read-modify-write releases the whole block's writes. No
  /// fence: a __threadfence() here was a MEMBAR.SC.GPU on every block's path to its verdict.
  __device__ static void publish() { __syncthreads(); }
  template <class T>
  __device__ static T share(T x) {
    __shared__ T slot;
    sync();
    if (leader()) slot = x;
    sync();
    return slot;
  }
  /// Each warp scans by shuffles, then every warp scans the warps' totals: a lane holds its own values only. (CUB's
  /// block scans rake 16 values a lane of one warp: the owner's plan then spilled in stash kernels at 64 registers.)
  __device__ static cuda::std::int64_t exclusive_sum(cuda::std::int64_t x, cuda::std::int64_t& total) {
    using WarpScan = cub::WarpScan<cuda::std::int64_t>;
    __shared__ typename WarpScan::TempStorage none;  // empty: a shuffle scan keeps nothing in shared memory
    __shared__ cuda::std::int64_t totals[BlockThreads / 32];
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    cuda::std::int64_t in_warp = 0;
    WarpScan(none).ExclusiveSum(x, x, in_warp);
    sync();  // the totals' previous use is over
    if (lane == 0) totals[warp] = in_warp;
    sync();
    cuda::std::int64_t before = lane < BlockThreads / 32 ? totals[lane] : 0;  // lane w: the warps before warp w
    WarpScan(none).ExclusiveSum(before, before, total);
    return x + __shfl_sync(0xFFFFFFFFu, before, warp);
  }
};

/// The 32 lanes of one warp: the team that copies one tile.
struct WarpLanes {
  __device__ static int rank() { return static_cast<int>(threadIdx.x % 32); }
  __device__ static constexpr int size() { return 32; }
  /// The warp's lanes wait for each other; their shared-memory writes before it are visible to all after it.
  __device__ static void sync_lanes() { __syncwarp(); }
  /// Each x[k] becomes its largest over the aligned `group` lanes (a power of two) this lane is one of. Every lane of
  /// the warp calls it.
  template <int N>
  __device__ static void max_over(cuda::std::uint32_t (&x)[N], int group) {
    PAGESTASH_UNROLL
    for (int offset = group / 2; offset > 0; offset /= 2) {
      PAGESTASH_UNROLL
      for (int k = 0; k < N; ++k) x[k] = max(x[k], __shfl_xor_sync(0xFFFFFFFFu, x[k], offset));
    }
  }
  __device__ static cuda::std::int64_t exclusive_sum(cuda::std::int64_t x, cuda::std::int64_t& total) {
    using WarpScan = cub::WarpScan<cuda::std::int64_t>;
    __shared__ typename WarpScan::TempStorage none;  // empty: a shuffle scan keeps nothing in shared memory
    WarpScan(none).ExclusiveSum(x, x, total);
    return x;
  }
  template <class T>
  __device__ static T share(T x) {
    static_assert(sizeof(T) % 4 == 0, "share: whole 32-bit words");
    cuda::std::uint32_t w[sizeof(T) / 4];
    memcpy(w, &x, sizeof(T));
    __syncwarp();
    PAGESTASH_UNROLL
    for (int k = 0; k < static_cast<int>(sizeof(T) / 4); ++k) w[k] = __shfl_sync(0xFFFFFFFFu, w[k], 0);
    memcpy(&x, w, sizeof(T));
    return x;
  }
};
#endif

}  // namespace detail
PAGESTASH_NAMESPACE_END
