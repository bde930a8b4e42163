#pragma once
// The copy engine: how the bytes of one tile (stash/work.hpp) move between the buffer and
// the stream. Two movers over the same resolved tile (TileSpan, locate):
//
//   copy_tile_vectors  the lanes of a warp (the kernels; the grid emulator runs it on host
//                      threads). Lane i takes the tile's 16-byte stream vectors i, i + 32, ...;
//                      a vector may hold bytes of several short lines. The stream side is
//                      always a whole, aligned vector (a tile starts on 16 bytes and never
//                      straddles a page); the buffer side is a whole vector when it is
//                      aligned alike, else it is gathered from (stash) or scattered to
//                      (reload) its runs with aligned 4-byte words and funnel shifts, and
//                      byte stores at the edges: no byte outside a live run is written.
//                      StashPolicy::loads_in_flight vectors per lane are loaded before
//                      they are stored, so that that many loads are in flight.
//   copy_tile_staged   the lanes of a warp, for a tile of short lines (runs of at most
//                      StashPolicy::staged_max_run bytes, line starts on 16 bytes): lanes map
//                      to (line, 16-byte chunk) and load aligned chunks from the line starts,
//                      staged_loads a lane, all independent (dense lines: two halves); the warp
//                      compacts their live bytes in its stage (shared memory; the grid
//                      emulator's per-warp host buffer)
//                      and stores whole, aligned stream vectors from it. A reload loads the
//                      stream's vectors into the stage and stores exactly the live bytes,
//                      each sector by one store instruction: a line's whole sectors as
//                      vectors, the bytes past its last sector boundary (dense lines: every
//                      byte) a byte a lane. Rounds of lines that fit the stage, a ring: the stream
//                      vector across two rounds waits there for the second.
//   copy_tile_pieces   one host thread (the host executor): the same pieces, each line's run
//                      a memcpy, which is what a CPU copies fastest; where a line's dead rest
//                      is a cache line or two, those are prefetched, so that the CPU's
//                      prefetcher sees one dense stream.
//
// A stash writes the stream's padding after a segment (up to 15 bytes) as zeros: page bytes don't depend on the mover.

#include <pagestash/detail/atomics.hpp>
#include <pagestash/stash/policy.hpp>
#include <pagestash/stash/work.hpp>

#include <cuda/std/type_traits>

#include <cstring>

// Host code under AddressSanitizer (g++ says so by __SANITIZE_ADDRESS__, clang by __has_feature): prefetch_to_l2's
// check.
#if !defined(__CUDA_ARCH__) && defined(__SANITIZE_ADDRESS__)
#  define PAGESTASH_ASAN 1
#elif !defined(__CUDA_ARCH__) && defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define PAGESTASH_ASAN 1
#  endif
#endif
#if defined(PAGESTASH_ASAN)
#  include <sanitizer/asan_interface.h>
#endif

PAGESTASH_NAMESPACE_BEGIN

/// What a tile's copy does.
enum class TileOp : int { stash, reload, zero };

/// Whether a host thread prefetches the dead cache lines between runs: a CPU's stream prefetcher runs ahead of a dense
/// stream of lines, not of one with holes, so where the dead rest of each line is one or two cache lines, reading it
/// too is faster (NVFP4 columnwise data at 128 tokens per expert, a 128-byte pitch with every other cache line live: up
/// to 1.2x from memory, docs/benchmarks.md).
inline bool prefetches_dead_lines(cuda::std::uint32_t run, cuda::std::int64_t pitch) {
  return pitch - run >= 64 && pitch - run <= 128;
}

/// Prefetches the whole cache lines in the dead rest of the line whose run starts at `at`.
inline void prefetch_dead_lines(const unsigned char* at, cuda::std::uint32_t run, cuda::std::int64_t pitch) {
#if defined(__GNUC__)
  const auto end = reinterpret_cast<cuda::std::uintptr_t>(at) + static_cast<cuda::std::uintptr_t>(pitch);
  for (auto line = (reinterpret_cast<cuda::std::uintptr_t>(at) + run + 63) / 64 * 64; line + 64 <= end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line));
#else
  (void)at, (void)run, (void)pitch;
#endif
}

/// A lane's access to the buffer or the pages, as a host observer sees it (vector_observer): a load or store of
/// `bytes` (a store at address null: the lane's store instruction ran with the lane off, so that its count of
/// instructions stays in step with its warp's), the start of a span (address null, `bytes` the plan's index of its
/// first tile), after which the lanes of a warp make their accesses in step again, or a use (address null): the lane
/// uses the values it loaded before it loads again, as a store of them does (a round, docs/design.md's glossary), or a
/// prefetch of `bytes` bytes (prefetch_to_l2: a hint, no access in the memory model).
enum class VectorAccess : int { load, store, tile, use, prefetch };

#if !defined(__CUDA_ARCH__)
using VectorObserver = void (*)(const void* address, int bytes, VectorAccess access, void* context);
using VectorObserverSlot = ObserverSlot<VectorObserver>;

/// The process's observer of the lanes' loads and stores on the host (the grid emulator: the host executor's copies are
/// its own), so that a benchmark counts the sectors a warp's access touches without a GPU. Set it only while no
/// operation runs.
inline VectorObserverSlot& vector_observer() {
  static VectorObserverSlot slot;
  return slot;
}
#endif

namespace detail {

/// Tells the host's vector observer of an access; nothing on the device.
PAGESTASH_HOST_DEVICE inline void observe_vector(const void* address, int bytes, VectorAccess access) {
#if !defined(__CUDA_ARCH__)
  VectorObserverSlot& slot = vector_observer();
  if (const VectorObserver f = slot.observer.load(std::memory_order_relaxed)) f(address, bytes, access, slot.context);
#else
  (void)address, (void)bytes, (void)access;
#endif
}

/// Bytes (16 or 8) as little-endian words (CUDA's hosts are little-endian), held in registers between a load and a
/// store: a copy's vector, or a compressed unit's 8 codes (stash/compress.hpp).
template <int Bytes>
struct Vector {
  cuda::std::uint32_t w[Bytes / 4];
};
using Vector16 = Vector<16>;
using Vector8 = Vector<8>;

/// Aligned bytes, read once (the buffer on stash, the pages on reload): on the device, evict-first (ld.global.cs).
template <int Bytes>
PAGESTASH_HOST_DEVICE Vector<Bytes> load_vector(const unsigned char* src) {
  static_assert(Bytes == 16 || Bytes == 8);
  observe_vector(src, Bytes, VectorAccess::load);
#if defined(__CUDA_ARCH__)
  if constexpr (Bytes == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(src));
    return {{u.x, u.y, u.z, u.w}};
  } else {
    const uint2 u = __ldcs(reinterpret_cast<const uint2*>(src));
    return {{u.x, u.y}};
  }
#else
  Vector<Bytes> x;
  std::memcpy(x.w, src, Bytes);
  return x;
#endif
}

/// A hint that the n bytes at p (16-byte aligned, n a multiple of 16, in one allocation) are read soon: on the device
/// (sm_90 on) one bulk prefetch into L2 (cp.async.bulk.prefetch.L2, written out: CCCL 3.0's cuda::ptx lacks it), no
/// access in the memory model and no register waiting on it; on the host it is observed (vector_observer), and under
/// AddressSanitizer its bytes must be addressable, as a GPU needs its range to be mapped (it reads nothing: no race).
PAGESTASH_HOST_DEVICE inline void prefetch_to_l2(const unsigned char* p, cuda::std::uint32_t n) {
  observe_vector(p, static_cast<int>(n), VectorAccess::prefetch);
#if defined(__CUDA_ARCH__)
#  if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n));
#  else
  (void)p, (void)n;
#  endif
#elif defined(PAGESTASH_ASAN)
  // A range ASan does not own (it is not the heap's: a pool's mapped arena) has no poisoned byte.
  if (const void* bad = __asan_region_is_poisoned(const_cast<unsigned char*>(p), n))
    (void)*static_cast<const volatile unsigned char*>(bad);  // ASan's report, at the first byte a GPU could not map
#else
  (void)p, (void)n;
#endif
}

/// Aligned bytes. Pages are read much later (evict-first, st.global.cs), a reloaded buffer soon (plain store).
template <int Bytes>
PAGESTASH_HOST_DEVICE void store_vector(unsigned char* dst, const Vector<Bytes>& x, bool read_soon) {
  static_assert(Bytes == 16 || Bytes == 8);
  observe_vector(dst, Bytes, VectorAccess::store);
#if defined(__CUDA_ARCH__)
  if constexpr (Bytes == 16) {
    const uint4 u = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
    if (read_soon) __stwb(reinterpret_cast<uint4*>(dst), u);  // global, said not inferred (else ptxas may emit ST)
    else __stcs(reinterpret_cast<uint4*>(dst), u);
  } else {
    const uint2 u = make_uint2(x.w[0], x.w[1]);
    if (read_soon) __stwb(reinterpret_cast<uint2*>(dst), u);
    else __stcs(reinterpret_cast<uint2*>(dst), u);
  }
#else
  (void)read_soon;
  std::memcpy(dst, x.w, Bytes);
#endif
}

/// The low word of (hi:lo) >> bits, bits < 32.
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t funnel_shift_right(cuda::std::uint32_t lo, cuda::std::uint32_t hi,
                                                                    unsigned bits) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, bits);
#else
  return bits == 0 ? lo : (lo >> bits) | (hi << (32 - bits));
#endif
}

/// Bytes [0, n) of x, the others zero.
PAGESTASH_HOST_DEVICE inline Vector16 keep_bytes(Vector16 x, unsigned n) {
  PAGESTASH_UNROLL
  for (unsigned k = 0; k < 4; ++k) {
    if (n <= 4 * k) x.w[k] = 0;
    else if (n < 4 * k + 4) x.w[k] &= (cuda::std::uint32_t{1} << (8 * (n - 4 * k))) - 1;
  }
  return x;
}

/// x moved up (to byte 15) or down by `bytes` < 16, zeros in. A run-time index into x.w would put x in local memory.
PAGESTASH_HOST_DEVICE inline Vector16 shift_bytes(const Vector16& x, unsigned bytes, bool up) {
  cuda::std::uint64_t lo = x.w[0] | cuda::std::uint64_t{x.w[1]} << 32, hi = x.w[2] | cuda::std::uint64_t{x.w[3]} << 32;
  const unsigned b = 8 * bytes;
  if (b >= 64) {
    if (up) hi = lo << (b - 64), lo = 0;
    else lo = hi >> (b - 64), hi = 0;
  } else if (b > 0) {
    if (up) hi = hi << b | lo >> (64 - b), lo <<= b;
    else lo = lo >> b | hi << (64 - b), hi >>= b;
  }
  return {{static_cast<cuda::std::uint32_t>(lo), static_cast<cuda::std::uint32_t>(lo >> 32),
           static_cast<cuda::std::uint32_t>(hi), static_cast<cuda::std::uint32_t>(hi >> 32)}};
}

/// 4 bytes at an aligned `word`, as a word (evict-first on the device: read once).
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t load_word(const unsigned char* word) {
  observe_vector(word, 4, VectorAccess::load);
#if defined(__CUDA_ARCH__)
  return __ldcs(reinterpret_cast<const unsigned int*>(word));
#else
  cuda::std::uint32_t w;
  std::memcpy(&w, word, 4);
  return w;
#endif
}

/// Bytes [0, n) (n < 4) of the aligned word at `word`, zero above: a 2-byte and a byte load, so nothing after is read.
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t load_word_head(const unsigned char* word, unsigned n) {
  cuda::std::uint32_t w = 0;
  if (n >= 2) observe_vector(word, 2, VectorAccess::load);
  if (n % 2 == 1) observe_vector(word + n - 1, 1, VectorAccess::load);
#if defined(__CUDA_ARCH__)
  if (n >= 2) w = __ldcs(reinterpret_cast<const unsigned short*>(word));
  if (n % 2 == 1) w |= cuda::std::uint32_t{__ldcs(word + n - 1)} << (8 * (n - 1));
#else
  if (n >= 2) {
    cuda::std::uint16_t h;
    std::memcpy(&h, word, 2);
    w = h;
  }
  if (n % 2 == 1) w |= cuda::std::uint32_t{word[n - 1]} << (8 * (n - 1));
#endif
  return w;
}

/// The n (1..16) bytes at src, any alignment, as bytes [0, n) of a vector (zero above): the aligned 4-byte words from
/// the one that holds src, shifted into place. A word that ends past the run's last byte is read only up to it
/// (load_word_head): that byte may be the buffer's last, and nothing after it is the caller's. Bytes before src in the
/// first word are the buffer's (buffers start on 16 bytes). The device and the host make the same loads, so that the
/// grid emulator under ASan sees what a GPU reads.
PAGESTASH_HOST_DEVICE inline Vector16 load_bytes(const unsigned char* src, unsigned n) {
  const auto offset = static_cast<unsigned>(reinterpret_cast<cuda::std::uintptr_t>(src) % 4);
  const unsigned char* first = src - offset;
  const unsigned end = offset + n;  // of the wanted bytes, from `first`
  cuda::std::uint32_t words[5];
  PAGESTASH_UNROLL
  for (unsigned k = 0; k < 5; ++k) {
    if (4 * k + 4 <= end) words[k] = load_word(first + 4 * k);
    else words[k] = 4 * k < end ? load_word_head(first + 4 * k, end - 4 * k) : 0u;
  }
  Vector16 out;
  PAGESTASH_UNROLL
  for (unsigned k = 0; k < 4; ++k) out.w[k] = funnel_shift_right(words[k], words[k + 1], 8 * offset);
  return keep_bytes(out, n);
}

/// An aligned word, half-word or byte of a buffer's line (a reload's exact stores), observed as store_vector's are;
/// where `on` is false, none (the lane is off for this store: observed as such).
template <class Unit>
PAGESTASH_HOST_DEVICE void store_unit(unsigned char* dst, Unit u, bool on = true) {
  if (!on) return observe_vector(nullptr, sizeof(Unit), VectorAccess::store);
#if defined(__CUDA_ARCH__)
  __stwb(reinterpret_cast<Unit*>(dst), u);
#else
  std::memcpy(dst, &u, sizeof(Unit));
#endif
  observe_vector(dst, sizeof(Unit), VectorAccess::store);
}

/// The bytes of x that `mask` selects (bit b: byte b) to dst on 16 bytes; no other byte is written. Every aligned 16,
/// 8, 4 or 2 bytes the mask fills is one store, the rest single bytes: a line's piece of n bytes from a chunk's start
/// takes one store for each power of two in n (store_bytes takes up to 6), a whole chunk one. Constant indices only.
/// Each store is a place in the lane's instructions, made or (observed) not, as its warp runs it.
PAGESTASH_HOST_DEVICE inline void store_masked(unsigned char* dst, const Vector16& x, cuda::std::uint32_t mask) {
  using u32 = cuda::std::uint32_t;
  observe_vector(nullptr, 0, VectorAccess::use);
  const bool whole = (mask & 0xFFFF) == 0xFFFF;
  if (whole) store_vector(dst, x, true);
  else observe_vector(nullptr, 16, VectorAccess::store);
  PAGESTASH_UNROLL
  for (u32 h = 0; h < 2; ++h) {
    const bool half = !whole && ((mask >> (8 * h)) & 0xFF) == 0xFF;
    if (half) store_vector(dst + 8 * h, Vector8{{x.w[2 * h], x.w[2 * h + 1]}}, true);
    else observe_vector(nullptr, 8, VectorAccess::store);
    PAGESTASH_UNROLL
    for (u32 q = 2 * h; q < 2 * h + 2; ++q) {
      const bool wider = whole || half, word = !wider && ((mask >> (4 * q)) & 0xF) == 0xF;
      store_unit(dst + 4 * q, x.w[q], word);
      PAGESTASH_UNROLL
      for (u32 k = 0; k < 4; k += 2) {
        const u32 pair = wider || word ? 0u : (mask >> (4 * q + k)) & 3, bits = x.w[q] >> (8 * k);
        store_unit(dst + 4 * q + k, static_cast<cuda::std::uint16_t>(bits), pair == 3);
        store_unit(dst + 4 * q + k, static_cast<unsigned char>(bits), pair == 1);
        store_unit(dst + 4 * q + k + 1, static_cast<unsigned char>(bits >> 8), pair == 2);
      }
    }
  }
}

/// Bytes [0, n) of x to dst, any alignment; no other byte is written. Whole words where dst
/// is 4-byte aligned, else bytes. Every index into x.w is a constant (unrolled loops, and a
/// shift for the last word): a run-time index would put x in local memory.
PAGESTASH_HOST_DEVICE inline void store_bytes(unsigned char* dst, const Vector16& x, unsigned n) {
  observe_vector(nullptr, 0, VectorAccess::use);  // x's loads are used here, then its word and byte stores
  if (reinterpret_cast<cuda::std::uintptr_t>(dst) % 4 == 0) {
    PAGESTASH_UNROLL
    for (unsigned k = 0; k < 4; ++k) store_unit(dst + 4 * k, x.w[k], 4 * k + 4 <= n);
    const unsigned whole = n / 4 * 4;
    const cuda::std::uint32_t last = shift_bytes(x, whole % 16, false).w[0];
    PAGESTASH_UNROLL
    for (unsigned b = 0; b < 3; ++b)
      store_unit(dst + whole + b, static_cast<unsigned char>(last >> (8 * b)), whole + b < n);
    return;
  }
  PAGESTASH_UNROLL
  for (unsigned b = 0; b < 16; ++b) store_unit(dst + b, static_cast<unsigned char>(x.w[b / 4] >> (8 * (b % 4))), b < n);
}

PAGESTASH_HOST_DEVICE inline bool aligned16(const unsigned char* p) {
  return reinterpret_cast<cuda::std::uintptr_t>(p) % 16 == 0;
}

/// fn(address, offset in vector, bytes) for each run piece of the n-byte vector at tile byte q (first: p, located).
template <class Fn>
PAGESTASH_HOST_DEVICE void for_each_run_piece(const TileSpan& s, cuda::std::uint32_t q, cuda::std::uint32_t n, Piece p,
                                              const Fn& fn) {
  for (cuda::std::uint32_t done = 0;;) {
    const cuda::std::uint32_t m = p.room < n - done ? p.room : n - done;
    fn(p.at, done, m);
    done += m;
    if (done >= n) return;
    p = locate(s, q + done);
  }
}

/// The n bytes of a vector at tile byte q (first piece p, located), gathered from their runs by word loads; zero above.
PAGESTASH_HOST_DEVICE inline Vector16 gather_vector(const TileSpan& s, cuda::std::uint32_t q, cuda::std::uint32_t n,
                                                    Piece p) {
  Vector16 x{};
  for_each_run_piece(s, q, n, p, [&](const unsigned char* at, cuda::std::uint32_t done, cuda::std::uint32_t m) {
    const Vector16 part = shift_bytes(load_bytes(at, m), done, true);
    observe_vector(nullptr, 0, VectorAccess::use);  // the next piece's loads wait for this one's: a round each
    PAGESTASH_UNROLL
    for (int k = 0; k < 4; ++k) x.w[k] |= part.w[k];
  });
  return x;
}

/// Bytes [0, n) of x to the runs of the vector at tile byte q (the first piece p, located).
PAGESTASH_HOST_DEVICE inline void scatter_vector(const TileSpan& s, cuda::std::uint32_t q, cuda::std::uint32_t n,
                                                 Piece p, const Vector16& x) {
  for_each_run_piece(s, q, n, p, [&](unsigned char* at, cuda::std::uint32_t done, cuda::std::uint32_t m) {
    store_bytes(at, shift_bytes(x, done, false), m);
  });
}

/// One vector of a tile, starting at byte q, however its bytes lie in the buffer.
PAGESTASH_HOST_DEVICE inline void move_vector(const TileSpan& s, TileOp op, cuda::std::uint32_t q) {
  const cuda::std::uint32_t n = s.bytes - q < 16 ? s.bytes - q : 16;
  const Piece first = locate(s, q);
  if (n == 16 && first.room >= 16 && aligned16(first.at)) {  // whole and aligned alike
    if (op == TileOp::stash) store_vector(s.stream + q, load_vector<16>(first.at), false);
    else store_vector(first.at, op == TileOp::reload ? load_vector<16>(s.stream + q) : Vector16{}, true);
    return;
  }
  if (op == TileOp::stash) {
    store_vector(s.stream + q, gather_vector(s, q, n, first), false);  // bytes past n: the segment's padding, zeros
    return;
  }
  scatter_vector(s, q, n, first, op == TileOp::reload ? load_vector<16>(s.stream + q) : Vector16{});
}

/// Whether every whole vector of the tile lies in one run, aligned alike: tile and line boundaries all on 16 bytes.
PAGESTASH_HOST_DEVICE inline bool tile_aligned(const TileSpan& s) {
  if (!aligned16(s.head)) return false;
  if (s.head_bytes == s.bytes) return true;
  return s.head_bytes % 16 == 0 && s.run % 16 == 0 && s.pitch % 16 == 0 && aligned16(s.body);
}

/// Whether each of the N vectors of a batch (tile bytes 16 v, 16 (v + stride), ...) lies in
/// one run with `room` bytes from its start; if not, the batch is moved a vector at a time.
template <cuda::std::uint32_t N>
PAGESTASH_HOST_DEVICE bool batch_in_runs(const TileSpan& s, TileOp op, cuda::std::uint32_t v,
                                         cuda::std::uint32_t stride, cuda::std::uint32_t room) {
  bool inside = true;
  PAGESTASH_UNROLL
  for (cuda::std::uint32_t k = 0; k < N; ++k) inside = inside && locate(s, 16 * (v + k * stride)).room >= room;
  if (!inside) {
    PAGESTASH_UNROLL
    for (cuda::std::uint32_t k = 0; k < N; ++k) move_vector(s, op, 16 * (v + k * stride));
  }
  return inside;
}

/// n bytes between non-overlapping ranges; short runs inline (often a few bytes: a libc call costs more than the copy).
inline void copy_run(unsigned char* dst, const unsigned char* src, cuda::std::uint32_t n) {
  if (n > 256) return static_cast<void>(std::memcpy(dst, src, n));
  if (n >= 16) {
    for (cuda::std::uint32_t i = 0; i + 16 < n; i += 16) std::memcpy(dst + i, src + i, 16);
    std::memcpy(dst + n - 16, src + n - 16, 16);  // may overlap the one before
  } else if (n >= 8) {
    std::memcpy(dst, src, 8);
    std::memcpy(dst + n - 8, src + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(dst, src, 4);
    std::memcpy(dst + n - 4, src + n - 4, 4);
  } else if (n >= 2) {
    std::memcpy(dst, src, 2);
    std::memcpy(dst + n - 2, src + n - 2, 2);
  } else if (n == 1) {
    dst[0] = src[0];
  }
}

/// Width tags for short runs: 16, 8 or 4 bytes.
template <unsigned W>
struct Width {
  static constexpr unsigned bytes = W;
};

/// No short-run path: every run is moved exactly.
struct ExactRuns {};

/// move(buffer address, tile offset, bytes) for each piece of the tile: the head, the whole runs, the rest. Unless
/// ShortRun is ExactRuns, `short_run(at, q, Width<W>{})` takes a whole run shorter than W bytes, W the widest of 16, 8
/// and 4 that the pitch holds, when W bytes from q are in the tile (and W bytes from `at` are in its line: pitch >= W).
template <class Move, class ShortRun = ExactRuns>
inline void for_each_piece(const TileSpan& s, const Move& move, const ShortRun& short_run = {}) {
  move(s.head, 0u, s.head_bytes);
  // In locals: the copies store through byte pointers that may alias `s`; the compiler would reload after every store.
  const cuda::std::uint32_t bytes = s.bytes, run = s.run;
  const cuda::std::int64_t pitch = s.pitch;
  cuda::std::uint32_t q = s.head_bytes;
  unsigned char* at = s.body;
  if constexpr (!cuda::std::is_same_v<ShortRun, ExactRuns>) {
    const auto short_runs = [&](auto width) {
      constexpr unsigned w = decltype(width)::bytes;
      for (; q + w <= bytes; q += run, at += pitch) short_run(at, q, width);
    };
    if (run < 16 && pitch >= 16) short_runs(Width<16>{});
    else if (run < 8 && pitch >= 8) short_runs(Width<8>{});
    else if (run < 4 && pitch >= 4) short_runs(Width<4>{});
  }
  const bool dense = prefetches_dead_lines(run, pitch);
  for (; q < bytes && bytes - q >= run; q += run, at += pitch) {
    if (dense) prefetch_dead_lines(at, run, pitch);
    move(at, q, run);
  }
  if (q < bytes) move(at, q, bytes - q);
}

}  // namespace detail

namespace detail {

/// Whether lanes of this kind stage through their warp's shared memory (they have sync_lanes()).
template <class Lanes, class = void>
struct Stages : cuda::std::false_type {};
template <class Lanes>
struct Stages<Lanes, cuda::std::void_t<decltype(cuda::std::declval<const Lanes&>().sync_lanes())>>
    : cuda::std::true_type {};

/// A staged tile's constants and round (copy_tile_staged). On the device the lanes keep them in their warp's copy in
/// shared memory, each lane writing the same values, and read them (volatile) where they are used: held in registers
/// across a round, they would leave too few for its loads (8 x 4 registers of data a lane).
struct StagedTile {
  unsigned char* line0;   ///< the line of the tile's first byte
  unsigned char* stream;  ///< the tile's first stream byte
  cuda::std::uint32_t run, col0, bytes, pitch;
  cuda::std::uint32_t lines, group;  ///< the tile's lines, and a round's
  cuda::std::uint32_t shift;         ///< lines on 16 bytes: 2^shift chunks a line
  cuda::std::uint32_t skew;          ///< dense: line0's offset from 16 bytes
  cuda::std::uint32_t per_pitch;     ///< dense: ShortDivisor(pitch).m
  bool dense;                        ///< lines not on 16 bytes, a short pitch
  cuda::std::uint32_t first, done;   ///< the round's first line; stream vectors the rounds before stored (loaded)
};

#if defined(__CUDA_ARCH__)
/// A warp's shared memory for staging: its stage, and its staged tile (one base address for both).
struct WarpStage {
  alignas(16) unsigned char bytes[StashPolicy::stage_bytes];
  StagedTile tile;
};
__device__ inline WarpStage& warp_stage() {
  __shared__ WarpStage stages[StashPolicy::warps_per_block];
  return stages[threadIdx.x / 32];
}
#endif

/// The warp's stage: StashPolicy::stage_bytes of shared memory on the device (one per warp of the block), the lanes'
/// own buffer on the host (the grid emulator's).
template <class Lanes>
PAGESTASH_HOST_DEVICE unsigned char* stage_of(const Lanes& lanes) {
#if defined(__CUDA_ARCH__)
  (void)lanes;
  return warp_stage().bytes;
#else
  return lanes.stage();
#endif
}

/// 16 aligned bytes of the stage (shared memory: not a global access, not observed).
PAGESTASH_HOST_DEVICE inline Vector16 load_staged(const unsigned char* at) {
#if defined(__CUDA_ARCH__)
  const uint4 u = *reinterpret_cast<const uint4*>(at);
  return {{u.x, u.y, u.z, u.w}};
#else
  Vector16 x;
  std::memcpy(x.w, at, 16);
  return x;
#endif
}
PAGESTASH_HOST_DEVICE inline void store_staged(unsigned char* at, const Vector16& x) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(at) = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
#else
  std::memcpy(at, x.w, 16);
#endif
}

}  // namespace detail

/// Whether copy_tile_staged can move the tile: a copy of short runs, not aligned alike, whose line starts (and so the
/// chunks it loads, up to the pitch) are on 16 bytes, or whose lines are dense (a short pitch: it loads the aligned
/// chunks over them). copy_tile_vectors stages such tiles when StashPolicy::staged and its lanes stage.
PAGESTASH_HOST_DEVICE inline bool tile_stageable(const TileSpan& s, TileOp op) {
  using namespace detail;
  if (op == TileOp::zero || s.run > StashPolicy::staged_max_run || tile_aligned(s)) return false;
  if (s.pitch > cuda::std::int64_t{0xFFFFFFFF}) return false;  // the mover keeps the pitch in 32 bits
  return (s.pitch % 16 == 0 && aligned16(s.body)) || s.pitch <= StashPolicy::staged_max_dense_pitch;
}

namespace detail {

/// The first n (1..15) bytes at `at`, zero above: a byte load each (the one chunk a round that the buffer may end in,
/// so nothing past them is read; few registers, where a lane holds its other chunks).
PAGESTASH_HOST_DEVICE inline Vector16 load_head(const unsigned char* at, unsigned n) {
  Vector16 x{};
  PAGESTASH_UNROLL
  for (unsigned b = 0; b < 15; ++b) {
    if (b >= n) continue;
    observe_vector(at + b, 1, VectorAccess::load);
#if defined(__CUDA_ARCH__)
    const cuda::std::uint32_t byte = __ldcs(at + b);
#else
    const cuda::std::uint32_t byte = at[b];
#endif
    x.w[b / 4] |= byte << (8 * (b % 4));
  }
  return x;
}

/// Word i of the stage's ring.
PAGESTASH_HOST_DEVICE inline cuda::std::uint32_t stage_word(const unsigned char* stage, cuda::std::uint32_t i) {
  const cuda::std::uint32_t at = 4 * (i & (StashPolicy::stage_bytes / 4 - 1));
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const cuda::std::uint32_t*>(stage + at);
#else
  cuda::std::uint32_t w;
  std::memcpy(&w, stage + at, 4);
  return w;
#endif
}

/// This lane's index in its warp, found again where it is used (on the device: not kept in a register).
template <class Lanes>
PAGESTASH_HOST_DEVICE cuda::std::uint32_t lane_of(const Lanes& lanes) {
#if defined(__CUDA_ARCH__)
  (void)lanes;
  cuda::std::uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
#else
  return static_cast<cuda::std::uint32_t>(lanes.rank());
#endif
}

/// One 16-byte chunk of a lane's in a staged round: its aligned address's offset from the tile's first line (the
/// address itself only where it is used: line0 is read again); its first byte's column in that byte's line (dense:
/// negative before the tile's first line) and stream byte, from the tile's first (negative before it). Lines on 16
/// bytes: one line a chunk, whose bytes [first, end) are the round's (none: first >= end).
struct StagedChunk {
  cuda::std::int64_t rel;
  cuda::std::int32_t col, pos;
  cuda::std::int32_t first, end;
};

/// A staged round of lines [first, end): its stream bytes [lo, hi), and its whole vectors end at `last`.
struct StagedRound {
  cuda::std::uint32_t first, end;
  cuda::std::int32_t lo, hi;
  cuda::std::uint32_t last;
};

/// The round from line `first` of tile t.
template <class Tile>
PAGESTASH_HOST_DEVICE StagedRound staged_round(const Tile& t, cuda::std::uint32_t first) {
  const cuda::std::uint32_t run = t.run, col0 = t.col0, bytes = t.bytes, lines = t.lines;
  StagedRound r;
  r.first = first;
  r.end = first + t.group < lines ? first + t.group : lines;
  const cuda::std::uint32_t hi = r.end * run - col0 < bytes ? r.end * run - col0 : bytes;
  r.hi = static_cast<cuda::std::int32_t>(hi);
  r.lo = first == 0 ? 0 : static_cast<cuda::std::int32_t>(first * run - col0);
  r.last = r.end == lines ? (bytes + 15) / 16 : hi / 16;
  return r;
}

/// Chunk j (of staged_loads) of lane `lane` of `width` in round r of tile t (`dense`: t.dense).
template <class Tile>
PAGESTASH_HOST_DEVICE StagedChunk staged_chunk(const Tile& t, const StagedRound& r, bool dense,
                                               cuda::std::uint32_t lane, cuda::std::uint32_t width,
                                               cuda::std::uint32_t j) {
  using u32 = cuda::std::uint32_t;
  using i32 = cuda::std::int32_t;
  const u32 run = t.run, col0 = t.col0, pitch = t.pitch;
  StagedChunk c;
  if (!dense) {
    const u32 shift = t.shift;
    u32 l, col;
    if (width % 16 == 0) {  // a warp: lane's chunks are in one column, width >> shift lines apart
      l = r.first + (lane >> shift) + j * (width >> shift);
      col = 16 * (lane & ((1u << shift) - 1));
    } else {
      const u32 k = lane + j * width;
      l = r.first + (k >> shift);
      col = 16 * (k & ((1u << shift) - 1));
    }
    c.rel = static_cast<cuda::std::int64_t>(static_cast<cuda::std::uint64_t>(l) * pitch + col);
    c.col = static_cast<i32>(col);
    c.pos = static_cast<i32>(l * run + col - col0);
    c.first = r.lo - c.pos > 0 ? r.lo - c.pos : 0;
    const i32 in_line = static_cast<i32>(run) - c.col, in_round = r.hi - c.pos;
    c.end = in_line < in_round ? in_line : in_round;
    if (c.end > 16) c.end = 16;
    return c;
  }
  const u32 skew = t.skew;
  const u32 from = r.first * pitch + (r.first == 0 ? col0 : 0);  // the round's first byte, from line0
  const i32 rel = static_cast<i32>(((from + skew) & ~15u) - skew + 16 * (lane + j * width));
  c.rel = rel;
  const i32 l = rel < 0 ? -1 : static_cast<i32>(ShortDivisor::kept(t.per_pitch).of(static_cast<u32>(rel)));
  c.col = rel - l * static_cast<i32>(pitch);
  c.pos = l * static_cast<i32>(run) + c.col - static_cast<i32>(col0);
  c.first = 0;
  c.end = 16;
  return c;
}

/// The bytes of chunk c that its lane loads: 16, 0 (none of the round's) or a head (dense: the buffer may end with the
/// round's last line).
template <class Tile>
PAGESTASH_HOST_DEVICE cuda::std::uint32_t staged_room(const Tile& t, const StagedRound& r, bool dense,
                                                      const StagedChunk& c) {
  using u32 = cuda::std::uint32_t;
  using i32 = cuda::std::int32_t;
  if (!dense) return c.first < c.end ? 16 : 0;
  const u32 run = t.run, pitch = t.pitch;
  const u32 last_live = t.bytes + t.col0 - (r.end - 1) * run;  // the round's last line's live bytes end here
  const i32 live_end = static_cast<i32>((r.end - 1) * pitch + (last_live < run ? last_live : run));
  const i32 line_end = static_cast<i32>(r.end * pitch);  // past it, the buffer may end
  const auto rel = static_cast<i32>(c.rel);
  return rel >= live_end ? 0u : static_cast<u32>(line_end - rel < 16 ? line_end - rel : 16);
}

/// fn(b, p) for each byte b of chunk c that is a live byte of round r, p its stream byte. A dense chunk's bytes walk
/// its lines (a column at the pitch starts the next line).
template <class Tile, class Fn>
PAGESTASH_HOST_DEVICE void for_each_staged_byte(const Tile& t, const StagedRound& r, bool dense, const StagedChunk& c,
                                                const Fn& fn) {
  using i32 = cuda::std::int32_t;
  if (!dense) {
    PAGESTASH_UNROLL
    for (i32 b = 0; b < 16; ++b)
      if (b >= c.first && b < c.end)
        fn(static_cast<cuda::std::uint32_t>(b), static_cast<cuda::std::uint32_t>(c.pos + b));
    return;
  }
  const auto run = static_cast<i32>(t.run), pitch = static_cast<i32>(t.pitch);
  i32 col = c.col, pos = c.pos;
  PAGESTASH_UNROLL
  for (cuda::std::uint32_t b = 0; b < 16; ++b) {
    if (col < run && pos >= r.lo && pos < r.hi) fn(b, static_cast<cuda::std::uint32_t>(pos));
    if (++col == pitch) col = 0, pos += run - pitch;
    ++pos;
  }
}

}  // namespace detail

/// The lanes of a warp move a tile of short lines through their stage (see the top of this file; tile_stageable). Each
/// phase of a round finds the lane's chunks again from the tile's constants (StagedTile), by shifts and multiplies (no
/// division), so that across the loads only the chunks' data are live.
template <class Lanes>
PAGESTASH_HOST_DEVICE void copy_tile_staged(const Lanes& lanes, const TileSpan& s, TileOp op) {
  using namespace detail;  // the vector and run helpers above
  using u32 = cuda::std::uint32_t;
  constexpr u32 loads = StashPolicy::staged_loads, ring = StashPolicy::stage_bytes;
  static_assert(ring % 16 == 0 && (ring & (ring - 1)) == 0 && StashPolicy::staged_max_run <= 256);
#if defined(__CUDA_ARCH__)
  volatile StagedTile& tile = warp_stage().tile;
#else
  StagedTile own;
  StagedTile& tile = own;
#endif
  unsigned char* const stage = stage_of(lanes);
  const u32 width = static_cast<u32>(lanes.size());
  {
    unsigned char* const line0 = s.body - s.pitch;
    const u32 run = s.run, col0 = static_cast<u32>(s.head - line0), bytes = s.bytes;
    const auto pitch = static_cast<u32>(s.pitch);  // under 2^32 (tile_stageable)
    // Lines on 16 bytes: each line's chunks, 2^shift a line (a power of two: a chunk's line and column are a shift and
    // a mask). Else (dense: a pitch of at most staged_max_dense_pitch) the aligned chunks over the round's lines, each
    // chunk's first line found by a multiply-high.
    const bool dense = !(pitch % 16 == 0 && aligned16(line0));
    const u32 shift = run <= 16 ? 0 : (run <= 32 ? 1 : (run <= 64 ? 2 : (run <= 128 ? 3 : 4)));
    const ShortDivisor per_run(run), per_pitch(pitch);
    // Lines a round: a chunk a load (dense: two more for the ends), and the round's bytes (with the vector carried
    // over) within the ring.
    const u32 by_lanes = dense ? per_pitch.of(16 * (width * loads - 2)) : (width * loads) >> shift;
    const u32 by_ring = per_run.of(ring - 32);
    tile.line0 = line0;
    tile.stream = s.stream;
    tile.run = run;
    tile.col0 = col0;
    tile.bytes = bytes;
    tile.pitch = pitch;
    tile.lines = per_run.of(col0 + bytes - 1) + 1;
    tile.group = by_lanes < by_ring ? by_lanes : by_ring;
    tile.shift = shift;
    tile.skew = static_cast<u32>(reinterpret_cast<cuda::std::uintptr_t>(line0) % 16);
    tile.per_pitch = per_pitch.m;
    tile.dense = dense;
    tile.first = 0;
    tile.done = 0;
  }
  // A round's lanes read the tile's constants no later than its barrier: past it, another lane may be writing the
  // next tile's.
  for (;;) {
    u32 last;
    if (op == TileOp::stash) {
      // The chunks' loads, then their live bytes into the stage; dense or not, a loop of its own (merged, the two
      // would hold both kinds' values at once). Dense chunks go in two halves: the walk over their lines' bytes needs
      // more registers than a lane has beside 8 chunks.
      const auto load_and_stage = [&](auto dense_tag) {
        constexpr bool dense = decltype(dense_tag)::value;
        constexpr u32 batch = dense ? loads / 2 : loads;
        PAGESTASH_UNROLL
        for (u32 h = 0; h < loads; h += batch) {
          Vector16 x[batch];
          {
            const StagedRound r = staged_round(tile, tile.first);
            PAGESTASH_UNROLL
            for (u32 i = 0; i < batch; ++i) {
              const StagedChunk c = staged_chunk(tile, r, dense, lane_of(lanes), width, h + i);
              const u32 room = staged_room(tile, r, dense, c);
              unsigned char* const at = tile.line0 + c.rel;
              if (room == 16) x[i] = load_vector<16>(at);
              else x[i] = room > 0 ? load_head(at, room) : Vector16{};  // the round's last line may end the buffer
            }
          }
          observe_vector(nullptr, 0, VectorAccess::use);
#if defined(__CUDA_ARCH__)
          __syncwarp();  // every load issued before a byte is staged: else ptxas sinks loads to their uses
#endif
          const StagedRound r = staged_round(tile, tile.first);
          PAGESTASH_UNROLL
          for (u32 i = 0; i < batch; ++i) {
            // A chunk not loaded has none of the round's bytes.
            const StagedChunk c = staged_chunk(tile, r, dense, lane_of(lanes), width, h + i);
            const Vector16 y = x[i];
            for_each_staged_byte(tile, r, dense, c, [&](u32 b, u32 p) {
              stage[p & (ring - 1)] = static_cast<unsigned char>(y.w[b / 4] >> (8 * (b % 4)));
            });
          }
        }
      };
      if (tile.dense) load_and_stage(cuda::std::true_type{});
      else load_and_stage(cuda::std::false_type{});
      lanes.sync_lanes();
      const StagedRound r = staged_round(tile, tile.first);
      const u32 bytes = tile.bytes;
      unsigned char* const stream = tile.stream;
      for (u32 v = tile.done + lane_of(lanes); v < r.last; v += width) {
        Vector16 y = load_staged(stage + ((16 * v) & (ring - 1)));
        if (16 * v + 16 > bytes) y = keep_bytes(y, bytes - 16 * v);  // the segment's padding: zeros
        store_vector(stream + 16 * v, y, false);
      }
      last = r.last;
    } else {
      {
        // The stream vectors under the round's bytes (the one it shares with the round before, again).
        const StagedRound r = staged_round(tile, tile.first);
        const u32 top = (static_cast<u32>(r.hi) + 15) / 16;
        unsigned char* const stream = tile.stream;
        constexpr u32 batch = ring / 16 / 32 > 0 ? ring / 16 / 32 : 1;
#if defined(__CUDA_ARCH__)
#  pragma unroll 1
#endif
        for (u32 v = tile.done + lane_of(lanes); v < top; v += batch * width) {
          Vector16 x[batch] = {};
          PAGESTASH_UNROLL
          for (u32 i = 0; i < batch; ++i)
            if (v + i * width < top) x[i] = load_vector<16>(stream + 16 * (v + i * width));
          observe_vector(nullptr, 0, VectorAccess::use);
          PAGESTASH_UNROLL
          for (u32 i = 0; i < batch; ++i)
            if (v + i * width < top) store_staged(stage + ((16 * (v + i * width)) & (ring - 1)), x[i]);
        }
      }
      lanes.sync_lanes();
      const StagedRound r = staged_round(tile, tile.first);
      if (tile.dense) {
        // Dense lines: lanes sweep the round's buffer bytes in sectors, a byte a lane, and store the live ones: each
        // sector is one store instruction's.
        const u32 pitch = tile.pitch, run = tile.run, col0 = tile.col0;
        const ShortDivisor per_pitch = ShortDivisor::kept(tile.per_pitch);
        const u32 skew = static_cast<u32>(reinterpret_cast<cuda::std::uintptr_t>(tile.line0) % 32);
        const u32 from = r.first * pitch + (r.first == 0 ? col0 : 0), to = (r.end - 1) * pitch + run;
        const auto start = static_cast<cuda::std::int32_t>(((from + skew) & ~31u) - skew);  // from line0, >= -31
        const u32 n = to - static_cast<u32>(start);
        for (u32 k0 = 0; k0 < n; k0 += width) {
          const u32 k = k0 + lane_of(lanes);
          const cuda::std::int32_t rel = start + static_cast<cuda::std::int32_t>(k);
          const u32 l = rel < 0 ? 0u : per_pitch.of(static_cast<u32>(rel)), col = static_cast<u32>(rel) - l * pitch;
          const auto p = static_cast<cuda::std::int32_t>(l * run + col - col0);
          const bool on = k < n && rel >= 0 && col < run && p >= r.lo && p < r.hi;
          store_unit(tile.line0 + rel, stage[static_cast<u32>(p) & (ring - 1)], on);
        }
      } else {
        // Lines on 16 bytes: a line's bytes up to its last sector boundary are whole chunks, stored as vectors (two
        // lanes' of one instruction a sector); its bytes past it (its tail: up to 31) are lanes' of one byte store,
        // 2^g lanes a line, so that every sector is written by one store instruction.
        const u32 run = tile.run, pitch = tile.pitch, col0 = tile.col0;
        const u32 skew0 = static_cast<u32>(reinterpret_cast<cuda::std::uintptr_t>(tile.line0) % 32), flip = pitch % 32;
        const auto tail_of = [run](u32 skew) {  // the tail of a line starting `skew` bytes into a sector (0 or 16)
          const u32 t = (skew + run) % 32;
          return t > run ? run : (t == 16 ? 0 : t);  // a whole chunk alone in its sector: a vector
        };
        PAGESTASH_UNROLL
        for (u32 j = 0; j < loads; ++j) {
          const StagedChunk c = staged_chunk(tile, r, false, lane_of(lanes), width, j);
          unsigned char* const at = tile.line0 + c.rel;
          const u32 skew =
              static_cast<u32>((reinterpret_cast<cuda::std::uintptr_t>(at) - static_cast<u32>(c.col)) % 32);
          if (c.first >= c.end || static_cast<u32>(c.col) >= run - tail_of(skew)) {
#if !defined(__CUDA_ARCH__)
            store_masked(at, Vector16{}, 0);  // the lane off for the chunk's stores, which its warp runs
#endif
            continue;
          }
          // One line's bytes, consecutive in the stream: the stage's words under them, shifted into place (bytes
          // before c.first, of another round or none, are read but not stored).
          const auto p = static_cast<u32>(c.pos);
          u32 words[5];
          PAGESTASH_UNROLL
          for (u32 i = 0; i < 5; ++i) words[i] = stage_word(stage, p / 4 + i);
          Vector16 y;
          PAGESTASH_UNROLL
          for (u32 i = 0; i < 4; ++i) y.w[i] = funnel_shift_right(words[i], words[i + 1], 8 * (p % 4));
          store_masked(at, y, (1u << c.end) - (1u << c.first));
        }
        const u32 even = tail_of(skew0), odd = tail_of(skew0 ^ flip), most = even > odd ? even : odd;
        const u32 g = most <= 1 ? 0 : (most <= 2 ? 1 : (most <= 4 ? 2 : (most <= 8 ? 3 : (most <= 16 ? 4 : 5))));
        const u32 n = most == 0 ? 0 : (r.end - r.first) << g;
        for (u32 k0 = 0; k0 < n; k0 += width) {
          const u32 k = k0 + lane_of(lanes), l = r.first + (k >> g), b = k & ((1u << g) - 1);
          const u32 tail = l % 2 == 0 ? even : odd, col = run - tail + b;
          const auto p = static_cast<cuda::std::int32_t>(l * run + col - col0);
          const bool on = k < n && b < tail && p >= r.lo && p < r.hi;
          store_unit(tile.line0 + static_cast<cuda::std::uint64_t>(l) * pitch + col,
                     stage[static_cast<u32>(p) & (ring - 1)], on);
        }
      }
      last = r.last;
    }
    const u32 next = tile.first + tile.group;
    const bool more = next < tile.lines;
    lanes.sync_lanes();  // the next round writes the stage
    if (!more) return;
    tile.first = next;
    tile.done = last;
  }
}

/// The lanes of a team move a tile's vectors (see the top of this file).
template <class Lanes>
PAGESTASH_HOST_DEVICE void copy_tile_vectors(const Lanes& lanes, const TileSpan& s, TileOp op) {
  using namespace detail;  // the vector and run helpers above
  if constexpr (Stages<Lanes>::value && StashPolicy::staged)
    if (tile_stageable(s, op)) return copy_tile_staged(lanes, s, op);
  constexpr cuda::std::uint32_t in_flight = StashPolicy::loads_in_flight;
  const cuda::std::uint32_t vectors = (s.bytes + 15) / 16, stride = static_cast<cuda::std::uint32_t>(lanes.size());
  auto v = static_cast<cuda::std::uint32_t>(lanes.rank());
  // Each loop loads in_flight whole vectors per lane, then stores them: the pointers may alias, so the compiler would
  // not hoist a load above an earlier store itself. A short last vector, and the vectors left over, go to move_vector.
  const auto whole_batch = [&] { return 16 * (v + (in_flight - 1) * stride) + 16 <= s.bytes; };
  if (tile_aligned(s)) {
    for (; whole_batch(); v += in_flight * stride) {
      // Buffer addresses are found where they are used, so that only the vectors stay live.
      Vector16 x[in_flight];
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < in_flight; ++k) {
        const cuda::std::uint32_t q = 16 * (v + k * stride);
        if (op == TileOp::stash) x[k] = load_vector<16>(locate(s, q).at);
        else if (op == TileOp::reload) x[k] = load_vector<16>(s.stream + q);
        else x[k] = Vector16{};
      }
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < in_flight; ++k) {
        const cuda::std::uint32_t q = 16 * (v + k * stride);
        if (op == TileOp::stash) store_vector(s.stream + q, x[k], false);
        else store_vector(locate(s, q).at, x[k], true);
      }
    }
  } else if (op != TileOp::stash) {
    // Scattered: the stream's vectors are whole and aligned, their stores are not. A batch whose vectors each lie in
    // one run (the common case) loads them all before it stores any; one across a run's end moves a vector at a time.
    for (; whole_batch(); v += in_flight * stride) {
      if (!batch_in_runs<in_flight>(s, op, v, stride, 16)) continue;
      Vector16 x[in_flight];
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < in_flight; ++k)
        x[k] = op == TileOp::reload ? load_vector<16>(s.stream + 16 * (v + k * stride)) : Vector16{};
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < in_flight; ++k) store_bytes(locate(s, 16 * (v + k * stride)).at, x[k], 16);
    }
  } else {
    constexpr cuda::std::uint32_t gather = StashPolicy::gather_vectors;
    // Gathered: a batch whose vectors each lie in one run with 4 bytes to spare (runs longer than a vector, the common
    // case) loads the 5 aligned words under each vector before it shifts and stores any; a batch at a run's end moves a
    // vector at a time. The words under a vector are the run's (room >= 20) or, before it, the buffer's (buffers start
    // on 16 bytes), as load_bytes reads them.
    for (; 16 * (v + (gather - 1) * stride) + 16 <= s.bytes; v += gather * stride) {
      if (!batch_in_runs<gather>(s, op, v, stride, 20)) continue;
      cuda::std::uint32_t words[gather][5];
      unsigned shift[gather];
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < gather; ++k) {
        const unsigned char* at = locate(s, 16 * (v + k * stride)).at;
        shift[k] = 8 * static_cast<unsigned>(reinterpret_cast<cuda::std::uintptr_t>(at) % 4);
        const unsigned char* first = at - shift[k] / 8;
        PAGESTASH_UNROLL
        for (int j = 0; j < 5; ++j) words[k][j] = load_word(first + 4 * j);
      }
#if defined(__CUDA_ARCH__)
      __syncwarp();  // every word issued before one is shifted: else ptxas for sm_90 shifts the first vector early
#endif
      Vector16 x[gather];
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < gather; ++k) {
        PAGESTASH_UNROLL
        for (int j = 0; j < 4; ++j) x[k].w[j] = funnel_shift_right(words[k][j], words[k][j + 1], shift[k]);
      }
      PAGESTASH_UNROLL
      for (cuda::std::uint32_t k = 0; k < gather; ++k) store_vector(s.stream + 16 * (v + k * stride), x[k], false);
    }
  }
  for (; v < vectors; v += stride) move_vector(s, op, 16 * v);
}

/// One host thread moves a tile, a line's run at a time (see the top of this file).
inline void copy_tile_pieces(const TileSpan& s, TileOp op) {
  using namespace detail;  // the vector and run helpers above
  using u32 = cuda::std::uint32_t;
  unsigned char* const stream = s.stream;
  if (op == TileOp::stash) {
    // A short run is copied as 16, 8 or 4 bytes: the next run overwrites the excess in the stream.
    for_each_piece(
        s, [stream](const unsigned char* at, u32 q, u32 m) { copy_run(stream + q, at, m); },
        [stream](const unsigned char* at, u32 q, auto width) { std::memcpy(stream + q, at, width.bytes); });
    if (s.last && s.bytes % 16 != 0) std::memset(s.stream + s.bytes, 0, 16 - s.bytes % 16);
  } else if (op == TileOp::reload) {
    // Exactly: no byte outside a live run is written.
    for_each_piece(s, [stream](unsigned char* at, u32 q, u32 m) { copy_run(at, stream + q, m); });
  } else {
    for_each_piece(s, [](unsigned char* at, u32, u32 m) { std::memset(at, 0, m); });
  }
}

PAGESTASH_HOST_DEVICE inline TileOp tile_op(const TileWork& w, const ItemCursor& c) {
  if (w.items[c.item].kind == WorkKind::zero) return TileOp::zero;
  return w.to_pages ? TileOp::stash : TileOp::reload;
}

PAGESTASH_NAMESPACE_END
