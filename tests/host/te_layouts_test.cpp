// Packed placements against TransformerEngine's own formulas, written out here from TE's
// sources (NVIDIA/TransformerEngine, read at commit d0067d0, August 2026):
//
//   per-tensor scale shapes  transformer_engine/pytorch/tensor/mxfp8_tensor.py, MXFP8Quantizer.get_scale_shape:
//                              rowwise [ru(M, 128), ru(K / 32, 4)], columnwise [ru(M / 32, 4), ru(K, 128)]
//                            transformer_engine/pytorch/tensor/nvfp4_tensor.py, NVFP4Quantizer.get_scale_shape:
//                              rowwise [ru(M, 128), ru(ceil(K / 16), 4)], columnwise [ru(K, 128), ru(ceil(M / 16), 4)]
//   groups back to back      transformer_engine/pytorch/tensor/storage/grouped_tensor_storage.py, make_grouped_tensor:
//                              scale_inv_offsets = running sum of prod(get_scale_shape(shape_i))
//   grouped GEMM             transformer_engine/common/gemm/cublaslt_grouped_gemm.cu, compute_grouped_scale_inv_offset
//                              with padded_mxfp8_scale_inv_bytes / padded_nvfp4_scale_inv_bytes: the sum of
//                              ru(y, 128) * ru(ceil(x / block), 4) over the groups before (y = first dim rowwise,
//                              last dim columnwise); data at base + offset_elements * bits / 8, offsets = sum m_h * K
//   Packed's count rule      transformer_engine/common/cast/core/grouped_layout.cuh: "First dimension of each
//                              tensor in a group must be divisible by 128"
//
// Checked: each group's data and scale offsets and sizes (from the layouts' geometry) equal
// TE's, under both of TE's scale models; the producer writes every element where TE reads
// it (quantized here independently with the formats layer); the worked examples of issue 14;
// the allocation bound of PackedPadded; and a stash / reload of the worked example.

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/reference.hpp>

#include "../common/host_tensor.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace ps = pagestash;
using pagestash_test::HostTensor;
using ps::BufferRole;
using std::int64_t;

int64_t ru(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t cdiv(int64_t x, int64_t m) { return (x + m - 1) / m; }

// ---- TE's formulas ---------------------------------------------------------------------------

/// A per-tensor scale matrix [rows, cols] of TE (get_scale_shape), for m tokens and hidden K.
struct TeScaleShape {
  int64_t rows, cols;
  int64_t bytes() const { return rows * cols; }
};

template <class F>
TeScaleShape te_scale_shape(int64_t m, int64_t K, bool columnwise) {
  if constexpr (std::is_same_v<F, ps::NVFP4>) {  // nvfp4_tensor.py
    return columnwise ? TeScaleShape{ru(K, 128), ru(cdiv(m, 16), 4)} : TeScaleShape{ru(m, 128), ru(cdiv(K, 16), 4)};
  } else {  // mxfp8_tensor.py (floor division: M and K are multiples of 32 there)
    return columnwise ? TeScaleShape{ru(m / 32, 4), ru(K, 128)} : TeScaleShape{ru(m, 128), ru(K / 32, 4)};
  }
}

/// cublaslt_grouped_gemm.cu, padded_{mxfp8,nvfp4}_scale_inv_bytes(first = m, last = K, rowwise).
int64_t te_gemm_scale_bytes(int64_t first, int64_t last, bool rowwise, int64_t block) {
  const int64_t y = rowwise ? first : last;
  const int64_t x = rowwise ? last : first;
  return ru(y, 128) * ru(cdiv(x, block), 4);
}

/// Offsets (exclusive running sums, one more than groups) of a per-group size.
template <class Size>
std::vector<int64_t> running_sum(const std::vector<std::int32_t>& counts, Size size) {
  std::vector<int64_t> at{0};
  for (std::int32_t m : counts) at.push_back(at.back() + size(m));
  return at;
}

template <class L>
constexpr bool columnwise_v = L::direction == ps::Direction::columnwise;

template <class L>
std::vector<int64_t> te_scale_offsets(const std::vector<std::int32_t>& counts, int64_t K) {
  return running_sum(counts,
                     [&](int64_t m) { return te_scale_shape<typename L::format>(m, K, columnwise_v<L>).bytes(); });
}

template <class L>
std::vector<int64_t> te_data_offsets(const std::vector<std::int32_t>& counts, int64_t K) {
  return running_sum(counts, [&](int64_t m) { return m * K * L::format::element_bits / 8; });
}

/// Whether the layout accepts the counts (each a multiple of its count alignment).
template <class L>
bool accepts(const ps::GroupedView<L>& v, const std::vector<std::int32_t>& counts) {
  return ps::check_counts(v, counts.data()).verdict() == ps::Flag::none;
}

template <class L>
ps::GroupedView<L> shape_for(const std::vector<std::int32_t>& counts, int64_t K) {
  ps::GroupedView<L> v;
  v.groups = static_cast<std::int32_t>(counts.size());
  v.hidden = K;
  v.max_tokens = ru(std::max<int64_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 1), 128);
  return v;
}

// ---- Offsets and sizes ---------------------------------------------------------------------

/// Every group's data and scale offsets and sizes, and the live prefixes, equal TE's.
template <class L>
void check_offsets(const std::vector<std::int32_t>& counts, int64_t K) {
  const ps::GroupedView<L> v = shape_for<L>(counts, K);
  REQUIRE(accepts(v, counts));
  const std::vector<int64_t> te_data = te_data_offsets<L>(counts, K);
  const std::vector<int64_t> te_scales = te_scale_offsets<L>(counts, K);
  const ps::BufferGeometry data = v.geometry(BufferRole::data);
  const ps::BufferGeometry scales = v.geometry(BufferRole::scales);
  constexpr int64_t block = L::format::block_size;
  for (std::int32_t g = 0; g <= v.groups; ++g) {
    CAPTURE(g);
    const auto i = static_cast<std::size_t>(g);
    CHECK(data.group_offset(g, counts.data()) == te_data[i]);
    CHECK(scales.group_offset(g, counts.data()) == te_scales[i]);
    if (g == v.groups) break;
    // TE's two scale models agree here; and so does the group block the producer fills.
    const int64_t m = counts[i];
    CHECK(te_scales[i + 1] - te_scales[i] == te_gemm_scale_bytes(m, K, !columnwise_v<L>, block));
    CHECK(ps::group_block(v, counts.data(), BufferRole::scales, g).shape.bytes() == te_scales[i + 1] - te_scales[i]);
    CHECK(ps::group_block(v, counts.data(), BufferRole::data, g).shape.bytes() == te_data[i + 1] - te_data[i]);
  }
  // A stash moves exactly the prefix up to the end of the last group, and it fits.
  CHECK(data.segment(0, counts.data()).live == te_data.back());
  CHECK(scales.segment(0, counts.data()).live == te_scales.back());
  CHECK(te_data.back() <= data.total_bytes);
  CHECK(te_scales.back() <= scales.total_bytes);
}

// ---- Where the producer writes -------------------------------------------------------------

/// Produces the tensor and reads every element back where TE reads it: data at TE's data
/// offset of the group (row-major, or transposed [K, m/2] for NVFP4 columnwise), scales at
/// TE's scale offset, inside TE's per-tensor matrix (row-major, or cuBLAS 128x4 tiles);
/// expected bytes come from the formats layer's quantize_block on the source. Bytes past
/// the last group keep the poison.
template <class L>
void check_producer_writes_where_te_reads(const std::vector<std::int32_t>& counts, int64_t K, std::uint32_t seed) {
  using F = typename L::format;
  constexpr int b = F::block_size;
  constexpr bool col = columnwise_v<L>;
  constexpr bool fp4 = F::element_bits == 4;
  constexpr bool swizzled = L::scale_arrangement::swizzled;
  const ps::GroupedView<L> shape = shape_for<L>(counts, K);
  HostTensor<L> t(shape.max_tokens, K, shape.groups, counts);
  const auto source = pagestash_test::random_source(shape.max_tokens, K, seed);
  constexpr std::uint8_t poison = 0xA5;
  ps::produce(t.view, source.data(), counts.data(), poison);

  const std::vector<int64_t> data_at = te_data_offsets<L>(counts, K);
  const std::vector<int64_t> scale_at = te_scale_offsets<L>(counts, K);
  const std::uint8_t* data = t.bytes(BufferRole::data);
  const std::uint8_t* scales = t.bytes(BufferRole::scales);
  int64_t checked = 0, wrong = 0;
  auto expect = [&](std::uint8_t got, std::uint8_t want, const char* what, int g, int64_t token, int64_t k) {
    ++checked;
    if (got != want && ++wrong <= 5)
      FAIL_CHECK(what << " of group " << g << " token " << token << " k " << k << ": " << int{got}
                      << " != " << int{want});
  };
  int64_t first_row = 0;  // of the group, in the packed token space
  for (int g = 0; g < shape.groups; ++g) {
    const auto gi = static_cast<std::size_t>(g);
    const int64_t m = counts[gi];
    const TeScaleShape te = te_scale_shape<F>(m, K, col);
    const float amax = ps::abs_max(source.data() + first_row * K, m * K);
    const auto tensor = F::TensorScale::from_amax(amax);
    // Blocks along tokens (columnwise) or along hidden (rowwise); (i, j) = (token, k) of the block's first value.
    for (int64_t i = 0; i < m; i += col ? b : 1) {
      for (int64_t j = 0; j < K; j += col ? 1 : b) {
        float values[b];
        for (int e = 0; e < b; ++e)
          values[e] =
              source[static_cast<std::size_t>((first_row + i + (col ? e : 0)) * K + j + (col ? 0 : e))].to_float();
        typename F::element_type codes[b];
        const auto scale = ps::quantize_block(F{}, values, tensor, codes);
        // Scale (r, c) of TE's matrix: columnwise MXFP8 [m/32, Kp] (compact) but swizzled as the
        // transposed [Kp, m/32]; NVFP4 columnwise [Kp, m/16]; rowwise [m, K/b].
        int64_t r = col ? i / b : i, c = col ? j : j / b;
        if (col && (fp4 || swizzled)) std::swap(r, c);
        const int64_t cols = col && swizzled && !fp4 ? te.rows : te.cols;  // MXFP8 col swizzled: transposed
        const int64_t in_matrix = swizzled ? ps::SwizzleTile::offset(r, c, cols) : r * cols + c;
        expect(scales[scale_at[gi] + in_matrix], scale.bits, "scale", g, i, j);
        for (int e = 0; e < b; e += fp4 ? 2 : 1) {
          const int64_t token = i + (col ? e : 0), k = j + (col ? 0 : e);
          // Data byte: row-major [m, K] bytes, or NVFP4 [m, K/2] (rowwise) / [K, m/2] (columnwise).
          const int64_t at = !fp4 ? token * K + k : (col ? k * (m / 2) + token / 2 : token * (K / 2) + k / 2);
          std::uint8_t want = codes[e].bits;
          if constexpr (fp4) want = ps::E2M1x2::pack(codes[e], codes[e + 1]).bits;
          expect(data[data_at[gi] + at], want, "data", g, token, k);
        }
      }
    }
    first_row += m;
  }
  // Every data byte and every scale of every group was compared.
  CHECK(checked == first_row * K / (fp4 ? 2 : 1) + first_row * K / b);
  CHECK(wrong == 0);
  CHECK(std::all_of(data + data_at.back(), data + t.view.buffer_bytes(BufferRole::data),
                    [](std::uint8_t x) { return x == poison; }));
  CHECK(std::all_of(scales + scale_at.back(), scales + t.view.buffer_bytes(BufferRole::scales),
                    [](std::uint8_t x) { return x == poison; }));
}

// ---- Every packed quantized layout, several counts and hidden sizes ------------------------

const std::vector<std::vector<std::int32_t>> count_vectors = {
    {16, 48, 0, 80},     // multiples of 16 (NVFP4 columnwise and rowwise PackedPadded)
    {32, 96, 128, 64},   // multiples of 32: issue 14's worked example
    {64, 192, 0, 128},   // multiples of 64
    {128, 0, 256, 128},  // multiples of 128: Packed too
    {0, 0, 0, 0},        // nothing live
    {0, 512, 0, 0},      // one group holds everything
    {1, 17, 130, 3},     // any counts (rowwise PackedPadded)
};

template <class L>
void check_layout_against_te(std::uint32_t& seed) {
  for (int64_t K : {2048, 7168, 320}) {  // 320: not a multiple of 128, TE's padding shows
    for (const auto& counts : count_vectors) {
      CAPTURE(K);
      std::string shown;
      for (std::int32_t m : counts) shown += std::to_string(m) + " ";
      CAPTURE(shown);
      const ps::GroupedView<L> v = shape_for<L>(counts, K);
      // TE's rules: its device kernels need multiples of 128; its host-shape storage, whole
      // blocks along tokens (columnwise; rowwise any count).
      const int64_t te_alignment =
          !L::placement::pads_group_scales ? 128 : (columnwise_v<L> ? L::format::block_size : 1);
      const bool aligned =
          std::all_of(counts.begin(), counts.end(), [&](std::int32_t m) { return m % te_alignment == 0; });
      CHECK(accepts(v, counts) == aligned);
      if (!aligned) continue;
      check_offsets<L>(counts, K);
      // The producer check quantizes every element: all counts at 2048 and 320, one at 7168;
      // E5M2 is placed as E4M3 (same geometry), so its offsets suffice.
      const bool e5m2 = std::is_same_v<typename L::format, ps::MXFP8_E5M2>;
      if (!e5m2 && (K != 7168 || counts == count_vectors[1]))
        check_producer_writes_where_te_reads<L>(counts, K, ++seed);
    }
  }
}

}  // namespace

TEST_CASE("packed placements: offsets, sizes and produced bytes equal TransformerEngine's") {
  std::uint32_t seed = 14;
#define PAGESTASH_CHECK_TE(Dir, F, P, S)      \
  {                                           \
    using L = ps::Dir<ps::F, ps::P, ps::S>;   \
    CAPTURE(#Dir "<" #F ", " #P ", " #S ">"); \
    check_layout_against_te<L>(seed);         \
  }
#define PAGESTASH_CHECK_TE_PLACEMENTS(Dir, F)        \
  PAGESTASH_CHECK_TE(Dir, F, Packed, CompactScales)  \
  PAGESTASH_CHECK_TE(Dir, F, Packed, SwizzledScales) \
  PAGESTASH_CHECK_TE(Dir, F, PackedPadded, CompactScales) PAGESTASH_CHECK_TE(Dir, F, PackedPadded, SwizzledScales)
  PAGESTASH_CHECK_TE_PLACEMENTS(ColumnwiseQuantized, MXFP8_E4M3)
  PAGESTASH_CHECK_TE_PLACEMENTS(ColumnwiseQuantized, MXFP8_E5M2)
  PAGESTASH_CHECK_TE_PLACEMENTS(ColumnwiseQuantized, NVFP4)
  PAGESTASH_CHECK_TE_PLACEMENTS(RowwiseQuantized, MXFP8_E4M3)
  PAGESTASH_CHECK_TE_PLACEMENTS(RowwiseQuantized, MXFP8_E5M2)
  PAGESTASH_CHECK_TE_PLACEMENTS(RowwiseQuantized, NVFP4)
#undef PAGESTASH_CHECK_TE_PLACEMENTS
#undef PAGESTASH_CHECK_TE
}

TEST_CASE("count alignment: Packed quantized layouts take multiples of 128, PackedPadded the block") {
  const auto alignment = [](auto layout) {
    ps::GroupedView<decltype(layout)> v;
    v.hidden = 2048;
    return v.count_alignment();
  };
  using ps::Packed, ps::PackedPadded, ps::CapacityPadded, ps::CompactScales, ps::SwizzledScales;
  CHECK(alignment(ps::ColumnwiseQuantized<ps::MXFP8_E4M3, Packed, CompactScales>{}) == 128);
  CHECK(alignment(ps::ColumnwiseQuantized<ps::NVFP4, Packed, CompactScales>{}) == 128);
  CHECK(alignment(ps::RowwiseQuantized<ps::MXFP8_E5M2, Packed, CompactScales>{}) == 128);
  CHECK(alignment(ps::RowwiseQuantized<ps::NVFP4, Packed, SwizzledScales>{}) == 128);
  CHECK(alignment(ps::ColumnwiseQuantized<ps::MXFP8_E4M3, PackedPadded, SwizzledScales>{}) == 32);
  CHECK(alignment(ps::ColumnwiseQuantized<ps::NVFP4, PackedPadded, SwizzledScales>{}) == 16);
  CHECK(alignment(ps::RowwiseQuantized<ps::MXFP8_E4M3, PackedPadded, CompactScales>{}) == 1);
  CHECK(alignment(ps::RowwiseQuantized<ps::NVFP4, PackedPadded, SwizzledScales>{}) == 1);
  CHECK(alignment(ps::RowwiseUnquantized<ps::BF16, Packed>{}) == 1);
  CHECK(alignment(ps::RowwiseUnquantized<float, Packed>{}) == 1);
  CHECK(alignment(ps::ColumnwiseQuantized<ps::MXFP8_E4M3, CapacityPadded, SwizzledScales>{}) == 1);
}

TEST_CASE("issue 14's worked examples: refused by Packed, placed where TE puts them by PackedPadded") {
  using ps::Packed, ps::PackedPadded, ps::CompactScales;
  const std::vector<std::int32_t> mx = {32, 96, 128, 64}, nv = {16, 48, 64, 128};
  const auto scale_offsets = [](auto layout, const std::vector<std::int32_t>& counts) {
    const ps::GroupedView<decltype(layout)> v = shape_for<decltype(layout)>(counts, 2048);
    const ps::BufferGeometry geo = v.geometry(BufferRole::scales);
    std::vector<int64_t> at;
    for (std::int32_t g = 0; g <= v.groups; ++g) at.push_back(geo.group_offset(g, counts.data()));
    return at;
  };
  SUBCASE("MXFP8 columnwise, hidden 2048: group 1's scales at 8192, live prefix 32768") {
    CHECK(
        ps::check_counts(shape_for<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, Packed, CompactScales>>(mx, 2048), mx.data())
            .first_bad_group == 0);
    CHECK(scale_offsets(ps::ColumnwiseQuantized<ps::MXFP8_E4M3, PackedPadded, CompactScales>{}, mx) ==
          std::vector<int64_t>{0, 8192, 16384, 24576, 32768});
  }
  SUBCASE("MXFP8 rowwise, hidden 2048: 128 padded rows of 64 scales per group") {
    CHECK(ps::check_counts(shape_for<ps::RowwiseQuantized<ps::MXFP8_E4M3, Packed, CompactScales>>(mx, 2048), mx.data())
              .first_bad_group == 0);
    CHECK(scale_offsets(ps::RowwiseQuantized<ps::MXFP8_E4M3, PackedPadded, CompactScales>{}, mx) ==
          std::vector<int64_t>{0, 8192, 16384, 24576, 32768});
  }
  SUBCASE("NVFP4 columnwise, hidden 2048, counts {16, 48, 64, 128}: [2048, ru(m/16, 4)] per group") {
    CHECK(ps::check_counts(shape_for<ps::ColumnwiseQuantized<ps::NVFP4, Packed, CompactScales>>(nv, 2048), nv.data())
              .first_bad_group == 0);
    CHECK(scale_offsets(ps::ColumnwiseQuantized<ps::NVFP4, PackedPadded, CompactScales>{}, nv) ==
          std::vector<int64_t>{0, 8192, 16384, 24576, 40960});
  }
}

namespace {

/// The largest prefix any accepted counts give, by exhaustive search over small shapes,
/// equals the allocation (buffer_bytes): the bound is safe and tight.
template <class L>
void check_allocation_bound(int64_t max_tokens, int groups) {
  ps::GroupedView<L> v;
  v.max_tokens = max_tokens;
  v.hidden = 64;
  v.groups = groups;
  const int64_t a = v.count_alignment();
  const ps::BufferGeometry geo = v.geometry(BufferRole::scales);
  int64_t most = 0;
  std::vector<std::int32_t> counts(static_cast<std::size_t>(groups), 0);
  // Every vector of counts (multiples of a, summing to at most max_tokens): odometer.
  for (;;) {
    if (accepts(v, counts)) most = std::max(most, geo.segment(0, counts.data()).live);
    std::size_t g = 0;
    while (g < counts.size() && (counts[g] += static_cast<std::int32_t>(a)) > max_tokens) counts[g++] = 0;
    if (g == counts.size()) break;
  }
  CHECK(most == geo.total_bytes);
}

}  // namespace

TEST_CASE("PackedPadded scales: the allocation is the most any accepted counts fill") {
  using ps::PackedPadded, ps::CompactScales, ps::SwizzledScales;
  for (int groups : {1, 2, 3}) {
    for (int64_t max_tokens : {128, 256, 384}) {
      CAPTURE(groups);
      CAPTURE(max_tokens);
      check_allocation_bound<ps::ColumnwiseQuantized<ps::MXFP8_E4M3, PackedPadded, CompactScales>>(max_tokens, groups);
      check_allocation_bound<ps::ColumnwiseQuantized<ps::NVFP4, PackedPadded, SwizzledScales>>(max_tokens, groups);
      if (max_tokens <= 256)  // rowwise counts step by 1: keep the search small
        check_allocation_bound<ps::RowwiseQuantized<ps::MXFP8_E4M3, PackedPadded, CompactScales>>(
            max_tokens, groups == 3 ? 2 : groups);
    }
  }
}

TEST_CASE("a stash of the worked example restores TE's padded layout bit for bit, and Packed fails it loudly") {
  using Padded = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::PackedPadded, ps::CompactScales>;
  using Tight = ps::ColumnwiseQuantized<ps::MXFP8_E4M3, ps::Packed, ps::CompactScales>;
  const std::vector<std::int32_t> counts = {32, 96, 128, 64};
  ps::PoolConfig config;
  config.page_bytes = 4096;
  config.device_pages = 512;
  ps::PagePool pool(config, ps::MemorySpace::host);

  const ps::GroupedView<Padded> shape = shape_for<Padded>(counts, 2048);
  HostTensor<Padded> t(shape.max_tokens, 2048, shape.groups, counts);
  const auto source = pagestash_test::random_source(shape.max_tokens, 2048, 77);
  ps::produce(t.view, source.data(), counts.data(), 0x3C);
  const std::vector<std::uint8_t> data = t.data, scales = t.scales;
  auto record = ps::make_record<ps::StashTraits<Padded>>(pool, t.view);
  ps::stash(ps::host, pool, t.view, record);
  CHECK(record.status().state == ps::RecordState::stashed);
  CHECK(record.status().live_bytes == 320 * 2048 + 32768);  // data prefix T * K, scales prefix as TE's
  std::fill(t.data.begin(), t.data.end(), std::uint8_t{0});
  std::fill(t.scales.begin(), t.scales.end(), std::uint8_t{0});
  ps::reload(ps::host, pool, record, t.view);
  CHECK(record.status().state == ps::RecordState::reloaded);
  // Everything in the prefixes is back; everything past them was left alone (zero here).
  CHECK(std::equal(data.begin(), data.begin() + 320 * 2048, t.data.begin()));
  CHECK(std::equal(scales.begin(), scales.begin() + 32768, t.scales.begin()));
  CHECK(std::all_of(t.scales.begin() + 32768, t.scales.end(), [](std::uint8_t x) { return x == 0; }));
  CHECK_FALSE(pool.stats().flags.overflow);

  HostTensor<Tight> tight(shape.max_tokens, 2048, shape.groups, counts);
  auto tight_record = ps::make_record<ps::StashTraits<Tight>>(pool, tight.view);
  ps::stash(ps::host, pool, tight.view, tight_record);
  CHECK(tight_record.status().state == ps::RecordState::failed);
  CHECK(tight_record.status().error == ps::Flag::bad_counts);
  CHECK(tight_record.status().first_bad_group == 0);
  CHECK(pool.stats().flags.error);
  CHECK(pool.stats().flags.bad_counts == 1);
}
