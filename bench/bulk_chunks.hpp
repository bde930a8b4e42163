#pragma once
// The TMA baseline's cut of the live runs into bulk copies (stash_bench.cu, `tma_bulk`): host and device code, so
// that bulk_chunks_test.cpp walks the chunks exactly as the kernel's blocks do and copies CPU memory with them.
//
// A piece is a live run's part inside one page: `bytes` from `src` to `dst`. A bulk copy (cp.async.bulk) needs both
// addresses and its size to be multiples of 16 bytes, and goes through one stage of shared memory, so each piece is cut
// into chunks of at most a stage. The grid splits the chunks into equal contiguous ranges, one a block; a block finds
// its first chunk by a binary search over the pieces' first chunks, then walks on.

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#  define PAGESTASH_BENCH_HD __host__ __device__
#else
#  define PAGESTASH_BENCH_HD
#endif

namespace pagestash_bench {

/// `bytes` from `src` to `dst`, addresses as integers.
struct BulkPiece {
  std::uint64_t src = 0, dst = 0;
  std::int64_t bytes = 0;
};

/// One bulk copy: at most a stage.
struct BulkChunk {
  std::uint64_t src = 0, dst = 0;
  std::uint32_t bytes = 0;
};

/// What a bulk copy needs of its addresses and size.
constexpr std::uint64_t bulk_alignment = 16;

/// Whether bulk copies can move the piece.
PAGESTASH_BENCH_HD inline bool bulk_copyable(const BulkPiece& p) {
  return p.bytes >= 0 && (p.src | p.dst | static_cast<std::uint64_t>(p.bytes)) % bulk_alignment == 0;
}

/// Chunks of a piece: each `stage_bytes` (a multiple of 16), the last the rest.
PAGESTASH_BENCH_HD inline std::int64_t bulk_chunk_count(const BulkPiece& p, std::int64_t stage_bytes) {
  return (p.bytes + stage_bytes - 1) / stage_bytes;
}

/// Chunk `j` of a piece.
PAGESTASH_BENCH_HD inline BulkChunk bulk_chunk(const BulkPiece& p, std::int64_t j, std::int64_t stage_bytes) {
  const std::int64_t at = j * stage_bytes;
  const std::int64_t n = p.bytes - at < stage_bytes ? p.bytes - at : stage_bytes;
  return {p.src + static_cast<std::uint64_t>(at), p.dst + static_cast<std::uint64_t>(at),
          static_cast<std::uint32_t>(n)};
}

/// The first chunk of block `b` of `blocks` over `chunks` (block b's are [begin(b), begin(b + 1))).
PAGESTASH_BENCH_HD inline std::int64_t bulk_block_begin(std::int64_t chunks, std::int64_t blocks, std::int64_t b) {
  return chunks / blocks * b + (b < chunks % blocks ? b : chunks % blocks);
}

/// Where a walk over the chunks stands: chunk `chunk` of piece `piece`.
struct BulkCursor {
  std::int64_t piece = 0, chunk = 0;
};

/// The cursor of chunk `c`: `first[i]` is piece i's first chunk, `first[pieces]` the total (pieces with no bytes have
/// none: the search lands on the last piece that starts at or before `c`, which holds it).
PAGESTASH_BENCH_HD inline BulkCursor bulk_seek(const std::int64_t* first, std::int64_t pieces, std::int64_t c) {
  std::int64_t lo = 0, hi = pieces;  // the answer is in [lo, hi): first[lo] <= c < first[hi]
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (first[mid] <= c) lo = mid;
    else hi = mid;
  }
  return {lo, c - first[lo]};
}

/// The chunk at the cursor, and the cursor moved to the next one.
PAGESTASH_BENCH_HD inline BulkChunk bulk_next(const BulkPiece* pieces, const std::int64_t* first, std::int64_t count,
                                              BulkCursor& cur, std::int64_t stage_bytes) {
  const BulkChunk out = bulk_chunk(pieces[cur.piece], cur.chunk, stage_bytes);
  ++cur.chunk;
  while (cur.piece < count && first[cur.piece] + cur.chunk >= first[cur.piece + 1]) {
    ++cur.piece;
    cur.chunk = 0;
  }
  return out;
}

/// Each piece's first chunk, and the total last (bulk_seek's `first`).
inline std::vector<std::int64_t> bulk_first_chunks(const std::vector<BulkPiece>& pieces, std::int64_t stage_bytes) {
  std::vector<std::int64_t> first{0};
  for (const BulkPiece& p : pieces) first.push_back(first.back() + bulk_chunk_count(p, stage_bytes));
  return first;
}

}  // namespace pagestash_bench
