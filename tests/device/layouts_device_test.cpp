// The device producer writes the host producer's bytes, for every layout configuration.

#include <pagestash/layouts/layouts.hpp>

#include "../common/device_buffer.hpp"
#include "../common/layout_list.hpp"
#include "../common/test_data.hpp"
#include "layout_kernels.hpp"

#include <doctest/doctest.h>

#include <random>
#include <vector>

namespace ps = pagestash;
using pagestash_test::DeviceBuffer;

namespace {

template <class L>
void check_device_producer(std::int64_t max_tokens, std::int64_t hidden, int groups, std::uint32_t seed) {
  ps::GroupedView<L> host;
  host.max_tokens = max_tokens;
  host.hidden = hidden;
  host.groups = groups;
  std::mt19937 rng(seed);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(groups));
  std::int64_t left = max_tokens;
  for (auto& m : counts) {
    const std::int64_t cap = L::placement::packed ? left : max_tokens;
    m = static_cast<std::int32_t>(std::uniform_int_distribution<std::int64_t>(0, cap)(rng) / host.count_alignment() *
                                  host.count_alignment());
    left -= L::placement::packed ? m : 0;
  }
  std::vector<ps::BF16> source;
  for (float x : pagestash_test::random_activations(static_cast<std::size_t>(host.token_rows() * hidden), seed))
    source.push_back(ps::BF16::from_float(x));

  std::vector<std::uint8_t> data(host.buffer_bytes(ps::BufferRole::data)), scales(host.buffer_bytes(ps::BufferRole::scales));
  std::vector<float> amax(host.buffer_bytes(ps::BufferRole::amax) / 4);
  host.data = reinterpret_cast<typename L::data_type*>(data.data());
  if constexpr (!std::is_void_v<typename L::scale_type>) host.scales = reinterpret_cast<typename L::scale_type*>(scales.data());
  host.amax = amax.data();
  ps::produce(host, source.data(), counts.data(), 0x3C);

  DeviceBuffer<std::uint8_t> d_data(data.size()), d_scales(scales.size());
  DeviceBuffer<float> d_amax(amax.size());
  DeviceBuffer<std::int32_t> d_counts(counts.size());
  DeviceBuffer<ps::BF16> d_source(source.size());
  d_counts.upload(counts);
  d_source.upload(source);
  auto dev = host;
  dev.data = reinterpret_cast<typename L::data_type*>(d_data.ptr);
  if constexpr (!std::is_void_v<typename L::scale_type>) dev.scales = reinterpret_cast<typename L::scale_type*>(d_scales.ptr);
  dev.amax = d_amax.ptr;
  dev.counts = d_counts.ptr;
  REQUIRE(pagestash_test::produce_on_device_sync(dev, d_source.ptr, 0x3C) == 1);
  CHECK(d_data.download() == data);
  if (!scales.empty()) CHECK(d_scales.download() == scales);
  if (!amax.empty()) CHECK(d_amax.download() == amax);
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("device producer matches the host producer for every layout") {
  int seed = 0;
#define PAGESTASH_CHECK_LAYOUT(L)                                                   \
  {                                                                                 \
    CAPTURE(#L);                                                                    \
    check_device_producer<L>(L::token_multiple == 1 ? 96 : 256, 160, std::is_same_v<L, Pf32> || std::is_same_v<L, Pbf16> ? 1 : 3, ++seed); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_CHECK_LAYOUT)
#undef PAGESTASH_CHECK_LAYOUT
}
