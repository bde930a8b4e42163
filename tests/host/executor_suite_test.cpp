// The GPU tests' bodies (tests/common/executor_suite.hpp) on the CPU: through the host
// executor and through the grid emulator, smaller than on the GPU (ASan and TSan run them
// too), so that a body whose setup is wrong fails here before any GPU runs it. The cases
// that run host threads are named so that scripts/test's ThreadSanitizer filter takes them
// ("*concurrent*", "emulated grid*").

#include <doctest/doctest.h>

#include "../common/executor_suite.hpp"
#include "../common/suite_backends.hpp"

namespace {

using namespace pagestash_test;
using Host = HostExecutorBackend<1>;
using Emulated = EmulatorBackend<2, 64, 2>;  // two warps a block, two blocks at once

}  // namespace

using namespace pagestash_test::layouts;

// ---- The host executor ------------------------------------------------------------------

TEST_CASE("executor suite, host executor: every layout's random sequences (the GPU test's body)") {
  suite::every_layout_sequences<Host>(12, 12);
}

TEST_CASE("executor suite, host executor: the same pages and bytes as the host executor (the GPU test's body)") {
  suite::every_layout_same_as_host<Host>(2);
}

TEST_CASE(
    "executor suite, host executor: a recorded graph of stashes and out-of-order reloads, replayed with new counts") {
  CHECK(suite::graph_replays<ColNv4CapSw, Host>(12, 1) == 12);
  CHECK(suite::graph_replays<RuBf16, Host>(12, 2) == 12);
  CHECK(suite::graph_replays<RowMx4PackSw, Host>(6, 3) == 6);
}

TEST_CASE("executor suite, host executor: a graph recorded on a small pool runs after grow, bit-exact (no re-record)") {
  CHECK(suite::graph_after_grow<ColNv4CapSw, Host>(6, 1) == 6);
  CHECK(suite::graph_after_grow<RuBf16, Host>(6, 2) == 6);
}

TEST_CASE("executor suite, host executor: an attached pool is not resized, the owner's grow shows through it") {
  CHECK(suite::attached_pool_is_not_resized<ColNv4CapSw, Host>(1) == 2);
  CHECK(suite::attached_pool_is_not_resized<RuBf16, Host>(2) == 2);
}

TEST_CASE("executor suite, host executor: a spill that grows, shrinks to none and grows again") {
  CHECK(suite::spill_grows_and_shrinks<ColNv4CapSw, Host>(1) == 2);
  CHECK(suite::spill_grows_and_shrinks<RuBf16, Host>(2) == 2);
}

TEST_CASE(
    "executor suite, host executor: stashes and reloads of different records on concurrent streams share one pool") {
  suite::concurrent_streams<RuBf16Cap, Host>(8, 4, 7);
  suite::concurrent_streams<ColMx4CapSw, Host>(4, 2, 8);
}

TEST_CASE(
    "executor suite, host executor: stashes of what the reload before each wrote, on one stream, unsynchronised") {
  suite::chained_hops<RuBf16Cap, Host>(4, 9);
  suite::chained_hops<ColMx4CapSw, Host>(3, 10);
}

TEST_CASE("executor suite, host executor: every layout at odd shapes, buffers allocated to the exact byte") {
  suite::every_layout_exact_buffers<Host>();
}

TEST_CASE(
    "executor suite, host executor: end_step, a clean step is balanced, a record left stashed raises unbalanced") {
  suite::end_step_balance<Host>();
}

TEST_CASE(
    "executor suite, host executor: a reload that does not restore poisons its destination (poison off: untouched)") {
  suite::every_layout_failed_reloads<Host>();
}

TEST_CASE("executor suite, host executor: bad input is rejected before anything runs") {
  suite::refused_before_launch<Host>([](ps::PagePool&, const auto&, auto&) {});
}

TEST_CASE("executor suite, host executor: a stash as another kind where the host cannot tell writes its own kind") {
  suite::stash_as_other_kind_is_stamped<Host>([](ps::PagePool& pool, const auto& view, auto& rec) {
    using Tr = typename std::remove_reference_t<decltype(rec)>::traits;
    ps::stash_on_host<Tr>(ps::host, pool.ref(), view, rec.ref());  // past the host checks, as on the device
  });
}

TEST_CASE("executor suite, host executor: the steps refuse a record of another pool where the host cannot tell") {
  suite::foreign_record_refused<Host>([](ps::PagePool& pool_b, const auto& src, const auto& dst, auto& rec_a) {
    using Tr = typename std::remove_reference_t<decltype(rec_a)>::traits;
    // Past the host checks, as on the device with attached objects (no ids on the host).
    ps::stash_on_host<Tr>(ps::host, pool_b.ref(), src, rec_a.ref());
    ps::reload_on_host<Tr>(ps::host, pool_b.ref(), rec_a.ref(), dst, ps::ReloadOptions{true});
    ps::discard_pages(ps::SerialTeam{}, pool_b.ref(), rec_a.ref(), ps::record_kind<Tr>(rec_a.shape()));
  });
}

TEST_CASE("executor suite, host executor: a record used as another recipe, compression or shape is refused") {
  suite::mismatched_record_refused<Host>();
}

// ---- The grid emulator ------------------------------------------------------------------
// Emulated launches are dear (host threads, and TSan runs these): the bodies run for one
// layout of each family here; emulator_test.cpp runs every layout through the emulator.

#define PAGESTASH_SUITE_FEW_LAYOUTS(X) X(Pbf16) X(RuBf16) X(ColNv4PackSw) X(RowMx4PadCo)

TEST_CASE("emulated grid: executor suite, random sequences (the GPU test's body), one layout of each family") {
  std::uint32_t seed = 1000;
#define PAGESTASH_SUITE_EMULATED_SEQUENCES(L) suite::sequences<ps::StashTraits<L>, Emulated>(seed, 3);
  PAGESTASH_SUITE_FEW_LAYOUTS(PAGESTASH_SUITE_EMULATED_SEQUENCES)
#undef PAGESTASH_SUITE_EMULATED_SEQUENCES
  suite::sequences<traits::ScalesOnly, Emulated>(seed, 3);
}

TEST_CASE("emulated grid: compressed stash, random sequences reload the reference's round trip (the GPU test's body)") {
  std::uint32_t seed = 7000;
#define PAGESTASH_EMULATED_COMPRESSED(Tr) suite::sequences<Tr, Emulated>(seed, 8);
  PAGESTASH_TEST_FOR_EACH_COMPRESSED_TRAITS(PAGESTASH_EMULATED_COMPRESSED)
#undef PAGESTASH_EMULATED_COMPRESSED
}

TEST_CASE("emulated grid: executor suite, the same pages and bytes as the host executor (the GPU test's body)") {
  std::uint32_t seed = 40;
#define PAGESTASH_SUITE_EMULATED_SAME(L) suite::same_as_host<L, Emulated>(++seed, 2);
  PAGESTASH_SUITE_FEW_LAYOUTS(PAGESTASH_SUITE_EMULATED_SAME)
#undef PAGESTASH_SUITE_EMULATED_SAME
}

TEST_CASE(
    "emulated grid: executor suite, a recorded graph of stashes and out-of-order reloads, replayed with new counts") {
  CHECK(suite::graph_replays<ColNv4CapSw, Emulated>(2, 1) == 2);
  CHECK(suite::graph_replays<RuBf16, Emulated>(2, 2) == 2);
}

TEST_CASE("emulated grid: executor suite, a graph recorded on a small pool runs after grow, bit-exact") {
  CHECK(suite::graph_after_grow<ColNv4CapSw, Emulated>(2, 1) == 2);
}

TEST_CASE("emulated grid: executor suite, an attached pool is not resized, the owner's grow shows through it") {
  CHECK(suite::attached_pool_is_not_resized<ColNv4CapSw, Emulated>(1) == 2);
}

TEST_CASE("emulated grid: executor suite, a spill that grows, shrinks to none and grows again") {
  CHECK(suite::spill_grows_and_shrinks<RuBf16, Emulated>(2) == 2);
}

TEST_CASE(
    "emulated grid: executor suite, stashes and reloads of different records on concurrent streams share one pool") {
  suite::concurrent_streams<RuBf16Cap, Emulated>(3, 1, 7);
}

TEST_CASE("emulated grid: executor suite, stashes of what the reload before each wrote, on one stream") {
  suite::chained_hops<RuBf16Cap, Emulated>(2, 9);
}

TEST_CASE("emulated grid: executor suite, odd shapes, buffers allocated to the exact byte (ASan sees past the end)") {
  std::uint32_t seed = 90;
#define PAGESTASH_SUITE_EMULATED_EXACT(L)                                              \
  {                                                                                    \
    CAPTURE(#L);                                                                       \
    CHECK(suite::exact_buffers<L, Emulated>(sequence_shape<L>(true), ++seed) == 4);    \
    CHECK(suite::exact_buffers<L, Emulated>(suite::smallest_shape<L>(), ++seed) == 4); \
  }
  PAGESTASH_SUITE_FEW_LAYOUTS(PAGESTASH_SUITE_EMULATED_EXACT)
#undef PAGESTASH_SUITE_EMULATED_EXACT
}

TEST_CASE(
    "emulated grid: executor suite, a reload that does not restore poisons its destination, one layout of each "
    "family") {
  std::uint32_t seed = 500;
#define PAGESTASH_SUITE_EMULATED_FAILED_RELOADS(L) \
  CHECK(suite::failed_reload_poisons<ps::StashTraits<L>, Emulated>(++seed) == 8);
  PAGESTASH_SUITE_FEW_LAYOUTS(PAGESTASH_SUITE_EMULATED_FAILED_RELOADS)
#undef PAGESTASH_SUITE_EMULATED_FAILED_RELOADS
  CHECK(suite::failed_reload_poisons<traits::ScalesOnly, Emulated>(++seed) == 8);  // a dropped buffer stays
}

TEST_CASE(
    "emulated grid: executor suite, end_step, a clean step is balanced, a record left stashed raises unbalanced") {
  suite::end_step_balance<Emulated>();
}

TEST_CASE("emulated grid: executor suite, a record used as another recipe, compression or shape is refused") {
  suite::mismatched_record_refused<Emulated>();
}

TEST_CASE("emulated grid: executor suite, a stash as another kind where the host cannot tell writes its own kind") {
  suite::stash_as_other_kind_is_stamped<Emulated>([](ps::PagePool& pool, const auto& view, auto& rec) {
    using Tr = typename std::remove_reference_t<decltype(rec)>::traits;
    Emulated::emulator().launch<Tr, ps::Operation::stash>(pool.ref(), view, rec.ref(), {});
  });
}

TEST_CASE("emulated grid: executor suite, the kernels refuse a record of another pool where the host cannot tell") {
  suite::foreign_record_refused<Emulated>([](ps::PagePool& pool_b, const auto& src, const auto& dst, auto& rec_a) {
    using Tr = typename std::remove_reference_t<decltype(rec_a)>::traits;
    using ps::Operation;
    // Launches on the handles, past the host checks, as on the device with attached objects.
    const Emulator em = Emulated::emulator();
    em.launch<Tr, Operation::stash>(pool_b.ref(), src, rec_a.ref(), {});
    em.launch<Tr, Operation::reload>(pool_b.ref(), dst, rec_a.ref(), ps::ReloadOptions{true});
    em.launch<Tr, Operation::discard>(pool_b.ref(), rec_a.shape(), rec_a.ref(), {});
  });
}

#undef PAGESTASH_SUITE_FEW_LAYOUTS
