// A training step on every visible GPU, one rank each (one thread per GPU, NCCL), the way a
// trainer wires pagestash: the step's stash, reload, agree() and report() are captured in
// a CUDA graph once and replayed every step; after each replay every rank reads the agreed
// flags from pinned memory (an event, no device-wide sync) and takes the same decision. At
// step 2 the last rank routes every token to one expert's full capacity, which its pool
// cannot hold: every rank reruns that step without paging. Exits 0 when every rank kept the
// other steps bit-exact and reran step 2; 77 without a GPU. CI compiles and links it;
// scripts/gpu-check runs it.
#include <pagestash/nccl.cuh>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ps = pagestash;
using Layout = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;
using Traits = ps::StashTraits<Layout>;

#define CHECK_NCCL(call)                                                                                 \
  do {                                                                                                   \
    const ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) throw std::runtime_error(std::string(#call) + ": " + ncclGetErrorString(r_)); \
  } while (0)

constexpr int kSteps = 4, kOverflowStep = 2, kGroups = 8;
constexpr std::int64_t kHidden = 1024, kCapacity = 256;

/// One rank: returns the number of steps that went wrong (0 when all is as expected).
int run_rank(int rank, int ranks, const ncclUniqueId& id) {
  PAGESTASH_CUDA_TRY(cudaSetDevice(rank));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, ranks, id, rank));
  cudaStream_t stream;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  ps::GroupedView<Layout> view, dest;
  view.groups = kGroups;
  view.hidden = kHidden;
  view.max_tokens = kCapacity;
  const std::int64_t bytes = view.buffer_bytes(ps::BufferRole::data);
  std::vector<unsigned char> host(static_cast<std::size_t>(bytes)), back(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>((i * 131 + rank * 7) % 251 + 1);
  ps::BF16 *data = nullptr, *out = nullptr;
  std::int32_t* counts = nullptr;
  PAGESTASH_CUDA_TRY(cudaMalloc(&data, static_cast<std::size_t>(bytes)));
  PAGESTASH_CUDA_TRY(cudaMalloc(&out, static_cast<std::size_t>(bytes)));
  PAGESTASH_CUDA_TRY(cudaMalloc(&counts, kGroups * sizeof(std::int32_t)));
  PAGESTASH_CUDA_TRY(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice));
  // A pageable cudaMemcpy may return before the copy lands, and `stream` (non-blocking)
  // does not wait for the legacy stream it ran on.
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
  view.data = data;
  view.counts = counts;
  dest = view;
  dest.data = out;

  // A pool for the usual step (a quarter of the capacity per expert), not for the worst case.
  ps::PoolConfig cfg;
  cfg.page_bytes = 64 << 10;
  cfg.device_pages = ps::pages_for(bytes / 4 + kGroups * 16, cfg.page_bytes);
  ps::PagePool pool(cfg);
  auto record = ps::make_record<Traits>(pool, view);
  ps::PoolStats* report = nullptr;  // pinned: the host reads it after the step's event
  PAGESTASH_CUDA_TRY(cudaHostAlloc(&report, sizeof(ps::PoolStats), cudaHostAllocMapped));

  // The step, captured once: what forward and backward would do around the layer.
  const auto ex = ps::on(stream);
  cudaGraph_t graph;
  cudaGraphExec_t step;
  // [trainer_capture]
  PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ps::stash(ex, pool, view, record);   // after forward
  ps::reload(ex, pool, record, dest);  // in backward
  ps::end_step(ex, pool);              // every page back, else `unbalanced` (a leak)
  ps::agree(ex, pool, comm);           // every rank's flags, all-reduced (max) in place
  ps::report(ex, pool, report);        // flags and counters into pinned memory
  PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  // [trainer_capture]
  PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&step, graph, 0));
  cudaEvent_t done;
  PAGESTASH_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

  int wrong = 0;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::int32_t> c(kGroups, static_cast<std::int32_t>(kCapacity / 4));
    if (s == kOverflowStep && rank == ranks - 1) c[0] = static_cast<std::int32_t>(kCapacity);  // one hot expert
    PAGESTASH_CUDA_TRY(
        cudaMemcpyAsync(counts, c.data(), c.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
    PAGESTASH_CUDA_TRY(cudaMemsetAsync(out, 0, static_cast<std::size_t>(bytes), stream));
    // [trainer_decide]
    PAGESTASH_CUDA_TRY(cudaGraphLaunch(step, stream));
    PAGESTASH_CUDA_TRY(cudaEventRecord(done, stream));
    PAGESTASH_CUDA_TRY(cudaEventSynchronize(done));               // this stream's work only
    const ps::StepDecision decision = ps::decide(report->flags);  // the same on every rank
    if (decision != ps::StepDecision::keep) {
      // Every rank: reset the pool, run the step again without paging (here: the activation
      // is kept as it is, so backward reads it in place).
      ps::reset(ex, pool);
      PAGESTASH_CUDA_TRY(cudaMemcpyAsync(out, data, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
    // [trainer_decide]
    PAGESTASH_CUDA_TRY(cudaMemcpyAsync(back.data(), out, back.size(), cudaMemcpyDeviceToHost, stream));
    PAGESTASH_CUDA_TRY(cudaStreamSynchronize(stream));
    // Backward's check: every live row is back (dead rows are zero, or whole on a rerun).
    bool exact = true;
    const std::int64_t row = kHidden * 2;
    for (int g = 0; g < kGroups && exact; ++g)
      for (std::int64_t t = 0; t < c[static_cast<std::size_t>(g)]; ++t) {
        const std::int64_t at = (g * kCapacity + t) * row;
        exact = exact && std::memcmp(back.data() + at, host.data() + at, static_cast<std::size_t>(row)) == 0;
      }
    const bool expected =
        decision == (s == kOverflowStep ? ps::StepDecision::rerun_without_paging : ps::StepDecision::keep);
    if (!exact || !expected) ++wrong;
    std::printf("rank %d step %d: %s%s, overflow %d error %d, %s\n", rank, s,
                decision == ps::StepDecision::keep ? "kept" : "rerun without paging", expected ? "" : " (unexpected)",
                report->flags.overflow, report->flags.error, exact ? "bit-exact" : "MISMATCH");
  }
  cudaEventDestroy(done);
  cudaGraphExecDestroy(step);
  cudaGraphDestroy(graph);
  cudaFreeHost(report);
  cudaFree(counts);
  cudaFree(out);
  cudaFree(data);
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
  return wrong;
}

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("multi_rank_step: no CUDA device: skipped\n");
    return 77;
  }
  ncclUniqueId id;
  CHECK_NCCL(ncclGetUniqueId(&id));
  std::vector<int> wrong(static_cast<std::size_t>(gpus), 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < gpus; ++r)
    ranks.emplace_back([&, r] {
      try {
        wrong[static_cast<std::size_t>(r)] = run_rank(r, gpus, id);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        wrong[static_cast<std::size_t>(r)] = kSteps;
      }
    });
  for (auto& t : ranks) t.join();
  int total = 0;
  for (int w : wrong) total += w;
  std::printf("multi_rank_step: %d rank(s), %d step(s) each: %s\n", gpus, kSteps, total == 0 ? "OK" : "FAILED");
  return total == 0 ? 0 : 1;
}
