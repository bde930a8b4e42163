// Stash kernels for every recipe (pagestash/layouts/recipes.hpp) and the tests' Plain layouts.
#define PAGESTASH_TEST_DEFINE_POOL_ENTRY_POINTS
#include "stash_kernels.inl"

namespace {
__global__ void launch_id_kernel(std::uint64_t* out) { *out = pagestash::grid_launch_id(); }
}  // namespace

void pagestash_test::launch_id_on(cudaStream_t stream, std::uint64_t* out) {
  launch_id_kernel<<<1, 1, 0, stream>>>(out);
  PAGESTASH_CUDA_CHECK_LAUNCH();
}

PAGESTASH_FOR_EACH_RECIPE(PAGESTASH_INSTANTIATE_STASH)
PAGESTASH_TEST_PLAIN_LAYOUTS(PAGESTASH_INSTANTIATE_STASH)
