// The reference formats on the GPU produce the same bytes as on the host.

#include <pagestash/cuda/error.hpp>
#include <pagestash/reference/reference.hpp>
#include <pagestash/reference/quantize.hpp>

#include "../common/device_buffer.hpp"
#include "../common/test_data.hpp"
#include "format_kernels.hpp"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <vector>

namespace ps = pagestash;

namespace {

using pagestash_test::DeviceBuffer;

template <class Format>
void check_device_matches_host(std::int64_t M, std::int64_t K, std::uint32_t seed) {
  std::vector<ps::BF16> source;
  for (float x : pagestash_test::random_activations(M * K, seed, 2.0f)) source.push_back(ps::BF16::from_float(x));
  for (auto dir : {ps::Direction::rowwise, ps::Direction::columnwise}) {
    ps::QuantizedMatrix<Format> host_q;
    host_q.rows = M;
    host_q.cols = K;
    host_q.direction = dir;
    std::vector<std::uint8_t> data(host_q.data_bytes()), scales(host_q.scale_bytes());
    float amax = 0;
    host_q.data = reinterpret_cast<typename Format::data_storage*>(data.data());
    host_q.scales = reinterpret_cast<typename Format::scale_type*>(scales.data());
    host_q.amax = &amax;
    ps::quantize_matrix(source.data(), host_q);
    std::vector<float> host_out(M * K);
    ps::dequantize_matrix(host_q, host_out.data());

    DeviceBuffer<ps::BF16> d_source(source.size());
    DeviceBuffer<std::uint8_t> d_data(data.size()), d_scales(scales.size());
    DeviceBuffer<float> d_amax(1), d_out(host_out.size());
    d_source.upload(source);
    d_data.upload(std::vector<std::uint8_t>(data.size(), 0xA5));
    d_amax.upload({amax});
    auto dev_q = host_q;
    dev_q.data = reinterpret_cast<typename Format::data_storage*>(d_data.ptr);
    dev_q.scales = reinterpret_cast<typename Format::scale_type*>(d_scales.ptr);
    dev_q.amax = d_amax.ptr;
    const auto tensor = Format::TensorScale::from_amax(amax);
    pagestash_test::quantize_on_device(d_source.ptr, dev_q, tensor);
    CHECK(d_data.download() == data);
    CHECK(d_scales.download() == scales);
    pagestash_test::dequantize_on_device(dev_q, tensor, d_out.ptr);
    const auto device_out = d_out.download();
    int mismatches = 0;
    for (std::size_t i = 0; i < host_out.size(); ++i)
      mismatches += pagestash_test::bits_of(device_out[i]) != pagestash_test::bits_of(host_out[i]);
    CHECK(mismatches == 0);
  }
}

}  // namespace

TEST_CASE("MXFP8 E4M3 on the device matches the host bytes") {
  check_device_matches_host<ps::MXFP8_E4M3>(256, 512, 41);
}
TEST_CASE("MXFP8 E5M2 on the device matches the host bytes") {
  check_device_matches_host<ps::MXFP8_E5M2>(256, 512, 42);
}
TEST_CASE("NVFP4 on the device matches the host bytes") { check_device_matches_host<ps::NVFP4>(256, 512, 43); }
