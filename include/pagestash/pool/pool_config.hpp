#pragma once
// How big a page pool is, what it reports, and how to size it from an observed step.

#include <pagestash/config.hpp>
#include <pagestash/detail/math.hpp>
#include <pagestash/pool/flags.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN

/// Pages are sized in bytes, so one pool serves every buffer, dtype and hidden size.
struct PoolConfig {
  std::int64_t page_bytes = std::int64_t{64} << 10;  ///< a power of two, at least 256
  std::int64_t device_pages = 0;                     ///< pages in device memory
  std::int64_t host_pages = 0;  ///< spill pages in pinned, device-mapped host memory

  std::int64_t device_bytes() const { return device_pages * page_bytes; }
  std::int64_t host_bytes() const { return host_pages * page_bytes; }
};

/// What a pool did since its last reset, read back by PagePool::stats().
struct PoolStats : PoolCounts {
  PoolConfig config;
  PoolFlags flags{};  ///< the flags, as PagePool::flags() holds them (`overflow`: rerun the step; `error`: a bug)
  std::int64_t failures = 0;  ///< overflows + errors: operations that did nothing (see each record)
};

namespace detail {
[[noreturn]] inline void invalid_pool(const std::string& what) { throw std::invalid_argument("PoolConfig: " + what); }
}  // namespace detail

/// Throws std::invalid_argument naming the bad field.
inline void validate(const PoolConfig& c) {
  if (c.page_bytes < 256 || (c.page_bytes & (c.page_bytes - 1)) != 0)
    detail::invalid_pool("page_bytes = " + std::to_string(c.page_bytes) + " must be a power of two >= 256");
  if (c.device_pages < 0 || c.host_pages < 0)
    detail::invalid_pool("device_pages = " + std::to_string(c.device_pages) +
                         ", host_pages = " + std::to_string(c.host_pages) + ": must not be negative");
  if (c.device_pages == 0 && c.host_pages == 0)
    detail::invalid_pool("device_pages = 0 and host_pages = 0: a pool of no pages (device_pages = 0 alone is a "
                         "spill-only pool)");
  if (c.device_pages + c.host_pages > INT32_MAX)
    detail::invalid_pool("device_pages + host_pages = " + std::to_string(c.device_pages + c.host_pages) +
                         " exceeds 2^31 - 1 page ids");
}

/// Pages needed to hold `bytes` (rounded up).
inline std::int64_t pages_for(std::int64_t bytes, std::int64_t page_bytes) {
  return detail::ceil_div(bytes, page_bytes);
}

/// A pool sized from an observed step (typically an eager step run with a generous pool):
/// the peak number of pages held at once, times a safety factor for each memory. Pages
/// already include the rounding of each stash to whole pages, so the factor only covers
/// step-to-step variation. The observed pool's page size is kept.
inline PoolConfig size_from_peak(const PoolStats& observed, double device_factor = 1.10, double host_factor = 0.0) {
  if (!(device_factor >= 0.0) || !(host_factor >= 0.0))
    throw std::invalid_argument("size_from_peak: factors must be non-negative");
  PoolConfig c;
  c.page_bytes = observed.config.page_bytes;
  const double peak = static_cast<double>(observed.peak_pages_used);
  c.device_pages = static_cast<std::int64_t>(std::ceil(peak * device_factor));
  c.host_pages = static_cast<std::int64_t>(std::ceil(peak * host_factor));
  return c;
}

PAGESTASH_NAMESPACE_END
