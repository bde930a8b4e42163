// pagestash microbenchmarks (Google Benchmark, manual timing).
//
// GPU present: stash and reload with the CUDA executor for each recipe and live size, and,
// on the same live bytes in the same run, the baselines: cudaMemcpyAsync device to device
// (the ceiling), a per-token kernel in the reference algorithm's style (one block per
// token row, 1024-element chunks, one launch per buffer), cub::DeviceMemcpy::Batched
// over the same page list and a plain TMA bulk copy of the same pieces (sm_90 and newer);
// host spill against cudaMemcpyAsync device to host; captured graphs of 32 stashes, reloads
// and discards, each timed alone; the compressed stash and its reload (bf16/capacity, DeepSeek-V3's hidden, each format
// of PAGESTASH_FOR_EACH_COMPRESSION) beside the lossless ones. Times come from CUDA events.
//
// No GPU: the host reference executor against std::memcpy of the same bytes, a sanity
// figure for the reference path (reported as such), and the compressed stash and reload the same way.
//
// After the benchmarks a table gives GB/s (bytes read + written) and the ratios to the
// ceiling. Flags: --preset=short|full (sizes), --recipes=a,b (default: every recipe of
// pagestash/layouts/recipes.hpp), and Google Benchmark's own (--benchmark_out=file.json
// --benchmark_out_format=json for the plot, --benchmark_list_tests: the names only).

#include <pagestash/layouts/recipes.hpp>
#include <pagestash/pagestash.cuh>
#include <pagestash/reference/reference.cuh>
#include <pagestash/sizing/model_shapes.hpp>

#include "bulk_chunks.hpp"
#include "fine_grained.hpp"
#include "sector_floor.hpp"

#include <benchmark/benchmark.h>
#include <cub/device/device_memcpy.cuh>
#include <cuda/annotated_ptr>
#include <cuda/ptx>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ps = pagestash;
using std::int64_t;

namespace {

bool g_gpu = false;
std::vector<int64_t> g_sizes_mib;

/// GB/s per (kernel, recipe, MiB), filled by the benchmarks, printed as a table at the end.
std::map<std::string, std::map<std::pair<std::string, int64_t>, double>> g_rates;

/// Pages of one stash per (compression, recipe, MiB), for the compressed table.
std::map<std::string, std::map<std::pair<std::string, int64_t>, int64_t>> g_pages;

void record_rate(const std::string& kernel, const std::string& recipe, int64_t mib, int64_t bytes, double seconds,
                 benchmark::State& state) {
  const double rate = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  g_rates[kernel][{recipe, mib}] = rate;
  state.counters["GB/s"] = rate;
  state.counters["bytes"] = static_cast<double>(bytes);
}

// ---- Recipes: a layout, and a shape whose live bytes are about the requested size ----------

// Every recipe of pagestash/layouts/recipes.hpp is benched (--recipes=a,b narrows them);
// the spill and graph benchmarks use bf16/capacity.
using Bf16 = ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>;

constexpr int64_t kHidden = 7168;  // DeepSeek-V3
constexpr int kGroups = 8;

/// A shape with capacity twice the live count, whose live bytes are close to `mib` MiB:
/// up to 8 groups (fewer where one granule per group is already more).
template <class L>
ps::GroupedView<L> shape_for(int64_t mib, std::vector<std::int32_t>& counts) {
  using Tr = ps::StashTraits<L>;
  ps::GroupedView<L> v;
  v.hidden = kHidden;
  v.groups = 1;
  const int64_t granule = v.granule();
  v.max_tokens = granule;
  const std::int32_t one = static_cast<std::int32_t>(granule);
  const int64_t per_granule = ps::plan_work<Tr>(v, &one, false, nullptr).live_bytes;
  const int64_t granules = std::max<int64_t>(1, (mib << 20) / per_granule);
  v.groups = ps::Recipe<L>::plain ? 1 : static_cast<std::int32_t>(std::clamp<int64_t>(granules, 1, kGroups));
  const int64_t per_group = std::max<int64_t>(1, granules / v.groups);
  v.max_tokens = 2 * per_group * granule;
  counts.assign(static_cast<std::size_t>(v.groups), static_cast<std::int32_t>(per_group * granule));
  return v;
}

// ---- Memory ----------------------------------------------------------------------------------

/// Host bytes to device memory, landed before the call returns: a pageable cudaMemcpy may
/// return before its DMA is done, and the benchmarks' non-blocking stream does not order
/// with the legacy stream it ran on.
void upload(void* dst, const void* src, std::size_t n) {
  PAGESTASH_CUDA_TRY(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
}

struct Bytes {
  bool device;
  std::size_t n;
  unsigned char* p = nullptr;
  Bytes(bool on_device, std::size_t bytes) : device(on_device), n(bytes) {
    if (device) PAGESTASH_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n + 16));
    else p = static_cast<unsigned char*>(ps::allocate_host(n + 16));  // as the host pool: 2 MiB pages
  }
  ~Bytes() {
    if (device) cudaFree(p);
    else ps::free_host(p, n + 16);
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  void fill_random(std::uint32_t seed);
};

/// Non-zero random bytes: word k of the buffer seeded `seed` (splitmix64), the same on the host and the device.
__host__ __device__ inline std::uint64_t random_word(std::uint32_t seed, std::uint64_t k) {
  std::uint64_t z = (std::uint64_t{seed} << 40 ^ k) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 0x0101010101010101ull;
}

__global__ void fill_random_kernel(unsigned char* p, std::size_t n, std::uint32_t seed) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t k = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; k * 8 < n; k += stride) {
    const std::uint64_t w = random_word(seed, k);
    for (std::size_t b = 0; b < 8 && k * 8 + b < n; ++b) p[k * 8 + b] = static_cast<unsigned char>(w >> (8 * b));
  }
}

// Filled where the bytes live: the GPU's rotations are hundreds of MiB per benchmark, which a host loop and an upload
// took seconds each to make.
void Bytes::fill_random(std::uint32_t seed) {
  if (device) {
    fill_random_kernel<<<1024, 256>>>(p, n, seed);
    PAGESTASH_CUDA_TRY(cudaGetLastError());
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    return;
  }
  for (std::size_t k = 0; k * 8 < n; ++k) {
    const std::uint64_t w = random_word(seed, k);
    std::memcpy(p + k * 8, &w, std::min<std::size_t>(8, n - k * 8));
  }
}

/// One grouped tensor's buffers (and counts), in host or device memory.
template <class L>
struct Tensor {
  ps::GroupedView<L> view;
  std::vector<std::unique_ptr<Bytes>> owned;
  Tensor(const ps::GroupedView<L>& shape, const std::vector<std::int32_t>& counts, bool device, std::uint32_t seed)
      : view(shape) {
    auto make = [&](std::size_t n) {
      owned.push_back(std::make_unique<Bytes>(device, n));
      return owned.back()->p;
    };
    for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales, ps::BufferRole::amax}) {
      if (!L::has(role)) continue;
      unsigned char* p = make(static_cast<std::size_t>(view.buffer_bytes(role)));
      owned.back()->fill_random(seed + static_cast<std::uint32_t>(role));
      if (role == ps::BufferRole::data) view.data = reinterpret_cast<typename L::data_type*>(p);
      if constexpr (!std::is_void_v<typename L::scale_type>)
        if (role == ps::BufferRole::scales) view.scales = reinterpret_cast<typename L::scale_type*>(p);
      if (role == ps::BufferRole::amax) view.amax = reinterpret_cast<float*>(p);
    }
    unsigned char* c = make(counts.size() * sizeof(std::int32_t));
    if (device) upload(c, counts.data(), counts.size() * 4);
    else std::memcpy(c, counts.data(), counts.size() * 4);
    view.counts = reinterpret_cast<const std::int32_t*>(c);
  }
};

/// Enough copies of the tensor that rotating through them keeps small sizes out of L2
/// (H200: 50 MB of L2; we rotate over at least 256 MiB).
template <class L>
std::vector<std::unique_ptr<Tensor<L>>> rotation(const ps::GroupedView<L>& shape,
                                                 const std::vector<std::int32_t>& counts, bool device) {
  int64_t bytes = 0;
  for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales}) bytes += shape.buffer_bytes(role);
  const int64_t copies = device ? std::clamp<int64_t>((int64_t{256} << 20) / std::max<int64_t>(bytes, 1), 1, 64) : 1;
  std::vector<std::unique_ptr<Tensor<L>>> out;
  for (int64_t i = 0; i < copies; ++i)
    out.push_back(std::make_unique<Tensor<L>>(shape, counts, device, static_cast<std::uint32_t>(i * 7 + 1)));
  return out;
}

ps::PoolConfig pool_for(int64_t pages, int64_t host_pages = 0) {
  ps::PoolConfig c;
  c.page_bytes = 64 << 10;
  c.device_pages = pages;
  c.host_pages = host_pages;
  return c;
}

// ---- GPU timing ----------------------------------------------------------------------------

struct Events {
  cudaEvent_t start{}, stop{};
  Events() {
    PAGESTASH_CUDA_TRY(cudaEventCreate(&start));
    PAGESTASH_CUDA_TRY(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  /// Seconds `work` takes on `stream`, from events around it.
  double time(cudaStream_t stream, const std::function<void()>& work) {
    PAGESTASH_CUDA_TRY(cudaEventRecord(start, stream));
    work();
    PAGESTASH_CUDA_TRY(cudaEventRecord(stop, stream));
    PAGESTASH_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    PAGESTASH_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return ms / 1e3;
  }
};

cudaStream_t bench_stream() {
  static cudaStream_t s = [] {
    cudaStream_t x;
    PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    return x;
  }();
  return s;
}

// ---- Baseline: a per-token kernel in the reference algorithm's style -------------------------

/// One block per row (token), the row copied in chunks of 1024 elements of T, the page of
/// row t at page_ids[t / rows_per_page]. One launch per buffer.
template <class T>
__global__ void per_token_kernel(const unsigned char* src, const int64_t* row_offsets, int64_t row_bytes,
                                 const std::int32_t* page_ids, int64_t rows_per_page, unsigned char* arena,
                                 int64_t page_bytes) {
  const int64_t row = blockIdx.x;
  const T* in = reinterpret_cast<const T*>(src + row_offsets[row]);
  T* out = reinterpret_cast<T*>(arena + page_ids[row / rows_per_page] * page_bytes + (row % rows_per_page) * row_bytes);
  const int64_t n = row_bytes / static_cast<int64_t>(sizeof(T));
  for (int64_t chunk = 0; chunk < n; chunk += 1024)
    for (int64_t i = chunk + threadIdx.x; i < chunk + 1024 && i < n; i += blockDim.x) out[i] = in[i];
}

/// The rows of one buffer's live runs: token-major buffers as rows of `row_bytes`, other
/// runs (NVFP4's transposed lines) as rows of their own length, padded to the widest.
struct Rows {
  std::vector<int64_t> offsets;
  int64_t row_bytes = 0;
};

template <class L>
Rows rows_of(const ps::GroupedView<L>& v, ps::BufferRole role, const std::vector<std::int32_t>& counts) {
  const ps::BufferGeometry geo = v.geometry(role);
  Rows r;
  const bool token_rows = geo.block.token_axis == ps::TokenAxis::rows && !geo.block.swizzled;
  r.row_bytes = token_rows ? geo.block.cols : 0;
  for (int64_t i = 0; i < ps::run_count(geo); ++i) {
    const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
    if (!token_rows) r.row_bytes = std::max(r.row_bytes, run.bytes);
  }
  for (int64_t i = 0; i < ps::run_count(geo); ++i) {
    const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
    if (token_rows) {
      for (int64_t o = 0; o < run.bytes; o += r.row_bytes) r.offsets.push_back(run.offset + o);
    } else if (run.bytes > 0) {
      r.offsets.push_back(run.offset);
    }
  }
  return r;
}

// ---- Benchmarks ------------------------------------------------------------------------------

enum class Op { stash, reload };

/// A stash or reload of `mib` MiB of live bytes, lossless or compressed (CompressionTraits). Its bytes are what the
/// stream holds, read + written; compressed, twice the live BF16/FP16 bytes instead (what a lossless stash of the
/// tensor moves), so that a compressed row and the lossless row of its tensor compare by time alone.
template <class L, class Compression = ps::Lossless>
void bm_stash(benchmark::State& state, Op op, int64_t mib, int max_blocks = 0) {
  using Tr = ps::CompressionTraits<L, Compression>;
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<L>(mib, counts);
  auto tensors = rotation(shape, counts, g_gpu);
  ps::PagePool pool(pool_for(ps::work_bounds<Tr>(shape).stream_bytes / (64 << 10) + 1),
                    g_gpu ? ps::MemorySpace::device : ps::MemorySpace::host);
  auto rec = ps::make_record<Tr>(pool, shape);
  Events* events = g_gpu ? new Events : nullptr;
  std::size_t k = 0;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    auto& t = *tensors[k++ % tensors.size()];
    double s = 0;
    if (g_gpu) {
      const auto ex = ps::on(bench_stream()).with_max_blocks(max_blocks);
      if (op == Op::stash) {
        s = events->time(bench_stream(), [&] { ps::stash(ex, pool, t.view, rec); });
        ps::discard(ex, pool, rec);
      } else {
        ps::stash(ex, pool, t.view, rec);
        s = events->time(bench_stream(), [&] { ps::reload(ex, pool, rec, t.view); });
      }
    } else {
      using clock = std::chrono::steady_clock;
      if (op == Op::stash) {
        const auto t0 = clock::now();
        ps::stash(ps::host, pool, t.view, rec);
        s = std::chrono::duration<double>(clock::now() - t0).count();
        ps::discard(ps::host, pool, rec);
      } else {
        ps::stash(ps::host, pool, t.view, rec);
        const auto t0 = clock::now();
        ps::reload(ps::host, pool, rec, t.view);
        s = std::chrono::duration<double>(clock::now() - t0).count();
      }
    }
    state.SetIterationTime(s);
    seconds += s;
    const ps::RecordStatus st = rec.status();
    bytes += 2 * (Compression::compressed ? st.live_bytes : st.stream_bytes);  // read + written (metadata below)
  }
  delete events;
  const auto st = rec.status();
  state.counters["meta_bytes"] = static_cast<double>(st.pages * 4 + 4 * shape.groups * 64);
  // A stash's pages, from the plan (the record is empty again after a stash row's discard).
  const int64_t pages =
      ps::pages_for(ps::plan_work<Tr>(shape, counts.data(), false, nullptr).stream_bytes, int64_t{64} << 10);
  state.counters["pages"] = static_cast<double>(pages);
  record_rate(std::string(g_gpu ? "" : "host_") + (op == Op::stash ? "stash" : "reload") +
                  (Compression::compressed ? std::string("_") + Compression::name : std::string()) +
                  (max_blocks > 0 ? "@" + std::to_string(max_blocks) : std::string()),
              ps::Recipe<L>::name(), mib, bytes, seconds, state);
  if (op == Op::stash) g_pages[Compression::name][{ps::Recipe<L>::name(), mib}] = pages;
}

/// The ceiling: one contiguous copy of the same live bytes (cudaMemcpyAsync D2D, or
/// std::memcpy on the host).
template <class L>
void bm_memcpy(benchmark::State& state, int64_t mib) {
  using Tr = ps::StashTraits<L>;
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<L>(mib, counts);
  const int64_t live = ps::plan_work<Tr>(shape, counts.data(), false, nullptr).live_bytes;
  const int64_t copies = g_gpu ? std::clamp<int64_t>((int64_t{256} << 20) / live, 1, 64) : 1;
  std::vector<std::unique_ptr<Bytes>> src;
  for (int64_t i = 0; i < copies; ++i) {
    src.push_back(std::make_unique<Bytes>(g_gpu, static_cast<std::size_t>(live)));
    src.back()->fill_random(static_cast<std::uint32_t>(i));
  }
  Bytes dst(g_gpu, static_cast<std::size_t>(live));
  Events* events = g_gpu ? new Events : nullptr;
  std::size_t k = 0;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    const unsigned char* s = src[k++ % src.size()]->p;
    double t = 0;
    if (g_gpu) {
      t = events->time(bench_stream(), [&] {
        PAGESTASH_CUDA_TRY(
            cudaMemcpyAsync(dst.p, s, static_cast<std::size_t>(live), cudaMemcpyDeviceToDevice, bench_stream()));
      });
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.p, s, static_cast<std::size_t>(live));
      benchmark::ClobberMemory();
      t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    state.SetIterationTime(t);
    seconds += t;
    bytes += 2 * live;
  }
  delete events;
  record_rate(g_gpu ? "memcpy_d2d" : "host_memcpy", ps::Recipe<L>::name(), mib, bytes, seconds, state);
}

/// The reference style: per-token blocks, one launch per paged buffer, into its own pages.
template <class L>
void bm_per_token(benchmark::State& state, int64_t mib) {
  using Tr = ps::StashTraits<L>;
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<L>(mib, counts);
  auto tensors = rotation(shape, counts, true);
  struct Buffer {
    ps::BufferRole role;
    int64_t rows, row_bytes, rows_per_page;
    std::unique_ptr<Bytes> offsets, ids, arena;
  };
  const int64_t page_bytes = 64 << 10;
  std::vector<Buffer> buffers;
  int64_t live = 0;
  for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales}) {
    if (ps::handling_of<Tr>(role) != ps::Handling::paged) continue;
    const Rows r = rows_of(shape, role, counts);
    Buffer b{role,        static_cast<int64_t>(r.offsets.size()),
             r.row_bytes, std::max<int64_t>(1, page_bytes / r.row_bytes),
             {},          {},
             {}};
    const int64_t pages = (b.rows + b.rows_per_page - 1) / b.rows_per_page;
    b.offsets = std::make_unique<Bytes>(true, r.offsets.size() * sizeof(int64_t));
    upload(b.offsets->p, r.offsets.data(), b.offsets->n);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int32_t>(ids.size() - 1 - i);  // not in order
    b.ids = std::make_unique<Bytes>(true, ids.size() * 4);
    upload(b.ids->p, ids.data(), b.ids->n);
    b.arena = std::make_unique<Bytes>(true, static_cast<std::size_t>(pages * std::max(page_bytes, r.row_bytes)));
    live += b.rows * b.row_bytes;
    buffers.push_back(std::move(b));
  }
  Events events;
  std::size_t k = 0;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    auto& t = *tensors[k++ % tensors.size()];
    const double s = events.time(bench_stream(), [&] {
      for (const Buffer& b : buffers) {
        const auto* src = static_cast<const unsigned char*>(t.view.buffer(b.role));
        const int64_t pb = std::max(page_bytes, b.row_bytes);
        if (b.row_bytes % 2 == 0 && std::is_same_v<typename L::scale_type, void>)
          per_token_kernel<std::uint16_t><<<static_cast<unsigned>(b.rows), 256, 0, bench_stream()>>>(
              src, reinterpret_cast<const int64_t*>(b.offsets->p), b.row_bytes,
              reinterpret_cast<const std::int32_t*>(b.ids->p), b.rows_per_page, b.arena->p, pb);
        else
          per_token_kernel<std::uint8_t><<<static_cast<unsigned>(b.rows), 256, 0, bench_stream()>>>(
              src, reinterpret_cast<const int64_t*>(b.offsets->p), b.row_bytes,
              reinterpret_cast<const std::int32_t*>(b.ids->p), b.rows_per_page, b.arena->p, pb);
        PAGESTASH_CUDA_CHECK_LAUNCH();
      }
    });
    state.SetIterationTime(s);
    seconds += s;
    bytes += 2 * live;
  }
  record_rate("per_token_ref", ps::Recipe<L>::name(), mib, bytes, seconds, state);
}

/// Each piece of the live runs inside one page, in the stream's order (the stream's layout, stash/work.hpp: segments
/// on 16-byte boundaries, lines back to back): from `buffer(role)` + the run's offset to `page(index)` + the offset in
/// that page of 64 KiB, addresses as integers. cub_batched and tma_bulk copy these.
template <class L, class Buffer, class Page>
std::vector<pagestash_bench::BulkPiece> live_pieces(const ps::GroupedView<L>& shape,
                                                    const std::vector<std::int32_t>& counts, Buffer&& buffer,
                                                    Page&& page) {
  using Tr = ps::StashTraits<L>;
  constexpr int64_t page_bytes = int64_t{64} << 10;
  std::vector<pagestash_bench::BulkPiece> out;
  int64_t stream = 0;
  for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales}) {
    if (ps::handling_of<Tr>(role) != ps::Handling::paged) continue;
    const ps::BufferGeometry geo = shape.geometry(role);
    const std::uint64_t base = buffer(role);
    for (int32_t seg_index = 0; seg_index < geo.segment_count(); ++seg_index) {
      const ps::Segment seg = geo.segment(seg_index, counts.data());
      for (int64_t line = 0; line < seg.lines; ++line) {
        for (int64_t o = 0; o < seg.live;) {
          const int64_t pos = stream + o;
          const int64_t in_page = std::min(seg.live - o, page_bytes - pos % page_bytes);
          out.push_back({base + static_cast<std::uint64_t>(seg.line_offset(line) + o),
                         page(pos / page_bytes) + static_cast<std::uint64_t>(pos % page_bytes), in_page});
          o += in_page;
        }
        stream += seg.live;
      }
      stream = (stream + 15) / 16 * 16;
    }
  }
  return out;
}

/// A rotation of tensors of a recipe's shape, and the pages a real stash of the first moved it into: what the bulk
/// baselines copy into (cub_batched, tma_bulk).
template <class L>
struct StashedPages {
  using Tr = ps::StashTraits<L>;
  std::vector<std::int32_t> counts;
  ps::GroupedView<L> shape;
  std::vector<std::unique_ptr<Tensor<L>>> tensors;
  ps::PagePool pool;
  decltype(ps::make_record<Tr>(std::declval<ps::PagePool&>(), std::declval<const ps::GroupedView<L>&>())) rec;
  std::vector<std::int32_t> ids;
  explicit StashedPages(int64_t mib)
      : shape(shape_for<L>(mib, counts)), tensors(rotation(shape, counts, true)),
        pool(pool_for(ps::work_bounds<Tr>(shape).stream_bytes / (64 << 10) + 1)),
        rec(ps::make_record<Tr>(pool, shape)) {
    ps::stash(ps::on(bench_stream()), pool, tensors[0]->view, rec);
    PAGESTASH_CUDA_TRY(cudaStreamSynchronize(bench_stream()));
    ids = rec.page_ids();
  }
};

/// live_pieces of tensor `t` into the pages `ids` of `pool`.
template <class L>
std::vector<pagestash_bench::BulkPiece> pieces_into_pages(const ps::GroupedView<L>& shape,
                                                          const std::vector<std::int32_t>& counts, const Tensor<L>& t,
                                                          ps::PagePool& pool, const std::vector<std::int32_t>& ids) {
  return live_pieces(
      shape, counts, [&](ps::BufferRole role) { return reinterpret_cast<std::uint64_t>(t.view.buffer(role)); },
      [&](int64_t index) {
        return reinterpret_cast<std::uint64_t>(pool.ref().page(ids[static_cast<std::size_t>(index)]));
      });
}

/// cub::DeviceMemcpy::Batched over the page list a real stash produced: one buffer per
/// piece of a run inside one page.
template <class L>
void bm_cub_batched(benchmark::State& state, int64_t mib) {
  StashedPages<L> run(mib);
  const auto &counts = run.counts, &ids = run.ids;
  const auto& shape = run.shape;
  auto& tensors = run.tensors;
  auto& pool = run.pool;
  // Each tensor copy gets its own list of (source, destination, size).
  struct List {
    std::unique_ptr<Bytes> src, dst, sizes;
    int64_t count = 0;
  };
  std::vector<List> lists;
  int64_t live = 0;
  for (auto& t : tensors) {
    std::vector<const void*> s;
    std::vector<void*> d;
    std::vector<std::size_t> n;
    live = 0;
    for (const pagestash_bench::BulkPiece& p : pieces_into_pages(shape, counts, *t, pool, ids)) {
      s.push_back(reinterpret_cast<const void*>(p.src));
      d.push_back(reinterpret_cast<void*>(p.dst));
      n.push_back(static_cast<std::size_t>(p.bytes));
      live += p.bytes;
    }
    List l;
    l.count = static_cast<int64_t>(n.size());
    l.src = std::make_unique<Bytes>(true, s.size() * sizeof(void*));
    l.dst = std::make_unique<Bytes>(true, d.size() * sizeof(void*));
    l.sizes = std::make_unique<Bytes>(true, n.size() * sizeof(std::size_t));
    upload(l.src->p, s.data(), l.src->n);
    upload(l.dst->p, d.data(), l.dst->n);
    upload(l.sizes->p, n.data(), l.sizes->n);
    lists.push_back(std::move(l));
  }
  std::size_t temp_bytes = 0;
  PAGESTASH_CUDA_TRY(cub::DeviceMemcpy::Batched(
      nullptr, temp_bytes, reinterpret_cast<void**>(lists[0].src->p), reinterpret_cast<void**>(lists[0].dst->p),
      reinterpret_cast<std::size_t*>(lists[0].sizes->p), static_cast<std::uint32_t>(lists[0].count), bench_stream()));
  Bytes temp(true, temp_bytes);
  Events events;
  std::size_t k = 0;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    const List& l = lists[k++ % lists.size()];
    const double s = events.time(bench_stream(), [&] {
      PAGESTASH_CUDA_TRY(cub::DeviceMemcpy::Batched(
          temp.p, temp_bytes, reinterpret_cast<void**>(l.src->p), reinterpret_cast<void**>(l.dst->p),
          reinterpret_cast<std::size_t*>(l.sizes->p), static_cast<std::uint32_t>(l.count), bench_stream()));
    });
    state.SetIterationTime(s);
    seconds += s;
    bytes += 2 * live;
  }
  state.counters["meta_bytes"] = static_cast<double>(lists[0].count * 24);
  record_rate("cub_batched", ps::Recipe<L>::name(), mib, bytes, seconds, state);
}

// ---- Baseline: a plain TMA bulk copy of the same pieces ------------------------------------------

// The design of Megatron-LM's CuTe DSL paged-stash kernel, written from its description: many one-warp blocks, one lane
// of each issuing bulk copies (cp.async.bulk) global -> shared -> global through a ring of stages, each load tracked by
// an mbarrier (complete_tx), loads that evict first from L2 (read once) and stores that evict last (read back by the
// reload). sm_90 and newer; elsewhere the row is skipped, saying why.
constexpr int kTmaStages = 4;                               // loads in flight per block: up to kTmaStages - 1
constexpr std::int64_t kTmaStageBytes = int64_t{16} << 10;  // one bulk copy at most

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// CCCL 3.0's cuda::ptx::cp_async_bulk has no L2 cache-hint form: these two are written out (PTX ISA 8.6, sm_90).
__device__ inline void bulk_load(void* stage, std::uint64_t src, std::uint32_t bytes, std::uint64_t* full,
                                 std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cta.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          static_cast<std::uint32_t>(__cvta_generic_to_shared(stage))),
      "l"(__cvta_generic_to_global(reinterpret_cast<const void*>(src))), "r"(bytes),
      "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(full))), "l"(policy)
      : "memory");
}
__device__ inline void bulk_store(std::uint64_t dst, const void* stage, std::uint32_t bytes, std::uint64_t policy) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(
                   __cvta_generic_to_global(reinterpret_cast<void*>(dst))),
               "r"(static_cast<std::uint32_t>(__cvta_generic_to_shared(stage))), "r"(bytes), "l"(policy)
               : "memory");
}
#endif

/// Block b copies its equal share of the chunks (bulk_chunks.hpp), kTmaStages loads ahead: it stores chunk k once its
/// load has landed, then refills the stage of chunk k - 1 (whose store has read it by then, or is waited for) with the
/// load of chunk k - 1 + kTmaStages.
__global__ void __launch_bounds__(32)
    tma_bulk_kernel(const pagestash_bench::BulkPiece* pieces, const std::int64_t* first, std::int64_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace pb = pagestash_bench;
  namespace ptx = cuda::ptx;
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ std::uint64_t full[kTmaStages];
  if (threadIdx.x != 0) return;  // one lane drives the copy engine
  const std::int64_t chunks = first[count];
  const std::int64_t c0 = pb::bulk_block_begin(chunks, gridDim.x, blockIdx.x);
  const std::int64_t n = pb::bulk_block_begin(chunks, gridDim.x, blockIdx.x + 1) - c0;
  if (n == 0) return;
  for (int s = 0; s < kTmaStages; ++s) ptx::mbarrier_init(&full[s], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // the barriers, before the bulk copies see them
  constexpr auto evict_first = static_cast<std::uint64_t>(cuda::access_property(cuda::access_property::streaming{}));
  constexpr auto evict_last = static_cast<std::uint64_t>(cuda::access_property(cuda::access_property::persisting{}));
  pb::BulkCursor load = pb::bulk_seek(first, count, c0), store = load;
  auto issue = [&](std::int64_t k) {
    const int s = static_cast<int>(k % kTmaStages);
    const pb::BulkChunk c = pb::bulk_next(pieces, first, count, load, kTmaStageBytes);
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &full[s], c.bytes);
    bulk_load(stages + s * kTmaStageBytes, c.src, c.bytes, &full[s], evict_first);
  };
  for (std::int64_t k = 0; k < n && k < kTmaStages; ++k) issue(k);
  for (std::int64_t k = 0; k < n; ++k) {
    const int s = static_cast<int>(k % kTmaStages);
    while (!ptx::mbarrier_try_wait_parity(&full[s], static_cast<std::uint32_t>((k / kTmaStages) & 1))) {}
    const pb::BulkChunk c = pb::bulk_next(pieces, first, count, store, kTmaStageBytes);
    bulk_store(c.dst, stages + s * kTmaStageBytes, c.bytes, evict_last);
    ptx::cp_async_bulk_commit_group();
    if (k >= 1 && k - 1 + kTmaStages < n) {
      ptx::cp_async_bulk_wait_group_read(ptx::n32_t<1>{});  // the store of chunk k - 1 has read its stage
      issue(k - 1 + kTmaStages);
    }
  }
  ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});  // the stages stay until the last store has left
#else
  (void)pieces, (void)first, (void)count;
#endif
}

/// Why this device cannot run tma_bulk_kernel, or empty.
std::string tma_unavailable() {
  int device = 0, major = 0;
  PAGESTASH_CUDA_TRY(cudaGetDevice(&device));
  PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaFuncAttributes attr{};
  PAGESTASH_CUDA_TRY(cudaFuncGetAttributes(&attr, tma_bulk_kernel));
  if (major < 9) return "the GPU is older than sm_90 (no cp.async.bulk)";
  if (attr.binaryVersion < 90) return "stash_bench was compiled for an architecture older than sm_90";
  return "";
}

/// Pieces that a bulk copy cannot move (not 16-byte aligned), and all pieces, of a recipe's shape: from the offsets
/// alone (buffers and pages start on 256 bytes or more).
template <class L>
std::pair<std::int64_t, std::int64_t> unaligned_pieces(int64_t mib) {
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<L>(mib, counts);
  const auto pieces = live_pieces(
      shape, counts, [](ps::BufferRole) { return std::uint64_t{0}; },
      [](int64_t index) { return static_cast<std::uint64_t>(index) << 16; });
  const auto bad = std::count_if(pieces.begin(), pieces.end(), [](const pagestash_bench::BulkPiece& p) {
    return !pagestash_bench::bulk_copyable(p);
  });
  return {static_cast<std::int64_t>(bad), static_cast<std::int64_t>(pieces.size())};
}

/// tma_bulk_kernel over the pieces a real stash of the same tensor moves, into its pages; the first copy is checked
/// byte for byte against the stash's pages (the pages poisoned in between).
template <class L>
void bm_tma_bulk(benchmark::State& state, int64_t mib) {
  if (const std::string why = tma_unavailable(); !why.empty()) {
    state.SkipWithError(("tma_bulk skipped: " + why).c_str());
    return;
  }
  StashedPages<L> run(mib);
  const auto &counts = run.counts, &ids = run.ids;
  const auto& shape = run.shape;
  auto& tensors = run.tensors;
  auto& pool = run.pool;
  struct List {
    std::unique_ptr<Bytes> pieces, first;
    std::vector<pagestash_bench::BulkPiece> host;
    int64_t count = 0, chunks = 0;
  };
  std::vector<List> lists;
  int64_t live = 0;
  for (auto& t : tensors) {
    List l;
    l.host = pieces_into_pages(shape, counts, *t, pool, ids);
    for (const auto& p : l.host) {
      if (!pagestash_bench::bulk_copyable(p)) {
        state.SkipWithError("tma_bulk skipped: a live piece is not 16-byte aligned");
        return;
      }
    }
    const std::vector<int64_t> first = pagestash_bench::bulk_first_chunks(l.host, kTmaStageBytes);
    l.count = static_cast<int64_t>(l.host.size());
    l.chunks = first.back();
    l.pieces = std::make_unique<Bytes>(true, l.host.size() * sizeof(pagestash_bench::BulkPiece));
    l.first = std::make_unique<Bytes>(true, first.size() * sizeof(int64_t));
    upload(l.pieces->p, l.host.data(), l.host.size() * sizeof(pagestash_bench::BulkPiece));
    upload(l.first->p, first.data(), first.size() * sizeof(int64_t));
    live = 0;
    for (const auto& p : l.host) live += p.bytes;
    lists.push_back(std::move(l));
  }
  const int smem = kTmaStages * static_cast<int>(kTmaStageBytes);
  PAGESTASH_CUDA_TRY(cudaFuncSetAttribute(tma_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int device = 0, sms = 0, per_sm = 0;
  PAGESTASH_CUDA_TRY(cudaGetDevice(&device));
  PAGESTASH_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PAGESTASH_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tma_bulk_kernel, 32, smem));
  auto launch = [&](const List& l) {
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(l.chunks, 1, int64_t{sms} * std::max(per_sm, 1)));
    tma_bulk_kernel<<<blocks, 32, static_cast<std::size_t>(smem), bench_stream()>>>(
        reinterpret_cast<const pagestash_bench::BulkPiece*>(l.pieces->p), reinterpret_cast<const int64_t*>(l.first->p),
        l.count);
    PAGESTASH_CUDA_CHECK_LAUNCH();
  };
  {  // The check: tensors[0]'s live bytes in the stash's pages, poisoned, then copied by the kernel.
    const auto page_bytes = static_cast<std::size_t>(64 << 10);
    std::vector<std::vector<unsigned char>> stashed(ids.size(), std::vector<unsigned char>(page_bytes));
    std::vector<std::vector<unsigned char>> copied = stashed;
    for (std::size_t i = 0; i < ids.size(); ++i)
      PAGESTASH_CUDA_TRY(cudaMemcpy(stashed[i].data(), pool.ref().page(ids[i]), page_bytes, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < ids.size(); ++i)
      PAGESTASH_CUDA_TRY(cudaMemset(pool.ref().page(ids[i]), 0xA5, page_bytes));
    launch(lists[0]);
    PAGESTASH_CUDA_TRY(cudaStreamSynchronize(bench_stream()));
    for (std::size_t i = 0; i < ids.size(); ++i)
      PAGESTASH_CUDA_TRY(cudaMemcpy(copied[i].data(), pool.ref().page(ids[i]), page_bytes, cudaMemcpyDeviceToHost));
    std::map<std::uint64_t, std::size_t> page_of;  // a page's address -> its index in ids
    for (std::size_t i = 0; i < ids.size(); ++i) page_of[reinterpret_cast<std::uint64_t>(pool.ref().page(ids[i]))] = i;
    for (const auto& p : lists[0].host) {
      auto at = std::prev(page_of.upper_bound(p.dst));
      const std::size_t o = p.dst - at->first;
      if (std::memcmp(stashed[at->second].data() + o, copied[at->second].data() + o,
                      static_cast<std::size_t>(p.bytes)) != 0) {
        state.SkipWithError("tma_bulk copied other bytes than the stash");
        return;
      }
    }
  }
  Events events;
  std::size_t k = 0;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    const List& l = lists[k++ % lists.size()];
    const double s = events.time(bench_stream(), [&] { launch(l); });
    state.SetIterationTime(s);
    seconds += s;
    bytes += 2 * live;
  }
  state.counters["meta_bytes"] =  // the pieces and their first chunks
      static_cast<double>(lists[0].count * static_cast<int64_t>(sizeof(pagestash_bench::BulkPiece) + sizeof(int64_t)));
  record_rate("tma_bulk", ps::Recipe<L>::name(), mib, bytes, seconds, state);
}

/// Host spill: a stash into pinned host pages against cudaMemcpyAsync D2H of the same bytes.
void bm_spill(benchmark::State& state, bool baseline, int64_t mib) {
  using Tr = ps::StashTraits<Bf16>;
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<Bf16>(mib, counts);
  Tensor<Bf16> t(shape, counts, true, 3);
  const int64_t pages = ps::work_bounds<Tr>(shape).stream_bytes / (64 << 10) + 1;
  ps::PagePool pool(pool_for(0, pages));
  auto rec = ps::make_record<Tr>(pool, shape);
  const int64_t live = ps::plan_work<Tr>(shape, counts.data(), false, nullptr).live_bytes;
  void* pinned = nullptr;
  PAGESTASH_CUDA_TRY(cudaMallocHost(&pinned, static_cast<std::size_t>(live)));
  Events events;
  int64_t bytes = 0;
  double seconds = 0;
  for (auto _ : state) {
    double s = 0;
    if (baseline) {
      s = events.time(bench_stream(), [&] {
        PAGESTASH_CUDA_TRY(cudaMemcpyAsync(pinned, t.view.data, static_cast<std::size_t>(live), cudaMemcpyDeviceToHost,
                                           bench_stream()));
      });
    } else {
      s = events.time(bench_stream(), [&] { ps::stash(ps::on(bench_stream()), pool, t.view, rec); });
      ps::discard(ps::on(bench_stream()), pool, rec);
    }
    state.SetIterationTime(s);
    seconds += s;
    bytes += live;  // one way over the link
  }
  cudaFreeHost(pinned);
  record_rate(baseline ? "memcpy_d2h" : "spill_stash", "bf16/capacity", mib, bytes, seconds, state);
}

/// What a pool's grow and shrink cost (a pool with a reserve, pages of 64 KiB): each iteration grows a pool of 16
/// pages by `mib` MiB and shrinks it back, timed on the host (the device's: a grow maps 2 MiB chunks, a shrink
/// synchronises its stream).
void bm_grow_shrink(benchmark::State& state, int64_t mib) {
  ps::PoolConfig cfg;
  cfg.page_bytes = 64 << 10;
  cfg.device_pages = 16;
  cfg.device_reserve = cfg.device_pages + (mib << 20) / cfg.page_bytes;
  ps::PagePool pool(cfg, g_gpu ? ps::MemorySpace::device : ps::MemorySpace::host);
  for (auto _ : state) {
    if (g_gpu) {
      ps::grow(ps::on(bench_stream()), pool, cfg.device_reserve, 0);
      ps::shrink(ps::on(bench_stream()), pool, cfg.device_pages, 0);
    } else {
      ps::grow(ps::host, pool, cfg.device_reserve, 0);
      ps::shrink(ps::host, pool, cfg.device_pages, 0);
    }
  }
}

/// GPU microseconds per operation of each graph row (graph32_stash, graph32_reload, graph32_discard,
/// graph32_stash_plain), for the summary.
std::map<std::string, double> g_graph_us;

/// What a graph row times: stash_plain is the stash with plain launches (CudaExecutor::programmatic_launch off), to
/// set beside the stash's programmatic ones.
enum class Graphed { stash, reload, discard, stash_plain };

/// The launch-bound regime: 32 operations of 1 MiB (bf16/capacity) on 32 records captured in one graph, replayed, and
/// GPU time per operation, of that operation alone. Three graphs: 32 stashes, 32 reloads, 32 discards. A replay of
/// the stash graph is timed, then the discard graph empties the records, untimed; a replay of the reload (or discard)
/// graph is timed after the stash graph, untimed, has filled them (a reload returns the pages, as a discard does).
void bm_graph32(benchmark::State& state, Graphed graphed) {
  const bool plain = graphed == Graphed::stash_plain;
  const Graphed op = plain ? Graphed::stash : graphed;
  using Tr = ps::StashTraits<Bf16>;
  std::vector<std::int32_t> counts;
  const auto shape = shape_for<Bf16>(1, counts);
  std::vector<std::unique_ptr<Tensor<Bf16>>> tensors;
  ps::PagePool pool(pool_for(32 * (ps::work_bounds<Tr>(shape).stream_bytes / (64 << 10) + 1)));
  std::vector<ps::StashRecord<Tr>> recs;
  for (int i = 0; i < 32; ++i) {
    tensors.push_back(std::make_unique<Tensor<Bf16>>(shape, counts, true, static_cast<std::uint32_t>(i)));
    recs.push_back(ps::make_record<Tr>(pool, shape));
  }
  const auto ex = ps::on(bench_stream()).with_programmatic_launch(!plain);
  // Each kernel launched once before the captures (its first launch on a device queries its occupancy).
  ps::stash(ex, pool, tensors[0]->view, recs[0]);
  ps::discard(ex, pool, recs[0]);
  ps::stash(ex, pool, tensors[0]->view, recs[0]);
  ps::reload(ex, pool, recs[0], tensors[0]->view);
  PAGESTASH_CUDA_TRY(cudaStreamSynchronize(bench_stream()));
  auto capture = [&](const std::function<void(std::size_t)>& each) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(bench_stream(), cudaStreamCaptureModeThreadLocal));
    for (std::size_t i = 0; i < 32; ++i) each(i);
    PAGESTASH_CUDA_TRY(cudaStreamEndCapture(bench_stream(), &graph));
    PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    PAGESTASH_CUDA_TRY(cudaGraphDestroy(graph));
    return exec;
  };
  cudaGraphExec_t stashes = capture([&](std::size_t i) { ps::stash(ex, pool, tensors[i]->view, recs[i]); });
  cudaGraphExec_t discards = capture([&](std::size_t i) { ps::discard(ex, pool, recs[i]); });
  cudaGraphExec_t reloads = capture([&](std::size_t i) { ps::reload(ex, pool, recs[i], tensors[i]->view); });
  const cudaGraphExec_t timed = op == Graphed::stash ? stashes : op == Graphed::reload ? reloads : discards;
  const cudaGraphExec_t before = op == Graphed::stash ? nullptr : stashes;
  const cudaGraphExec_t after = op == Graphed::stash ? discards : nullptr;
  Events events;
  double seconds = 0;
  int64_t n = 0;
  for (auto _ : state) {
    if (before != nullptr) PAGESTASH_CUDA_TRY(cudaGraphLaunch(before, bench_stream()));
    const double s = events.time(bench_stream(), [&] { PAGESTASH_CUDA_TRY(cudaGraphLaunch(timed, bench_stream())); });
    if (after != nullptr) PAGESTASH_CUDA_TRY(cudaGraphLaunch(after, bench_stream()));
    state.SetIterationTime(s);
    seconds += s;
    ++n;
  }
  PAGESTASH_CUDA_TRY(cudaStreamSynchronize(bench_stream()));
  const double us = n > 0 ? seconds / static_cast<double>(n) / 32 * 1e6 : 0;
  state.counters["us_per_op"] = us;
  g_graph_us[plain                   ? "stash_plain"
             : op == Graphed::stash  ? "stash"
             : op == Graphed::reload ? "reload"
                                     : "discard"] = us;
  for (cudaGraphExec_t e : {stashes, discards, reloads}) cudaGraphExecDestroy(e);
}

template <class L>
void register_recipe() {
  const std::string r = ps::Recipe<L>::name();
  for (int64_t mib : g_sizes_mib) {
    const std::string size = "/" + std::to_string(mib) + "MiB";
    auto reg = [&](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark((name + "/" + r + size).c_str(), fn)->UseManualTime()->Unit(benchmark::kMicrosecond);
    };
    reg(g_gpu ? "stash" : "host_stash", [mib](benchmark::State& s) { bm_stash<L>(s, Op::stash, mib); });
    reg(g_gpu ? "reload" : "host_reload", [mib](benchmark::State& s) { bm_stash<L>(s, Op::reload, mib); });
    reg(g_gpu ? "memcpy_d2d" : "host_memcpy", [mib](benchmark::State& s) { bm_memcpy<L>(s, mib); });
    // The TMA baseline moves 16-byte aligned pieces only: a recipe whose pieces are not has no such row, and says so.
    const auto [unaligned, pieces] = unaligned_pieces<L>(mib);
    if (unaligned > 0)
      std::printf(
          "stash_bench: no tma_bulk row for %s at %lld MiB: %lld of its %lld live pieces are not 16-byte aligned "
          "(a bulk copy needs 16-byte addresses and sizes)\n",
          r.c_str(), static_cast<long long>(mib), static_cast<long long>(unaligned), static_cast<long long>(pieces));
    if (g_gpu) {
      reg("per_token_ref", [mib](benchmark::State& s) { bm_per_token<L>(s, mib); });
      reg("cub_batched", [mib](benchmark::State& s) { bm_cub_batched<L>(s, mib); });
      if (unaligned == 0) reg("tma_bulk", [mib](benchmark::State& s) { bm_tma_bulk<L>(s, mib); });
      // SMs left to the GEMMs beside the stash: the grid capped at a budget of blocks.
      if (mib >= 64)
        for (int blocks : {8, 16, 32, 66}) {
          reg("stash@" + std::to_string(blocks),
              [mib, blocks](benchmark::State& s) { bm_stash<L>(s, Op::stash, mib, blocks); });
        }
    }
  }
}

/// The compressed stash and reload of bf16/capacity (hidden 7168, as DeepSeek-V3), each format, every size.
void register_compressed() {
  for (int64_t mib : g_sizes_mib) {
    const std::string size = "/" + std::to_string(mib) + "MiB";
    const std::string prefix = g_gpu ? "" : "host_";
    auto reg = [&](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark((prefix + name + "/bf16/capacity" + size).c_str(), fn)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    };
#define PAGESTASH_BENCH_COMPRESSED(F)                                                        \
  reg(std::string("stash_") + F::name,                                                       \
      [mib](benchmark::State& s) { bm_stash<Bf16, ps::Compressed<F>>(s, Op::stash, mib); }); \
  reg(std::string("reload_") + F::name,                                                      \
      [mib](benchmark::State& s) { bm_stash<Bf16, ps::Compressed<F>>(s, Op::reload, mib); });
    PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_BENCH_COMPRESSED)
#undef PAGESTASH_BENCH_COMPRESSED
  }
}

/// The compressed rows against the lossless ones of the same tensor: GB/s on the live BF16 bytes (x 2, as the
/// lossless rows' bytes), the ratio to lossless, and the pages of one stash against lossless.
void print_compressed_table() {
  const std::string prefix = g_gpu ? "" : "host_";
  if (g_pages.size() < 2) return;  // no compressed rows (or no lossless bf16/capacity to compare with)
  std::printf(
      "\ncompressed stash, bf16/capacity (hidden 7168): GB/s = 2 x BF16 live bytes / s (the lossless rows' bytes), "
      "x = ratio to lossless, pages = one stash's pages / lossless's\n");
  std::printf("%-12s %7s %10s %10s %6s %10s %10s %6s %7s\n", "format", "MiB", "lossless", "stash", "x", "lossless",
              "reload", "x", "pages");
  for (const std::string& format : ps::compression_names()) {
    if (format == ps::Lossless::name) continue;
    for (const auto& [key, rate] : g_rates[prefix + "stash_" + format]) {
      const double stash0 = g_rates[prefix + "stash"][key], reload0 = g_rates[prefix + "reload"][key];
      const double reload = g_rates[prefix + "reload_" + format][key];
      const auto lossless_pages = g_pages[ps::Lossless::name][key];
      std::printf(
          "%-12s %7lld %10.2f %10.2f %6.2f %10.2f %10.2f %6.2f %7.3f\n", format.c_str(),
          static_cast<long long>(key.second), stash0, rate, stash0 > 0 ? rate / stash0 : 0.0, reload0, reload,
          reload0 > 0 ? reload / reload0 : 0.0,
          lossless_pages > 0 ? static_cast<double>(g_pages[format][key]) / static_cast<double>(lossless_pages) : 0.0);
    }
  }
}

void print_table() {
  const std::string ceiling = g_gpu ? "memcpy_d2d" : "host_memcpy";
  const std::vector<std::string> kernels =
      g_gpu ? std::vector<std::string>{"stash", "reload", "per_token_ref", "cub_batched", "tma_bulk"}
            : std::vector<std::string>{"host_stash", "host_reload"};
  std::printf("\n%s: GB/s (bytes read + written) and ratio to %s on the same live bytes\n",
              g_gpu ? "GPU" : "CPU (host reference executor; a sanity figure, not a GPU result)", ceiling.c_str());
  std::printf("%-33s %7s %10s", "recipe", "MiB", ceiling.c_str());
  for (const auto& k : kernels) std::printf(" %13s %6s", k.c_str(), "ratio");
  std::printf("\n");
  for (const auto& [key, base] : g_rates[ceiling]) {
    std::printf("%-33s %7lld %10.1f", key.first.c_str(), static_cast<long long>(key.second), base);
    for (const auto& k : kernels) {
      const auto it = g_rates[k].find(key);
      if (it == g_rates[k].end()) std::printf(" %13s %6s", "-", "-");
      else std::printf(" %13.1f %6.2f", it->second, base > 0 ? it->second / base : 0.0);
    }
    std::printf("\n");
  }
  if (g_gpu) {
    for (const auto& [key, rate] : g_rates["spill_stash"]) {
      const double base = g_rates["memcpy_d2h"][key];
      std::printf("host spill %lld MiB: stash %.1f GB/s, memcpy D2H %.1f GB/s, ratio %.2f\n",
                  static_cast<long long>(key.second), rate, base, base > 0 ? rate / base : 0.0);
    }
    // The stash's own ratio to the TMA baseline (target >= 1.0), where both ran.
    for (const auto& [key, tma] : g_rates["tma_bulk"]) {
      const double stash = g_rates["stash"][key], reload = g_rates["reload"][key];
      std::printf("%s %lld MiB: stash / tma_bulk %.2f, reload / tma_bulk %.2f\n", key.first.c_str(),
                  static_cast<long long>(key.second), tma > 0 ? stash / tma : 0.0, tma > 0 ? reload / tma : 0.0);
    }
    if (!g_graph_us.empty())
      std::printf(
          "graphs of 32 operations of 1 MiB (bf16/capacity), GPU us per operation, each timed alone: "
          "stash %.1f, reload %.1f, discard %.1f; stash with plain launches %.1f\n",
          g_graph_us["stash"], g_graph_us["reload"], g_graph_us["discard"], g_graph_us["stash_plain"]);
  }
}

}  // namespace

// ---- Fine-grained MoE ------------------------------------------------------------------------

// A fine-grained layer's expert buffers, for each model shape: fine_grained.hpp.

/// The median seconds of each of `ops`, timed in turn, round after round (at least 5 rounds,
/// about 0.1 s in all on the host), so that the machine's drift reaches each of them alike.
std::vector<double> interleaved_medians(const std::vector<std::function<double()>>& ops) {
  std::vector<std::vector<double>> t(ops.size());
  double first_round = 0;
  for (std::size_t k = 0; k < ops.size(); ++k) first_round += (t[k].push_back(ops[k]()), t[k].back());
  const int rounds = static_cast<int>(std::clamp(0.1 / std::max(first_round, 1e-9), 5.0, 31.0));
  for (int r = 1; r < rounds; ++r)
    for (std::size_t k = 0; k < ops.size(); ++k) t[k].push_back(ops[k]());
  std::vector<double> medians;
  for (auto& x : t) {
    std::sort(x.begin(), x.end());
    medians.push_back(x[x.size() / 2]);
  }
  return medians;
}

/// Reads 64 MiB (twice this CPU's last-level cache) of other bytes, so that what is timed
/// next starts from memory, as a stash in training does: the host's counterpart of the
/// GPU table's rotation through 256 MiB of copies.
void evict_host_caches() {
  static const std::vector<unsigned char> other(std::size_t{64} << 20, 1);  // written: real pages
  unsigned sum = 0;
  for (std::size_t i = 0; i < other.size(); i += 64) sum += other[i];
  benchmark::DoNotOptimize(sum);
}

/// Seconds of `work` on the host, from evicted caches.
double cold_seconds(const std::function<void()>& work) {
  evict_host_caches();
  const auto t0 = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Seconds of one stash (or reload) of `t`: CUDA events on a GPU, a steady clock on the host
/// (from evicted caches).
template <class L>
double time_op(Op op, ps::PagePool& pool, ps::StashRecord<ps::StashTraits<L>>& rec, Tensor<L>& t, Events* events) {
  auto run = [&](auto&& ex) {
    auto timed = [&](const std::function<void()>& work) {
      return events != nullptr ? events->time(bench_stream(), work) : cold_seconds(work);
    };
    double s = 0;
    if (op == Op::stash) {
      s = timed([&] { ps::stash(ex, pool, t.view, rec); });
      ps::discard(ex, pool, rec);
    } else {
      ps::stash(ex, pool, t.view, rec);
      s = timed([&] { ps::reload(ex, pool, rec, t.view); });
    }
    return s;
  };
  return events != nullptr ? run(ps::on(bench_stream())) : run(ps::host);
}

/// One row: exact stream and page bytes against the live bytes, and stash / reload against
/// one copy of the live bytes (cudaMemcpyAsync D2D, or std::memcpy), timed side by side.
template <class L>
void fine_row(const char* recipe, const ps::sizing::ModelShape& fs, int64_t mean) {
  using Tr = ps::StashTraits<L>;
  const ps::GroupedView<L> v = pagestash_bench::fine_view<L>(fs, mean);
  const auto counts = pagestash_bench::fine_counts(fs, mean, v.max_tokens);
  const ps::WorkTotals plan = ps::plan_work<Tr>(v, counts.data(), false, nullptr);
  const ps::PoolConfig cfg = pool_for(ps::pages_for(ps::work_bounds<Tr>(v).stream_bytes, 64 << 10));
  const int64_t pages = ps::pages_for(plan.stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, g_gpu ? ps::MemorySpace::device : ps::MemorySpace::host);
  auto rec = ps::make_record<Tr>(pool, v);
  Tensor<L> tensor(v, counts, g_gpu, 11);
  std::unique_ptr<Events> events(g_gpu ? new Events : nullptr);
  Bytes src(g_gpu, static_cast<std::size_t>(plan.live_bytes)), dst(g_gpu, static_cast<std::size_t>(plan.live_bytes));
  src.fill_random(3);
  const auto n = static_cast<std::size_t>(plan.live_bytes);
  std::vector<std::function<double()>> ops{
      [&] {
        if (events)
          return events->time(bench_stream(), [&] {
            PAGESTASH_CUDA_TRY(cudaMemcpyAsync(dst.p, src.p, n, cudaMemcpyDeviceToDevice, bench_stream()));
          });
        return cold_seconds([&] {
          std::memcpy(dst.p, src.p, n);
          benchmark::ClobberMemory();
        });
      },
      [&] { return time_op<L>(Op::stash, pool, rec, tensor, events.get()); },
      [&] { return time_op<L>(Op::reload, pool, rec, tensor, events.get()); }};
  // Each live run of the paged buffers, in buffer order: fn(address, bytes, pitch).
  auto each_run = [&](const auto& fn) {
    for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales}) {
      if (ps::handling_of<Tr>(role) != ps::Handling::paged) continue;
      const ps::BufferGeometry geo = v.geometry(role);
      const auto* base = static_cast<const unsigned char*>(tensor.view.buffer(role));
      for (int32_t s = 0; s < geo.segment_count(); ++s) {
        const ps::Segment seg = geo.segment(s, counts.data());
        for (int64_t l = 0; l < seg.lines; ++l) fn(base + seg.line_offset(l), seg.live, seg.pitch);
      }
    }
  };
  // On the host, two more baselines. runs: the same live runs, one memcpy each, into
  // contiguous bytes (the simplest code that moves exactly what a stash moves). floor: one
  // byte loaded from each 64-byte cache line that holds a live byte, nothing written, the
  // faster of two orders: a stash must read those lines and a reload must own them.
  if (!g_gpu) {
    ops.emplace_back([&] {
      return cold_seconds([&] {
        unsigned char* out = dst.p;
        each_run([&](const unsigned char* at, int64_t bytes, int64_t) {
          std::memcpy(out, at, static_cast<std::size_t>(bytes));
          out += bytes;
        });
        benchmark::ClobberMemory();
      });
    });
    // Both read patterns: the live lines alone, and with the dead lines the host executor
    // prefetches (a denser stream for the CPU's prefetcher).
    for (const bool dense : {false, true}) {
      ops.emplace_back([&, dense] {
        return cold_seconds([&] {
          unsigned sum = 0;
          each_run([&](const unsigned char* at, int64_t bytes, int64_t pitch) {
            const auto run = static_cast<std::uint32_t>(std::min<int64_t>(bytes, INT32_MAX));
            if (dense && ps::prefetches_dead_lines(run, pitch)) ps::prefetch_dead_lines(at, run, pitch);
            const auto first = reinterpret_cast<std::uintptr_t>(at);
            for (std::uintptr_t a = first; a < first + static_cast<std::uintptr_t>(bytes); a = (a | 63) + 1)
              sum += *reinterpret_cast<const unsigned char*>(a);
          });
          benchmark::DoNotOptimize(sum);
        });
      });
    }
  }
  const std::vector<double> secs = interleaved_medians(ops);
  const double copy = secs[0], stash = secs[1], reload = secs[2];
  const double runs = g_gpu ? 0 : secs[3], floor = g_gpu ? 0 : std::min(secs[4], secs[5]);
  auto rate = [](int64_t bytes, double s) { return 2.0 * static_cast<double>(bytes) / s / 1e9; };
  const double copy_rate = rate(plan.live_bytes, copy);
  double buffers = 0;  // how sparse the live bytes are: what a stash reads from
  for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales})
    if (ps::handling_of<Tr>(role) == ps::Handling::paged) buffers += static_cast<double>(v.buffer_bytes(role));
  const pagestash_bench::SectorFloor sectors = pagestash_bench::sector_floor<Tr>(v, counts.data());
  std::printf("%-12s %-28s %5lld %4lld %9.2f %7.2f %8.4f %8.4f %7.2f %8.1f %8.1f %6.2f %8.1f %6.2f", fs.name, recipe,
              static_cast<long long>(mean), static_cast<long long>(v.max_tokens),
              static_cast<double>(plan.live_bytes) / (1 << 20), buffers / static_cast<double>(plan.live_bytes),
              static_cast<double>(plan.stream_bytes) / static_cast<double>(plan.live_bytes),
              static_cast<double>(pages * cfg.page_bytes) / static_cast<double>(plan.live_bytes),
              sectors.per_live_byte(), copy_rate, rate(plan.stream_bytes, stash),
              rate(plan.stream_bytes, stash) / copy_rate, rate(plan.stream_bytes, reload),
              rate(plan.stream_bytes, reload) / copy_rate);
  if (g_gpu) std::printf("\n");
  else
    std::printf(" %8.1f %6.2f %8.1f %6.2f %6.2f\n", rate(plan.live_bytes, runs),
                rate(plan.stream_bytes, stash) / rate(plan.live_bytes, runs), rate(plan.live_bytes, floor),
                rate(plan.live_bytes, floor) / copy_rate,
                rate(plan.stream_bytes, stash) / rate(plan.live_bytes, floor));
  std::fflush(stdout);
}

/// The fine-grained table: both shapes, every capacity recipe, means of 32 to 256 tokens per
/// expert.
void print_fine_grained() {
  const char* copy = g_gpu ? "memcpy D2D" : "memcpy";
  std::printf(
      "\nfine-grained MoE: capacity-padded [experts, cap, hidden] with cap = 2 x mean rounded up to the layout's\n"
      "granule, Dirichlet(1) counts (seeded), 64 KiB pages; buffer/live: bytes of the paged buffers per live byte;\n"
      "sector floor: bytes of the 32-byte sectors a perfect copy reads and writes (the buffers' holding live bytes\n"
      "and the stream's) per live byte, 2.00 when whole sectors are live (bench/sector_floor.hpp);\n"
      "GB/s = bytes read + written; x = ratio to one %s of the live bytes in the same run (%s)%s\n",
      copy, g_gpu ? "CUDA executor" : "host executor, one thread",
      g_gpu ? ""
            : ";\nruns: the same live runs copied by a plain loop, one memcpy per run, and stash / that;\n"
              "floor: one byte loaded from each cache line holding a live byte (the faster of: alone, and with the\n"
              "dead lines the executor prefetches), its x, and stash / floor;\n"
              "host memory of 2 MiB or more in 2 MiB pages where the OS offers them (as device memory is)");
  std::printf("%-12s %-28s %5s %4s %9s %7s %8s %8s %7s %8s %8s %6s %8s %6s%s\n", "shape", "recipe", "mean", "cap",
              "live MiB", "buffer/", "stream/", "pages/", "sector", copy, "stash", "x", "reload", "x",
              g_gpu ? "" : "     runs  stash/    floor      x stash/");
  std::printf(
      "%-12s %-28s %5s %4s %9s %7s %8s %8s %7s%s\n", "", "", "", "", "", "live", "live", "live", "floor",
      g_gpu ? "" : "                                                                      runs                  floor");
  for (const ps::sizing::ModelShape& fs : ps::sizing::model_shapes) {
    for (int64_t mean : {32, 64, 128, 256}) {
      ps::for_each_recipe([&](auto r) {
        using R = decltype(r);
        if (std::string(R::placement) == "capacity") fine_row<typename R::layout>(R::name().c_str(), fs, mean);
      });
    }
  }
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

int main(int argc, char** argv) {
  std::string preset = "short";
  std::vector<std::string> recipes;  // none: every recipe
  bool listing = false;              // --benchmark_list_tests: the names, no tables
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--preset=", 9) == 0) preset = argv[i] + 9;
    else if (std::strncmp(argv[i], "--recipes=", 10) == 0) recipes = split(argv[i] + 10);
    else args.push_back(argv[i]);
    listing = listing || std::strcmp(argv[i], "--benchmark_list_tests") == 0;
  }
  int n = 0;
  g_gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (preset == "full")
    g_sizes_mib = g_gpu ? std::vector<int64_t>{1, 4, 16, 64, 256, 1024, 2048} : std::vector<int64_t>{1, 16, 64};
  else if (preset == "short") g_sizes_mib = g_gpu ? std::vector<int64_t>{1, 64, 256} : std::vector<int64_t>{1, 8};
  else {
    std::fprintf(stderr, "stash_bench: --preset must be short or full\n");
    return 2;
  }
  std::printf("stash_bench: %s, preset %s\n", g_gpu ? "GPU (CUDA executor)" : "no GPU: host reference executor",
              preset.c_str());
  for (const std::string& name : recipes) {
    try {
      ps::with_recipe(name, [](auto) {});
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "stash_bench: --recipes: %s\n", e.what());
      return 2;
    }
  }
  ps::for_each_recipe([&](auto r) {
    if (recipes.empty() || std::find(recipes.begin(), recipes.end(), r.name()) != recipes.end())
      register_recipe<typename decltype(r)::layout>();
  });
  if (recipes.empty() || std::find(recipes.begin(), recipes.end(), "bf16/capacity") != recipes.end())
    register_compressed();
  if (g_gpu) {
    for (int64_t mib : g_sizes_mib) {
      const std::string size = "/" + std::to_string(mib) + "MiB";
      benchmark::RegisterBenchmark(("spill_stash/bf16" + size).c_str(),
                                   [mib](benchmark::State& s) { bm_spill(s, false, mib); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("memcpy_d2h/bf16" + size).c_str(),
                                   [mib](benchmark::State& s) { bm_spill(s, true, mib); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
    for (const auto& [name, op] :
         {std::pair{"stash", Graphed::stash}, std::pair{"reload", Graphed::reload},
          std::pair{"discard", Graphed::discard}, std::pair{"stash_plain", Graphed::stash_plain}}) {
      benchmark::RegisterBenchmark((std::string("graph32_") + name + "/bf16/1MiB").c_str(),
                                   [op = op](benchmark::State& s) { bm_graph32(s, op); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (int64_t mib : g_sizes_mib)
    benchmark::RegisterBenchmark(("grow_shrink/" + std::to_string(mib) + "MiB").c_str(), [mib](benchmark::State& s) {
      bm_grow_shrink(s, mib);
    })->Unit(benchmark::kMicrosecond);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (listing) return 0;
  print_table();
  print_compressed_table();
  print_fine_grained();
  return 0;
}
