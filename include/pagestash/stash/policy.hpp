#pragma once
// The tuning as data, one policy per architecture (as CUB's policy hubs): the CUDA executor's launch shape, the tile
// size and the copy loop's loads in flight. Device code reads the policy of the architecture it is compiled for
// (StashPolicy, by __CUDA_ARCH__); the host sizes a launch by the device's compute capability (with_stash_policy). The
// host executor has its own (HostPolicy). Plain data: host code reads it too (the grid emulator's cost benchmark sizes
// its launches as the executor would on a given GPU).

#include <pagestash/config.hpp>
#include <pagestash/detail/math.hpp>

#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

PAGESTASH_NAMESPACE_BEGIN

/// H100/H200 (sm_90), and any architecture before sm_100.
struct StashPolicy90 {
  /// Threads of a block of the operation kernels: 16 warps, so few blocks carry the launch's fixed cost (two
  /// read-modify-writes on the launch line per block, execution/operation.hpp); one block per SM has enough loads.
  static constexpr int threads_per_block = 512;
  static constexpr int warps_per_block = threads_per_block / 32;
  /// Blocks that must fit on an SM at once (the launch bound): at most 64 registers a thread, which the compiled-kernel
  /// check also holds it to (a tighter bound makes ptxas for sm_100 spill the work plan's loops).
  static constexpr int min_blocks_per_sm = 2;
  /// Blocks per SM a launch is sized for: enough 16-byte loads in flight to cover memory latency (Little's law:
  /// bandwidth x latency / SMs, loads only: a store is not waited on). 90% of an H200's copy (half of 4.8 TB/s is
  /// loads, 0.6-1 us loaded, 132 SMs) needs 9.6-16 KiB of loads in flight per SM; one block has 16 warps x 32 lanes x 4
  /// loads x 16 bytes = 32 KiB (the gather of unaligned lines: a quarter, one vector a lane).
  static constexpr int grid_blocks_per_sm = 1;
  /// Consecutive tiles each warp of a block gets per claim: a block claims warps x this many at once (128 KiB of 4 KiB
  /// tiles at 16 warps), few enough claims that the atomic is cheap, small enough that the last claims even out. The
  /// leader claims the next chunk after its warp's first tile (execution/operation.hpp), so that the claim's round
  /// trips overlap the rest of the chunk's copies.
  static constexpr cuda::std::int64_t tiles_per_warp_claim = 2;
  /// Most items of a plan a warp looks ahead on (stash/look_ahead.hpp): its lanes plan 32 items a round of three warp
  /// scans, so that 4 rounds (64 groups of data and scales) are done well within the owner's path to its verdict.
  static constexpr cuda::std::int32_t look_ahead_items = 128;
  /// log2 of a warp's tile (clipped to the page, tile_shift_for): 4 KiB, two rounds of loads_in_flight vectors a lane.
  /// Smaller tiles pay lookups for fewer bytes; larger leave a small stash too few (docs/design.md, "The work plan").
  static constexpr int tile_shift = 12;
  /// 16-byte vectors a lane of the copy loop loads before it stores them: one load in flight covered 60-85% of the
  /// memory latency (docs/benchmarks.md); four make the 32 KiB per block that grid_blocks_per_sm counts on.
  static constexpr cuda::std::uint32_t loads_in_flight = 4;
  /// 16-byte vectors a lane of the unaligned stash (the gather: 5 aligned words under each vector, shifted into place)
  /// loads before it stores them; check_kernels.py counts the words in flight (at least 4 vectors' worth).
  static constexpr cuda::std::uint32_t gather_vectors = loads_in_flight;
  /// The staged mover of short lines (stash/copy.hpp, copy_tile_staged): 16-byte chunks from line starts a lane loads
  /// before it compacts them in its warp's stage (at least 8 in flight, check_kernels.py), the stage's bytes in shared
  /// memory (16 warps x 2 KiB: 32 KiB a block, under the 48 KiB of static shared memory), and the longest run it takes
  /// (longer runs fill whole vectors: the gather batches them).
  static constexpr cuda::std::uint32_t staged_loads = 8;
  static constexpr cuda::std::uint32_t stage_bytes = 2048;
  static constexpr cuda::std::uint32_t staged_max_run = 256;
  /// The longest pitch of lines not on 16 bytes it takes (compact scales: a few bytes a line): it loads every chunk.
  static constexpr cuda::std::int64_t staged_max_dense_pitch = 64;
  /// Whether the kernels stage short-line tiles (off: the gather moves them). The grid emulator runs the same policy;
  /// the copy-engine tests run the staged mover directly (tile_stageable).
  static constexpr bool staged = true;
  /// The bulk mover (stash/bulk_copy.hpp): whether kernels move aligned tiles by TMA bulk copies where their traits
  /// don't say (BulkCopy does), the slots of the warp's stage it rings through (of stage_bytes), and the shortest run
  /// it takes (each run piece is a copy of one lane's). Off until a GPU has measured it.
  static constexpr bool bulk = false;
  static constexpr cuda::std::uint32_t bulk_stages = 4;
  static constexpr cuda::std::uint32_t bulk_min_run = 128;
};

/// B200 (sm_100 and later).
struct StashPolicy100 : StashPolicy90 {
  static constexpr int min_compute_major = 10;  ///< the first compute capability it is for
  /// 8 TB/s over 148 SMs needs 15-25 KiB of loads in flight per SM: one block has them; a second copies while the first
  /// waits at a barrier.
  static constexpr int grid_blocks_per_sm = 2;
};

/// The host executor's: one host thread moves a tile.
struct HostPolicy {
  /// log2 of a host thread's tile: 64 KiB, so that it pays the tile lookup once per more
  /// bytes (16-64 KiB tiles were 25-35% faster than 4 KiB ones on a CPU, docs/benchmarks.md).
  static constexpr int tile_shift = 16;
};

// The host launches blocks of one thread count and sizes a record's tiles (work_bounds) with one tile shift, whatever
// policy the device's code was compiled with (a kernel JIT-compiled from sm_90 PTX runs StashPolicy90 on a B200): those
// stay the same in every device policy.
static_assert(StashPolicy100::threads_per_block == StashPolicy90::threads_per_block,
              "the host launches one thread count: every device policy must have it");
static_assert(StashPolicy100::tile_shift == StashPolicy90::tile_shift,
              "the host sizes records with one device tile shift: every device policy must have it");
// work_bounds counts tiles of the device's size, so that its bounds hold for either executor.
static_assert(HostPolicy::tile_shift >= StashPolicy90::tile_shift, "the host's tiles may not be the smaller");

/// The device policy of compute capability ComputeMajor.
template <int ComputeMajor>
using StashPolicyFor =
    cuda::std::conditional_t<(ComputeMajor >= StashPolicy100::min_compute_major), StashPolicy100, StashPolicy90>;

/// The device policy of the code being compiled: the architecture's in device code; in host code (nvcc's host pass, and
/// the grid emulator, which runs the device code on host threads) sm_90's, whose threads and tile shift all share.
#if defined(__CUDA_ARCH__)
using StashPolicy = StashPolicyFor<__CUDA_ARCH__ / 100>;
#else
using StashPolicy = StashPolicy90;
#endif

/// fn(policy) with the device policy of compute capability `compute_major`, by which the host sizes a launch on it.
template <class Fn>
auto with_stash_policy(int compute_major, const Fn& fn) {
  return compute_major >= StashPolicy100::min_compute_major ? fn(StashPolicy100{}) : fn(StashPolicy90{});
}

/// Blocks a launch may have on `sms` SMs holding `resident_per_sm` blocks each: grid_blocks_per_sm per SM, if they fit.
template <class Policy>
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t device_blocks(int sms, int resident_per_sm) {
  const int wanted = Policy::grid_blocks_per_sm;
  return cuda::std::int64_t{sms} * (resident_per_sm <= 0 ? 1 : (resident_per_sm < wanted ? resident_per_sm : wanted));
}

/// Blocks of a launch, at least 1: device_blocks, capped by `max_blocks` (0: none) and by max_tiles (one claim each).
template <class Policy>
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t launch_blocks(cuda::std::int64_t on_device, int max_blocks,
                                                                 cuda::std::int64_t max_tiles) {
  cuda::std::int64_t blocks = on_device;
  if (max_blocks > 0 && max_blocks < blocks) blocks = max_blocks;
  const cuda::std::int64_t per_claim = Policy::warps_per_block * Policy::tiles_per_warp_claim;
  const cuda::std::int64_t needed = detail::ceil_div(max_tiles, per_claim);
  if (needed < blocks) blocks = needed;
  return blocks > 0 ? blocks : 1;
}

PAGESTASH_NAMESPACE_END
