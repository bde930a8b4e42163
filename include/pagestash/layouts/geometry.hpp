#pragma once
// Where the live bytes of one buffer are, computed from the per-group counts alone. This is the single description the
// stash kernels and the host executor walk.
//
//   capacity-padded  one segment per group: group g's block starts at g * block_bytes;
//                    inside it, `lines` runs, `pitch` apart, each of run_bytes(m_g)
//   packed           one segment, one run: the prefix up to the end of the last group's
//                    block; group g's block starts where group g - 1's ends and holds its
//                    m_g tokens (PackedPadded scales: m_g rounded up to whole 128x4 tiles)
//   whole            (small buffers kept whole, e.g. NVFP4 amax) one run: the whole buffer

#include <pagestash/layouts/block_shape.hpp>
#include <pagestash/layouts/buffer_role.hpp>

PAGESTASH_NAMESPACE_BEGIN

/// The live bytes of one group of one buffer (the whole buffer when packed): `lines` runs `pitch` bytes apart from
/// `offset`, each `live` bytes long; the rest of each line (`pitch - live` bytes) is dead, cleared by reload's
/// zero_tail.
struct Segment {
  cuda::std::int64_t offset = 0;
  cuda::std::int64_t lines = 0;
  cuda::std::int64_t pitch = 0;
  cuda::std::int64_t live = 0;

  PAGESTASH_HOST_DEVICE cuda::std::int64_t line_offset(cuda::std::int64_t line) const { return offset + line * pitch; }
};

struct BufferGeometry {
  bool present = false;
  bool whole = false;  ///< live as a whole, independent of the counts
  bool packed = false;
  cuda::std::int32_t groups = 1;
  BlockShape block;                    ///< per-group block (capacity-padded) or per granule (packed)
  cuda::std::int64_t pad_tokens = 1;   ///< packed: each group's tokens rounded up to this (1: not padded)
  cuda::std::int64_t total_bytes = 0;  ///< size of the allocation

  /// Token granule: live bytes come in whole granules of this many tokens.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t granule() const { return block.granule(); }

  /// Tokens a packed group of m tokens occupies: m, or m padded on its own (PackedPadded scales).
  PAGESTASH_HOST_DEVICE cuda::std::int64_t padded_tokens(cuda::std::int64_t m) const {
    return detail::round_up(m, pad_tokens);
  }

  /// Bytes of the block of a group of m tokens: packed, whole granules of its padded tokens (bytes are linear in
  /// granules); capacity-padded, the fixed block.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t group_bytes(cuda::std::int64_t m) const {
    if (!packed) return block.bytes();
    return detail::ceil_div(padded_tokens(m), granule()) * block.bytes();
  }

  /// Where group g's block starts: after the blocks of groups 0..g-1 (packed), or at g blocks (capacity-padded);
  /// group_offset(groups) is the end of the last block.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t group_offset(cuda::std::int32_t g, const cuda::std::int32_t* counts) const {
    if (!packed) return g * block.bytes();
    cuda::std::int64_t offset = 0;
    for (cuda::std::int32_t h = 0; h < g; ++h) offset += group_bytes(counts[h]);
    return offset;
  }

  /// Segments: one per group for capacity-padded placement, one in all for packed or whole.
  PAGESTASH_HOST_DEVICE cuda::std::int32_t segment_count() const {
    if (!present) return 0;
    return whole || packed ? 1 : groups;
  }

  PAGESTASH_HOST_DEVICE Segment segment(cuda::std::int32_t s, const cuda::std::int32_t* counts) const {
    if (whole) return {0, 1, total_bytes, total_bytes};
    if (packed) return {0, 1, total_bytes, group_offset(groups, counts)};
    return {s * block.bytes(), block.lines(), block.pitch(), block.run_bytes(counts[s])};
  }

  /// Segment s at its largest, whatever the counts: a full group (capacity-padded), the whole buffer (packed:
  /// total_bytes is the most any accepted counts can fill).
  PAGESTASH_HOST_DEVICE Segment largest_segment(cuda::std::int32_t s) const {
    if (whole || packed) return {0, 1, total_bytes, total_bytes};
    return {s * block.bytes(), block.lines(), block.pitch(), block.run_bytes(block.tokens())};
  }
};

PAGESTASH_NAMESPACE_END
