#pragma once
// The buffers a grouped tensor may have.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

enum class BufferRole : int { data = 0, scales = 1, amax = 2 };

PAGESTASH_HOST_DEVICE constexpr const char* name_of(BufferRole role) {
  return role == BufferRole::data ? "data" : (role == BufferRole::scales ? "scales" : "amax");
}

/// Calls f(role) for data, scales and amax, in that order: unrolled calls, not a loop over a braced list, which would
/// be an array in local memory on the device.
PAGESTASH_EXEC_CHECK_DISABLE
template <class F>
PAGESTASH_HOST_DEVICE constexpr void for_each_role(F&& f) {
  f(BufferRole::data);
  f(BufferRole::scales);
  f(BufferRole::amax);
}

/// The same for the buffers whose bytes follow the tokens, data and scales (amax is one value per group): the ones a
/// stash may page.
PAGESTASH_EXEC_CHECK_DISABLE
template <class F>
PAGESTASH_HOST_DEVICE constexpr void for_each_token_role(F&& f) {
  f(BufferRole::data);
  f(BufferRole::scales);
}

PAGESTASH_NAMESPACE_END
