#pragma once
// Where the live bytes of one buffer are, computed from the per-group counts alone. This is
// the single description the stash kernels and the host executor walk.
//
//   capacity-padded  group g's block starts at g * block_bytes; inside it, `lines` runs,
//                    `line_stride` apart, each of run_bytes(m_g) bytes
//   packed           one run: the prefix of bytes_for(T) bytes, T = sum of the counts
//   whole            (small buffers kept whole, e.g. NVFP4 amax) one run: the whole buffer

#include <pagestash/layouts/block_shape.hpp>
#include <pagestash/layouts/buffer_role.hpp>

PAGESTASH_NAMESPACE_BEGIN

struct ByteRun {
  cuda::std::int64_t offset = 0;
  cuda::std::int64_t bytes = 0;
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

  PAGESTASH_HOST_DEVICE cuda::std::int64_t run_count() const {
    if (!present) return 0;
    return whole || packed ? 1 : groups * block.lines();
  }

  /// Run i for the given counts (counts[g] for each group; packed uses their sum).
  PAGESTASH_HOST_DEVICE ByteRun run(cuda::std::int64_t i, const cuda::std::int32_t* counts) const {
    if (whole) return {0, total_bytes};
    if (packed) {
      cuda::std::int64_t total = 0;
      for (cuda::std::int32_t g = 0; g < groups; ++g) total += counts[g];
      // block describes one granule: bytes are linear in whole granules.
      return {0, (total + granule_tokens() - 1) / granule_tokens() * block.bytes()};
    }
    const cuda::std::int64_t g = i / block.lines();
    const cuda::std::int64_t line = i % block.lines();
    return {g * block.bytes() + line * block.line_stride(), block.run_bytes(counts[g])};
  }

  /// Sum of the run lengths: what a stash of this buffer moves.
  PAGESTASH_HOST_DEVICE cuda::std::int64_t live_bytes(const cuda::std::int32_t* counts) const {
    cuda::std::int64_t sum = 0;
    for (cuda::std::int64_t i = 0; i < run_count(); ++i) sum += run(i, counts).bytes;
    return sum;
  }
};

PAGESTASH_NAMESPACE_END
