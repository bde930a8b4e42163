#pragma once
// A grouped tensor in host memory, with seeded counts and sources, for the layout tests.

#include <pagestash/layouts/layouts.hpp>

#include "test_data.hpp"

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

namespace pagestash_test {

namespace ps = pagestash;
using ps::BufferRole;
using std::int64_t;

/// Host buffers of every buffer the layout has, and a view of them.
template <class L>
struct HostTensor {
  ps::GroupedView<L> view;
  std::vector<std::uint8_t> data, scales;
  std::vector<float> amax;
  std::vector<std::int32_t> counts;

  HostTensor(int64_t max_tokens, int64_t hidden, int groups, std::vector<std::int32_t> c) : counts(std::move(c)) {
    view.max_tokens = max_tokens;
    view.hidden = hidden;
    view.groups = groups;
    data.resize(static_cast<std::size_t>(view.buffer_bytes(BufferRole::data)));
    scales.resize(static_cast<std::size_t>(view.buffer_bytes(BufferRole::scales)));
    amax.resize(static_cast<std::size_t>(view.buffer_bytes(BufferRole::amax) / 4));
    view.data = reinterpret_cast<typename L::data_type*>(data.data());
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(scales.data());
    view.amax = amax.empty() ? nullptr : amax.data();
    view.counts = counts.data();
  }
  std::uint8_t* bytes(BufferRole role) { return static_cast<std::uint8_t*>(view.buffer(role)); }
};

/// Random counts: 0, full capacity and values between, respecting the packed alignment.
template <class L>
std::vector<std::int32_t> random_counts(const ps::GroupedView<L>& v, std::mt19937& rng) {
  const int64_t align = v.count_alignment();
  std::vector<std::int32_t> counts(static_cast<std::size_t>(v.groups));
  int64_t left = v.max_tokens;
  for (int g = 0; g < v.groups; ++g) {
    const int64_t cap = L::placement::packed ? left : v.max_tokens;
    const int pick = std::uniform_int_distribution<int>(0, 5)(rng);
    int64_t m = pick == 0 ? 0 : (pick == 1 ? cap : std::uniform_int_distribution<int64_t>(0, cap)(rng));
    m = m / align * align;
    counts[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(m);
    left -= L::placement::packed ? m : 0;
  }
  return counts;
}

inline std::vector<ps::BF16> random_source(int64_t rows, int64_t hidden, std::uint32_t seed) {
  std::vector<ps::BF16> s;
  for (float x : pagestash_test::random_activations(static_cast<std::size_t>(rows * hidden), seed, 2.0f))
    s.push_back(ps::BF16::from_float(x == 0.0f ? 0.5f : x));  // non-zero data
  return s;
}

}  // namespace pagestash_test
