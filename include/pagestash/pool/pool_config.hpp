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
/// A pool may have a reserve: the most pages it may ever hold, as address space only; grow() backs more of it and
/// shrink() gives some back, and page ids and addresses never move (docs/api.md, "A pool that grows").
struct PoolConfig {
  std::int64_t page_bytes = std::int64_t{64} << 10;  ///< a power of two, at least 256
  std::int64_t device_pages = 0;                     ///< pages in device memory (at first, for a pool with a reserve)
  std::int64_t host_pages = 0;                       ///< spill pages in pinned, device-mapped host memory (the same)
  std::int64_t device_reserve = 0;                   ///< the most device pages grow() may give; 0: device_pages
  std::int64_t host_reserve = 0;                     ///< the most host pages grow() may give; 0: host_pages

  std::int64_t device_bytes() const { return device_pages * page_bytes; }
  std::int64_t host_bytes() const { return host_pages * page_bytes; }
  /// Page ids [0, reserved_device_pages()) are device pages, the next reserved_host_pages() host pages.
  std::int64_t reserved_device_pages() const { return device_reserve > 0 ? device_reserve : device_pages; }
  std::int64_t reserved_host_pages() const { return host_reserve > 0 ? host_reserve : host_pages; }
  bool growable() const { return reserved_device_pages() > device_pages || reserved_host_pages() > host_pages; }
};

/// Throws std::invalid_argument naming the bad field.
inline void validate(const PoolConfig& c) {
  if (c.page_bytes < 256 || (c.page_bytes & (c.page_bytes - 1)) != 0)
    detail::throw_invalid("PoolConfig",
                          "page_bytes = " + std::to_string(c.page_bytes) + " must be a power of two >= 256");
  if (c.device_pages < 0 || c.host_pages < 0)
    detail::throw_invalid("PoolConfig", "device_pages = " + std::to_string(c.device_pages) + ", host_pages = " +
                                            std::to_string(c.host_pages) + ": must not be negative");
  if ((c.device_reserve != 0 && c.device_reserve < c.device_pages) ||
      (c.host_reserve != 0 && c.host_reserve < c.host_pages) || c.device_reserve < 0 || c.host_reserve < 0)
    detail::throw_invalid("PoolConfig", "device_reserve = " + std::to_string(c.device_reserve) +
                                            ", host_reserve = " + std::to_string(c.host_reserve) +
                                            ": a reserve is 0 (none) or at least its pages");
  const std::int64_t reserved = c.reserved_device_pages() + c.reserved_host_pages();
  if (reserved == 0)
    detail::throw_invalid("PoolConfig",
                          "device_pages = 0 and host_pages = 0: a pool of no pages (device_pages = 0 alone is a "
                          "spill-only pool; a reserve lets a pool start at 0 and grow)");
  if (reserved > INT32_MAX)
    detail::throw_invalid("PoolConfig", "the pool's page ids (its pages, or its reserve: " + std::to_string(reserved) +
                                            ") exceed 2^31 - 1");
}

/// Pages needed to hold `bytes` (rounded up).
inline std::int64_t pages_for(std::int64_t bytes, std::int64_t page_bytes) {
  return detail::ceil_div(bytes, page_bytes);
}

PAGESTASH_NAMESPACE_END
