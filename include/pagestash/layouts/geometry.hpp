#pragma once
// Where the live bytes of one buffer are, computed from the per-group counts alone. This is
// the single description the stash kernels and the host executor walk.
//
//   capacity-padded  one segment per group: group g's block starts at g * block_bytes;
//                    inside it, `lines` runs, `line_stride` apart, each of run_bytes(m_g)
//   packed           one segment, one run: the prefix of bytes_for(T), T = sum of counts
//   whole            (small buffers kept whole, e.g. NVFP4 amax) one run: the whole buffer

#include <pagestash/layouts/block_shape.hpp>
#include <pagestash/layouts/buffer_role.hpp>

PAGESTASH_NAMESPACE_BEGIN

struct ByteRun {
  cuda::std::int64_t offset = 0;
  cuda::std::int64_t bytes = 0;
};

/// The live bytes of one group of one buffer (of the whole buffer, when packed): `lines`
/// runs starting `pitch` bytes apart at `offset`, each `live` bytes long. The rest of each
/// line, `pitch - live` bytes, is dead (what reload's zero_tail clears).
struct Segment {
  cuda::std::int64_t offset = 0;
  cuda::std::int64_t lines = 0;
  cuda::std::int64_t pitch = 0;
  cuda::std::int64_t live = 0;

  PAGESTASH_HOST_DEVICE cuda::std::int64_t line_offset(cuda::std::int64_t line) const { return offset + line * pitch; }
};

struct BufferGeometry {
  bool present = false;
  bool whole = false;   ///< live as a whole, independent of the counts
  bool packed = false;
  cuda::std::int32_t groups = 1;
  BlockShape block;                   ///< per-group block (capacity-padded) or per granule (packed)
  cuda::std::int64_t total_bytes = 0; ///< size of the allocation

  /// Token granule: live bytes come in whole granules of this many tokens.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t granule_tokens() const { return block.granule_tokens(); }

  /// Segments: one per group for capacity-padded placement, one in all for packed or whole.
  PAGESTASH_HOST_DEVICE cuda::std::int32_t segment_count() const {
    if (!present) return 0;
    return whole || packed ? 1 : groups;
  }

  /// Segment s for the given counts (counts[g] for each group; packed uses their sum).
  PAGESTASH_HOST_DEVICE Segment segment(cuda::std::int32_t s, const cuda::std::int32_t* counts) const {
    if (whole) return {0, 1, total_bytes, total_bytes};
    if (packed) {
      cuda::std::int64_t total = 0;
      for (cuda::std::int32_t g = 0; g < groups; ++g) total += counts[g];
      // block describes one granule: bytes are linear in whole granules.
      const cuda::std::int64_t granules = (total + granule_tokens() - 1) / granule_tokens();
      return {0, 1, total_bytes, granules * block.bytes()};
    }
    return {s * block.bytes(), block.lines(), block.bytes() / block.lines(), block.run_bytes(counts[s])};
  }

  PAGESTASH_HOST_DEVICE cuda::std::int64_t run_count() const {
    if (!present) return 0;
    return whole || packed ? 1 : groups * block.lines();
  }

  /// Run i for the given counts: line i % lines of segment i / lines.
  PAGESTASH_HOST_DEVICE ByteRun run(cuda::std::int64_t i, const cuda::std::int32_t* counts) const {
    const cuda::std::int64_t lines = whole || packed ? 1 : block.lines();
    const Segment seg = segment(static_cast<cuda::std::int32_t>(i / lines), counts);
    return {seg.line_offset(i % lines), seg.live};
  }

  /// Sum of the run lengths: what a stash of this buffer moves.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t live_bytes(const cuda::std::int32_t* counts) const {
    cuda::std::int64_t sum = 0;
    for (cuda::std::int64_t i = 0; i < run_count(); ++i) sum += run(i, counts).bytes;
    return sum;
  }
};

PAGESTASH_NAMESPACE_END
