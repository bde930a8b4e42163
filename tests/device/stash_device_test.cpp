// The CUDA executor: the host parity suite on the device, byte-for-byte agreement with the
// host executor, a captured graph replayed with different device counts, stashes and
// reloads of different records on concurrent streams against one pool, and every layout
// from buffers allocated to the exact byte (for compute-sanitizer memcheck).

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/device_buffer.hpp"
#include "../common/layout_list.hpp"
#include "../common/page_bytes.hpp"
#include "../common/stash_sequence.hpp"
#include "stash_kernels.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace {

namespace ps = pagestash;
using namespace pagestash_test;

/// Device memory and the CUDA executor on the per-thread stream, synchronised after each
/// operation so that the sequence can check the results. The per-thread stream waits for
/// the legacy one, where the buffers are uploaded. Buffers have `Slack` bytes past their
/// end (0: allocated to the exact byte).
template <std::size_t Slack>
struct DeviceBackendWith {
  static constexpr ps::MemorySpace space = ps::MemorySpace::device;

  struct Bytes {
    DeviceBuffer<std::uint8_t> buffer;
    explicit Bytes(std::size_t n) : buffer(n, Slack) {}
    std::uint8_t* ptr() const { return buffer.ptr; }
    void upload(const std::vector<std::uint8_t>& b) {
      REQUIRE(b.size() == buffer.count);
      buffer.upload(b);
    }
    std::vector<std::uint8_t> download() const { return buffer.download(); }
  };

  static void sync() { PAGESTASH_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread)); }
  template <class Tr>
  static void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    stash_on(cudaStreamPerThread, pool, v, rec);
    sync();
  }
  template <class Tr>
  static void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                     bool zero_tail) {
    reload_on(cudaStreamPerThread, pool, rec, dest, zero_tail);
    sync();
  }
  template <class Tr>
  static void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) {
    discard_on(cudaStreamPerThread, pool, rec);
    sync();
  }
  static void reset(ps::PagePool& pool) {
    reset_on(cudaStreamPerThread, pool);
    sync();
  }
};
using DeviceBackend = DeviceBackendWith<1>;
using ExactDeviceBackend = DeviceBackendWith<0>;

template <class Traits>
void device_sequences(std::uint32_t& seed, int ops) {
  for (bool odd : {false, true})
    for (Order order : {Order::lifo, Order::fifo, Order::random})
      CHECK(run_stash_sequence<Traits, DeviceBackend>(sequence_shape<typename Traits::layout>(odd), order, ops, ++seed,
                                                      odd ? 256 : 1024) == ops);
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("every layout, random stash / reload / discard sequences match a byte-for-byte copy") {
  std::uint32_t seed = 1000;
#define PAGESTASH_DEVICE_SEQUENCES(L) \
  {                                   \
    CAPTURE(#L);                      \
    device_sequences<ps::StashTraits<L>>(seed, 60); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_DEVICE_SEQUENCES)
#undef PAGESTASH_DEVICE_SEQUENCES
#define PAGESTASH_DEVICE_SEQUENCES_TRAITS(Tr) device_sequences<Tr>(seed, 30);
  PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(PAGESTASH_DEVICE_SEQUENCES_TRAITS)
#undef PAGESTASH_DEVICE_SEQUENCES_TRAITS
}

namespace {

template <class L, class Backend>
void fill(Tensor<L, Backend>& t, const std::vector<std::int32_t>& counts, std::mt19937& rng,
          std::array<std::vector<std::uint8_t>, 3>* kept = nullptr) {
  t.set_counts(counts);
  for (BufferRole role : all_roles) {
    auto b = random_bytes(static_cast<std::size_t>(t.view.buffer_bytes(role)), rng);
    t.set(role, b);
    if (kept != nullptr) (*kept)[static_cast<std::size_t>(role)] = std::move(b);
  }
}

/// The same stash on the host and on the device: same page ids (device and spilled host
/// pages), same stream bytes in the pages (the rest of the last page is never written and
/// holds what each allocation held: see tests/common/page_bytes.hpp), same reloaded bytes.
template <class L>
void check_same_as_host(std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(seed % 2 == 1);
  const ps::PoolConfig cfg = spilling_config<Tr>(shape);  // a large stash spills
  ps::PagePool host_pool(cfg, ps::MemorySpace::host), device_pool(cfg, ps::MemorySpace::device);
  Tensor<L, DeviceBackend> d_src(shape), d_dest(shape);
  Tensor<L, HostBackend<1>> h_src(shape), h_dest(shape);
  auto h_rec = ps::make_record<Tr>(host_pool, shape);
  auto d_rec = ps::make_record<Tr>(device_pool, shape);
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    const auto counts = random_counts(shape, rng);
    std::array<std::vector<std::uint8_t>, 3> bytes;
    fill(h_src, counts, rng, &bytes);
    d_src.set_counts(counts);
    for (BufferRole role : all_roles) d_src.set(role, bytes[static_cast<std::size_t>(role)]);
    ps::stash(ps::host, host_pool, h_src.view, h_rec);
    DeviceBackend::stash(device_pool, d_src.view, d_rec);
    const ps::RecordStatus hs = h_rec.status(), ds = d_rec.status();
    CHECK(ds.state == hs.state);
    CHECK(ds.pages == hs.pages);
    CHECK(ds.device_pages == hs.device_pages);
    CHECK(ds.stream_bytes == hs.stream_bytes);
    CHECK(d_rec.page_ids() == h_rec.page_ids());
    CHECK(stream_bytes_of(device_pool, d_rec) == stream_bytes_of(host_pool, h_rec));
    for (BufferRole role : all_roles) {
      const auto poison = random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
      h_dest.set(role, poison);
      d_dest.set(role, poison);
    }
    ps::reload(ps::host, host_pool, h_rec, h_dest.view, ps::ReloadOptions{round % 2 == 0});
    DeviceBackend::reload(device_pool, d_rec, d_dest.view, round % 2 == 0);
    for (BufferRole role : all_roles) CHECK(d_dest.bytes(role) == h_dest.bytes(role));
    CHECK(ps::free_pages(device_pool) == ps::free_pages(host_pool));
  }
}

}  // namespace

TEST_CASE("the CUDA executor writes the host executor's pages and bytes") {
  std::uint32_t seed = 40;
#define PAGESTASH_SAME_AS_HOST(L) \
  {                               \
    CAPTURE(#L);                  \
    check_same_as_host<L>(++seed); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_SAME_AS_HOST)
#undef PAGESTASH_SAME_AS_HOST
}

namespace {

/// Stash three tensors and reload them out of order (one with zero_tail), all captured in
/// one graph; replay it with new counts and data in the same device buffers each time.
template <class L>
void check_graph_replays(int replays, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 3 * ps::pages_for(ps::detail::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::device);
  std::vector<std::unique_ptr<Tensor<L, DeviceBackend>>> src, dest;
  std::vector<std::unique_ptr<ps::StashRecord<Tr>>> recs;
  for (int i = 0; i < 3; ++i) {
    src.push_back(std::make_unique<Tensor<L, DeviceBackend>>(shape));
    dest.push_back(std::make_unique<Tensor<L, DeviceBackend>>(shape));
    recs.push_back(std::make_unique<ps::StashRecord<Tr>>(pool, shape));
  }
  cudaStream_t stream = nullptr;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) stash_on(stream, pool, src[i]->view, *recs[i]);
  const int order[3] = {2, 0, 1};
  for (int i : order) reload_on(stream, pool, *recs[i], dest[i]->view, i == 1);
  PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));

  int checked = 0;
  for (int replay = 0; replay < replays; ++replay) {
    CAPTURE(replay);
    std::array<std::vector<std::int32_t>, 3> counts;
    std::array<std::array<std::vector<std::uint8_t>, 3>, 3> bytes, poison;
    for (int i = 0; i < 3; ++i) {
      counts[i] = random_counts(shape, rng);
      fill(*src[i], counts[i], rng, &bytes[i]);
      for (BufferRole role : all_roles) {
        poison[i][static_cast<std::size_t>(role)] = random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
        dest[i]->set(role, poison[i][static_cast<std::size_t>(role)]);
      }
    }
    // The uploads above are cudaMemcpy from pageable memory on the legacy stream: they may
    // return before the copy lands, and the non-blocking stream does not wait for them.
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    PAGESTASH_CUDA_TRY(cudaGraphLaunch(exec, stream));
    PAGESTASH_CUDA_TRY(cudaStreamSynchronize(stream));
    bool all_equal = true;
    for (int i = 0; i < 3; ++i) {
      CHECK(recs[i]->status().state == ps::RecordState::reloaded);
      for (BufferRole role : all_roles) {
        const auto r = static_cast<std::size_t>(role);
        all_equal = all_equal && dest[i]->bytes(role) == expected_reload<Tr>(shape, role, counts[i], bytes[i][r],
                                                                             poison[i][r], i == 1);
      }
    }
    CHECK(all_equal);
    const ps::PoolStats st = pool.stats();
    CHECK(!st.overflow);
    CHECK(st.device_pages_free == cfg.device_pages);
    checked += all_equal;
  }
  CHECK(checked == replays);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("a captured graph of stashes and out-of-order reloads, replayed with new device counts") {
  check_graph_replays<ColNv4CapSw>(120, 1);
  check_graph_replays<RuBf16>(120, 2);
  check_graph_replays<RowMx4PackSw>(40, 3);
}

namespace {

/// Streams enqueue interleaved stashes and reloads of their own records, all at once,
/// against one pool; then every destination is checked and every page is back.
template <class L>
void check_concurrent_streams(int streams, int rounds, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  constexpr int per_stream = 4;
  std::mt19937 rng(seed);
  const auto shape = sequence_shape<L>(false);
  ps::PoolConfig cfg;
  cfg.page_bytes = 512;
  cfg.device_pages = streams * 3 * ps::pages_for(ps::detail::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.host_pages = ps::pages_for(ps::detail::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  ps::PagePool pool(cfg, ps::MemorySpace::device);
  const int n = streams * per_stream;
  std::vector<std::unique_ptr<Tensor<L, DeviceBackend>>> src, dest;
  std::vector<std::unique_ptr<ps::StashRecord<Tr>>> recs;
  for (int i = 0; i < n; ++i) {
    src.push_back(std::make_unique<Tensor<L, DeviceBackend>>(shape));
    dest.push_back(std::make_unique<Tensor<L, DeviceBackend>>(shape));
    recs.push_back(std::make_unique<ps::StashRecord<Tr>>(pool, shape));
  }
  std::vector<cudaStream_t> s(static_cast<std::size_t>(streams));
  for (auto& x : s) PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));

  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    std::vector<std::vector<std::int32_t>> counts(static_cast<std::size_t>(n));
    std::vector<std::array<std::vector<std::uint8_t>, 3>> bytes(static_cast<std::size_t>(n)),
        poison(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      counts[i] = random_counts(shape, rng);
      fill(*src[i], counts[i], rng, &bytes[i]);
      for (BufferRole role : all_roles) {
        poison[i][static_cast<std::size_t>(role)] = random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
        dest[i]->set(role, poison[i][static_cast<std::size_t>(role)]);
      }
    }
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    // Per stream: stash 0, stash 1, reload 0, stash 2, reload 2, stash 3, reload 1, reload 3;
    // the streams' steps are enqueued round-robin so that they overlap.
    const int steps[8][2] = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 2}, {0, 3}, {1, 1}, {1, 3}};
    for (const auto& step : steps) {
      for (int k = 0; k < streams; ++k) {
        const int i = k * per_stream + step[1];
        if (step[0] == 0) stash_on(s[static_cast<std::size_t>(k)], pool, src[i]->view, *recs[i]);
        else reload_on(s[static_cast<std::size_t>(k)], pool, *recs[i], dest[i]->view, (i + round) % 2 == 0);
      }
    }
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      wrong += recs[i]->status().state != ps::RecordState::reloaded;
      for (BufferRole role : all_roles) {
        const auto r = static_cast<std::size_t>(role);
        wrong += dest[i]->bytes(role) !=
                 expected_reload<Tr>(shape, role, counts[i], bytes[i][r], poison[i][r], (i + round) % 2 == 0);
      }
    }
    CHECK(wrong == 0);
    const ps::PoolStats st = pool.stats();
    CHECK(!st.overflow);
    CHECK(st.device_pages_free == cfg.device_pages);
    CHECK(st.host_pages_free == cfg.host_pages);
    std::vector<std::int32_t> ids = ps::free_pages(pool);
    std::sort(ids.begin(), ids.end());
    bool permutation = true;
    for (std::size_t i = 0; i < ids.size(); ++i) permutation = permutation && ids[i] == static_cast<std::int32_t>(i);
    CHECK(permutation);
  }
  for (auto x : s) cudaStreamDestroy(x);
}

}  // namespace

TEST_CASE("stashes and reloads of different records on concurrent streams share one pool") {
  check_concurrent_streams<RuBf16Cap>(8, 20, 7);
  check_concurrent_streams<ColMx4CapSw>(4, 10, 8);
}

namespace {

/// Counts that reach the end of every buffer: each group full (capacity-padded), or the
/// groups' shares adding up to max_tokens (packed), at the count alignment.
template <class L>
std::vector<std::int32_t> full_counts(const ps::GroupedView<L>& v) {
  const std::int64_t align = v.count_alignment();
  std::vector<std::int32_t> c(static_cast<std::size_t>(v.groups), static_cast<std::int32_t>(v.max_tokens / align * align));
  if constexpr (L::placement::packed) {
    std::int64_t left = v.max_tokens / align * align;
    for (std::size_t g = 0; g < c.size(); ++g) {
      const std::int64_t share = g + 1 == c.size() ? left : v.max_tokens / v.groups / align * align;
      c[g] = static_cast<std::int32_t>(share);
      left -= share;
    }
  }
  return c;
}

/// The smallest shape the layout takes, with an odd hidden where it allows one (3, for the
/// layouts without scales: rows of 6 or 12 bytes) and more than one group unless Plain.
template <class L>
ps::GroupedView<L> smallest_shape() {
  ps::GroupedView<L> v;
  v.groups = std::is_same_v<L, ps::Plain<typename L::data_type>> ? 1 : 3;
  v.hidden = L::hidden_multiple == 1 ? 3 : L::hidden_multiple;
  v.max_tokens = v.token_granule() == 1 ? 5 : v.token_granule();
  return v;
}

/// Every buffer (and the counts) allocated with cudaMalloc of exactly its bytes, filled with
/// random bytes; stashed and reloaded into a poisoned destination of exact buffers, with and
/// without zero_tail, from full and random counts, with host spill. Under compute-sanitizer
/// memcheck a read or write past the end of any buffer is reported. Returns the rounds.
template <class L>
int check_exact_buffers(const ps::GroupedView<L>& shape, std::uint32_t seed) {
  using Tr = ps::StashTraits<L>;
  std::mt19937 rng(seed);
  ps::validate_shape(shape);
  const ps::PoolConfig cfg = spilling_config<Tr>(shape);  // a large stash spills
  ps::PagePool pool(cfg, ps::MemorySpace::device);
  Tensor<L, ExactDeviceBackend> src(shape), dest(shape);
  auto rec = ps::make_record<Tr>(pool, shape);
  int rounds = 0;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    const bool zero_tail = round % 2 == 1;
    const auto counts = round < 2 ? full_counts(shape) : random_counts(shape, rng);
    std::array<std::vector<std::uint8_t>, 3> bytes, poison;
    fill(src, counts, rng, &bytes);
    for (BufferRole role : all_roles) {
      poison[static_cast<std::size_t>(role)] = random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
      dest.set(role, poison[static_cast<std::size_t>(role)]);
    }
    ExactDeviceBackend::stash(pool, src.view, rec);
    REQUIRE(rec.status().state == ps::RecordState::stashed);
    ExactDeviceBackend::reload(pool, rec, dest.view, zero_tail);
    CHECK(rec.status().state == ps::RecordState::reloaded);
    for (BufferRole role : all_roles) {
      CAPTURE(ps::name_of(role));
      const auto r = static_cast<std::size_t>(role);
      CHECK(dest.bytes(role) == expected_reload<Tr>(shape, role, counts, bytes[r], poison[r], zero_tail));
    }
    const ps::PoolStats st = pool.stats();
    CHECK(!st.overflow);
    CHECK(!st.error);
    CHECK(st.device_pages_free == cfg.device_pages);
    ++rounds;
  }
  return rounds;
}

}  // namespace

// scripts/gpu-check runs this one under compute-sanitizer memcheck ("exact-size").
TEST_CASE("exact-size buffers: every layout at odd shapes, stashed and reloaded from buffers allocated to the exact byte") {
  std::uint32_t seed = 90;
  int layouts = 0, rounds = 0;
#define PAGESTASH_EXACT_SIZE(L)                                        \
  {                                                                    \
    CAPTURE(#L);                                                       \
    ++layouts;                                                         \
    rounds += check_exact_buffers<L>(sequence_shape<L>(true), ++seed); \
    rounds += check_exact_buffers<L>(smallest_shape<L>(), ++seed);     \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_EXACT_SIZE)
#undef PAGESTASH_EXACT_SIZE
  CHECK(rounds == layouts * 2 * 4);
}

TEST_CASE("bad input is rejected on the host before any launch") {
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 8;
  ps::PagePool device_pool(cfg, ps::MemorySpace::device), host_pool(cfg, ps::MemorySpace::host);
  const auto shape = sequence_shape<RuBf16>(false);
  Tensor<RuBf16, DeviceBackend> t(shape);
  t.set_counts({8});
  auto rec = ps::make_record<ps::StashTraits<RuBf16>>(device_pool, shape);
  CHECK_THROWS_WITH_AS(ps::stash(ps::host, device_pool, t.view, rec), doctest::Contains("device memory"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(stash_on(nullptr, device_pool, t.view, rec), doctest::Contains("null"), std::invalid_argument);
  auto host_rec = ps::make_record<ps::StashTraits<RuBf16>>(host_pool, shape);
  CHECK_THROWS_WITH_AS(stash_on(cudaStreamPerThread, host_pool, t.view, host_rec), doctest::Contains("host memory"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(stash_on(cudaStreamPerThread, device_pool, t.view, host_rec),
                       doctest::Contains("another pool"), std::invalid_argument);
  CHECK(rec.status().state == ps::RecordState::empty);
}

namespace {

/// Pages of 1 KiB for two of the largest stashes of `shape`.
template <class Tr>
ps::PoolConfig room_for_two(const ps::GroupedView<typename Tr::layout>& shape) {
  ps::PoolConfig cfg;
  cfg.page_bytes = 1024;
  cfg.device_pages = 2 * ps::pages_for(ps::detail::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  return cfg;
}

}  // namespace

TEST_CASE("end_step on the device: a clean step is balanced, a record left stashed raises unbalanced") {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  ps::PagePool pool(room_for_two<Tr>(shape), ps::MemorySpace::device);
  auto a = ps::make_record<Tr>(pool, shape), b = ps::make_record<Tr>(pool, shape);
  std::mt19937 rng(73);
  Tensor<L, DeviceBackend> src(shape), dst(shape);
  std::vector<std::int32_t> counts = random_counts(shape, rng);
  counts[0] = static_cast<std::int32_t>(shape.max_tokens);  // at least one page
  src.set(BufferRole::data, random_bytes(static_cast<std::size_t>(shape.buffer_bytes(BufferRole::data)), rng));
  src.set_counts(counts);
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());

  DeviceBackend::stash(pool, src.view, a);
  DeviceBackend::stash(pool, src.view, b);
  DeviceBackend::reload(pool, a, dst.view, false);
  DeviceBackend::discard(pool, b);
  end_step_on(cudaStreamPerThread, pool);
  ps::PoolStats s = pool.stats();
  CHECK(s.flags.unbalanced == 0);
  CHECK(s.pages_held_at_step_end == 0);

  DeviceBackend::stash(pool, src.view, a);
  DeviceBackend::stash(pool, src.view, b);
  DeviceBackend::reload(pool, a, dst.view, false);  // b is forgotten
  end_step_on(cudaStreamPerThread, pool);
  s = pool.stats();
  CHECK(b.status().pages > 0);
  CHECK(s.pages_held_at_step_end == b.status().pages);
  CHECK(s.flags.unbalanced == 1);
  CHECK(s.flags.error == 1);
}

TEST_CASE("attached device objects: the host knows no ids, and the kernels refuse a record of another pool") {
  using L = RuBf16;
  using Tr = ps::StashTraits<L>;
  const auto shape = sequence_shape<L>(false);
  const ps::PoolConfig cfg = room_for_two<Tr>(shape);
  ps::PagePool pool_a(cfg, ps::MemorySpace::device), pool_b(cfg, ps::MemorySpace::device);
  CHECK(pool_a.id() != pool_b.id());
  auto rec_a = ps::make_record<Tr>(pool_a, shape);
  std::mt19937 rng(71);
  Tensor<L, DeviceBackend> src(shape), dst(shape);
  const std::vector<std::int32_t> counts = random_counts(shape, rng);
  const auto data_bytes = static_cast<std::size_t>(shape.buffer_bytes(BufferRole::data));
  const std::vector<std::uint8_t> source = random_bytes(data_bytes, rng);
  const std::vector<std::uint8_t> poisoned = random_bytes(source.size(), rng);
  src.set(BufferRole::data, source);
  dst.set(BufferRole::data, poisoned);
  src.set_counts(counts);
  PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());  // the uploads, before the per-thread stream reads them
  DeviceBackend::stash(pool_a, src.view, rec_a);
  const std::vector<std::int32_t> held = rec_a.page_ids();

  // Per call, as a framework makes them: attach reads no device memory, so no ids.
  ps::PagePool b = ps::PagePool::attach(cfg, ps::MemorySpace::device,
                                        ps::PoolMemory{pool_b.ref().counters, pool_b.ref().device_arena, nullptr});
  CHECK(b.id() == 0);
  auto on_b = ps::StashRecord<Tr>::attach(b, shape, rec_a.ref().header);
  CHECK(on_b.pool_id() == 0);
  CHECK(ps::make_record<Tr>(b, shape).pool_id() == pool_b.id());  // made: reads the id once
  DeviceBackend::stash(b, src.view, on_b);
  DeviceBackend::reload(b, on_b, dst.view, true);
  DeviceBackend::discard(b, on_b);
  const ps::PoolStats s = pool_b.stats();
  CHECK(s.flags.foreign_record == 1);
  CHECK(s.flags.error == 1);
  CHECK(s.errors == 3);
  CHECK(s.stashes == 0);
  CHECK(s.reloads == 0);
  CHECK(s.device_pages_free == cfg.device_pages);
  std::vector<std::int32_t> free = ps::free_pages(pool_b);
  std::sort(free.begin(), free.end());
  for (std::size_t i = 0; i < free.size(); ++i) CHECK(free[i] == static_cast<std::int32_t>(i));
  CHECK(rec_a.status().error == ps::Flag::foreign_record);
  CHECK(rec_a.status().state == ps::RecordState::stashed);
  CHECK(rec_a.page_ids() == held);
  CHECK(dst.bytes(BufferRole::data) == poisoned);

  // A's record is intact: it reloads on its own pool.
  DeviceBackend::reload(pool_a, rec_a, dst.view, false);
  CHECK(dst.bytes(BufferRole::data) == expected_reload<Tr>(shape, BufferRole::data, counts, source, poisoned, false));
  CHECK(pool_a.stats().flags.error == 0);
}

TEST_CASE("every launch has its own id, graph replays and two executables of one graph too") {
  // The operation kernels tell their launch from another by this id (%gridid + 1), so that
  // two launches with the same arguments on one record never join (docs/design.md).
  pagestash_test::DeviceBuffer<std::uint64_t> out(1);
  std::vector<std::uint64_t> ids;
  auto read = [&] {
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    ids.push_back(out.download()[0]);
  };
  cudaStream_t stream = nullptr;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 3; ++i) {
    pagestash_test::launch_id_on(stream, out.ptr);
    read();
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec[2] = {nullptr, nullptr};
  PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  pagestash_test::launch_id_on(stream, out.ptr);
  PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  for (auto& e : exec) PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&e, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    for (auto& e : exec) {
      PAGESTASH_CUDA_TRY(cudaGraphLaunch(e, stream));
      read();
    }
  }
  for (auto& e : exec) PAGESTASH_CUDA_TRY(cudaGraphExecDestroy(e));
  PAGESTASH_CUDA_TRY(cudaGraphDestroy(graph));
  PAGESTASH_CUDA_TRY(cudaStreamDestroy(stream));
  CAPTURE(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CHECK(ids[i] != 0);
    for (std::size_t j = 0; j < i; ++j) CHECK(ids[i] != ids[j]);
  }
}
