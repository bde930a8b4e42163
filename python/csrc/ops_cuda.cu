// The extension's CUDA side (nvcc): the CUDA executor on pointers ops.cpp has checked. No
// PyTorch headers here, so this translation unit compiles in the time the kernels take.

// In any order: recipes.hpp includes pagestash.cuh itself under nvcc, so its templates' qualified calls
// (pagestash::stash etc.) see the CUDA executor's overloads whatever came first. recipes.hpp comes first here on
// purpose: the order that failed before (no CUDA overload of pagestash::stash), compiled by the
// pagestash_python_cuda target (tests/CMakeLists.txt) as by pip.
#include "recipes.hpp"

#include <pagestash/pagestash.cuh>

namespace pagestash_torch {

void run_cuda(cudaStream_t stream, ps::Operation op, Kind k, const PoolParts& pool, const Shape& s,
              const RecordMemory& record, const Buffers& buffers, ps::ReloadOptions options) {
  run(ps::on(stream), op, k, pool, s, record, buffers, options);
}

void pool_step_cuda(cudaStream_t stream, const PoolParts& pool, PoolStep step) {
  run_pool_step(ps::on(stream), pool, step);
}

void report_cuda(cudaStream_t stream, const PoolParts& pool, ps::PoolStats* dst) {
  run_report(ps::on(stream), pool, dst);
}

void resize_cuda(cudaStream_t stream, ps::PagePool& pool, bool growing, std::int64_t device_pages,
                 std::int64_t host_pages) {
  if (growing) ps::grow(ps::on(stream), pool, device_pages, host_pages);
  else ps::shrink(ps::on(stream), pool, device_pages, host_pages);
}

}  // namespace pagestash_torch
