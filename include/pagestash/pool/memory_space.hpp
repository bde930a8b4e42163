#pragma once
// Where a pool and its records keep their memory: it decides which executor may use them.

#include <pagestash/config.hpp>

PAGESTASH_NAMESPACE_BEGIN

enum class MemorySpace : int { host = 0, device = 1 };

inline const char* name_of(MemorySpace s) { return s == MemorySpace::host ? "host" : "device"; }

PAGESTASH_NAMESPACE_END
