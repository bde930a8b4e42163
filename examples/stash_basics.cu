// The same as stash_basics.cpp with the CUDA executor: device memory, counts that stay on
// the device, a stash and a reload captured once in a CUDA graph and replayed with new
// counts. Needs a GPU; without one it says so and exits 77 (ctest: skipped).

#include <pagestash/pagestash.cuh>

#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  using Layout = pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::CapacityPadded>;
  using Traits = pagestash::StashTraits<Layout>;

  pagestash::GroupedView<Layout> view;
  view.max_tokens = 256;
  view.hidden = 1024;
  view.groups = 4;
  std::int32_t* counts = nullptr;
  PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&view.data), view.buffer_bytes(pagestash::BufferRole::data)));
  PAGESTASH_CUDA_TRY(
      cudaMalloc(reinterpret_cast<void**>(&view.scales), view.buffer_bytes(pagestash::BufferRole::scales)));
  PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&view.amax), view.buffer_bytes(pagestash::BufferRole::amax)));
  PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&counts), 4 * sizeof(std::int32_t)));
  PAGESTASH_CUDA_TRY(cudaMemset(view.data, 0x11, view.buffer_bytes(pagestash::BufferRole::data)));
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());  // the memset is on the legacy stream, which `stream` does not wait for
  view.counts = counts;

  // [graph]
  pagestash::PoolConfig config;
  config.device_pages = 64;          // of 64 KiB
  pagestash::PagePool pool(config);  // device memory
  auto record = pagestash::make_record<Traits>(pool, view);

  cudaStream_t stream;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t step;
  PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  pagestash::stash(pagestash::on(stream), pool, view, record);   // after forward
  pagestash::reload(pagestash::on(stream), pool, record, view);  // in backward
  PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&step, graph, 0));

  for (std::int32_t step_index = 0; step_index < 3; ++step_index) {
    const std::vector<std::int32_t> live = {200 - 64 * step_index, 0, 17, 256};  // new counts each step
    PAGESTASH_CUDA_TRY(cudaMemcpyAsync(counts, live.data(), 16, cudaMemcpyHostToDevice, stream));
    PAGESTASH_CUDA_TRY(cudaGraphLaunch(step, stream));
  }
  PAGESTASH_CUDA_TRY(cudaStreamSynchronize(stream));
  // [graph]

  const pagestash::PoolStats stats = pool.stats();
  std::printf("record %s, pool peak %lld pages, overflow %d\n", pagestash::name_of(record.status().state),
              static_cast<long long>(stats.peak_pages_held), static_cast<int>(stats.flags.overflow));
  const bool ok = record.status().state == pagestash::RecordState::reloaded && !stats.flags.overflow &&
                  stats.device_pages_free == config.device_pages;
  cudaGraphExecDestroy(step);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(view.data);
  cudaFree(view.scales);
  cudaFree(view.amax);
  cudaFree(counts);
  return ok ? 0 : 1;
}
