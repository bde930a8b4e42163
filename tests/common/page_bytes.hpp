#pragma once
// A stash's pages read back as bytes, for comparing two pools' stashes (host tests with g++,
// GPU tests). A stash writes its page stream [0, stream_bytes) across its pages end to end;
// the rest of its last page is never written by any executor and holds whatever the pool's
// allocation held before (operator new, cudaMalloc, cudaHostAlloc), so two pools agree on
// the stream bytes, not on whole pages. Host pools are read with memcpy, device pools (both
// arenas: device memory and mapped host memory) with cudaMemcpy.

#include <pagestash/cuda/error.hpp>
#include <pagestash/pagestash.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace pagestash_test {

namespace ps = pagestash;

/// The first `bytes` bytes of the pages `ids` of `pool`, taken end to end (the last page
/// only as far as `bytes` reaches).
inline std::vector<std::uint8_t> page_prefix_of(const ps::PagePool& pool, const std::vector<std::int32_t>& ids,
                                                std::int64_t bytes) {
  const auto page = static_cast<std::size_t>(pool.config().page_bytes);
  if (bytes < 0 || static_cast<std::size_t>(bytes) > ids.size() * page)
    throw std::invalid_argument("page_prefix_of: more bytes than the pages hold");
  std::vector<std::uint8_t> out(static_cast<std::size_t>(bytes));
  for (std::size_t i = 0, at = 0; at < out.size(); ++i, at += page) {
    const void* src = pool.ref().page(ids[i]);
    const std::size_t n = std::min(page, out.size() - at);
    if (pool.space() == ps::MemorySpace::host) std::memcpy(out.data() + at, src, n);
    else PAGESTASH_CUDA_TRY(cudaMemcpy(out.data() + at, src, n, cudaMemcpyDefault));
  }
  return out;
}

/// Whole pages `ids` of `pool`, end to end: differs between pools whose arenas held
/// different bytes, even where the stashes agree (the tests show it).
inline std::vector<std::uint8_t> whole_pages_of(const ps::PagePool& pool, const std::vector<std::int32_t>& ids) {
  return page_prefix_of(pool, ids, static_cast<std::int64_t>(ids.size()) * pool.config().page_bytes);
}

/// The stream bytes of a stashed record: [0, stream_bytes) of its pages end to end. What
/// two executors must agree on for the same stash.
template <class Traits>
std::vector<std::uint8_t> stream_bytes_of(const ps::PagePool& pool, const ps::StashRecord<Traits>& record) {
  const ps::RecordStatus s = record.status();
  return page_prefix_of(pool, record.page_ids(), s.state == ps::RecordState::stashed ? s.stream_bytes : 0);
}

}  // namespace pagestash_test
