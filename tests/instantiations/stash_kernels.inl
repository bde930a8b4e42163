// The definitions behind stash_kernels.hpp; each stash_kernels_*.cu instantiates a share
// of the traits (several files, so that nvcc builds them in parallel).

#include "stash_kernels.hpp"

#include <pagestash/pagestash.cuh>

#include "../common/layout_list.hpp"

namespace pagestash_test {

template <class Tr>
void stash_on(cudaStream_t stream, ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& view,
              ps::StashRecord<Tr>& rec) {
  ps::stash(ps::on(stream), pool, view, rec);
}
template <class Tr>
void reload_on(cudaStream_t stream, ps::PagePool& pool, ps::StashRecord<Tr>& rec,
               const ps::GroupedView<typename Tr::layout>& dest, ps::ReloadOptions options) {
  ps::reload(ps::on(stream), pool, rec, dest, options);
}
template <class Tr>
void discard_on(cudaStream_t stream, ps::PagePool& pool, ps::StashRecord<Tr>& rec) {
  ps::discard(ps::on(stream), pool, rec);
}

}  // namespace pagestash_test

// The pool's entry points, in the one file of an executable's kernels that defines them.
#if defined(PAGESTASH_TEST_DEFINE_POOL_ENTRY_POINTS)
void pagestash_test::reset_on(cudaStream_t stream, pagestash::PagePool& pool) {
  pagestash::reset(pagestash::on(stream), pool);
}
void pagestash_test::end_step_on(cudaStream_t stream, pagestash::PagePool& pool) {
  pagestash::end_step(pagestash::on(stream), pool);
}
void pagestash_test::grow_on(cudaStream_t stream, pagestash::PagePool& pool, std::int64_t device_pages,
                             std::int64_t host_pages) {
  pagestash::grow(pagestash::on(stream), pool, device_pages, host_pages);
}
void pagestash_test::shrink_on(cudaStream_t stream, pagestash::PagePool& pool, std::int64_t device_pages,
                               std::int64_t host_pages) {
  pagestash::shrink(pagestash::on(stream), pool, device_pages, host_pages);
}
#endif

#define PAGESTASH_INSTANTIATE_STASH_TRAITS(Tr)                                                                        \
  template void pagestash_test::stash_on<Tr>(cudaStream_t, pagestash::PagePool&,                                      \
                                             const pagestash::GroupedView<Tr::layout>&, pagestash::StashRecord<Tr>&); \
  template void pagestash_test::reload_on<Tr>(cudaStream_t, pagestash::PagePool&, pagestash::StashRecord<Tr>&,        \
                                              const pagestash::GroupedView<Tr::layout>&, pagestash::ReloadOptions);   \
  template void pagestash_test::discard_on<Tr>(cudaStream_t, pagestash::PagePool&, pagestash::StashRecord<Tr>&);
#define PAGESTASH_INSTANTIATE_STASH(L) PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash::StashTraits<PAGESTASH_LAYOUT(L)>)
