#pragma once
// How the library refuses a call on the host, before anything runs: one helper for all.

#include <pagestash/config.hpp>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

/// Throws std::invalid_argument("<who>: <what>"): `who` the operation or type refused (e.g.
/// "pagestash::stash", "PoolConfig", "GroupedView<Plain>"), `what` which value is wrong and why.
[[noreturn]] inline void throw_invalid(const std::string& who, const std::string& what) {
  throw std::invalid_argument(who + ": " + what);
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
