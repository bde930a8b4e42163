#pragma once
// The library's operations for every traits the host tests use, compiled once. The files of
// tests/instances/ instantiate them (PAGESTASH_TEST_INSTANTIATE_*), at the build type's
// optimisation (-O3 in scripts/test's first step, where g++ warns most) with the tests'
// warnings; a test target that links pagestash_test_instances gets
// PAGESTASH_TEST_EXTERN_INSTANCES, and its translation units (compiled at
// PAGESTASH_TEST_OPTIMIZE, -O1) take them from there instead of instantiating every layout's
// operations again. The fuzz target links none: it instruments the library's code itself.
//
// The operations: the host executor's stash, reload and discard (with their host checks)
// and its steps on the handles, and the kernel body (run_operation) as the grid emulator
// runs it.

#include <pagestash/pagestash.hpp>

#include "grid_emulator.hpp"
#include "layout_list.hpp"

#define PAGESTASH_TEST_INSTANCE_RUN(ext, Tr, op)                                                                       \
  ext template void                                                                                                    \
  pagestash::run_operation<Tr, pagestash::Operation::op, pagestash_test::EmulatedTeam, pagestash_test::EmulatedLanes>( \
      const pagestash_test::EmulatedContext&, const pagestash::PoolRef&, const pagestash::GroupedView<Tr::layout>&,    \
      const pagestash::RecordRef&, pagestash::ReloadOptions);
/// Every operation of traits Tr; `ext` is `extern` for the declarations, empty for the definitions.
#define PAGESTASH_TEST_INSTANCE_OPS(ext, Tr)                                                                      \
  ext template void pagestash::stash<Tr>(const pagestash::HostExecutor&, pagestash::PagePool&,                    \
                                         const pagestash::GroupedView<Tr::layout>&, pagestash::StashRecord<Tr>&); \
  ext template void pagestash::reload<Tr>(const pagestash::HostExecutor&, pagestash::PagePool&,                   \
                                          pagestash::StashRecord<Tr>&, const pagestash::GroupedView<Tr::layout>&, \
                                          pagestash::ReloadOptions);                                              \
  ext template void pagestash::discard<Tr>(const pagestash::HostExecutor&, pagestash::PagePool&,                  \
                                           pagestash::StashRecord<Tr>&);                                          \
  ext template void pagestash::stash_on_host<Tr>(const pagestash::HostExecutor&, const pagestash::PoolRef&,       \
                                                 const pagestash::GroupedView<Tr::layout>&,                       \
                                                 const pagestash::RecordRef&);                                    \
  ext template void pagestash::reload_on_host<Tr>(                                                                \
      const pagestash::HostExecutor&, const pagestash::PoolRef&, const pagestash::RecordRef&,                     \
      const pagestash::GroupedView<Tr::layout>&, pagestash::ReloadOptions);                                       \
  PAGESTASH_TEST_INSTANCE_RUN(ext, Tr, stash)                                                                     \
  PAGESTASH_TEST_INSTANCE_RUN(ext, Tr, reload) PAGESTASH_TEST_INSTANCE_RUN(ext, Tr, discard)

// The three shares of the instances (one file each, so that they build in parallel): every
// layout's default traits, the compressed layouts, the buffer selections.
#define PAGESTASH_TEST_INSTANCE_LAYOUT(ext, L) \
  PAGESTASH_TEST_INSTANCE_OPS(ext, pagestash::StashTraits<PAGESTASH_LAYOUT(L)>)
#define PAGESTASH_TEST_INSTANCE_COMPRESSED(ext, T) PAGESTASH_TEST_INSTANCE_OPS(ext, PAGESTASH_LAYOUT(T))
#define PAGESTASH_TEST_INSTANCE_EXTERN_LAYOUT(L) PAGESTASH_TEST_INSTANCE_LAYOUT(extern, L)
#define PAGESTASH_TEST_INSTANCE_EXTERN_COMPRESSED(T) PAGESTASH_TEST_INSTANCE_COMPRESSED(extern, T)
#define PAGESTASH_TEST_INSTANCE_EXTERN_TRAITS(Tr) PAGESTASH_TEST_INSTANCE_OPS(extern, Tr)

#ifdef PAGESTASH_TEST_EXTERN_INSTANCES
PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_TEST_INSTANCE_EXTERN_LAYOUT)
PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(PAGESTASH_TEST_INSTANCE_EXTERN_COMPRESSED)
PAGESTASH_TEST_FOR_EACH_SELECTION_TRAITS(PAGESTASH_TEST_INSTANCE_EXTERN_TRAITS)
#endif
