#pragma once
// The live bytes of a buffer as a list of byte runs, walked one run at a time: the plain
// oracle tests, examples and benchmarks check the stash's segments and tiles against.

#include <pagestash/layouts/geometry.hpp>

PAGESTASH_NAMESPACE_BEGIN

struct ByteRun {
  cuda::std::int64_t offset = 0;
  cuda::std::int64_t bytes = 0;
};

/// Runs of the buffer: one per line of each group (capacity-padded), one in all (packed,
/// whole).
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t run_count(const BufferGeometry& geo) {
  if (!geo.present) return 0;
  return geo.whole || geo.packed ? 1 : geo.groups * geo.block.lines();
}

/// Run i for the given counts: line i % lines of segment i / lines.
PAGESTASH_HOST_DEVICE inline ByteRun byte_run(const BufferGeometry& geo, cuda::std::int64_t i,
                                              const cuda::std::int32_t* counts) {
  const cuda::std::int64_t lines = geo.whole || geo.packed ? 1 : geo.block.lines();
  const Segment seg = geo.segment(static_cast<cuda::std::int32_t>(i / lines), counts);
  return {seg.line_offset(i % lines), seg.live};
}

/// Sum of the run lengths: what a stash of this buffer moves.
PAGESTASH_HOST_DEVICE inline cuda::std::int64_t live_bytes(const BufferGeometry& geo,
                                                           const cuda::std::int32_t* counts) {
  cuda::std::int64_t sum = 0;
  for (cuda::std::int64_t i = 0; i < run_count(geo); ++i) sum += byte_run(geo, i, counts).bytes;
  return sum;
}

PAGESTASH_NAMESPACE_END
