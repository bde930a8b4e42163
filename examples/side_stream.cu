// The side-stream pattern: a stash runs on its own stream while the next layer computes,
// and the events that make it safe. Three rules:
//   1. the stash waits for the producer (an event recorded after the layer that wrote the
//      activation);
//   2. the activation's buffer is reused only after the stash (an event recorded after it);
//   3. in backward, the reload waits until the buffer's other uses are done, and the
//      consumer waits for the reload (an event recorded after it).
// Exits 0 when the reloaded activation is bit-exact, 77 without a GPU. CI compiles it;
// docs/api.md quotes it.
#include <pagestash/pagestash.cuh>
#include <pagestash/reference/reference.cuh>

#include <cstdio>
#include <cstring>
#include <vector>

namespace ps = pagestash;
using Layout = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
using Traits = ps::StashTraits<Layout>;

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("side_stream: no CUDA device: skipped\n");
    return 77;
  }
  ps::GroupedView<Layout> view;
  view.groups = 4;
  view.hidden = 1024;
  view.max_tokens = 128;
  const auto bytes = static_cast<std::size_t>(view.buffer_bytes(ps::BufferRole::data));
  std::vector<unsigned char> host(bytes), back(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i % 251 + 1);
  const std::vector<std::int32_t> live = {128, 7, 0, 64};
  ps::BF16* activation = nullptr;
  std::int32_t* counts = nullptr;
  PAGESTASH_CUDA_TRY(cudaMalloc(&activation, bytes));
  PAGESTASH_CUDA_TRY(cudaMalloc(&counts, live.size() * sizeof(std::int32_t)));
  PAGESTASH_CUDA_TRY(cudaMemcpy(counts, live.data(), live.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  // A pageable cudaMemcpy may return before the copy lands, and the non-blocking streams
  // below do not wait for the legacy stream it ran on.
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
  view.data = activation;
  view.counts = counts;
  ps::PoolConfig config;
  config.device_pages = 16;  // of 64 KiB
  ps::PagePool pool(config);
  auto record = ps::make_record<Traits>(pool, view);
  cudaStream_t compute, side;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t produced, stashed, backward, reloaded;
  for (cudaEvent_t* e : {&produced, &stashed, &backward, &reloaded})
    PAGESTASH_CUDA_TRY(cudaEventCreateWithFlags(e, cudaEventDisableTiming));

  // Forward: the layer writes the activation on the compute stream (here: a copy).
  PAGESTASH_CUDA_TRY(cudaMemcpyAsync(activation, host.data(), bytes, cudaMemcpyHostToDevice, compute));
  // [side_stream]
  PAGESTASH_CUDA_TRY(cudaEventRecord(produced, compute));      // after the layer that wrote it
  PAGESTASH_CUDA_TRY(cudaStreamWaitEvent(side, produced, 0));  // 1. the stash waits for it
  ps::stash(ps::on(side), pool, view, record);
  PAGESTASH_CUDA_TRY(cudaEventRecord(stashed, side));
  // ... the next layers run on `compute` meanwhile ...
  PAGESTASH_CUDA_TRY(cudaStreamWaitEvent(compute, stashed, 0));  // 2. before the buffer is reused
  PAGESTASH_CUDA_TRY(cudaMemsetAsync(activation, 0, bytes, compute));
  // Backward: when it reaches this layer, reload on the side stream; the consumer waits.
  PAGESTASH_CUDA_TRY(cudaEventRecord(backward, compute));
  PAGESTASH_CUDA_TRY(cudaStreamWaitEvent(side, backward, 0));  // the buffer's last other use is done
  ps::reload(ps::on(side), pool, record, view);
  PAGESTASH_CUDA_TRY(cudaEventRecord(reloaded, side));
  PAGESTASH_CUDA_TRY(cudaStreamWaitEvent(compute, reloaded, 0));  // 3. before backward reads it
  // [side_stream]
  PAGESTASH_CUDA_TRY(cudaMemcpyAsync(back.data(), activation, bytes, cudaMemcpyDeviceToHost, compute));
  PAGESTASH_CUDA_TRY(cudaStreamSynchronize(compute));

  bool exact = true;
  const std::size_t row = static_cast<std::size_t>(view.hidden) * 2;
  for (std::size_t g = 0; g < live.size(); ++g)
    for (std::int32_t t = 0; t < live[g]; ++t) {
      const std::size_t at = (g * static_cast<std::size_t>(view.max_tokens) + static_cast<std::size_t>(t)) * row;
      exact = exact && std::memcmp(back.data() + at, host.data() + at, row) == 0;
    }
  const ps::PoolStats stats = pool.stats();
  std::printf("side_stream: reload %s, overflow %d, error %d\n", exact ? "bit-exact" : "MISMATCH",
              static_cast<int>(stats.flags.overflow), static_cast<int>(stats.flags.error));
  for (cudaEvent_t e : {produced, stashed, backward, reloaded}) cudaEventDestroy(e);
  cudaStreamDestroy(side);
  cudaStreamDestroy(compute);
  cudaFree(counts);
  cudaFree(activation);
  return exact && !stats.flags.overflow && !stats.flags.error ? 0 : 1;
}
