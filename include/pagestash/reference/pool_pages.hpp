#pragma once
// The pool's free page ids read back, for tests that check the page invariants (every id
// free once after a balanced sequence of operations).

#include <pagestash/pool/page_pool.hpp>

#include <cstdint>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN

/// The free page ids, device stack then host stack. Synchronises as PagePool::stats() does.
inline std::vector<std::int32_t> free_pages(const PagePool& pool) {
  const PoolStats s = pool.stats();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(s.device_pages_free + s.host_pages_free));
  const auto d = static_cast<std::size_t>(s.device_pages_free);
  detail::copy_bytes(pool.space(), ids.data(), pool.ref().device_stack, d * sizeof(std::int32_t), true);
  detail::copy_bytes(pool.space(), ids.data() + d, pool.ref().host_stack, (ids.size() - d) * sizeof(std::int32_t),
                     true);
  return ids;
}

PAGESTASH_NAMESPACE_END
