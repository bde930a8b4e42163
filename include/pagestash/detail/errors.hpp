#pragma once
// How a call is refused on the host before anything runs: std::invalid_argument saying
// which operation and what does not match (every executor and nccl.cuh use it).

#include <pagestash/config.hpp>

#include <stdexcept>
#include <string>

PAGESTASH_NAMESPACE_BEGIN
namespace detail {

[[noreturn]] inline void invalid_call(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("pagestash::") + op + ": " + what);
}

}  // namespace detail
PAGESTASH_NAMESPACE_END
