#pragma once
// The CUDA executor: stash, reload, discard and reset on a device pool, each one kernel
// launch on the caller's CUDA stream. No host synchronisation, no allocation: every operation
// can be captured in a CUDA graph, and replays read the counts of the moment.
//
// One launch per grouped tensor, for all its paged buffers. The kernels are thin shells: the launch body
// (execution/operation.hpp: arrival, verdict, tiles, finish) is host+device code that the tests' grid emulator also
// runs on host threads. The grid is persistent: sized by the device's policy (stash/policy.hpp: blocks per SM by
// architecture, no more than fit, capped by the most tiles the record's shape can need).

#include <pagestash/cuda/error.hpp>
#include <pagestash/cuda/stream.hpp>
#include <pagestash/execution/host.hpp>
#include <pagestash/execution/operation.hpp>
#include <pagestash/stash/policy.hpp>

#include <cuda/std/atomic>
#include <cuda_runtime_api.h>

PAGESTASH_NAMESPACE_BEGIN
/// The launch's id: the grid's own (%gridid, a new one for every launch in the context),
/// plus one, as 0 means "no launch" in the record's owner word.
__device__ inline cuda::std::uint64_t grid_launch_id() {
  cuda::std::uint64_t id = 0;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  return id + 1;
}

namespace detail {

/// A block of the operation kernels, as the architecture's policy has it.
using PolicyBlockTeam = BlockTeam<StashPolicy::threads_per_block>;

/// CUDA's context for a thread of the launch: its warps per block a constant, as the kernels are launched with the
/// policy's threads (below), so that a claim's chunk of tiles holds no register through the copy loop.
__device__ inline GridContext<PolicyBlockTeam, WarpLanes> device_grid_context() {
  return {PolicyBlockTeam{}, WarpLanes{}, blockIdx.x, gridDim.x, threadIdx.x / 32, StashPolicy::warps_per_block,
          grid_launch_id()};
}

// The kernels are bound to, and launched with, StashPolicy's threads: the architecture's in
// the device pass, sm_90's in the host's, the same count (stash/policy.hpp asserts it).
//
// A programmatic launch (CudaExecutor::programmatic_launch) may start the kernel while the one before it on the
// stream ends: every thread waits for that kernel's end and writes before anything else (the counts, the source, the
// pool and the record may all be its), then lets the next kernel start, whose threads wait alike. What it hides is the
// launch's latency, not any work. A plain launch passes both at once.
template <class Traits, Operation Op>
__global__ void __launch_bounds__(StashPolicy::threads_per_block, StashPolicy::min_blocks_per_sm)
    operation_kernel(PoolRef pool, GroupedView<typename Traits::layout> view, RecordRef rec, ReloadOptions options) {
#if __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  run_operation<Traits, Op>(device_grid_context(), pool, view, rec, options);
}

template <int Unused = 0>  // a template, so that the header defines it in every TU
__global__ void __launch_bounds__(StashPolicy::threads_per_block) reset_kernel(PoolRef pool) {
  reset_pool(PolicyBlockTeam{}, pool);
}

template <int Unused = 0>
__global__ void __launch_bounds__(32) report_kernel(PoolRef pool, PoolStats* dst) {
  write_report(BlockTeam<32>{}, pool, dst);
}

template <int Unused = 0>
__global__ void __launch_bounds__(32) end_step_kernel(PoolRef pool) {
  check_balance(BlockTeam<32>{}, pool);
}

template <int Unused = 0>
__global__ void __launch_bounds__(StashPolicy::threads_per_block)
    resize_kernel(PoolRef pool, cuda::std::int64_t device_pages, cuda::std::int64_t host_pages, bool growing) {
  if (growing) grow_pages(PolicyBlockTeam{}, pool, device_pages, host_pages);
  else shrink_pages(PolicyBlockTeam{}, pool, device_pages, host_pages);
}

/// grow and shrink run between steps, on a stream that is not being captured: a graph would repeat them.
inline void check_resize_stream(const char* name, cudaStream_t stream, const PagePool& pool) {
  check_memory_space(name, MemorySpace::device, pool.space());
  check_stream_device(name, stream, pool.device());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PAGESTASH_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw_invalid(std::string("pagestash::") + name,
                  "the stream is being captured: grow and shrink run between steps, outside a graph");
}

struct LaunchGrid {
  int blocks;
  bool programmatic;  ///< a programmatic launch (CudaExecutor::programmatic_launch) where the kernel's code waits
};

/// Blocks of a launch on the current device (launch_blocks of the device's policy), for a
/// record whose plans have at most `max_tiles` tiles, and whether it is programmatic. The device is queried once per
/// kernel and device (the first launch), so that later launches pay no query.
template <class Traits, Operation Op>
LaunchGrid grid_for(const CudaExecutor& ex, cuda::std::int64_t max_tiles) {
  constexpr int max_devices = 64;
  struct Queried {  // of one device; 0: not queried yet
    cuda::std::atomic<int> compute_major{0};
    cuda::std::atomic<int> ptx_version{0};            ///< of the kernel's code the device runs
    cuda::std::atomic<cuda::std::int64_t> blocks{0};  ///< device_blocks, stored after the two above
  };
  static Queried cached[max_devices];
  int device = 0;
  PAGESTASH_CUDA_TRY(cudaGetDevice(&device));
  Queried* known = device < max_devices ? &cached[device] : nullptr;
  cuda::std::int64_t on_device = known ? known->blocks.load(cuda::std::memory_order_acquire) : 0;
  int major = 0, ptx = 0;
  if (on_device != 0) {
    major = known->compute_major.load(cuda::std::memory_order_relaxed);
    ptx = known->ptx_version.load(cuda::std::memory_order_relaxed);
  } else {
    int sms = 0, per_sm = 0;
    PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PAGESTASH_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, operation_kernel<Traits, Op>,
                                                                     StashPolicy::threads_per_block, 0));
    cudaFuncAttributes code{};  // its PTX's version: a device of 9.0 may run code JIT-compiled from older PTX
    PAGESTASH_CUDA_TRY(cudaFuncGetAttributes(&code, operation_kernel<Traits, Op>));
    ptx = code.ptxVersion;
    on_device = with_stash_policy(major, [&](auto policy) { return device_blocks<decltype(policy)>(sms, per_sm); });
    if (known) {
      known->compute_major.store(major, cuda::std::memory_order_relaxed);
      known->ptx_version.store(ptx, cuda::std::memory_order_relaxed);
      known->blocks.store(on_device, cuda::std::memory_order_release);
    }
  }
  const int blocks = with_stash_policy(major, [&](auto policy) {
    return static_cast<int>(launch_blocks<decltype(policy)>(on_device, ex.max_blocks, max_tiles));
  });
  return {blocks, ex.programmatic_launch && ptx >= 90};  // code for compute_90 or newer waits
}

template <class Traits, Operation Op>
void launch(const CudaExecutor& ex, PagePool& pool, const GroupedView<typename Traits::layout>& view,
            StashRecord<Traits>& rec, ReloadOptions options, cuda::std::int64_t max_tiles) {
  check_stream_device(Op == Operation::stash ? "stash" : (Op == Operation::reload ? "reload" : "discard"), ex.stream,
                      pool.device());
  const LaunchGrid grid = grid_for<Traits, Op>(ex, max_tiles);
  cudaLaunchAttribute programmatic{cudaLaunchAttributeProgrammaticStreamSerialization, {}, {}};
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  const dim3 blocks(static_cast<unsigned>(grid.blocks)), threads(StashPolicy::threads_per_block);
  cudaLaunchConfig_t config{blocks, threads, 0, ex.stream, &programmatic, grid.programmatic ? 1u : 0u};
  const cudaError_t launched =
      cudaLaunchKernelEx(&config, operation_kernel<Traits, Op>, pool.ref(), view, rec.ref(), options);
  PAGESTASH_CUDA_CHECK_LAUNCH();  // takes the launch's error, as after <<<>>>
  PAGESTASH_CUDA_TRY(launched);
}

}  // namespace detail

/// Enqueues the stash of `view` on the executor's CUDA stream (see the host overload).
template <class Traits>
void stash(const CudaExecutor& ex, PagePool& pool, const GroupedView<typename Traits::layout>& view,
           StashRecord<Traits>& rec) {
  check_stash(ex.memory, pool, view, rec);
  detail::launch<Traits, Operation::stash>(ex, pool, view, rec, {}, rec.max_tiles());
}

/// Enqueues the reload of `rec` into `dest` on the executor's CUDA stream.
template <class Traits>
void reload(const CudaExecutor& ex, PagePool& pool, StashRecord<Traits>& rec,
            const GroupedView<typename Traits::layout>& dest, ReloadOptions options = {}) {
  // A larger destination has more bytes to zero than the record's shape.
  const cuda::std::int64_t max_tiles = check_reload(ex.memory, pool, rec, dest);
  detail::launch<Traits, Operation::reload>(ex, pool, dest, rec, options, max_tiles);
}

/// Enqueues the return of `rec`'s pages, without copying.
template <class Traits>
void discard(const CudaExecutor& ex, PagePool& pool, StashRecord<Traits>& rec) {
  check_pool_and_record("discard", ex.memory, pool, rec);
  detail::launch<Traits, Operation::discard>(ex, pool, rec.shape(), rec, {}, 0);
}

/// Enqueues a write of the pool's flags and counters into *dst (the caller's memory: pinned, mapped or device) on the
/// executor's CUDA stream. It sees every operation enqueued before it on that CUDA stream (and whatever operations on
/// other CUDA streams have done by then); read *dst on the host after an event on that CUDA stream. No synchronisation,
/// no allocation: it can be captured in a graph. One small kernel.
inline void report(const CudaExecutor& ex, const PagePool& pool, PoolStats* dst) {
  check_report(ex.memory, pool, dst);
  detail::check_stream_device("report", ex.stream, pool.device());
  detail::report_kernel<><<<1, 32, 0, ex.stream>>>(pool.ref(), dst);
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

/// Enqueues the end-of-step balance check (see the host overload) on the executor's CUDA stream,
/// after the step's last reload or discard and before report(). One small kernel; no sync.
inline void end_step(const CudaExecutor& ex, PagePool& pool) {
  check_memory_space("end_step", ex.memory, pool.space());
  detail::check_stream_device("end_step", ex.stream, pool.device());
  detail::end_step_kernel<><<<1, 32, 0, ex.stream>>>(pool.ref());
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

/// Enqueues a reset of the pool: every page free, flags and statistics cleared. Nothing
/// else may run on the pool meanwhile; records stashed before become stale.
inline void reset(const CudaExecutor& ex, PagePool& pool) {
  check_memory_space("reset", ex.memory, pool.space());
  detail::check_stream_device("reset", ex.stream, pool.device());
  detail::reset_kernel<><<<1, StashPolicy::threads_per_block, 0, ex.stream>>>(pool.ref());
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

/// Grows a device pool with a reserve (PoolConfig::device_reserve): backs the memory now (CUDA's virtual memory
/// management; out of memory: throws, the pool as it was), then enqueues the kernel that puts the new pages' ids on
/// the free stack, in stream order; operations on other streams may run meanwhile. The addresses of the pages, and
/// every graph captured on the pool, stay valid. Not on a capturing stream.
inline void grow(const CudaExecutor& ex, PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
  detail::check_resize_stream("grow", ex.stream, pool);
  detail::PoolResize::grow(pool, device_pages, host_pages, [&] {
    detail::resize_kernel<>
        <<<1, StashPolicy::threads_per_block, 0, ex.stream>>>(pool.ref(), device_pages, host_pages, true);
    PAGESTASH_CUDA_CHECK_LAUNCH();
  });
}

/// Shrinks a device pool in stream order when every page is back, and gives back the memory past the pages kept:
/// synchronises the stream to learn whether it did (refused while a record holds pages: std::invalid_argument,
/// nothing changed). Not on a capturing stream.
inline void shrink(const CudaExecutor& ex, PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
  detail::check_resize_stream("shrink", ex.stream, pool);
  detail::PoolResize::shrink(pool, device_pages, host_pages, [&] {
    detail::resize_kernel<>
        <<<1, StashPolicy::threads_per_block, 0, ex.stream>>>(pool.ref(), device_pages, host_pages, false);
    PAGESTASH_CUDA_CHECK_LAUNCH();
    PAGESTASH_CUDA_TRY(cudaStreamSynchronize(ex.stream));
    cuda::std::int32_t resized = 0;
    PAGESTASH_CUDA_TRY(cudaMemcpy(&resized, &pool.ref().state->resized, sizeof resized, cudaMemcpyDeviceToHost));
    return resized;
  });
}

PAGESTASH_NAMESPACE_END
