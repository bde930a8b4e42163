#pragma once
// StashRecord<Traits>: what one stashed grouped tensor keeps, in the pool's memory space, allocated once when the
// record is made (size from the view's shape): the counts the stash saw, the page ids, the work plan, the kept small
// buffers, and a state. The state makes a double reload, or a reload of a stash that overflowed, a refused reload:
// reported (the record's error, the pool's flag) and, with ReloadOptions::poison (the default), its destination
// written with NaN, never a silent stale copy.

#include <pagestash/pool/page_pool.hpp>
#include <pagestash/stash/work.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN

enum class RecordState : cuda::std::int32_t {
  empty = 0,       ///< never stashed
  stashed = 1,     ///< holds pages
  overflowed = 2,  ///< the stash found the pool full or the overflow flag set; holds nothing
  failed = 3,      ///< the stash found a count the view cannot hold; holds nothing
  reloaded = 4,    ///< pages copied back and returned
  discarded = 5,   ///< pages returned without copying
  stale = 6,       ///< (status(pool) only) stashed, but the pool was reset since: holds no pages of it
};

/// The state a stash leaves, from the failure it found (none: it holds pages): a lack of
/// room overflows it, a misuse (a count it cannot hold) fails it.
PAGESTASH_HOST_DEVICE constexpr RecordState state_after_stash(Flag error) {
  return error == Flag::none                            ? RecordState::stashed
         : category_of(error) == FlagCategory::capacity ? RecordState::overflowed
                                                        : RecordState::failed;
}

/// What a record's last operation left, which status() reads back: (type, name, initial, meaning)
/// a field; RecordSummary is made of it and for_each_field reads it (so does Python's status()).
#define PAGESTASH_RECORD_SUMMARY(X)                                                                                 \
  X(RecordState, state, RecordState::empty, "empty, stashed, overflowed, failed, reloaded, discarded or stale")     \
  X(Flag, error, Flag::none, "why the last operation did nothing (none: it did); a failed stash's reload keeps it") \
  X(cuda::std::int32_t, first_bad_group, -1, "with bad_counts: the first group whose count the view cannot hold")   \
  X(cuda::std::int32_t, generation, 0, "the pool's generation (resets so far) when last stashed")                   \
  X(cuda::std::int64_t, pages, 0, "pages the stash holds, device and host")                                         \
  X(cuda::std::int64_t, device_pages, 0, "of them on the device")                                                   \
  X(cuda::std::int64_t, stream_bytes, 0, "bytes the pages hold (segments padded to 16)")                            \
  X(cuda::std::int64_t, live_bytes, 0, "bytes of the live runs")
#define PAGESTASH_RECORD_FIELD(type, name, initial, meaning) type name = initial;

struct RecordSummary {
  PAGESTASH_RECORD_SUMMARY(PAGESTASH_RECORD_FIELD)
};

namespace detail {

#ifndef PAGESTASH_REMEMBERED_LAUNCHES
/// The refused launches a record remembers: 8 (at most). The launch protocol's exhaustive test builds with fewer, so
/// that small configurations reach the bound (tests/explorer).
#  define PAGESTASH_REMEMBERED_LAUNCHES 8
#endif

/// The words one kernel launch on a record coordinates through, on their own 128-byte line (blocks waiting for the
/// verdict poll it while the owner writes the header). `arrival` holds the newest launch to arrive (its id), whether it
/// was refused, and whether a launch holds the record; `remembered` the last refused launches (each by the block that
/// refused it), so that a refused launch's later blocks still find it refused after the word moves on
/// (execution/operation.hpp has the protocol). The
/// launch that takes the record publishes its id in `owner`, plans and publishes `verdict`; blocks claim tiles from
/// `next_tile`; the last block to finish releases the record. A launch that arrives while another holds the record is
/// refused as a whole: each of its blocks counts itself in `refused`, the pool's error flag (refused_launch) is raised,
/// and it does nothing (a reload poisons its destination: ReloadOptions::poison), so that an overlapping or
/// never-finished launch is reported, never a hang. Padded rather than over-aligned: caller memory need only be 16-byte
/// aligned (the words are on their own line when it is 128-byte aligned).
struct LaunchWords {
  static constexpr int remembered_launches = PAGESTASH_REMEMBERED_LAUNCHES;
  static_assert(remembered_launches >= 1 && remembered_launches <= 8, "PAGESTASH_REMEMBERED_LAUNCHES: 1 to 8");
  cuda::std::uint64_t arrival;   ///< newest launch id << 2 | refused (2) | held (1)
  cuda::std::uint64_t owner;     ///< the id of the launch that holds the record (0 once it released it)
  cuda::std::int64_t next_tile;  ///< the first tile no block has claimed yet
  cuda::std::uint64_t verdict;   ///< the verdict and, to copy, the plan's size: one load (operation.hpp's Start)
  cuda::std::int32_t refused;
  cuda::std::int32_t generation;  ///< the pool's generation when `owner` took the record
  cuda::std::uint32_t next_remembered;
  cuda::std::int32_t finished;
  cuda::std::uint64_t remembered[8];  ///< ids of the last remembered_launches refused launches
  unsigned char padding[16];
};
static_assert(sizeof(LaunchWords) == 128);
/// The bits of LaunchWords::arrival below the launch id.
inline constexpr cuda::std::uint64_t launch_held = 1, launch_refused = 2;
inline constexpr int launch_id_shift = 2;

/// FNV-1a over a string and its terminator, and over a word's bytes.
PAGESTASH_HOST_DEVICE constexpr cuda::std::uint64_t fnv1a(cuda::std::uint64_t h, const char* s) {
  for (;; ++s) {
    h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
    if (*s == '\0') return h;
  }
}
PAGESTASH_HOST_DEVICE constexpr cuda::std::uint64_t fnv1a(cuda::std::uint64_t h, cuda::std::uint64_t word) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((word >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h;
}

template <class Traits>
inline constexpr cuda::std::uint64_t traits_hash =
    fnv1a(fnv1a(fnv1a(fnv1a(fnv1a(14695981039346656037ull, Traits::layout::name), compression_of<Traits>::name),
                      static_cast<cuda::std::uint64_t>(Traits::data)),
                static_cast<cuda::std::uint64_t>(Traits::scales)),
          static_cast<cuda::std::uint64_t>(Traits::amax));
}  // namespace detail

/// What a record was made for: a hash of its traits (its layout's name, each buffer's handling, its compression) and
/// its shape. The record keeps it in its header; a reload and a discard compare their own (their traits' hash, a
/// constant of the kernel, and their view's shape) with it before they touch anything else, and the host a host
/// record's before a stash (checks.hpp), so that a record reached as another recipe, compression or shape (raw memory:
/// Python's ops take all three per call) is refused as misuse (Flag::record_mismatch), never read as what it is not. A
/// reload may write into a taller destination. A stash writes its own kind (a device record's is not compared first):
/// what the record holds and its kind are one.
struct RecordKind {
  cuda::std::uint64_t traits;
  cuda::std::int64_t max_tokens;
  cuda::std::int64_t hidden;
  cuda::std::int32_t groups;
  cuda::std::int32_t unused;
};

PAGESTASH_HOST_DEVICE constexpr bool operator==(const RecordKind& a, const RecordKind& b) {
  return a.traits == b.traits && a.max_tokens == b.max_tokens && a.hidden == b.hidden && a.groups == b.groups;
}

/// The kind of a record made for Traits and `shape`'s shape.
template <class Traits>
PAGESTASH_HOST_DEVICE constexpr RecordKind record_kind(const GroupedView<typename Traits::layout>& shape) {
  return RecordKind{detail::traits_hash<Traits>, shape.max_tokens, shape.hidden, shape.groups, 0};
}

namespace detail {
/// The record's header in the pool's memory space.
struct RecordHeader {
  RecordSummary summary;
  cuda::std::int64_t tiles;  ///< of the current operation's plan
  cuda::std::int32_t items;
  cuda::std::int32_t tile_shift;  ///< log2 of the plan's tile size
  cuda::std::uint64_t pool_id;    ///< the id of the pool the record was made for (detail::PoolState::id)
  RecordKind made_for;            ///< what it was made for, then stashed as: reloads and discards compare
  unsigned char padding[24];      ///< the launch words at offset 128
  LaunchWords launch;
};
static_assert(offsetof(RecordHeader, launch) == 128);
}  // namespace detail

/// A trivially copyable handle on a record's memory, passed by value to kernels.
struct RecordRef {
  detail::RecordHeader* header = nullptr;
  cuda::std::int32_t* counts = nullptr;
  WorkItem* items = nullptr;
  cuda::std::int32_t* page_ids = nullptr;
  unsigned char* kept = nullptr;  ///< kept buffers, in role order, each 16-byte aligned
};

/// What a record holds, read back on the host: the summary, then these fields.
#define PAGESTASH_RECORD_STATUS(X)                                                                                    \
  X(std::int64_t, host_pages, 0, "of the pages, on the host")                                                         \
  X(std::int32_t, refused_blocks, 0, "blocks of launches refused as another launch held the record (refused_launch)") \
  X(bool, launch_in_flight, false, "whether a launch holds the record now (after a sync: one that never finished)")

struct RecordStatus : RecordSummary {
  PAGESTASH_RECORD_STATUS(PAGESTASH_RECORD_FIELD)
};

template <class Fn>
void for_each_field(const RecordStatus& s, Fn&& fn) {  // fn(name, value) in the tables' order, the summary's first
#define PAGESTASH_RECORD_VISIT(type, name, initial, meaning) fn(#name, s.name);
  PAGESTASH_RECORD_SUMMARY(PAGESTASH_RECORD_VISIT) PAGESTASH_RECORD_STATUS(PAGESTASH_RECORD_VISIT)
}

struct WorkBounds {
  cuda::std::int64_t stream_bytes;  ///< of the largest stash
  cuda::std::int64_t tiles;         ///< most tiles a stash or reload (with zero_tail) can have
};

/// Bounds for a tensor of `shape`'s shape in pages of 2^page_shift bytes: stream bytes grow
/// with each segment, so the largest stash has every segment at its largest (which, for
/// packed placements, may take different counts for data and scales); a reload's zeroing is
/// largest with every count 0. The default page_shift stands for pages no smaller than a tile.
template <class Traits>
WorkBounds work_bounds(const GroupedView<typename Traits::layout>& shape, int page_shift = StashPolicy::tile_shift) {
  if (shape.max_tokens > INT32_MAX) detail::throw_invalid("StashRecord", "max_tokens exceeds 2^31 - 1");
  validate_compression<Traits>(shape);
  // Every count 0, kept per thread: a record attached per call (Python's ops) allocates nothing after the first.
  thread_local std::vector<cuda::std::int32_t> none;
  if (none.size() < static_cast<std::size_t>(shape.groups)) none.assign(static_cast<std::size_t>(shape.groups), 0);
  const int tile_shift =
      tile_shift_for(page_shift, StashPolicy::tile_shift);  // the device's, the smaller: the most tiles
  const WorkTotals most = plan_work_on_team<Traits>(SerialTeam{}, shape, LargestSegments{}, false, tile_shift, nullptr);
  const WorkBounds bounds{most.stream_bytes,
                          most.tiles + plan_work<Traits>(shape, none.data(), true, nullptr, tile_shift).tiles};
  for_each_token_role([&](BufferRole role) {
    const BufferGeometry geo = shape.geometry(role);
    if (handling_of<Traits>(role) != Handling::paged || geo.segment_count() == 0) return;
    const Segment seg = geo.largest_segment(0);
    if (seg.lines > 1 && seg.lines * seg.pitch > max_lined_segment_bytes)
      detail::throw_invalid("StashRecord", "a group's " + std::string(name_of(role)) + " block of " +
                                               std::to_string(seg.lines * seg.pitch) +
                                               " bytes exceeds 4 GiB (fewer tokens per group, or more groups)");
  });
  if (bounds.tiles > max_plan_tiles)
    detail::throw_invalid(
        "StashRecord", "a tensor of this shape needs " + std::to_string(bounds.tiles) + " tiles, more than 2^31 - 1");
  return bounds;
}

template <class Traits>
class StashRecord {
 public:
  using traits = Traits;
  using layout = typename Traits::layout;

  /// Allocates a record for tensors of `shape`'s shape (groups, max_tokens, hidden) in
  /// `pool`'s memory space. Only the shape of `shape` is read.
  StashRecord(const PagePool& pool, const GroupedView<layout>& shape)
      : StashRecord(pool, shape, nullptr, Memory::owned) {}

  /// A record in caller-owned memory: bytes_needed(pool, shape) bytes aligned to 16, in the pool's memory space. It
  /// allocates nothing, never frees the memory, and must not outlive it.
  StashRecord(const PagePool& pool, const GroupedView<layout>& shape, void* memory)
      : StashRecord(pool, shape, memory, Memory::borrowed) {}

  /// A record over caller-owned memory that already holds one of this shape, made for
  /// `pool`'s memory (PagePool::attach): the memory a record was made in, or a byte copy of
  /// it together with the pool's. Writes nothing; the record's state is the memory's. Its
  /// pool_id() is read from a host record's memory, and unknown (0) for a device record.
  static StashRecord attach(const PagePool& pool, const GroupedView<layout>& shape, void* memory) {
    return StashRecord(pool, shape, memory, Memory::attached);
  }

  /// Bytes of the memory a record of `shape`'s shape takes in `pool`'s memory space.
  static std::size_t bytes_needed(const PagePool& pool, const GroupedView<layout>& shape) {
    validate_shape(shape);
    const WorkBounds most = work_bounds<Traits>(shape, pool.ref().page_shift);
    return parts_of(shape, pages_for(most.stream_bytes, pool.config().page_bytes)).total;
  }

  /// The bytes of a record's header: an operation on memory made for another kind of record reads these alone.
  static constexpr std::size_t header_bytes = sizeof(detail::RecordHeader);

  StashRecord(StashRecord&&) noexcept = default;
  StashRecord& operator=(StashRecord&&) noexcept = default;

  const RecordRef& ref() const { return ref_; }
  /// The id of the pool the record was made for (detail::RecordHeader::pool_id); 0 where the host
  /// does not know it (an attached device record).
  std::uint64_t pool_id() const { return pool_id_; }
  MemorySpace space() const { return space_; }
  /// The shape the record was made for (pointers and counts are not kept).
  cuda::std::int32_t groups() const { return shape_.groups; }
  cuda::std::int64_t max_tokens() const { return shape_.max_tokens; }
  cuda::std::int64_t hidden() const { return shape_.hidden; }
  /// The record's shape: a view with no buffers or counts (what discard launches with).
  GroupedView<layout> shape() const {
    GroupedView<layout> v;
    v.groups = shape_.groups;
    v.max_tokens = shape_.max_tokens;
    v.hidden = shape_.hidden;
    return v;
  }
  /// Pages the largest stash of this shape takes.
  cuda::std::int64_t max_pages() const { return max_pages_; }
  /// Most tiles a stash or reload (with zero_tail) of this shape can have (WorkBounds::tiles).
  cuda::std::int64_t max_tiles() const { return max_tiles_; }
  /// log2 of the pool's page size, which the record's plans are cut by.
  int page_shift() const { return page_shift_; }
  /// The bytes allocated for the record.
  std::size_t bytes() const { return memory_.bytes(); }
  /// The counts the last stash saw (in the pool's memory space; read them on the device).
  const cuda::std::int32_t* counts() const { return ref_.counts; }
  /// Reads the header back. A device record synchronises the whole device first; a host
  /// record may not be in use by another thread meanwhile.
  RecordStatus status() const {
    if (space_ == MemorySpace::device) PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
    detail::RecordHeader h{};
    detail::copy_bytes(space_, &h, ref_.header, sizeof(h), true);
    RecordStatus s;
    static_cast<RecordSummary&>(s) = h.summary;
    s.host_pages = h.summary.pages - h.summary.device_pages;
    s.refused_blocks = h.launch.refused;
    s.launch_in_flight = (h.launch.arrival & detail::launch_held) != 0;
    return s;
  }

  /// status(), with `stale` in place of `stashed` when `pool` (the record's) was reset since
  /// the stash: the record's page ids are no longer its own (status() alone cannot know).
  RecordStatus status(const PagePool& pool) const {
    if (!same_pool(pool)) detail::throw_invalid("StashRecord::status", "the record was made for another pool");
    RecordStatus s = status();
    if (s.state == RecordState::stashed && s.generation != pool.stats().generation) s.state = RecordState::stale;
    return s;
  }

  /// Whether a stash of this record's kind may write into its memory (false: a host record attached to memory that was
  /// made for another kind; check_stash refuses it).
  bool stashable() const { return stashable_; }
  /// Whether the record may be of `pool`, as far as the host knows: false only when both ids
  /// are known and differ (the steps compare the ids in memory anyway).
  bool same_pool(const PagePool& pool) const { return pool_id_ == 0 || pool.id() == 0 || pool_id_ == pool.id(); }

  /// The page ids the record holds (empty unless stashed). Same synchronisation as status().
  std::vector<std::int32_t> page_ids() const {
    const RecordStatus s = status();
    std::vector<std::int32_t> ids(s.state == RecordState::stashed ? static_cast<std::size_t>(s.pages) : 0);
    detail::copy_bytes(space_, ids.data(), ref_.page_ids, ids.size() * sizeof(std::int32_t), true);
    return ids;
  }

 private:
  static std::size_t round16(std::size_t n) { return detail::round_up(n, 16); }

  /// Where each part of a record's memory starts, and its size.
  struct Parts {
    std::size_t counts_at, items_at, ids_at, kept_at, total;
  };
  static Parts parts_of(const GroupedView<layout>& shape, cuda::std::int64_t max_pages) {
    Parts p{};
    std::size_t offset = round16(sizeof(detail::RecordHeader));
    p.counts_at = offset;
    offset += round16(static_cast<std::size_t>(shape.groups) * sizeof(cuda::std::int32_t));
    p.items_at = offset;
    offset += round16(static_cast<std::size_t>(max_work_items(shape.groups)) * sizeof(WorkItem));
    // The kept buffers before the page ids, whose count grows with max_tokens: a reload into a taller destination
    // (Python's ops attach the record as the destination's shape) finds them where they were stashed.
    p.kept_at = offset;
    for_each_role([&](BufferRole role) {
      if (handling_of<Traits>(role) == Handling::kept)
        offset += round16(static_cast<std::size_t>(shape.buffer_bytes(role)));
    });
    p.ids_at = offset;
    offset += round16(static_cast<std::size_t>(max_pages) * sizeof(cuda::std::int32_t));
    p.total = offset;
    return p;
  }

  enum class Memory { owned, borrowed, attached };
  StashRecord(const PagePool& pool, const GroupedView<layout>& shape, void* memory, Memory how)
      : pool_id_(how == Memory::attached ? 0 : pool.id()), space_(pool.space()), shape_(shape),
        page_bytes_(pool.config().page_bytes), page_shift_(pool.ref().page_shift) {
    static_assert(check_stash_traits<Traits>());
    validate_shape(shape);
    const WorkBounds most = work_bounds<Traits>(shape, pool.ref().page_shift);
    max_pages_ = pages_for(most.stream_bytes, page_bytes_);
    max_tiles_ = most.tiles;
    const Parts parts = parts_of(shape, max_pages_);
    const auto kind = space_ == MemorySpace::device ? detail::MemoryKind::device : detail::MemoryKind::host;
    memory_ = how == Memory::owned ? detail::Allocation(kind, parts.total)
                                   : detail::Allocation::borrow(kind, memory, parts.total, "StashRecord memory");
    auto* base = static_cast<unsigned char*>(memory_.get());
    ref_.header = reinterpret_cast<detail::RecordHeader*>(base);
    ref_.counts = reinterpret_cast<cuda::std::int32_t*>(base + parts.counts_at);
    ref_.items = reinterpret_cast<WorkItem*>(base + parts.items_at);
    ref_.page_ids = reinterpret_cast<cuda::std::int32_t*>(base + parts.ids_at);
    ref_.kept = base + parts.kept_at;
    if (how == Memory::attached) {
      if (space_ == MemorySpace::host) {  // host memory: read at no cost, once, before any operation of this record's
        pool_id_ = ref_.header->pool_id;
        stashable_ = ref_.header->made_for == record_kind<Traits>(shape);
      }
      return;
    }
    // A pool attached to device memory does not know its id on the host: read it once (the
    // header's copy below synchronises anyway).
    if (pool_id_ == 0) detail::copy_bytes(space_, &pool_id_, &pool.ref().state->id, sizeof(pool_id_), true);
    detail::RecordHeader empty{};
    empty.pool_id = pool_id_;
    empty.made_for = record_kind<Traits>(shape);
    detail::copy_bytes(space_, ref_.header, &empty, sizeof(empty), false);
  }

  std::uint64_t pool_id_;
  /// Whether a stash may write a kind of this record's into the memory: made for it, or last stashed as it, when the
  /// record was made or attached (a host record's, read then: a stash's write of its kind races with no host read).
  bool stashable_ = true;
  MemorySpace space_;
  GroupedView<layout> shape_;
  cuda::std::int64_t page_bytes_;
  int page_shift_;
  cuda::std::int64_t max_pages_ = 0;
  cuda::std::int64_t max_tiles_ = 0;
  detail::Allocation memory_;
  RecordRef ref_;
};

/// Makes the record a stash of `view` needs, in `pool`'s memory space. Allocates; call it
/// once, up front, outside any graph capture.
template <class Traits>
StashRecord<Traits> make_record(const PagePool& pool, const GroupedView<typename Traits::layout>& view) {
  return StashRecord<Traits>(pool, view);
}

inline const char* name_of(RecordState s) {
  switch (s) {
    case RecordState::empty: return "empty";
    case RecordState::stashed: return "stashed";
    case RecordState::overflowed: return "overflowed";
    case RecordState::failed: return "failed";
    case RecordState::reloaded: return "reloaded";
    case RecordState::discarded: return "discarded";
    case RecordState::stale: return "stale";
  }
  return "?";
}

PAGESTASH_NAMESPACE_END
