#pragma once
// The CUDA executor's launch shape as data: threads per block, the launch bound, blocks per
// SM by architecture, tiles per claim. Host code reads it too (the grid emulator's cost
// benchmark sizes its launches as the executor would on a given GPU).

#include <pagestash/config.hpp>

#include <cuda/std/cstdint>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// Threads of a block of the operation kernels: 16 warps, so that few blocks carry the
/// launch's fixed cost (two read-modify-writes on the record's launch line per block,
/// execution/operation.hpp) while one block per SM keeps enough loads in flight.
inline constexpr int threads_per_block = 512;
inline constexpr int warps_per_block = threads_per_block / 32;
/// Blocks that must fit on an SM at once (the launch bound): at most 64 registers a thread,
/// which the compiled-kernel check also holds it to (left to itself, ptxas for sm_100 chose
/// 32 and spilled the planning loops).
inline constexpr int min_blocks_per_sm = 2;

/// Consecutive tiles each warp of a block gets per claim: a block claims warps x this many
/// at once (128 KiB of 4 KiB tiles at 16 warps), few enough claims that the atomic is
/// cheap, small enough that the last claims even out.
inline constexpr cuda::std::int64_t tiles_per_warp_claim = 2;

/// Blocks per SM a launch is sized for, by compute capability: enough 16-byte loads in
/// flight to cover memory latency (Little's law: bandwidth x latency / SMs). An H100/H200
/// (sm_90: 4.8 TB/s, about 0.8 us loaded, 132 SMs) needs about 29 KiB in flight per SM; one
/// block has 16 warps x 32 lanes x 4 loads x 16 bytes = 32 KiB. A B200 (sm_100: 8 TB/s,
/// 148 SMs) needs about 43 KiB: two blocks.
PAGESTASH_HOST_DEVICE constexpr int grid_blocks_per_sm(int compute_major) { return compute_major >= 10 ? 2 : 1; }

/// Blocks a launch may have on `sms` SMs of compute capability `compute_major` that hold
/// `resident_per_sm` blocks of the kernel each: grid_blocks_per_sm per SM, no more than fit.
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t device_blocks(int sms, int compute_major, int resident_per_sm) {
  const int wanted = grid_blocks_per_sm(compute_major);
  return cuda::std::int64_t{sms} * (resident_per_sm <= 0 ? 1 : (resident_per_sm < wanted ? resident_per_sm : wanted));
}

/// Blocks of a launch: device_blocks, capped by `max_blocks` (0: no cap) and by the most
/// tiles the record's plans can have (one claim each). At least 1.
PAGESTASH_HOST_DEVICE constexpr cuda::std::int64_t launch_blocks(cuda::std::int64_t on_device, int max_blocks,
                                                                 cuda::std::int64_t max_tiles) {
  cuda::std::int64_t blocks = on_device;
  if (max_blocks > 0 && max_blocks < blocks) blocks = max_blocks;
  const cuda::std::int64_t per_claim = warps_per_block * tiles_per_warp_claim;
  const cuda::std::int64_t needed = (max_tiles + per_claim - 1) / per_claim;
  if (needed < blocks) blocks = needed;
  return blocks > 0 ? blocks : 1;
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
