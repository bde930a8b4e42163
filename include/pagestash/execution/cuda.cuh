#pragma once
// The CUDA executor: stash, reload, discard and reset on a device pool, each one kernel
// launch on the caller's stream. No host synchronisation, no allocation: every operation
// can be captured in a CUDA graph, and replays read the counts of the moment.
//
// One launch per grouped tensor, for all its paged buffers. The kernels are thin shells:
// the launch body (execution/operation.hpp: arrival, verdict, tiles, finish) is host+device
// code that the tests' grid emulator also runs on host threads. The grid is persistent:
// sized from occupancy and capped by the most tiles the record's shape can need.

#include <pagestash/cuda/error.hpp>
#include <pagestash/execution/host.hpp>
#include <pagestash/execution/operation.hpp>

#include <cuda/std/atomic>
#include <cuda_runtime_api.h>

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

/// Blocks per SM a launch is sized for, by compute capability: enough 16-byte loads in
/// flight to cover memory latency (Little's law: bandwidth x latency / SMs). An H100/H200
/// (sm_90: 4.8 TB/s, about 0.8 us loaded, 132 SMs) needs about 29 KiB in flight per SM; one
/// block has 16 warps x 32 lanes x 4 loads x 16 bytes = 32 KiB. A B200 (sm_100: 8 TB/s,
/// 148 SMs) needs about 43 KiB: two blocks.
constexpr int grid_blocks_per_sm(int compute_major) { return compute_major >= 10 ? 2 : 1; }

/// The launch's id: the grid's own (%gridid, a new one for every launch in the context),
/// plus one, as 0 means "no launch" in the record's owner word.
__device__ inline cuda::std::uint64_t grid_launch_id() {
  cuda::std::uint64_t id = 0;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  return id + 1;
}

/// CUDA's context for a thread of the launch.
__device__ inline GridContext<BlockTeam<threads_per_block>, WarpLanes> device_grid_context() {
  return {BlockTeam<threads_per_block>{}, WarpLanes{}, blockIdx.x,    gridDim.x, threadIdx.x / 32, blockDim.x / 32,
          grid_launch_id()};
}

template <class Traits, Operation Op>
__global__ void __launch_bounds__(threads_per_block, min_blocks_per_sm)
    operation_kernel(PoolRef pool, GroupedView<typename Traits::layout> view, RecordRef rec, bool zero_tail) {
  run_operation<Traits, Op>(device_grid_context(), pool, view, rec, zero_tail);
}

template <int Unused = 0>  // a template, so that the header defines it in every TU
__global__ void __launch_bounds__(threads_per_block) reset_kernel(PoolRef pool) {
  reset_pool(BlockTeam<threads_per_block>{}, pool);
}

template <int Unused = 0>
__global__ void __launch_bounds__(32) report_kernel(PoolRef pool, PoolReport* dst) {
  write_report(BlockTeam<32>{}, pool, dst);
}

/// Blocks of a launch on the current device: as many as fit at once, and no more than
/// grid_blocks_per_sm per SM. Queried once per kernel and device (the first launch), so
/// that later launches pay no query.
template <class Traits, Operation Op>
int device_blocks() {
  constexpr int max_devices = 64;
  static cuda::std::atomic<int> cached[max_devices] = {};  // 0: not queried yet
  int device = 0;
  PAGESTASH_CUDA_TRY(cudaGetDevice(&device));
  int blocks = device < max_devices ? cached[device].load(cuda::std::memory_order_relaxed) : 0;
  if (blocks == 0) {
    int sms = 0, major = 0, per_sm = 0;
    PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PAGESTASH_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, operation_kernel<Traits, Op>, threads_per_block, 0));
    const int wanted = grid_blocks_per_sm(major);
    blocks = sms * (per_sm <= 0 ? 1 : (per_sm < wanted ? per_sm : wanted));
    if (device < max_devices) cached[device].store(blocks, cuda::std::memory_order_relaxed);
  }
  return blocks;
}

/// Blocks for a launch: device_blocks(), no more than the most tiles need (one claim of
/// warps x tiles_per_warp_claim tiles each).
template <class Traits, Operation Op>
int grid_for(const CudaExecutor& ex, cuda::std::int64_t max_tiles) {
  cuda::std::int64_t blocks = device_blocks<Traits, Op>();
  if (ex.max_blocks > 0 && ex.max_blocks < blocks) blocks = ex.max_blocks;
  const cuda::std::int64_t needed = ceil_div(max_tiles, warps_per_block * tiles_per_warp_claim);
  if (needed < blocks) blocks = needed;
  return static_cast<int>(blocks > 0 ? blocks : 1);
}

/// Refuses, on the host, an operation whose stream belongs to another device than the pool.
inline void check_stream_device(const char* op, const CudaExecutor& ex, const PagePool& pool) {
  int device = 0;
  PAGESTASH_CUDA_TRY(cudaStreamGetDevice(ex.stream, &device));
  if (device != pool.device())
    invalid_call(op, "the stream belongs to device " + std::to_string(device) + ", the pool lives on device " +
                         std::to_string(pool.device()));
}

template <class Traits, Operation Op>
void launch(const CudaExecutor& ex, PagePool& pool, const GroupedView<typename Traits::layout>& view,
            StashRecord<Traits>& rec, bool zero_tail, cuda::std::int64_t max_tiles) {
  check_stream_device(Op == Operation::stash ? "stash" : (Op == Operation::reload ? "reload" : "discard"), ex, pool);
  const int blocks = grid_for<Traits, Op>(ex, max_tiles);
  operation_kernel<Traits, Op><<<blocks, threads_per_block, 0, ex.stream>>>(pool.ref(), view, rec.ref(), zero_tail);
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

/// Enqueues the stash of `view` on the executor's stream (see the host overload).
template <class Traits>
void stash(const CudaExecutor& ex, PagePool& pool, const GroupedView<typename Traits::layout>& view,
           StashRecord<Traits>& rec) {
  detail::check_stash(ex.memory, pool, view, rec);
  detail::launch<Traits, detail::Operation::stash>(ex, pool, view, rec, false, rec.max_tiles());
}

/// Enqueues the reload of `rec` into `dest` on the executor's stream.
template <class Traits>
void reload(const CudaExecutor& ex, PagePool& pool, StashRecord<Traits>& rec,
            const GroupedView<typename Traits::layout>& dest, ReloadOptions options = {}) {
  // A larger destination has more bytes to zero than the record's shape.
  const cuda::std::int64_t max_tiles = detail::check_reload(ex.memory, pool, rec, dest);
  detail::launch<Traits, detail::Operation::reload>(ex, pool, dest, rec, options.zero_tail, max_tiles);
}

/// Enqueues the return of `rec`'s pages, without copying.
template <class Traits>
void discard(const CudaExecutor& ex, PagePool& pool, StashRecord<Traits>& rec) {
  detail::check_pool_and_record("discard", ex.memory, pool, rec);
  detail::launch<Traits, detail::Operation::discard>(ex, pool, rec.shape(), rec, false, 0);
}

/// Enqueues a write of the pool's flags and counters into *dst (the caller's memory: pinned,
/// mapped or device) on the executor's stream. It sees every operation enqueued before it
/// on that stream (and whatever operations on other streams have done by then); read *dst
/// on the host after an event on the stream. No synchronisation, no allocation: it can be
/// captured in a graph. One small kernel.
inline void report(const CudaExecutor& ex, const PagePool& pool, PoolReport* dst) {
  if (pool.space() != ex.memory) detail::invalid_call("report", "the pool is in host memory; use pagestash::host");
  if (dst == nullptr) detail::invalid_call("report", "dst is null");
  detail::check_stream_device("report", ex, pool);
  detail::report_kernel<><<<1, 32, 0, ex.stream>>>(pool.ref(), dst);
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

/// Enqueues a reset of the pool: every page free, flags and statistics cleared. Nothing
/// else may run on the pool meanwhile; records stashed before become stale.
inline void reset(const CudaExecutor& ex, PagePool& pool) {
  if (pool.space() != ex.memory) detail::invalid_call("reset", "the pool is in host memory; use pagestash::host");
  detail::check_stream_device("reset", ex, pool);
  detail::reset_kernel<><<<1, detail::threads_per_block, 0, ex.stream>>>(pool.ref());
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

PAGESTASH_NAMESPACE_END
