// Layouts: buffer sizes against TransformerEngine's shapes (written out here by hand),
// geometry and producer agreeing byte for byte, and produced tensors dequantizing back to
// their source within each format's error bound.

#include <pagestash/layouts/layouts.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/host_tensor.hpp"
#include "../common/layout_list.hpp"
#include "../common/test_data.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace ps = pagestash;
using ps::BufferRole;
using std::int64_t;

namespace {

int64_t ru(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---- Sizes: the domain table, by hand ------------------------------------------------------
struct Sizes {
  int64_t data, scales, amax;
};

template <class L>
Sizes sizes_of(int64_t M, int64_t K, int G) {
  ps::GroupedView<L> v;
  v.max_tokens = M;
  v.hidden = K;
  v.groups = G;
  return {v.buffer_bytes(BufferRole::data), v.buffer_bytes(BufferRole::scales), v.buffer_bytes(BufferRole::amax)};
}

void check_sizes(Sizes got, Sizes want) {
  CHECK(got.data == want.data);
  CHECK(got.scales == want.scales);
  CHECK(got.amax == want.amax);
}

}  // namespace

TEST_CASE("buffer sizes equal TransformerEngine's shapes") {
  const int64_t M = 384, K = 320, G = 3;  // K not a multiple of 128: padding shows
  const int64_t Kp = ru(K, 128);
  using ps::CapacityPadded, ps::CompactScales, ps::SwizzledScales, ps::Packed;

  SUBCASE("plain and unquantized") {
    check_sizes(sizes_of<ps::Plain<float>>(M, K, 1), {M * K * 4, 0, 0});
    check_sizes(sizes_of<ps::RowwiseUnquantized<ps::BF16>>(M, K, G), {M * K * 2, 0, 0});
    check_sizes(sizes_of<ps::RowwiseUnquantized<ps::FP16, CapacityPadded>>(M, K, G), {G * M * K * 2, 0, 0});
    check_sizes(sizes_of<ps::RowwiseUnquantized<float>>(M, K, G), {M * K * 4, 0, 0});
    check_sizes(sizes_of<ps::RowwiseUnquantized<float, CapacityPadded>>(M, K, G), {G * M * K * 4, 0, 0});
  }
  SUBCASE("MXFP8 columnwise: data [M, K], scales [roundup(M/32, 4), roundup(K, 128)]") {
    const Sizes te{M * K, ru(M / 32, 4) * Kp, 0};
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, Packed, SwizzledScales>>(M, K, G), te);
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::MXFP8_E5M2, Packed, CompactScales>>(M, K, G), te);
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, CapacityPadded, SwizzledScales>>(M, K, G),
                {G * te.data, G * te.scales, 0});
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::MXFP8_E5M2, CapacityPadded, CompactScales>>(M, K, G),
                {G * te.data, G * te.scales, 0});
  }
  SUBCASE("NVFP4 columnwise: data [K, M/2], scales [roundup(K, 128), roundup(M/16, 4)], amax [G]") {
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::NVFP4, Packed, SwizzledScales>>(M, K, G),
                {K * M / 2, Kp * ru(M / 16, 4), G * 4});
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::NVFP4, Packed, CompactScales>>(M, K, G),
                {K * M / 2, Kp * ru(M / 16, 4), G * 4});
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::NVFP4, CapacityPadded, SwizzledScales>>(M, K, G),
                {G * K * M / 2, G * Kp * ru(M / 16, 4), G * 4});
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::NVFP4, CapacityPadded, CompactScales>>(M, K, G),
                {G * K * M / 2, G * Kp * ru(M / 16, 4), G * 4});
  }
  SUBCASE("PackedPadded: data as Packed; scales hold the most that padded groups can fill") {
    // G = 3 groups of 32 (MXFP8) or 16 (NVFP4) tokens each padded to a whole tile, the other
    // tokens in whole tiles: ru(M/32, 4) * Kp grows to (3 + (384 - 96) / 128) * 4 * Kp.
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::PackedPadded, CompactScales>>(M, K, G),
                {M * K, (3 + (M - 3 * 32) / 128) * 4 * Kp, 0});
    check_sizes(sizes_of<ps::ColumnwiseQuantized<ps::NVFP4, ps::PackedPadded, SwizzledScales>>(M, K, G),
                {K * M / 2, (3 + (M - 3 * 16) / 64) * 4 * Kp, G * 4});
    check_sizes(sizes_of<ps::RowwiseQuantized<ps::MXFP8_E5M2, ps::PackedPadded, CompactScales>>(M, K, G),
                {M * K, (3 + (M - 3) / 128) * 128 * ru(K / 32, 4), 0});
  }
  SUBCASE("rowwise quantized: scales [roundup(M, 128), roundup(K/block, 4)]") {
    check_sizes(sizes_of<ps::RowwiseQuantized<ps::MXFP8_E4M3>>(M, K, G), {M * K, ru(M, 128) * ru(K / 32, 4), 0});
    check_sizes(sizes_of<ps::RowwiseQuantized<ps::MXFP8_E5M2, Packed, CompactScales>>(M, K, G),
                {M * K, ru(M, 128) * ru(K / 32, 4), 0});
    check_sizes(sizes_of<ps::RowwiseQuantized<ps::NVFP4>>(M, K, G), {M * K / 2, ru(M, 128) * ru(K / 16, 4), G * 4});
    check_sizes(sizes_of<ps::RowwiseQuantized<ps::NVFP4, CapacityPadded, CompactScales>>(M, K, G),
                {G * M * K / 2, G * ru(M, 128) * ru(K / 16, 4), G * 4});
  }
}

TEST_CASE("swizzled tile offsets follow cuBLAS's 128x4 scale-factor layout") {
  // Inside a tile: row r at (r % 32) * 16 + (r / 32) * 4, column c adds c; tiles are stored
  // row-block-major, 512 bytes each. Matrix of 256 rows x 8 columns: 2 x 2 tiles.
  const int64_t cols = 8;
  CHECK(ps::SwizzleTile::offset(0, 0, cols) == 0);
  CHECK(ps::SwizzleTile::offset(0, 3, cols) == 3);
  CHECK(ps::SwizzleTile::offset(1, 0, cols) == 16);
  CHECK(ps::SwizzleTile::offset(31, 2, cols) == 31 * 16 + 2);
  CHECK(ps::SwizzleTile::offset(32, 0, cols) == 4);
  CHECK(ps::SwizzleTile::offset(127, 3, cols) == 31 * 16 + 3 * 4 + 3);
  CHECK(ps::SwizzleTile::offset(0, 4, cols) == 512);
  CHECK(ps::SwizzleTile::offset(128, 0, cols) == 1024);
  CHECK(ps::SwizzleTile::offset(255, 7, cols) == 3 * 512 + 511);
  // A bijection onto [0, rows * cols).
  std::vector<int> hits(256 * cols, 0);
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < cols; ++c) ++hits[static_cast<std::size_t>(ps::SwizzleTile::offset(r, c, cols))];
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
}

namespace {

using pagestash_test::HostTensor;
using pagestash_test::random_counts;
using pagestash_test::random_source;

// Geometry and producer agree both ways: bytes inside the runs are written (two poisons give
// the same bytes), bytes outside keep the poison; runs stay in bounds and never overlap.
template <class L>
void check_geometry_matches_producer(int64_t max_tokens, int64_t hidden, int groups, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 3; ++trial) {
    HostTensor<L> probe(max_tokens, hidden, groups, std::vector<std::int32_t>(groups, 0));
    const auto counts = random_counts(probe.view, rng);
    CAPTURE(trial);
    const auto source = random_source(probe.view.token_rows(), hidden, seed + trial);
    HostTensor<L> a(max_tokens, hidden, groups, counts), b(max_tokens, hidden, groups, counts);
    ps::produce(a.view, source.data(), counts.data(), 0xA5);
    ps::produce(b.view, source.data(), counts.data(), 0x5A);
    for (BufferRole role : {BufferRole::data, BufferRole::scales, BufferRole::amax}) {
      if (!L::has(role)) continue;
      CAPTURE(ps::name_of(role));
      const ps::BufferGeometry geo = a.view.geometry(role);
      std::vector<int> live(static_cast<std::size_t>(geo.total_bytes), 0);
      for (int64_t i = 0; i < ps::run_count(geo); ++i) {
        const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
        REQUIRE(run.offset >= 0);
        REQUIRE(run.offset + run.bytes <= geo.total_bytes);
        for (int64_t j = 0; j < run.bytes; ++j) ++live[static_cast<std::size_t>(run.offset + j)];
      }
      int64_t outside_changed = 0, inside_unwritten = 0, overlapping = 0, live_bytes = 0;
      for (std::size_t j = 0; j < live.size(); ++j) {
        overlapping += live[j] > 1;
        live_bytes += live[j] > 0;
        if (live[j] == 0) outside_changed += a.bytes(role)[j] != 0xA5 || b.bytes(role)[j] != 0x5A;
        else inside_unwritten += a.bytes(role)[j] != b.bytes(role)[j];
      }
      CHECK(overlapping == 0);
      CHECK(outside_changed == 0);
      CHECK(inside_unwritten == 0);
      CHECK(live_bytes == ps::live_bytes(geo, counts.data()));
    }
  }
}

// Reads element (token, k) of group g back from the layout's buffers and dequantizes it.
template <class L>
float read_element(HostTensor<L>& t, int g, int64_t token, int64_t k) {
  const ps::GroupBlock data_group = ps::group_block(t.view, t.counts.data(), BufferRole::data, g);
  const ps::BlockShape& data_blk = data_group.shape;
  const int64_t data_base = data_group.base;
  if constexpr (!L::has(BufferRole::scales)) {
    typename L::data_type value;
    std::memcpy(&value, t.bytes(BufferRole::data) + data_base + data_blk.offset(token, k * int64_t{sizeof(value)}),
                sizeof(value));
    return ps::to_float(value);
  } else {
    using F = typename L::format;
    const ps::GroupBlock scale_group = ps::group_block(t.view, t.counts.data(), BufferRole::scales, g);
    const ps::BlockShape& scale_blk = scale_group.shape;
    const int64_t scale_base = scale_group.base;
    const bool col = L::direction == ps::Direction::columnwise;
    // Data byte and nibble: the token axis index is token (or token / 2 for packed FP4).
    constexpr int per_byte = 8 / F::element_bits;
    const int64_t along = col ? token : k;
    const int64_t token_index = col ? token / per_byte : token;
    const int64_t other = col ? k : k / per_byte;
    const int64_t r = data_blk.token_axis == ps::TokenAxis::rows ? token_index : other;
    const int64_t c = data_blk.token_axis == ps::TokenAxis::rows ? other : token_index;
    const std::uint8_t byte = t.bytes(BufferRole::data)[data_base + data_blk.offset(r, c)];
    const std::uint8_t code = per_byte == 2 ? ((along % 2) ? byte >> 4 : byte & 0xF) : byte;
    // Scale: columnwise (k, token / block), rowwise (token, k / block).
    const int64_t s_token_index = col ? token / F::block_size : token;
    const int64_t s_other = col ? k : k / F::block_size;
    const int64_t sr = scale_blk.token_axis == ps::TokenAxis::rows ? s_token_index : s_other;
    const int64_t sc = scale_blk.token_axis == ps::TokenAxis::rows ? s_other : s_token_index;
    const auto scale = F::scale_type::from_bits(t.bytes(BufferRole::scales)[scale_base + scale_blk.offset(sr, sc)]);
    float codes_out[F::block_size];
    typename F::element_type codes[F::block_size] = {};
    codes[0] = F::element_type::from_bits(code);
    const auto tensor = F::TensorScale::from_amax(t.amax.empty() ? 0.0f : t.amax[static_cast<std::size_t>(g)]);
    ps::dequantize_block(F{}, codes, scale, tensor, codes_out);
    return codes_out[0];
  }
}

template <class L>
void check_dequantized(int64_t max_tokens, int64_t hidden, int groups, std::uint32_t seed) {
  std::mt19937 rng(seed);
  HostTensor<L> t(max_tokens, hidden, groups, std::vector<std::int32_t>(groups, 0));
  t.counts = random_counts(t.view, rng);
  // At least one element in group 0; packed groups after it shrink to fit max_tokens.
  t.counts[0] = static_cast<std::int32_t>(std::max<int64_t>(t.counts[0], t.view.count_alignment()));
  int64_t left = max_tokens - t.counts[0];
  for (std::size_t g = 1; L::placement::packed && g < t.counts.size(); ++g) {
    t.counts[g] = static_cast<std::int32_t>(std::min<int64_t>(t.counts[g], left));
    left -= t.counts[g];
  }
  t.view.counts = t.counts.data();
  const auto source = random_source(t.view.token_rows(), hidden, seed);
  ps::produce(t.view, source.data(), t.counts.data(), 0xEE);

  std::vector<int64_t> rows(static_cast<std::size_t>(groups));
  for (int g = 0, next = 0; g < groups; next += t.counts[static_cast<std::size_t>(g)], ++g)
    rows[static_cast<std::size_t>(g)] = L::placement::packed ? next : g * max_tokens;
  int64_t checked = 0, bad = 0;
  for (int g = 0; g < groups; ++g) {
    // An NVFP4 block scale underflows E4M3 below 2^-10 / encode = 2^-10 * amax / 2688.
    const float group_amax = ps::abs_max(source.data() + rows[static_cast<std::size_t>(g)] * hidden,
                                         t.counts[static_cast<std::size_t>(g)] * hidden);
    for (int64_t i = 0; i < t.counts[static_cast<std::size_t>(g)]; ++i) {
      for (int64_t k = 0; k < hidden; ++k) {
        const float x =
            source[static_cast<std::size_t>((rows[static_cast<std::size_t>(g)] + i) * hidden + k)].to_float();
        float y = read_element(t, g, i, k);
        if constexpr (std::is_same_v<typename L::data_type, std::uint8_t>)  // bytes: the source's high byte
          y = y == static_cast<float>(ps::BF16::from_float(x).bits >> 8) ? x : y;
        double bound = 0;  // unquantized: exact for BF16 -> BF16/float, FP16 rounding otherwise
        if constexpr (std::is_same_v<typename L::data_type, ps::FP16>) bound = std::fabs(x) / 2048;
        if constexpr (L::has(BufferRole::scales)) {
          // The block formats' bounds (see formats_block_test.cpp): element rounding relative
          // to |x|, plus the smallest step relative to the block's amax.
          using F = typename L::format;
          const bool col = L::direction == ps::Direction::columnwise;
          double block_amax = 0;
          for (int j = 0; j < F::block_size; ++j) {
            const int64_t ti = col ? i - i % F::block_size + j : i;
            const int64_t kj = col ? k : k - k % F::block_size + j;
            if (ti < t.counts[static_cast<std::size_t>(g)])
              block_amax = std::max<double>(
                  block_amax,
                  std::fabs(source[static_cast<std::size_t>((rows[static_cast<std::size_t>(g)] + ti) * hidden + kj)]
                                .to_float()));
          }
          bound = std::is_same_v<F, ps::NVFP4>
                      ? 0.25 * std::fabs(x) + 0.06 * block_amax + 6.0 * group_amax / 1024 / 2688
                      : 0.125 * std::fabs(x) + block_amax / 1024;
        }
        ++checked;
        if (!(std::fabs(static_cast<double>(y) - x) <= bound) && ++bad <= 3)
          FAIL_CHECK("group " << g << " token " << i << " k " << k << ": source " << x << " read " << y);
      }
    }
  }
  CHECK(checked > 0);
  CHECK(bad == 0);
}

// The host producer's per-block fast path writes what produced_byte, byte by byte, gives.
template <class L>
void check_fast_path_matches_bytes(int64_t max_tokens, int64_t hidden, int groups, std::uint32_t seed) {
  std::mt19937 rng(seed);
  HostTensor<L> fast(max_tokens, hidden, groups, std::vector<std::int32_t>(groups, 0));
  fast.counts = random_counts(fast.view, rng);
  fast.view.counts = fast.counts.data();
  HostTensor<L> slow(max_tokens, hidden, groups, fast.counts);
  const auto source = random_source(fast.view.token_rows(), hidden, seed);
  ps::produce(fast.view, source.data(), fast.counts.data(), 0x6B);
  std::vector<int64_t> rows(static_cast<std::size_t>(groups));
  REQUIRE(ps::plan_groups(slow.view, slow.counts.data(), rows.data()).verdict() == ps::Flag::none);
  const ps::ProducerInput in{source.data(), slow.counts.data(), rows.data(),
                             fast.amax.empty() ? nullptr : fast.amax.data()};
  for (BufferRole role : {BufferRole::data, BufferRole::scales}) {
    if (!L::has(role)) continue;
    std::fill(slow.bytes(role), slow.bytes(role) + slow.view.buffer_bytes(role), std::uint8_t{0x6B});
    for (int g = 0; g < groups; ++g)
      ps::for_each_live_byte(slow.view, in, role, g,
                             [&](std::uint8_t* byte, const ps::BlockShape& blk, int64_t r, int64_t c) {
                               *byte = ps::produced_byte(slow.view, in, role, g, blk, r, c);
                             });
    CAPTURE(ps::name_of(role));
    CHECK(std::equal(slow.bytes(role), slow.bytes(role) + slow.view.buffer_bytes(role), fast.bytes(role)));
  }
}

template <class L>
void check_layout(int64_t max_tokens, int64_t hidden, int groups, std::uint32_t seed) {
  check_fast_path_matches_bytes<L>(max_tokens, hidden, groups, seed + 200);
  check_geometry_matches_producer<L>(max_tokens, hidden, groups, seed);
  check_dequantized<L>(max_tokens, hidden, groups, seed + 100);
}

}  // namespace

using namespace pagestash_test::layouts;

// Every dtype x layout x placement x scale arrangement, at two shapes: hidden not a multiple
// of 128 (padding shows), and few or many groups.
TEST_CASE("every layout: geometry matches the producer, and the produced tensor dequantizes back") {
  std::uint32_t seed = 0;
#define PAGESTASH_CHECK_LAYOUT(L)                                \
  {                                                              \
    using Layout = PAGESTASH_LAYOUT(L);                          \
    CAPTURE(#L);                                                 \
    const bool plain = ps::Recipe<Layout>::plain;                \
    const std::int64_t tokens = Layout::granule == 1 ? 48 : 256; \
    check_layout<Layout>(tokens, 160, plain ? 1 : 3, ++seed);    \
    check_layout<Layout>(tokens, 96, plain ? 1 : 5, ++seed);     \
  }
  PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_CHECK_LAYOUT)
#undef PAGESTASH_CHECK_LAYOUT
}

TEST_CASE("default StashTraits follow what backward needs") {
  using ps::Handling;
  using Bf = ps::StashTraits<ps::RowwiseUnquantized<ps::BF16>>;
  CHECK((Bf::data == Handling::paged && Bf::scales == Handling::dropped && Bf::amax == Handling::dropped));
  using F32 = ps::StashTraits<ps::RowwiseUnquantized<float, ps::CapacityPadded>>;
  CHECK((F32::data == Handling::paged && F32::scales == Handling::dropped && F32::amax == Handling::dropped));
  using Mx = ps::StashTraits<ps::ColumnwiseQuantized<ps::MXFP8_E4M3>>;
  CHECK((Mx::data == Handling::paged && Mx::scales == Handling::paged && Mx::amax == Handling::dropped));
  using Nv = ps::StashTraits<ps::ColumnwiseQuantized<ps::NVFP4>>;
  CHECK((Nv::data == Handling::paged && Nv::scales == Handling::paged && Nv::amax == Handling::kept));
  using Pl = ps::StashTraits<ps::Plain<float>>;
  CHECK(Pl::data == Handling::paged);
  // A custom selection: scales only (e.g. data recomputed in backward).
  using ScalesOnly =
      ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4>, Handling::dropped, Handling::paged, Handling::kept>;
  CHECK(ps::handling_of<ScalesOnly>(BufferRole::data) == Handling::dropped);
  CHECK(ps::handling_of<ScalesOnly>(BufferRole::scales) == Handling::paged);
}

TEST_CASE("view validation names the field and the value") {
  using L = ps::ColumnwiseQuantized<ps::MXFP8_E4M3>;
  using Traits = ps::StashTraits<L>;
  HostTensor<L> t(256, 128, 2, {128, 0});
  CHECK_NOTHROW(ps::validate<Traits>(t.view));
  auto v = t.view;
  v.hidden = 100;
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v),
                       "GroupedView<ColumnwiseQuantized<mxfp8, packed, swizzled>>: "
                       "hidden = 100 is not a multiple of the block size 32",
                       std::invalid_argument);
  v = t.view;
  v.max_tokens = 200;
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v),
                       "GroupedView<ColumnwiseQuantized<mxfp8, packed, swizzled>>: "
                       "max_tokens = 200 is not a multiple of the granule 128",
                       std::invalid_argument);
  v = t.view;
  v.scales = nullptr;
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v),
                       "GroupedView<ColumnwiseQuantized<mxfp8, packed, swizzled>>: "
                       "scales is null",
                       std::invalid_argument);
  v = t.view;
  v.data = reinterpret_cast<ps::E4M3*>(t.data.data() + 1);
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v), doctest::Contains("data = "), std::invalid_argument);
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v), doctest::Contains("is not 16-byte aligned"), std::invalid_argument);
  v = t.view;
  v.counts = nullptr;
  CHECK_THROWS_WITH_AS(ps::validate<Traits>(v),
                       "GroupedView<ColumnwiseQuantized<mxfp8, packed, swizzled>>: "
                       "counts is null",
                       std::invalid_argument);
  v = t.view;
  v.groups = 0;
  CHECK_THROWS_AS(ps::validate<Traits>(v), std::invalid_argument);
  // Dropped buffers may be null.
  using DataOnly = ps::BufferSelection<L, ps::Handling::paged>;
  v = t.view;
  v.scales = nullptr;
  CHECK_NOTHROW(ps::validate<DataOnly>(v));
}

TEST_CASE("producer rejects counts that break the packed alignment or the capacity") {
  using L = ps::ColumnwiseQuantized<ps::MXFP8_E4M3>;
  HostTensor<L> t(256, 64, 2, {100, 0});
  const auto source = random_source(256, 64, 1);
  CHECK_THROWS_WITH_AS(ps::produce(t.view, source.data(), t.counts.data(), 0),
                       "produce: count of group 0 = 100 is not a multiple of the packed alignment 128",
                       std::invalid_argument);
  t.counts = {256, 128};
  CHECK_THROWS_AS(ps::produce(t.view, source.data(), t.counts.data(), 0), std::invalid_argument);
}

namespace {
// docs/layouts.md's custom layout, with both placements: it needs no packed_count_alignment.
template <class Placement>
struct MyFp32Rows {
  using data_type = float;
  using scale_type = void;
  using placement = Placement;
  static constexpr const char* name = "MyFp32Rows";
  static constexpr cuda::std::int64_t granule = 1;
  static constexpr cuda::std::int64_t hidden_multiple = 1;
  PAGESTASH_HOST_DEVICE static constexpr bool has(ps::BufferRole role) { return role == ps::BufferRole::data; }
  PAGESTASH_HOST_DEVICE static ps::BlockShape block(ps::BufferRole, cuda::std::int64_t tokens,
                                                    cuda::std::int64_t hidden) {
    return ps::BlockShape{tokens, hidden * 4, ps::TokenAxis::rows, 1, false};
  }
};
}  // namespace

TEST_CASE("a custom layout needs only the documented members") {
  const std::vector<std::int32_t> counts = {3, 0, 5};
  ps::GroupedView<MyFp32Rows<ps::Packed>> packed;
  packed.max_tokens = 8;
  packed.hidden = 6;
  packed.groups = 3;
  CHECK(packed.count_alignment() == 1);
  CHECK(packed.geometry(BufferRole::data).segment(0, counts.data()).live == 8 * 6 * 4);
  CHECK(packed.geometry(BufferRole::data).group_offset(2, counts.data()) == 3 * 6 * 4);
  ps::GroupedView<MyFp32Rows<ps::CapacityPadded>> padded;
  padded.max_tokens = 8;
  padded.hidden = 6;
  padded.groups = 3;
  CHECK(padded.buffer_bytes(BufferRole::data) == 3 * 8 * 6 * 4);
  CHECK(padded.geometry(BufferRole::data).segment(2, counts.data()).live == 5 * 6 * 4);
  // The built-in FP32 rows place the same bytes.
  ps::GroupedView<ps::RowwiseUnquantized<float, ps::CapacityPadded>> builtin;
  builtin.max_tokens = 8;
  builtin.hidden = 6;
  builtin.groups = 3;
  CHECK(builtin.buffer_bytes(BufferRole::data) == padded.buffer_bytes(BufferRole::data));
  for (std::int32_t g = 0; g < 3; ++g) {
    const ps::Segment a = builtin.geometry(BufferRole::data).segment(g, counts.data());
    const ps::Segment b = padded.geometry(BufferRole::data).segment(g, counts.data());
    CHECK(a.offset == b.offset);
    CHECK(a.live == b.live);
    CHECK(a.lines == b.lines);
  }
}
