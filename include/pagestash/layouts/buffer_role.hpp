#pragma once
// The buffers a grouped tensor may have.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

enum class BufferRole : int { data = 0, scales = 1, amax = 2 };

PAGESTASH_HOST_DEVICE constexpr const char* name_of(BufferRole role) {
  return role == BufferRole::data ? "data" : (role == BufferRole::scales ? "scales" : "amax");
}

PAGESTASH_NAMESPACE_END
