#pragma once
// Reference producers: fill any layout from a BF16 [token_rows, hidden] source and per-group
// counts, quantizing with the reference quantizers, and leave a poison byte everywhere outside the
// live region. Tests, examples and benchmarks use them to make real inputs.
//
// The unit of work is one byte of one group's block (produced_byte), host+device: the CUDA
// kernel in producer.cuh and the host loop for unquantized layouts run it. For quantized
// layouts the host quantizes each block once and writes its bytes where produced_byte puts
// them (produce_group_blocks; the tests check both agree). Rows of the source beyond a
// group's count read as zero, so partial granules hold well-defined bytes.

#include <pagestash/detail/errors.hpp>
#include <pagestash/layouts/view.hpp>
#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/serial_plan.hpp>

#include <cstring>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN

/// What the per-byte producer reads; every pointer is readable where it runs.
struct ProducerInput {
  const BF16* source = nullptr;                    ///< [token_rows, hidden]
  const cuda::std::int32_t* counts = nullptr;      ///< G live counts
  const cuda::std::int64_t* group_rows = nullptr;  ///< G: first source row of each group
  const float* group_amax = nullptr;               ///< G: per-group amax (NVFP4 layouts)
};

namespace detail {

template <class T>
PAGESTASH_HOST_DEVICE T convert_from_float(float x) {
  if constexpr (cuda::std::is_same_v<T, float>) return x;
  else if constexpr (cuda::std::is_same_v<T, cuda::std::uint8_t>) return static_cast<T>(BF16::from_float(x).bits >> 8);
  else return T::from_float(x);
}

/// Value of element (token, k) of group g: the source inside the count, zero outside.
template <class Layout>
PAGESTASH_HOST_DEVICE float group_value(const GroupedView<Layout>& v, const ProducerInput& in, cuda::std::int32_t g,
                                        cuda::std::int64_t token, cuda::std::int64_t k) {
  if (token >= in.counts[g]) return 0.0f;
  return in.source[(in.group_rows[g] + token) * v.hidden + k].to_float();
}

/// Quantizes the block of Layout's format that starts at (token, k) of group g, along the
/// layout's block direction.
template <class Layout>
PAGESTASH_HOST_DEVICE typename Layout::format::scale_type quantize_group_block(
    const GroupedView<Layout>& v, const ProducerInput& in, cuda::std::int32_t g, cuda::std::int64_t token,
    cuda::std::int64_t k, typename Layout::format::element_type* codes) {
  using F = typename Layout::format;
  float values[F::block_size];
  for (int i = 0; i < F::block_size; ++i) {
    values[i] = Layout::direction == Direction::columnwise ? group_value(v, in, g, token + i, k)
                                                           : group_value(v, in, g, token, k + i);
  }
  const auto tensor = F::TensorScale::from_amax(in.group_amax != nullptr ? in.group_amax[g] : 0.0f);
  return quantize_block(F{}, values, tensor, codes);
}

template <class Layout>
PAGESTASH_HOST_DEVICE cuda::std::uint8_t quantized_byte(const GroupedView<Layout>& v, const ProducerInput& in,
                                                        BufferRole role, cuda::std::int32_t g, const BlockShape& blk,
                                                        cuda::std::int64_t r, cuda::std::int64_t c) {
  using F = typename Layout::format;
  constexpr int b = F::block_size;
  constexpr bool columnwise = Layout::direction == Direction::columnwise;
  const cuda::std::int64_t token_index = blk.token_axis == TokenAxis::rows ? r : c;
  const cuda::std::int64_t other = blk.token_axis == TokenAxis::rows ? c : r;
  typename F::element_type codes[b];
  if (token_index >= blk.live_indices(in.counts[g])) return 0;  // TE's per-group padding (PackedPadded)
  if (role == BufferRole::scales) {
    // Columnwise: one scale per (k, 32 or 16 tokens); rowwise: per (token, block of k).
    // Indices past the real hidden size are TE's padding and hold zero.
    if (columnwise) {
      if (other >= v.hidden) return 0;
      return quantize_group_block(v, in, g, token_index * b, other, codes).bits;
    }
    if (other >= v.hidden / b) return 0;
    return quantize_group_block(v, in, g, token_index, other * b, codes).bits;
  }
  // Data: one FP8 code, or two FP4 codes packed along the block direction.
  constexpr int per_byte = 8 / F::element_bits;
  const cuda::std::int64_t token = columnwise ? token_index * per_byte : token_index;
  const cuda::std::int64_t k = columnwise ? other : other * per_byte;
  const cuda::std::int64_t along = columnwise ? token : k;  // position along the block direction
  const cuda::std::int64_t start = along - along % b;
  quantize_group_block(v, in, g, columnwise ? start : token, columnwise ? k : start, codes);
  const int i = static_cast<int>(along % b);
  if constexpr (per_byte == 2) return E2M1x2::pack(codes[i], codes[i + 1]).bits;
  else return codes[i].bits;
}

}  // namespace detail

/// Byte (r, c) of group g's block of one buffer. Only called inside the live region.
template <class Layout>
PAGESTASH_HOST_DEVICE cuda::std::uint8_t produced_byte(const GroupedView<Layout>& v, const ProducerInput& in,
                                                       BufferRole role, cuda::std::int32_t g, const BlockShape& blk,
                                                       cuda::std::int64_t r, cuda::std::int64_t c) {
  if constexpr (Layout::has(BufferRole::scales)) {
    return detail::quantized_byte(v, in, role, g, blk, r, c);
  } else {  // unquantized: the element converted from BF16, byte by byte
    using T = typename Layout::data_type;
    constexpr cuda::std::int64_t size = sizeof(T);
    const T value = detail::convert_from_float<T>(detail::group_value(v, in, g, r, c / size));
    cuda::std::uint8_t bytes[size];
    memcpy(bytes, &value, size);
    return bytes[c % size];
  }
}

/// Group g's block of one buffer: its shape, where it starts in the buffer, and how many
/// token indices of it the producer writes: the live ones (whole granules) and, for
/// PackedPadded scales, the group's padding up to whole tiles (written as zero).
struct GroupBlock {
  BlockShape shape;
  cuda::std::int64_t base = 0;
  cuda::std::int64_t indices = 0;

  /// Rows and columns of the written region.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t rows() const {
    return shape.token_axis == TokenAxis::rows ? indices : shape.rows;
  }
  PAGESTASH_HOST_DEVICE cuda::std::int64_t cols() const {
    return shape.token_axis == TokenAxis::rows ? shape.cols : indices;
  }
};

/// Group g's block of one buffer, from the buffer's geometry (the one description of where
/// every group lives).
template <class Layout>
PAGESTASH_HOST_DEVICE GroupBlock group_block(const GroupedView<Layout>& v, const cuda::std::int32_t* counts,
                                             BufferRole role, cuda::std::int32_t g) {
  const BufferGeometry geo = v.geometry(role);
  const cuda::std::int64_t tokens = geo.padded_tokens(counts[g]);
  GroupBlock b;
  // Packed: group g is its own block of its (padded) tokens; capacity-padded: the fixed block.
  b.shape = geo.packed ? Layout::block(role, tokens, v.hidden) : geo.block;
  b.base = geo.group_offset(g, counts);
  b.indices = b.shape.live_indices(tokens);
  return b;
}

/// Calls f(byte pointer, block, r, c) for every byte of group g's region of one buffer.
template <class Layout, class F>
void for_each_live_byte(const GroupedView<Layout>& v, const ProducerInput& in, BufferRole role, cuda::std::int32_t g,
                        F&& f) {
  const GroupBlock blk = group_block(v, in.counts, role, g);
  auto* bytes = static_cast<cuda::std::uint8_t*>(v.buffer(role)) + blk.base;
  for (cuda::std::int64_t r = 0; r < blk.rows(); ++r)
    for (cuda::std::int64_t c = 0; c < blk.cols(); ++c) f(bytes + blk.shape.offset(r, c), blk.shape, r, c);
}

namespace detail {

/// The host producer's fast path for quantized layouts: each block quantized once, its
/// codes and scale written where produced_byte would put them (the tests check both agree).
/// Scale bytes of TE's padding (hidden and per group) are zero, as produced_byte makes them.
template <class Layout>
void produce_group_blocks(const GroupedView<Layout>& v, const ProducerInput& in, cuda::std::int32_t g) {
  using F = typename Layout::format;
  constexpr int b = F::block_size;
  constexpr int per_byte = 8 / F::element_bits;
  constexpr bool columnwise = Layout::direction == Direction::columnwise;
  for_each_live_byte(
      v, in, BufferRole::scales, g,
      [](cuda::std::uint8_t* byte, const BlockShape&, cuda::std::int64_t, cuda::std::int64_t) { *byte = 0; });
  const GroupBlock data_group = group_block(v, in.counts, BufferRole::data, g);
  const GroupBlock scale_group = group_block(v, in.counts, BufferRole::scales, g);
  const BlockShape& data_blk = data_group.shape;
  const BlockShape& scale_blk = scale_group.shape;
  auto* data = static_cast<cuda::std::uint8_t*>(v.buffer(BufferRole::data)) + data_group.base;
  auto* scales = static_cast<cuda::std::uint8_t*>(v.buffer(BufferRole::scales)) + scale_group.base;
  // Live token indices of each buffer (whole granules), and the tokens they span.
  const cuda::std::int64_t data_live = data_blk.live_indices(in.counts[g]);
  const cuda::std::int64_t scale_live = scale_blk.live_indices(in.counts[g]);
  const cuda::std::int64_t data_tokens = data_live * (columnwise ? per_byte : 1);
  const cuda::std::int64_t scale_tokens = scale_live * (columnwise ? b : 1);
  const cuda::std::int64_t tokens = data_tokens > scale_tokens ? data_tokens : scale_tokens;
  auto at = [](const BlockShape& blk, cuda::std::int64_t token_index, cuda::std::int64_t other) {
    return blk.token_axis == TokenAxis::rows ? blk.offset(token_index, other) : blk.offset(other, token_index);
  };
  typename F::element_type codes[b];
  for (cuda::std::int64_t t = 0; t < tokens; t += columnwise ? b : 1) {
    for (cuda::std::int64_t k = 0; k < v.hidden; k += columnwise ? 1 : b) {
      const auto scale = quantize_group_block(v, in, g, t, k, codes);
      const cuda::std::int64_t scale_index = columnwise ? t / b : t;
      if (scale_index < scale_live) scales[at(scale_blk, scale_index, columnwise ? k : k / b)] = scale.bits;
      for (int i = 0; i < b; i += per_byte) {
        const cuda::std::int64_t token = columnwise ? t + i : t;
        const cuda::std::int64_t index = columnwise ? token / per_byte : token;
        if (index >= data_live) break;
        cuda::std::uint8_t byte = 0;
        if constexpr (per_byte == 2) byte = E2M1x2::pack(codes[i], codes[i + 1]).bits;
        else byte = codes[i].bits;
        data[at(data_blk, index, columnwise ? k : (k + i) / per_byte)] = byte;
      }
    }
  }
}

}  // namespace detail

/// Host producer. `counts` is host memory. Fills every buffer the layout has (the view's
/// pointers are host memory): poison outside the live region, produced bytes inside it.
template <class Layout>
void produce(const GroupedView<Layout>& v, const BF16* source, const cuda::std::int32_t* counts,
             cuda::std::uint8_t poison) {
  validate_shape(v);
  std::vector<cuda::std::int64_t> group_rows(v.groups);
  const cuda::std::int32_t bad = plan_groups(v, counts, group_rows.data()).first_bad_group;
  if (bad >= 0) {
    const cuda::std::int64_t m = counts[bad];
    detail::throw_invalid("produce",
                          "count of group " + std::to_string(bad) + " = " + std::to_string(m) +
                              (m >= 0 && m % v.count_alignment() != 0
                                   ? " is not a multiple of the packed alignment " + std::to_string(v.count_alignment())
                                   : " does not fit max_tokens"));
  }
  std::vector<float> group_amax(v.groups);
  for (cuda::std::int32_t g = 0; g < v.groups; ++g)
    group_amax[g] = abs_max(source + group_rows[g] * v.hidden, counts[g] * v.hidden);
  const ProducerInput in{source, counts, group_rows.data(), group_amax.data()};

  for_each_role([&](BufferRole role) {
    if (!Layout::has(role)) return;
    auto* bytes = static_cast<cuda::std::uint8_t*>(v.buffer(role));
    std::memset(bytes, poison, static_cast<std::size_t>(v.buffer_bytes(role)));
    if (role == BufferRole::amax)
      std::memcpy(bytes, group_amax.data(), sizeof(float) * static_cast<std::size_t>(v.groups));
  });
  for (cuda::std::int32_t g = 0; g < v.groups; ++g) {
    if constexpr (Layout::has(BufferRole::scales)) {
      detail::produce_group_blocks(v, in, g);
    } else {
      for_each_live_byte(v, in, BufferRole::data, g,
                         [&](cuda::std::uint8_t* byte, const BlockShape& blk, cuda::std::int64_t r,
                             cuda::std::int64_t c) { *byte = produced_byte(v, in, BufferRole::data, g, blk, r, c); });
    }
  }
}

PAGESTASH_NAMESPACE_END
