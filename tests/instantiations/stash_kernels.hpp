#pragma once
// Host entry points of the stash kernels in stash_kernels*.cu (callable from g++ code): the
// CUDA executor's operations on `stream`, asynchronous as the library's are.

#include <pagestash/pagestash.hpp>

#include "../common/layout_list.hpp"  // the non-default traits (PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS)

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pagestash_test {

namespace ps = pagestash;

template <class Tr>
void stash_on(cudaStream_t stream, ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& view,
              ps::StashRecord<Tr>& rec);
template <class Tr>
void reload_on(cudaStream_t stream, ps::PagePool& pool, ps::StashRecord<Tr>& rec,
               const ps::GroupedView<typename Tr::layout>& dest, ps::ReloadOptions options);
template <class Tr>
void discard_on(cudaStream_t stream, ps::PagePool& pool, ps::StashRecord<Tr>& rec);
void reset_on(cudaStream_t stream, ps::PagePool& pool);
void end_step_on(cudaStream_t stream, ps::PagePool& pool);
void grow_on(cudaStream_t stream, ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages);
void shrink_on(cudaStream_t stream, ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages);
/// Enqueues one kernel of one thread that writes its launch id (what the operation kernels'
/// blocks tell their launch by: grid_launch_id) to *out.
void launch_id_on(cudaStream_t stream, std::uint64_t* out);

}  // namespace pagestash_test
