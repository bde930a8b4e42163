// The CUDA executor: the executor suite's bodies (tests/common/executor_suite.hpp, which
// also run on the CPU in CI: tests/host/executor_suite_test.cpp) through the CUDA executor
// (the host parity suite on the device, byte-for-byte agreement with the host executor, a
// captured graph replayed with different device counts, stashes and reloads of different
// records on concurrent streams against one pool, every layout from buffers allocated to the
// exact byte for compute-sanitizer memcheck, end_step), and what only a GPU shows: the
// CUDA executor's host checks, attached device objects (no ids on the host) and %gridid.

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/device_backend.hpp"
#include "../common/device_buffer.hpp"
#include "../common/executor_suite.hpp"
#include "../common/layout_list.hpp"
#include "../common/stash_sequence.hpp"
#include "stash_kernels.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace ps = pagestash;
using namespace pagestash_test;

using namespace pagestash_test::layouts;

// ---- The executor suite's bodies (also on the CPU: tests/host/executor_suite_test.cpp) ----

TEST_CASE("every layout, random stash / reload / discard sequences match a byte-for-byte copy") {
  suite::every_layout_sequences<DeviceBackend>(60, 30);
}

TEST_CASE("the CUDA executor writes the host executor's pages and bytes") {
  suite::every_layout_same_as_host<DeviceBackend>(4);
}

TEST_CASE("a captured graph of stashes and out-of-order reloads, replayed with new device counts") {
  CHECK(suite::graph_replays<ColNv4CapSw, DeviceBackend>(120, 1) == 120);
  CHECK(suite::graph_replays<RuBf16, DeviceBackend>(120, 2) == 120);
  CHECK(suite::graph_replays<RowMx4PackSw, DeviceBackend>(40, 3) == 40);
}

TEST_CASE("a graph captured on a small pool runs after grow with more live tokens than it held, bit-exact") {
  CHECK(suite::graph_after_grow<ColNv4CapSw, DeviceBackend>(20, 1) == 20);
  CHECK(suite::graph_after_grow<RuBf16, DeviceBackend>(20, 2) == 20);
}

TEST_CASE("an attached pool is not resized: refused before any launch, and the owner's grow shows through it") {
  CHECK(suite::attached_pool_is_not_resized<ColNv4CapSw, DeviceBackend>(1) == 2);
  CHECK(suite::attached_pool_is_not_resized<RuBf16, DeviceBackend>(2) == 2);
}

TEST_CASE("a device pool's spill (registered host memory) grows, shrinks to none and grows again") {
  CHECK(suite::spill_grows_and_shrinks<ColNv4CapSw, DeviceBackend>(1) == 2);
  CHECK(suite::spill_grows_and_shrinks<RuBf16, DeviceBackend>(2) == 2);
}

TEST_CASE("stashes and reloads of different records on concurrent streams share one pool") {
  suite::concurrent_streams<RuBf16Cap, DeviceBackend>(8, 20, 7);
  suite::concurrent_streams<ColMx4CapSw, DeviceBackend>(4, 10, 8);
}

TEST_CASE("programmatic launches: each stash reads what the reload just before it on the stream wrote, bit-exact") {
  suite::chained_hops<RuBf16Cap, DeviceBackend>(16, 9);
  suite::chained_hops<ColMx4CapSw, DeviceBackend>(16, 10);
  suite::chained_hops<ColNv4CapSw, DeviceBackend>(8, 11);
}

// scripts/gpu-check runs this one under compute-sanitizer memcheck ("exact-size").
TEST_CASE(
    "exact-size buffers: every layout at odd shapes, stashed and reloaded from buffers allocated to the exact byte") {
  suite::every_layout_exact_buffers<ExactDeviceBackend>();
}

TEST_CASE(
    "a reload that does not restore poisons its destination on the device, in the same launch (poison off: "
    "untouched)") {
  suite::every_layout_failed_reloads<DeviceBackend>();
}

TEST_CASE("end_step on the device: a clean step is balanced, a record left stashed raises unbalanced") {
  suite::end_step_balance<DeviceBackend>();
}

// ---- GPU only (docs/design.md, "Tests and build") --------------------------------------

TEST_CASE("bad input is rejected on the host before any launch") {
  suite::refused_before_launch<DeviceBackend>([](ps::PagePool& device_pool, const auto& view, auto& rec) {
    using Tr = typename std::remove_reference_t<decltype(rec)>::traits;
    // The one wording of check_memory_space (stash/checks.hpp), on both executors.
    CHECK_THROWS_WITH_AS(ps::stash(ps::host, device_pool, view, rec),
                         doctest::Contains("the pool is in device memory, the executor runs on host memory"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(stash_on(nullptr, device_pool, view, rec), doctest::Contains("null"), std::invalid_argument);
    ps::PagePool host_pool(device_pool.config(), ps::MemorySpace::host);
    auto host_rec = ps::make_record<Tr>(host_pool, rec.shape());
    CHECK_THROWS_WITH_AS(stash_on(cudaStreamPerThread, host_pool, view, host_rec),
                         doctest::Contains("the pool is in host memory, the executor runs on device memory"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(stash_on(cudaStreamPerThread, device_pool, view, host_rec), doctest::Contains("another pool"),
                         std::invalid_argument);
  });
}

TEST_CASE("the kernels refuse a record used as another recipe, compression or shape") {
  suite::mismatched_record_refused<DeviceBackend>();
}

TEST_CASE("a stash as another kind (the kernels do not compare it) writes its own kind: reloads compare with it") {
  suite::stash_as_other_kind_is_stamped<DeviceBackend>(
      [](ps::PagePool& pool, const auto& view, auto& rec) { DeviceBackend::stash(pool, view, rec); });
}

TEST_CASE("attached device objects: the host knows no ids, and the kernels refuse a record of another pool") {
  suite::foreign_record_refused<DeviceBackend>([](ps::PagePool& pool_b, const auto& src, const auto& dst, auto& rec_a) {
    using Tr = typename std::remove_reference_t<decltype(rec_a)>::traits;
    // Per call, as a framework makes them: attach reads no device memory, so no ids.
    ps::PagePool b = ps::PagePool::attach(pool_b.config(), ps::MemorySpace::device,
                                          ps::PoolMemory{pool_b.ref().state, pool_b.ref().device_arena, nullptr});
    CHECK(b.id() == 0);
    auto on_b = ps::StashRecord<Tr>::attach(b, rec_a.shape(), rec_a.ref().header);
    CHECK(on_b.pool_id() == 0);
    CHECK(ps::make_record<Tr>(b, rec_a.shape()).pool_id() == pool_b.id());  // made: reads the id once
    DeviceBackend::stash(b, src, on_b);
    DeviceBackend::reload(b, on_b, dst, true);
    DeviceBackend::discard(b, on_b);
  });
}

TEST_CASE("launch ids: every launch and each executable of one graph its own, a replay its executable's") {
  // The operation kernels tell their launch from another by this id (%gridid + 1), so that two launches with the same
  // arguments on one record never join (docs/design.md). A graph's replays run one after another and repeat their
  // kernel nodes' ids (seen on H200 with CUDA 13.0): the launch words clear the owner's id when it releases, so that
  // a replay's blocks wait for its own reset words.
  pagestash_test::DeviceBuffer<std::uint64_t> out(1);
  std::vector<std::uint64_t> eager, replays[2];
  auto read = [&](std::vector<std::uint64_t>& into) {
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    into.push_back(out.download()[0]);
  };
  cudaStream_t stream = nullptr;
  PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 3; ++i) {
    pagestash_test::launch_id_on(stream, out.ptr);
    read(eager);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec[2] = {nullptr, nullptr};
  PAGESTASH_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  pagestash_test::launch_id_on(stream, out.ptr);
  PAGESTASH_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  for (auto& e : exec) PAGESTASH_CUDA_TRY(cudaGraphInstantiate(&e, graph, 0));
  for (int replay = 0; replay < 2; ++replay)
    for (int e = 0; e < 2; ++e) {
      PAGESTASH_CUDA_TRY(cudaGraphLaunch(exec[e], stream));
      read(replays[e]);
    }
  for (auto& e : exec) PAGESTASH_CUDA_TRY(cudaGraphExecDestroy(e));
  PAGESTASH_CUDA_TRY(cudaGraphDestroy(graph));
  PAGESTASH_CUDA_TRY(cudaStreamDestroy(stream));
  std::vector<std::uint64_t> distinct = eager;
  distinct.push_back(replays[0][0]);
  distinct.push_back(replays[1][0]);
  for (std::size_t i = 0; i < distinct.size(); ++i) {
    CHECK(distinct[i] != 0);
    for (std::size_t j = 0; j < i; ++j) CHECK(distinct[i] != distinct[j]);
  }
  MESSAGE(
      "a replay's id: " << std::string(replays[0][0] == replays[0][1] ? "its executable's, repeated" : "a new one"));
}
