// Stash kernels for every recipe (pagestash/layouts/recipes.hpp) and the tests' Plain layouts.
#include "stash_kernels.inl"

void pagestash_test::reset_on(cudaStream_t stream, pagestash::PagePool& pool) {
  pagestash::reset(pagestash::on(stream), pool);
}
void pagestash_test::end_step_on(cudaStream_t stream, pagestash::PagePool& pool) {
  pagestash::end_step(pagestash::on(stream), pool);
}

namespace {
__global__ void launch_id_kernel(std::uint64_t* out) { *out = pagestash::grid_launch_id(); }
}  // namespace

void pagestash_test::launch_id_on(cudaStream_t stream, std::uint64_t* out) {
  launch_id_kernel<<<1, 1, 0, stream>>>(out);
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

PAGESTASH_FOR_EACH_RECIPE(PAGESTASH_INSTANTIATE_STASH)
PAGESTASH_TEST_PLAIN_LAYOUTS(PAGESTASH_INSTANTIATE_STASH)
