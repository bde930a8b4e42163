#pragma once
// The compressed stash's copy (layouts/compression.hpp): a tile of a compressed item is a run of blocks, each of units
// of 8 values. The lanes of a warp take two units each at a time (UnitLanes: an MXFP8 block over 4 consecutive lanes,
// an FP8 1x128 block over 8 for two loads), the block's amax shuffled among them: every load and store of the warp
// covers whole sectors, as the lossless copy's do. The host executor's one thread takes whole blocks in order. A
// block's codes are on the tile's page; its scale is in the segment's scales, after the codes.
//
// The quantizer is its own code, checked against reference/quantize.hpp bit for bit: the block's amax is the largest
// magnitude of the 16-bit source words (their order is the values' order; NaN and infinity sort above every finite
// value), and on the device the FP8 codes come from the hardware's conversions (cvt with satfinite, round to nearest
// even). The device and the host read and write the same bytes.

#include <pagestash/stash/bulk_copy.hpp>

#if defined(__CUDA_ARCH__)
#  include <cuda_bf16.h>
#  include <cuda_fp16.h>
#  include <cuda_fp8.h>
#endif

PAGESTASH_NAMESPACE_BEGIN

namespace detail {
/// The stream byte at position pos.
PAGESTASH_HOST_DEVICE inline unsigned char* stream_byte(const TileWork& w, cuda::std::int64_t pos) {
  return w.pool.page(w.page_ids[pos >> w.pool.page_shift]) + (pos & (w.pool.page_bytes - 1));
}

/// IEEE binary32 product (Op '*') or quotient ('/'), rounded to nearest even, subnormals kept: the codec's arithmetic.
/// In PTX on the device, so that the flags the user compiles the kernels with (--use_fast_math, -ftz=true,
/// -prec-div=false) cannot make them flush (a scale of 2^-127, a BF16 subnormal) or approximate (a division by
/// MUFU.RCP).
template <char Op>
PAGESTASH_HOST_DEVICE float ieee_rn(float a, float b) {
  static_assert(Op == '*' || Op == '/');
#if defined(__CUDA_ARCH__)
  float r;
  if constexpr (Op == '*') asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return Op == '*' ? a * b : a / b;
#endif
}
PAGESTASH_HOST_DEVICE inline float mul_rn(float a, float b) { return ieee_rn<'*'>(a, b); }
PAGESTASH_HOST_DEVICE inline float div_rn(float a, float b) { return ieee_rn<'/'>(a, b); }
}  // namespace detail

/// One tile of a compressed item, resolved.
struct CodedTile {
  unsigned char* buffer;           ///< the data buffer
  Segment segment;                 ///< the item's segment
  cuda::std::int64_t per_line;     ///< values a line holds (live)
  cuda::std::int64_t first;        ///< the tile's first value, in the item
  cuda::std::int64_t line;         ///< the first value's line (several lines: else 0)
  cuda::std::uint32_t col;         ///< and its column there (several lines)
  cuda::std::uint32_t per_line_m;  ///< ShortDivisor(min(per_line, 2^max_tile_shift)).m: value_at without a division
  cuda::std::uint32_t blocks;      ///< blocks of the tile
  unsigned char* codes;            ///< the tile's first code (one page holds every code of the tile)
  cuda::std::int64_t scales;       ///< stream position of the item's first scale
};

/// Resolves tile `tile` of a compressed item (Traits' data buffer is of 2-byte values); moves the cursor to its item.
template <class Compression>
PAGESTASH_HOST_DEVICE CodedTile resolve_coded_tile(const TileWork& w, ItemCursor& cursor, cuda::std::int32_t tile) {
  detail::seek_item(w, cursor, tile);
  cursor.grid = ItemCursor::grid_unknown;  // the codes' page is read after the item: not kept through the tile
  const WorkItem& item = w.items[cursor.item];
  CodedTile c;
  c.buffer = w.data;
  c.segment = item.segment;
  c.per_line = item.segment.live / 2;
  const cuda::std::int64_t values = item.segment.lines * c.per_line;
  // The tile's codes [first, end) of the item, on the stream's grid as a copy tile's (resolve_tile). Segments start on
  // compressed_alignment and tiles are larger: every tile starts on a block.
  const cuda::std::int64_t cell = ((item.stream >> w.tile_shift) + (tile - cursor.first)) << w.tile_shift;
  c.first = (cell > item.stream ? cell : item.stream) - item.stream;
  const cuda::std::int64_t next = cell + (cuda::std::int64_t{1} << w.tile_shift) - item.stream;
  c.blocks = static_cast<cuda::std::uint32_t>(((next < values ? next : values) - c.first) / Compression::block);
  c.line = 0, c.col = 0, c.per_line_m = 0;
  if (item.segment.lines > 1) {  // a segment of several lines holds less than 4 GiB: 32-bit division (copy.hpp)
    const auto first = static_cast<cuda::std::uint32_t>(c.first),
               per_line = static_cast<cuda::std::uint32_t>(c.per_line);
    c.line = first / per_line, c.col = first % per_line;
    constexpr cuda::std::uint32_t most = cuda::std::uint32_t{1} << max_tile_shift;  // a tile's values (a code a byte)
    c.per_line_m = detail::ShortDivisor(per_line < most ? per_line : most).m;
  }
  c.codes = detail::stream_byte(w, item.stream + c.first);
  c.scales = item.stream + detail::round_up(values, 16);
  return c;
}

namespace detail {

/// Where value o of a coded tile (from its first) is in the buffer: lines past the first by a multiply-high, exact as
/// o < 2^max_tile_shift (locate's), and the column carried over once.
PAGESTASH_HOST_DEVICE inline unsigned char* value_at(const CodedTile& c, cuda::std::uint32_t o) {
  if (c.segment.lines <= 1) return c.buffer + c.segment.line_offset(0) + 2 * (c.first + o);
  const auto per_line = static_cast<cuda::std::uint32_t>(c.per_line);
  cuda::std::uint32_t lines = ShortDivisor::kept(c.per_line_m).of(o), col = c.col + (o - lines * per_line);
  if (col >= per_line) col -= per_line, ++lines;
  return c.buffer + c.segment.line_offset(c.line + lines) + 2 * col;
}

/// The 16-bit source format's facts: the bits of infinity, and floor(log2) of a finite non-zero magnitude.
template <class T>
struct Source16 {
  static constexpr int mantissa_bits = cuda::std::is_same_v<T, BF16> ? 7 : 10;
  static constexpr int bias = cuda::std::is_same_v<T, BF16> ? 127 : 15;
  static constexpr cuda::std::uint32_t infinity = ((cuda::std::uint32_t{1} << (15 - mantissa_bits)) - 1)
                                                  << mantissa_bits;
  PAGESTASH_HOST_DEVICE static int floor_log2(cuda::std::uint32_t magnitude) {
    const int field = static_cast<int>(magnitude >> mantissa_bits);
    if (field != 0) return field - bias;
    return static_cast<int>(cuda::std::bit_width(magnitude)) - 1 - (bias - 1 + mantissa_bits);
  }
  PAGESTASH_HOST_DEVICE static float to_float(cuda::std::uint32_t bits) {
    if constexpr (cuda::std::is_same_v<T, BF16>) return float_from_bits(bits << 16);  // BF16: binary32's top half
#if defined(__CUDA_ARCH__)
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#else
    else return T::from_bits(static_cast<cuda::std::uint16_t>(bits)).to_float();
#endif
  }
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t from_float(float x) {
#if defined(__CUDA_ARCH__)
    if constexpr (cuda::std::is_same_v<T, BF16>) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    else return __half_as_ushort(__float2half_rn(x));
#else
    return T::from_float(x).bits;
#endif
  }
};

/// A block's scale, from its largest magnitude: what the codes are multiplied by (`encode`) and the stored bits.
template <class Format, class T>
struct BlockScale {
  float encode;
  cuda::std::uint32_t stored;  ///< E8M0 bits (MXFP8) or FP32 bits of 1 / encode (FP8Block128)
  bool finite;

  PAGESTASH_HOST_DEVICE static BlockScale of(cuda::std::uint32_t magnitude) {
    using S = Source16<T>;
    const bool finite = magnitude < S::infinity;
    if constexpr (cuda::std::is_same_v<Format, FP8Block128>) {
      float encode = magnitude == 0 ? 1.0f : div_rn(448.0f, S::to_float(magnitude));
      if (encode > cuda::std::numeric_limits<float>::max()) encode = cuda::std::numeric_limits<float>::max();
      return {encode, finite ? float_bits(div_rn(1.0f, encode)) : 0x7FC00000u, finite};
    } else {
      const int emax = cuda::std::is_same_v<typename Format::element_type, E4M3> ? 8 : 15;
      int e = magnitude == 0 ? -127 : S::floor_log2(magnitude) - emax;
      e = e < -127 ? -127 : (e > 127 ? 127 : e);
      return {exact_pow2(-e), finite ? static_cast<cuda::std::uint32_t>(e + 127) : 0xFFu, finite};
    }
  }
  /// The factor that dequantizes, from the stored bits.
  PAGESTASH_HOST_DEVICE static float decode(cuda::std::uint32_t stored) {
    if constexpr (cuda::std::is_same_v<Format, FP8Block128>) return float_from_bits(stored);
    else return stored == 0xFFu ? quiet_nan() : exact_pow2(static_cast<int>(stored) - 127);
  }
};

/// The largest magnitude of the 16-bit values in 16 bytes, as bits: above Source16::infinity - 1 when any is not
/// finite.
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t max_magnitude(const Vector16& x) {
  cuda::std::uint32_t m = 0;
  PAGESTASH_UNROLL
  for (int k = 0; k < 4; ++k) {
#if defined(__CUDA_ARCH__)
    m = __vmaxu2(m, x.w[k] & 0x7FFF7FFFu);
#else
    const cuda::std::uint32_t lo = x.w[k] & 0x7FFFu, hi = x.w[k] >> 16 & 0x7FFFu;
    m = ((m & 0xFFFFu) > lo ? m & 0xFFFFu : lo) | ((m >> 16) > hi ? m >> 16 : hi) << 16;
#endif
  }
  return (m & 0xFFFFu) > (m >> 16) ? m & 0xFFFFu : m >> 16;
}

/// Two floats as two FP8 codes (Element E4M3 or E5M2), round to nearest even, saturating: code a in the low byte. On
/// the device the hardware's conversion, on the host the codec it is tested against.
template <class Element>
PAGESTASH_HOST_DEVICE cuda::std::uint32_t fp8_pair(float a, float b) {
#if defined(__CUDA_ARCH__)
  constexpr __nv_fp8_interpretation_t kind = cuda::std::is_same_v<Element, E4M3> ? __NV_E4M3 : __NV_E5M2;
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
#else
  return Element::codec::encode(a) | Element::codec::encode(b) << 8;
#endif
}

/// Two FP8 codes (the low 16 bits of `pair`) as floats.
template <class Element>
PAGESTASH_HOST_DEVICE void fp8_unpair(cuda::std::uint32_t pair, float& a, float& b) {
#if defined(__CUDA_ARCH__)
  constexpr __nv_fp8_interpretation_t kind = cuda::std::is_same_v<Element, E4M3> ? __NV_E4M3 : __NV_E5M2;
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), kind)));
  a = f.x, b = f.y;
#else
  a = Element::codec::decode(pair & 0xFFu), b = Element::codec::decode(pair >> 8 & 0xFFu);
#endif
}

/// 16 bytes of source values (8) as 8 codes, in two words.
template <class Format, class T>
PAGESTASH_HOST_DEVICE Vector8 encode_vector(const Vector16& x, const BlockScale<Format, T>& s) {
  using S = Source16<T>;
  using Element = typename Format::element_type;
  Vector8 out;
  PAGESTASH_UNROLL
  for (int k = 0; k < 4; k += 2) {
    const cuda::std::uint32_t lo =
        fp8_pair<Element>(mul_rn(S::to_float(x.w[k] & 0xFFFFu), s.encode), mul_rn(S::to_float(x.w[k] >> 16), s.encode));
    const cuda::std::uint32_t hi = fp8_pair<Element>(mul_rn(S::to_float(x.w[k + 1] & 0xFFFFu), s.encode),
                                                     mul_rn(S::to_float(x.w[k + 1] >> 16), s.encode));
    out.w[k / 2] = s.finite ? (lo & 0xFFFFu) | hi << 16 : 0x7F7F7F7Fu;  // NaN codes for a block that is not finite
  }
  return out;
}

/// 8 codes (two words) as 16 bytes of values.
template <class Format, class T>
PAGESTASH_HOST_DEVICE Vector16 decode_vector(const Vector8& codes, float scale) {
  using S = Source16<T>;
  using Element = typename Format::element_type;
  Vector16 y;
  PAGESTASH_UNROLL
  for (int k = 0; k < 4; ++k) {
    float a, b;
    fp8_unpair<Element>(codes.w[k / 2] >> (16 * (k % 2)), a, b);
    y.w[k] = S::from_float(mul_rn(a, scale)) | S::from_float(mul_rn(b, scale)) << 16;
  }
  return y;
}

/// A unit of a coded tile: 8 consecutive values of one block (16 bytes of values, 8 codes).
inline constexpr cuda::std::uint32_t unit_values = 8;

/// Which unit a lane of a warp codes in each load of a batch: `group` lanes on one block take consecutive units, 32 /
/// group such groups on as many blocks in a row. MXFP8's block is 4 units, so 4 lanes cover it and each load covers 8
/// whole blocks, 512 consecutive bytes of values; an FP8 1x128 block is 16, so 8 lanes take 128 bytes of it in each of
/// two loads (whole lines) and a lane finds one scale a batch (two divisions). A lane codes two units a batch, not the
/// copy's loads_in_flight vectors: the values wait for their block's scale in registers (1024 threads an SM still keep
/// 32 KiB of loads in flight).
template <class Compression>
struct UnitLanes {
  static constexpr cuda::std::uint32_t per_block = Compression::block / unit_values;
  static constexpr cuda::std::uint32_t group = per_block > 4 ? 8 : 4;  ///< lanes on one block in one load
  static constexpr cuda::std::uint32_t rounds = per_block / group;     ///< loads a group takes for a block
  static constexpr cuda::std::uint32_t batch = 2;                      ///< a lane's loads before it codes
  static constexpr cuda::std::uint32_t blocks = batch / rounds;        ///< blocks a lane has in a batch
  static_assert(per_block % group == 0 && batch % rounds == 0);
  /// The block of the tile that lane `rank` of `lanes` lanes codes in load k of the batch from block `first`.
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t block(cuda::std::uint32_t first, cuda::std::uint32_t k,
                                                         cuda::std::uint32_t rank, cuda::std::uint32_t lanes) {
    return first + k / rounds * (lanes / group) + rank / group;
  }
  /// That lane's unit of the tile.
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t unit(cuda::std::uint32_t first, cuda::std::uint32_t k,
                                                        cuda::std::uint32_t rank, cuda::std::uint32_t lanes) {
    return block(first, k, rank, lanes) * per_block + k % rounds * group + rank % group;
  }
  /// Blocks the lanes take in one batch.
  PAGESTASH_HOST_DEVICE static cuda::std::uint32_t per_batch(cuda::std::uint32_t lanes) {
    return lanes / group * blocks;
  }
};

/// Where block k of a coded tile has its scale, in the stream.
template <class Compression>
PAGESTASH_HOST_DEVICE unsigned char* block_scale(const TileWork& w, const CodedTile& c, cuda::std::uint32_t k) {
  return stream_byte(w, c.scales + (c.first / Compression::block + k) * Compression::scale_bytes);
}

/// A block's stored scale (E8M0's byte, or FP32's word), written to the stream by a lane.
template <class Compression>
PAGESTASH_HOST_DEVICE void store_scale(unsigned char* at, cuda::std::uint32_t stored) {
  observe_vector(at, Compression::scale_bytes, VectorAccess::store);
#if defined(__CUDA_ARCH__)
  if constexpr (Compression::scale_bytes == 4) *reinterpret_cast<cuda::std::uint32_t*>(at) = stored;
  else *at = static_cast<unsigned char>(stored);
#else
  std::memcpy(at, &stored, Compression::scale_bytes);  // little-endian: the low byte is E8M0's
#endif
}

/// A block's stored scale, read by a lane.
template <class Compression>
PAGESTASH_HOST_DEVICE cuda::std::uint32_t load_scale(const unsigned char* at) {
  if constexpr (Compression::scale_bytes == 4) return load_word(at);
  observe_vector(at, 1, VectorAccess::load);
  return *at;
}

/// The lanes quantize a coded tile, a batch of units a lane at a time: a block's amax is the largest of its lanes'
/// (lanes.max_over), in one pass over the values.
template <class Compression, class T, class Lanes>
PAGESTASH_HOST_DEVICE void encode_units(const Lanes& lanes, const TileWork& w, const CodedTile& c) {
  using Format = typename Compression::format;
  using Map = UnitLanes<Compression>;
  const auto size = static_cast<cuda::std::uint32_t>(lanes.size()),
             rank = static_cast<cuda::std::uint32_t>(lanes.rank());
  for (cuda::std::uint32_t first = 0; first < c.blocks; first += Map::per_batch(size)) {  // as many trips every lane
    Vector16 x[Map::batch];
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t k = 0; k < Map::batch; ++k)
      x[k] = Map::block(first, k, rank, size) < c.blocks
                 ? load_vector<16>(value_at(c, unit_values * Map::unit(first, k, rank, size)))
                 : Vector16{};
    cuda::std::uint32_t m[Map::blocks] = {};
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t k = 0; k < Map::batch; ++k) {
      const cuda::std::uint32_t v = max_magnitude(x[k]);
      m[k / Map::rounds] = m[k / Map::rounds] > v ? m[k / Map::rounds] : v;
    }
    lanes.max_over(m, Map::group);  // a block's lanes: all past the tile's end, or none
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t j = 0; j < Map::blocks; ++j) {
      const cuda::std::uint32_t block = Map::block(first, j * Map::rounds, rank, size);
      if (block >= c.blocks) continue;
      const auto s = BlockScale<Format, T>::of(m[j]);
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t i = 0; i < Map::rounds; ++i) {
        const cuda::std::uint32_t k = j * Map::rounds + i;
        store_vector(c.codes + unit_values * Map::unit(first, k, rank, size), encode_vector<Format, T>(x[k], s), false);
      }
      if (rank % Map::group != 0) continue;
      store_scale<Compression>(block_scale<Compression>(w, c, block), s.stored);
    }
  }
}

/// The lanes dequantize a coded tile, a batch of units a lane at a time.
template <class Compression, class T, class Lanes>
PAGESTASH_HOST_DEVICE void decode_units(const Lanes& lanes, const TileWork& w, const CodedTile& c) {
  using Format = typename Compression::format;
  using Map = UnitLanes<Compression>;
  const auto size = static_cast<cuda::std::uint32_t>(lanes.size()),
             rank = static_cast<cuda::std::uint32_t>(lanes.rank());
  for (cuda::std::uint32_t first = 0; first < c.blocks; first += Map::per_batch(size)) {
    Vector8 codes[Map::batch] = {};
    float factor[Map::blocks] = {};
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t j = 0; j < Map::blocks; ++j) {
      const cuda::std::uint32_t block = Map::block(first, j * Map::rounds, rank, size);
      if (block >= c.blocks) continue;
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t i = 0; i < Map::rounds; ++i)
        codes[j * Map::rounds + i] =
            load_vector<8>(c.codes + unit_values * Map::unit(first, j * Map::rounds + i, rank, size));
      factor[j] = BlockScale<Format, T>::decode(load_scale<Compression>(block_scale<Compression>(w, c, block)));
    }
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t k = 0; k < Map::batch; ++k) {
      if (Map::block(first, k, rank, size) >= c.blocks) continue;
      const cuda::std::uint32_t u = Map::unit(first, k, rank, size);
      store_vector(value_at(c, unit_values * u), decode_vector<Format, T>(codes[k], factor[k / Map::rounds]), true);
    }
  }
}

#if !defined(__CUDA_ARCH__)
// GCC on x86-64 with glibc builds the host's coding loops for AVX2 and AVX-512 too, and the program takes the widest
// its CPU runs when it starts (an ifunc): the same code, as wide as the CPU allows. Not under a sanitizer, whose
// runtime is not up when the choice is made, nor with clang (no clones of templates).
#  if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
      !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#    define PAGESTASH_DETAIL_HOST_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#  else
#    define PAGESTASH_DETAIL_HOST_CLONES
#  endif

/// The host's quantizer: the same bytes read and written as the device's, in loops over the block's values that the
/// compiler vectorizes (the codec is branch-free).
template <class Format, class T>
PAGESTASH_DETAIL_HOST_CLONES void encode_block(const unsigned char* src, unsigned char* codes, unsigned char* scale) {
  using S = Source16<T>;
  using Element = typename Format::element_type;
  constexpr int n = Format::block_size;
  cuda::std::uint16_t x[n];
  std::memcpy(x, src, sizeof x);
  cuda::std::uint32_t m = 0;
  for (int i = 0; i < n; ++i) m = (x[i] & 0x7FFFu) > m ? x[i] & 0x7FFFu : m;
  const auto s = BlockScale<Format, T>::of(m);
  cuda::std::uint8_t out[n];
  for (int i = 0; i < n; ++i)
    out[i] = static_cast<cuda::std::uint8_t>(Element::codec::encode(S::to_float(x[i]) * s.encode));
  if (!s.finite) std::memset(out, 0x7F, sizeof out);  // NaN codes for a block that is not finite
  std::memcpy(codes, out, sizeof out);
  if constexpr (cuda::std::is_same_v<Format, FP8Block128>) std::memcpy(scale, &s.stored, 4);
  else *scale = static_cast<unsigned char>(s.stored);
}

/// The host's dequantizer, as encode_block.
template <class Format, class T>
PAGESTASH_DETAIL_HOST_CLONES void decode_block(const unsigned char* codes, const unsigned char* scale,
                                               unsigned char* dst) {
  using S = Source16<T>;
  using Element = typename Format::element_type;
  constexpr int n = Format::block_size;
  cuda::std::uint32_t stored;
  if constexpr (cuda::std::is_same_v<Format, FP8Block128>) std::memcpy(&stored, scale, 4);
  else stored = *scale;
  const float factor = BlockScale<Format, T>::decode(stored);
  cuda::std::uint8_t c[n];
  std::memcpy(c, codes, sizeof c);
  cuda::std::uint16_t y[n];
  for (int i = 0; i < n; ++i)
    y[i] = static_cast<cuda::std::uint16_t>(S::from_float(Element::codec::decode(c[i]) * factor));
  std::memcpy(dst, y, sizeof y);
}

/// The host executor's one thread codes a tile: the blocks in order, the line carried from block to block (no
/// division).
template <class Compression, class T>
void code_tile_serially(const TileWork& w, const CodedTile& c) {
  using Format = typename Compression::format;
  cuda::std::int64_t line = 0, col = c.first;
  if (c.segment.lines > 1) line = c.first / c.per_line, col = c.first % c.per_line;
  for (cuda::std::uint32_t k = 0; k < c.blocks; ++k, col += Compression::block) {
    for (; c.segment.lines > 1 && col >= c.per_line; col -= c.per_line) ++line;
    unsigned char* values = c.buffer + c.segment.line_offset(line) + 2 * col;
    unsigned char* codes = c.codes + cuda::std::int64_t{Compression::block} * k;
    unsigned char* scale = block_scale<Compression>(w, c, k);
    if (w.to_pages) encode_block<Format, T>(values, codes, scale);
    else decode_block<Format, T>(codes, scale, values);
  }
}
#endif

}  // namespace detail

/// The lanes of a warp quantize (stash) or dequantize (reload) the units of a compressed tile; the host executor's one
/// thread, its blocks.
template <class Compression, class T, class Lanes>
PAGESTASH_HOST_DEVICE void code_tile(const Lanes& lanes, const TileWork& w, const CodedTile& c) {
  if constexpr (cuda::std::is_same_v<Lanes, SerialTeam>) {
#if !defined(__CUDA_ARCH__)
    detail::code_tile_serially<Compression, T>(w, c);  // the host executor's; a device's lanes are a warp's
#endif
  } else if (w.to_pages) {
    detail::encode_units<Compression, T>(lanes, w, c);
  } else {
    detail::decode_units<Compression, T>(lanes, w, c);
  }
}

/// Moves tile `tile` with the lanes of a warp (or the one host thread), and the tiles after it before `until` that
/// resolve_tile spans with it: a compressed copy item's alone, by code_tile, any other by the copy engine. Returns the
/// tile after those it moved.
template <class Traits, class Lanes>
PAGESTASH_HOST_DEVICE cuda::std::int32_t run_tile(const Lanes& lanes, const TileWork& w, ItemCursor& cursor,
                                                  cuda::std::int32_t tile, cuda::std::int32_t until = 0) {
  using Compression = compression_of<Traits>;
  detail::observe_vector(nullptr, tile, VectorAccess::tile);
  if constexpr (Compression::compressed) {
    detail::seek_item(w, cursor, tile);
    if (w.items[cursor.item].kind == WorkKind::copy) {
      const CodedTile c = resolve_coded_tile<Compression>(w, cursor, tile);
      code_tile<Compression, typename Traits::layout::data_type>(lanes, w, c);
      return tile + 1;
    }
  }
  const TileSpan s = resolve_tile(w, cursor, tile, until);
  copy_tile<Traits>(lanes, s, tile_op(w, cursor));
  return tile + s.tiles;
}

PAGESTASH_NAMESPACE_END
