// Every layout's device producer, instantiated for each layout configuration.

#include "layout_kernels.hpp"

#include <pagestash/pagestash.cuh>
#include <pagestash/reference/reference.cuh>

#include "../common/layout_list.hpp"

namespace pagestash_test {

template <class Layout>
pagestash::Flag produce_on_device_sync(const pagestash::GroupedView<Layout>& view, const pagestash::BF16* source,
                                       std::uint8_t poison) {
  pagestash::Flag* status = nullptr;
  pagestash::Flag host_status = pagestash::Flag::error;
  PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&status), sizeof(*status)));
  pagestash::produce_on_device(view, source, poison, cudaStreamPerThread, status);
  PAGESTASH_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
  PAGESTASH_CUDA_TRY(cudaMemcpy(&host_status, status, sizeof(host_status), cudaMemcpyDeviceToHost));
  PAGESTASH_CUDA_TRY(cudaFree(status));
  return host_status;
}

using namespace layouts;
#define PAGESTASH_INSTANTIATE_PRODUCER(L)                               \
  template pagestash::Flag produce_on_device_sync<PAGESTASH_LAYOUT(L)>( \
      const pagestash::GroupedView<PAGESTASH_LAYOUT(L)>&, const pagestash::BF16*, std::uint8_t);
PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_INSTANTIATE_PRODUCER)

}  // namespace pagestash_test
