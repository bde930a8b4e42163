// The extension's CUDA side (nvcc): the CUDA executor on pointers ops.cpp has checked. No
// PyTorch headers here, so this translation unit compiles in the time the kernels take.

// The CUDA executor's overloads first: recipes.hpp's templates call pagestash::stash etc.
// by qualified name, which sees the declarations before it.
#include <pagestash/pagestash.cuh>

#include "recipes.hpp"

namespace pagestash_torch {

void run_cuda(cudaStream_t stream, Op op, const std::string& recipe, const std::string& compression,
              const PoolParts& pool, const Shape& s, const RecordMemory& record, const Buffers& buffers,
              ps::ReloadOptions options) {
  run(ps::on(stream), op, recipe, compression, pool, s, record, buffers, options);
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
