#pragma once
// How big a page pool is.

#include <pagestash/config.hpp>
#include <pagestash/detail/errors.hpp>
#include <pagestash/detail/math.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

/// Pages are sized in bytes, so one pool serves every buffer, dtype and hidden size.
struct PoolConfig {
  std::int64_t page_bytes = std::int64_t{64} << 10;  ///< a power of two, at least 256
  std::int64_t device_pages = 0;                     ///< pages in device memory
  std::int64_t host_pages = 0;                       ///< spill pages in pinned, device-mapped host memory

  std::int64_t device_bytes() const { return device_pages * page_bytes; }
  std::int64_t host_bytes() const { return host_pages * page_bytes; }
};

/// Throws std::invalid_argument naming the bad field.
inline void validate(const PoolConfig& c) {
  if (c.page_bytes < 256 || (c.page_bytes & (c.page_bytes - 1)) != 0)
    detail::throw_invalid("PoolConfig",
                          "page_bytes = " + std::to_string(c.page_bytes) + " must be a power of two >= 256");
  if (c.device_pages < 0 || c.host_pages < 0)
    detail::throw_invalid("PoolConfig", "device_pages = " + std::to_string(c.device_pages) + ", host_pages = " +
                                            std::to_string(c.host_pages) + ": must not be negative");
  if (c.device_pages == 0 && c.host_pages == 0)
    detail::throw_invalid("PoolConfig",
                          "device_pages = 0 and host_pages = 0: a pool of no pages (device_pages = 0 alone is a "
                          "spill-only pool)");
  if (c.device_pages + c.host_pages > INT32_MAX)
    detail::throw_invalid("PoolConfig", "device_pages + host_pages = " + std::to_string(c.device_pages + c.host_pages) +
                                            " exceeds 2^31 - 1 page ids");
}

/// Pages needed to hold `bytes` (rounded up).
inline std::int64_t pages_for(std::int64_t bytes, std::int64_t page_bytes) {
  return detail::ceil_div(bytes, page_bytes);
}

PAGESTASH_NAMESPACE_END
