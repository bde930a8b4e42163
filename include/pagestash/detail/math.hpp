#pragma once
// Integer rounding, in one place: every size, granule and page count rounds with these.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// a / b rounded up (a >= 0, b > 0), in a's type.
template <class T, class U>
PAGESTASH_HOST_DEVICE constexpr T ceil_div(T a, U b) {
  return (a + static_cast<T>(b) - 1) / static_cast<T>(b);
}

/// x rounded up to a multiple of m (x >= 0, m > 0), in x's type.
template <class T, class U>
PAGESTASH_HOST_DEVICE constexpr T round_up(T x, U m) {
  return ceil_div(x, m) * static_cast<T>(m);
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
