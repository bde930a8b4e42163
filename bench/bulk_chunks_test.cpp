// The TMA baseline's chunks (bulk_chunks.hpp), walked on the CPU as the kernel's blocks walk them: for several grids,
// every block's chunks copied with memcpy must write each live byte once, the same byte as a copy piece by piece,
// and nothing else; each chunk one bulk copy (16-byte aligned, a multiple of 16 bytes, at most a stage).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "bulk_chunks.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace pb = pagestash_bench;

namespace {

/// Random pieces over a source of `src_bytes` into destination regions that do not overlap (as pages), with gaps
/// between them; sizes multiples of 16, some empty, some several stages long.
std::vector<pb::BulkPiece> random_pieces(std::mt19937_64& rng, std::int64_t src_bytes, std::int64_t stage,
                                         std::int64_t& dst_bytes) {
  std::vector<pb::BulkPiece> out;
  std::int64_t dst = 0;
  const int count = 1 + static_cast<int>(rng() % 40);
  for (int i = 0; i < count; ++i) {
    std::int64_t bytes = 16 * static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(3 * stage / 16 + 2));
    if (rng() % 8 == 0) bytes = 0;
    const std::int64_t src =
        16 * static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>((src_bytes - bytes) / 16));
    dst += 16 * static_cast<std::int64_t>(rng() % 4);  // a gap that no chunk may write
    out.push_back({static_cast<std::uint64_t>(src), static_cast<std::uint64_t>(dst), bytes});
    dst += bytes;
  }
  dst_bytes = dst + 64;
  return out;
}

}  // namespace

TEST_CASE("bulk chunks: the blocks' chunks copy every live byte exactly once") {
  std::mt19937_64 rng(53);
  for (int round = 0; round < 200; ++round) {
    const std::int64_t stage = 16 * (1 + static_cast<std::int64_t>(rng() % 64));
    const std::int64_t src_bytes = 8 * stage + 4096;
    std::int64_t dst_bytes = 0;
    const std::vector<pb::BulkPiece> pieces = random_pieces(rng, src_bytes, stage, dst_bytes);
    std::vector<unsigned char> src(static_cast<std::size_t>(src_bytes));
    for (auto& b : src) b = static_cast<unsigned char>(1 + rng() % 255);
    // The oracle: each piece copied whole, onto poison.
    std::vector<unsigned char> expected(static_cast<std::size_t>(dst_bytes), 0);
    for (const pb::BulkPiece& p : pieces) {
      REQUIRE(pb::bulk_copyable(p));
      std::memcpy(expected.data() + p.dst, src.data() + p.src, static_cast<std::size_t>(p.bytes));
    }
    const std::vector<std::int64_t> first = pb::bulk_first_chunks(pieces, stage);
    const std::int64_t chunks = first.back();
    const auto count = static_cast<std::int64_t>(pieces.size());
    for (const std::int64_t blocks :
         {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, std::int64_t{7}, chunks > 0 ? chunks : 1, chunks + 5}) {
      CAPTURE(round);
      CAPTURE(stage);
      CAPTURE(blocks);
      std::vector<unsigned char> dst(static_cast<std::size_t>(dst_bytes), 0);
      std::vector<int> writes(static_cast<std::size_t>(dst_bytes), 0);
      std::int64_t walked = 0;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t c0 = pb::bulk_block_begin(chunks, blocks, b),
                           c1 = pb::bulk_block_begin(chunks, blocks, b + 1);
        REQUIRE(c0 <= c1);
        if (c0 == c1) continue;
        pb::BulkCursor cur = pb::bulk_seek(first.data(), count, c0);
        for (std::int64_t c = c0; c < c1; ++c) {
          const pb::BulkChunk k = pb::bulk_next(pieces.data(), first.data(), count, cur, stage);
          REQUIRE(k.bytes > 0);
          REQUIRE(k.bytes <= stage);
          REQUIRE((k.src | k.dst | k.bytes) % pb::bulk_alignment == 0);
          REQUIRE(k.dst + k.bytes <= static_cast<std::uint64_t>(dst_bytes));
          std::memcpy(dst.data() + k.dst, src.data() + k.src, k.bytes);
          for (std::uint64_t i = k.dst; i < k.dst + k.bytes; ++i) ++writes[i];
          ++walked;
        }
      }
      CHECK(walked == chunks);
      CHECK(pb::bulk_block_begin(chunks, blocks, blocks) == chunks);
      CHECK(dst == expected);
      // Each live byte written once, the gaps never.
      std::vector<int> live(static_cast<std::size_t>(dst_bytes), 0);
      for (const pb::BulkPiece& p : pieces)
        for (std::int64_t i = 0; i < p.bytes; ++i)
          live[static_cast<std::size_t>(p.dst) + static_cast<std::size_t>(i)] = 1;
      CHECK(writes == live);
    }
  }
}

TEST_CASE("bulk chunks: pieces a bulk copy cannot move are told apart") {
  CHECK(pb::bulk_copyable({0, 0, 0}));
  CHECK(pb::bulk_copyable({4096, 65536 + 32, 14336}));
  CHECK_FALSE(pb::bulk_copyable({8, 0, 16}));     // source
  CHECK_FALSE(pb::bulk_copyable({0, 4, 16}));     // destination
  CHECK_FALSE(pb::bulk_copyable({0, 0, 24}));     // size
  CHECK_FALSE(pb::bulk_copyable({16, 16, -16}));  // no bytes to speak of
}
