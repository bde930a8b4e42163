// The device producer writes the host producer's bytes, for every layout configuration.

#include <pagestash/layouts/layouts.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/device_buffer.hpp"
#include "../common/host_tensor.hpp"
#include "../common/layout_list.hpp"
#include "layout_kernels.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

namespace ps = pagestash;
using pagestash_test::DeviceBuffer;

namespace {

/// With `nan`, the first live value is a negative NaN, and only the amax is compared (bit
/// for bit: both producers give the positive quiet NaN).
template <class L>
void check_device_producer(std::int64_t max_tokens, std::int64_t hidden, int groups, std::uint32_t seed,
                           bool nan = false) {
  std::mt19937 rng(seed);
  pagestash_test::HostTensor<L> host(max_tokens, hidden, groups, std::vector<std::int32_t>(groups, 0));
  host.counts = pagestash_test::random_counts(host.view, rng);
  if (nan) host.counts = {128, 0, 0};  // group 0 holds the NaN
  host.view.counts = host.counts.data();
  auto source = pagestash_test::random_source(host.view.token_rows(), hidden, seed);
  if (nan) source[0] = ps::BF16::from_bits(0xFFC1);
  ps::produce(host.view, source.data(), host.counts.data(), 0x3C);

  DeviceBuffer<std::uint8_t> d_data(host.data.size()), d_scales(host.scales.size());
  DeviceBuffer<float> d_amax(host.amax.size());
  DeviceBuffer<std::int32_t> d_counts(host.counts.size());
  DeviceBuffer<ps::BF16> d_source(source.size());
  d_counts.upload(host.counts);
  d_source.upload(source);
  auto dev = host.view;
  dev.data = reinterpret_cast<typename L::data_type*>(d_data.ptr);
  if constexpr (!std::is_void_v<typename L::scale_type>)
    dev.scales = reinterpret_cast<typename L::scale_type*>(d_scales.ptr);
  dev.amax = d_amax.ptr;
  dev.counts = d_counts.ptr;
  REQUIRE(pagestash_test::produce_on_device_sync(dev, d_source.ptr, 0x3C) == pagestash::Flag::none);
  if (nan) {
    const std::vector<float> amax = d_amax.download();
    REQUIRE(amax.size() == host.amax.size());
    CHECK(std::memcmp(amax.data(), host.amax.data(), amax.size() * sizeof(float)) == 0);
    std::uint32_t bits = 0;
    std::memcpy(&bits, host.amax.data(), 4);
    CHECK(bits == 0x7FC00000u);
    return;
  }
  CHECK(d_data.download() == host.data);
  if (!host.scales.empty()) CHECK(d_scales.download() == host.scales);
  if (!host.amax.empty()) CHECK(d_amax.download() == host.amax);
}

}  // namespace

using namespace pagestash_test::layouts;

TEST_CASE("device producer matches the host producer for every layout") {
  int seed = 0;
#define PAGESTASH_CHECK_LAYOUT(L)                                                        \
  {                                                                                      \
    using Layout = PAGESTASH_LAYOUT(L);                                                  \
    CAPTURE(#L);                                                                         \
    const int groups = pagestash::Recipe<Layout>::plain ? 1 : 3;                         \
    check_device_producer<Layout>(Layout::granule == 1 ? 96 : 256, 160, groups, ++seed); \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_CHECK_LAYOUT)
#undef PAGESTASH_CHECK_LAYOUT
}

TEST_CASE("device and host producers agree on a NaN amax (the positive quiet NaN)") {
  check_device_producer<ColNv4PackCo>(256, 160, 3, 91, true);
  check_device_producer<ColNv4CapSw>(256, 160, 3, 92, true);
}
