#pragma once
// Optional: agreement on the pool's flags across ranks with NCCL (which ships with the CUDA toolkit; link libnccl, e.g.
// CMake's pagestash::nccl target when it was found). Every rank must take the same decision after a step (keep it, or
// rerun it without paging) though only one rank may have overflowed: agree() all-reduces the flags (max, word by word)
// in place on the CUDA stream, so that each rank's PagePool::flags() then holds the union, and decide() gives every
// rank the same answer. Graph-capturable; nothing synchronises.

#include <pagestash/pagestash.cuh>

#include <nccl.h>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

/// Enqueues an in-place all-reduce (ncclMax over the flag_count int32 words) of the pool's flags across the ranks of
/// `comm` on the executor's CUDA stream, after the step's work there (side streams joined with events), before
/// report().
inline void agree(const CudaExecutor& ex, PagePool& pool, ncclComm_t comm) {
  check_memory_space("agree", ex.memory, pool.space());
  detail::check_stream_device("agree", ex.stream, pool.device());
  constexpr std::size_t words = sizeof(PoolFlags) / sizeof(cuda::std::int32_t);
  const ncclResult_t r = ncclAllReduce(pool.flags(), pool.flags(), words, ncclInt32, ncclMax, comm, ex.stream);
  if (r != ncclSuccess)
    throw std::runtime_error(std::string("pagestash::agree: ncclAllReduce: ") + ncclGetErrorString(r));
}

PAGESTASH_NAMESPACE_END
