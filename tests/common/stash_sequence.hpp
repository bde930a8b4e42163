#pragma once
// The stash parity suite, shared by the host executor tests (g++) and the GPU tests: seeded
// random sequences of stash / reload / discard against one pool, in LIFO, FIFO or random
// order, with counts from 0 to max_tokens (and some a view cannot hold), overflow, host
// spill and reset. After every step it checks
//   - each record's state, error and page counts against a model of the pool,
//   - reloaded bytes against a plain byte-for-byte oracle built from the geometry's runs
//     (live bytes from the source, every other byte the destination's poison, or zero; a
//     compressed stash's live values are the reference quantizer's round trip of the source's),
//   - the page invariant: every page is either free or held by exactly one record.
//
// A Backend supplies memory and the four operations:
//   static constexpr ps::MemorySpace space;
//   struct Bytes { explicit Bytes(std::size_t); std::uint8_t* ptr() const;
//                  void upload(const std::vector<std::uint8_t>&); std::vector<std::uint8_t> download() const; };
//   template <class Tr> static void stash(ps::PagePool&, const ps::GroupedView<L>&, ps::StashRecord<Tr>&);
//   template <class Tr> static void reload(ps::PagePool&, ps::StashRecord<Tr>&, const ps::GroupedView<L>&, bool
//   zero_tail,
//                                          bool poison = true);  // ReloadOptions{zero_tail, poison}
//   template <class Tr> static void discard(ps::PagePool&, ps::StashRecord<Tr>&);
//   static void reset(ps::PagePool&);

#include <pagestash/pagestash.hpp>
#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/reference.hpp>

#include <doctest/doctest.h>

#include "host_tensor.hpp"
#include "instances.hpp"  // extern where the target links the instances

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

namespace pagestash_test {

namespace ps = pagestash;
using ps::BufferRole;

enum class Order { lifo, fifo, random };
inline const char* name_of(Order o) { return o == Order::lifo ? "LIFO" : (o == Order::fifo ? "FIFO" : "random"); }

inline constexpr std::array<BufferRole, 3> all_roles = {BufferRole::data, BufferRole::scales, BufferRole::amax};

/// The host executor (with Threads copying threads) on host memory.
template <unsigned Threads>
struct HostBackend {
  static constexpr ps::MemorySpace space = ps::MemorySpace::host;
  static constexpr ps::HostExecutor executor{Threads};

  struct Bytes {
    std::vector<std::uint8_t> v;
    explicit Bytes(std::size_t n) : v(n) {}
    std::uint8_t* ptr() const { return const_cast<std::uint8_t*>(v.data()); }
    void upload(const std::vector<std::uint8_t>& b) {
      REQUIRE(b.size() == v.size());
      std::copy(b.begin(), b.end(), v.begin());
    }
    std::vector<std::uint8_t> download() const { return v; }
  };

  template <class Tr>
  static void stash(ps::PagePool& pool, const ps::GroupedView<typename Tr::layout>& v, ps::StashRecord<Tr>& rec) {
    ps::stash(executor, pool, v, rec);
  }
  template <class Tr>
  static void reload(ps::PagePool& pool, ps::StashRecord<Tr>& rec, const ps::GroupedView<typename Tr::layout>& dest,
                     bool zero_tail, bool poison = true) {
    ps::reload(executor, pool, rec, dest, ps::ReloadOptions{zero_tail, poison});
  }
  template <class Tr>
  static void discard(ps::PagePool& pool, ps::StashRecord<Tr>& rec) {
    ps::discard(executor, pool, rec);
  }
  static void reset(ps::PagePool& pool) { ps::reset(executor, pool); }
  static void grow(ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    ps::grow(executor, pool, device_pages, host_pages);
  }
  static void shrink(ps::PagePool& pool, std::int64_t device_pages, std::int64_t host_pages) {
    ps::shrink(executor, pool, device_pages, host_pages);
  }
};

/// A shape with round sizes, and one with odd ones (lines that are not 16-byte aligned).
template <class L>
ps::GroupedView<L> sequence_shape(bool odd) {
  ps::GroupedView<L> v;
  const bool plain = std::is_same_v<L, ps::Plain<typename L::data_type>>;
  v.groups = plain ? 1 : (odd ? 4 : 3);
  if constexpr (L::has(BufferRole::scales)) {
    v.hidden = odd ? 96 : 160;
    const std::int64_t granule = v.granule();
    v.max_tokens = (odd ? 3 : 2) * granule;
  } else {
    v.hidden = odd ? 5 : 160;
    v.max_tokens = odd ? 7 : 48;
  }
  return v;
}

/// The buffers of one grouped tensor in the backend's memory, and a view of them.
template <class L, class Backend>
struct Tensor {
  using Bytes = typename Backend::Bytes;
  ps::GroupedView<L> view;
  std::array<std::unique_ptr<Bytes>, 3> buffers;
  Bytes counts;

  explicit Tensor(const ps::GroupedView<L>& shape)
      : view(shape), counts(static_cast<std::size_t>(shape.groups) * sizeof(std::int32_t)) {
    for (BufferRole role : all_roles)
      buffers[static_cast<std::size_t>(role)] =
          std::make_unique<Bytes>(static_cast<std::size_t>(view.buffer_bytes(role)));
    view.data = reinterpret_cast<typename L::data_type*>(ptr(BufferRole::data));
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view.scales = reinterpret_cast<typename L::scale_type*>(ptr(BufferRole::scales));
    view.amax = L::has(BufferRole::amax) ? reinterpret_cast<float*>(ptr(BufferRole::amax)) : nullptr;
    view.counts = reinterpret_cast<const std::int32_t*>(counts.ptr());
  }
  std::uint8_t* ptr(BufferRole role) const { return buffers[static_cast<std::size_t>(role)]->ptr(); }
  std::vector<std::uint8_t> bytes(BufferRole role) const { return buffers[static_cast<std::size_t>(role)]->download(); }
  void set(BufferRole role, const std::vector<std::uint8_t>& b) { buffers[static_cast<std::size_t>(role)]->upload(b); }
  void set_counts(const std::vector<std::int32_t>& c) {
    std::vector<std::uint8_t> b(c.size() * sizeof(std::int32_t));
    std::memcpy(b.data(), c.data(), b.size());
    counts.upload(b);
  }
};

/// Fills the host pools' device arenas with the same bytes: what neither of two runs writes stays equal.
inline void same_arenas(const ps::PoolConfig& cfg, std::initializer_list<ps::PagePool*> pools) {
  for (ps::PagePool* pool : pools)
    std::memset(pool->ref().device_arena, 0x5C, static_cast<std::size_t>(cfg.device_pages * cfg.page_bytes));
}

/// Two stashes of one tensor, each into a host pool of its own (two executors, or two movers): the same page ids,
/// and the same bytes on each page.
template <class TrA, class TrB>
void check_same_pages(const ps::PagePool& pool_a, const ps::StashRecord<TrA>& a, const ps::PagePool& pool_b,
                      const ps::StashRecord<TrB>& b) {
  const std::vector<std::int32_t> ids = a.page_ids();
  REQUIRE(b.page_ids() == ids);
  for (std::int32_t id : ids) {
    const unsigned char* p = pool_a.ref().page(id);
    const unsigned char* q = pool_b.ref().page(id);
    CHECK(std::equal(p, p + pool_a.config().page_bytes, q));
  }
}

/// Random bytes, none zero (so that a byte zeroed by mistake shows).
inline std::vector<std::uint8_t> random_bytes(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> b(n);
  for (std::size_t i = 0; i < n; i += 4) {
    auto word = static_cast<std::uint32_t>(rng());
    for (std::size_t j = i; j < i + 4 && j < n; ++j, word >>= 8)
      b[j] = static_cast<std::uint8_t>((word & 0xFF) == 0 ? 0xA5 : word & 0xFF);
  }
  return b;
}

/// The sequences' shape for Traits: sequence_shape's, but a compressed stash's hidden is whole blocks of 128 values.
template <class Traits>
ps::GroupedView<typename Traits::layout> sequence_shape_of(bool odd) {
  auto v = sequence_shape<typename Traits::layout>(odd);
  if constexpr (ps::compression_of<Traits>::compressed) v.hidden = odd ? 384 : 256;
  return v;
}

/// Random 16-bit values of T, n bytes of them, drawn block by block (32 values) from shapes a quantizer must get
/// right: any bits (NaN, infinity, subnormals), normal values around 2^k for k over T's whole range, zeros, and
/// normal values with one special among them (NaN, +-infinity, +-max, the least subnormal).
template <class T>
std::vector<std::uint8_t> random_values(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint16_t> v(n / 2);
  const bool bf16 = std::is_same_v<T, ps::BF16>;
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(bf16 ? -135 : -24, bf16 ? 120 : 14);
  const std::uint16_t specials[] = {
      bf16 ? std::uint16_t{0x7FC0} : std::uint16_t{0x7E00}, bf16 ? std::uint16_t{0x7F80} : std::uint16_t{0x7C00},
      bf16 ? std::uint16_t{0xFF80} : std::uint16_t{0xFC00}, bf16 ? std::uint16_t{0x7F7F} : std::uint16_t{0x7BFF},
      bf16 ? std::uint16_t{0xFF7F} : std::uint16_t{0xFBFF}, std::uint16_t{0x0001}};
  for (std::size_t b = 0; b < v.size(); b += 32) {
    const int mode = std::uniform_int_distribution<int>(0, 7)(rng);
    const float scale = std::ldexp(1.0f, exponent(rng));
    for (std::size_t i = b; i < b + 32 && i < v.size(); ++i) {
      if (mode == 0) v[i] = static_cast<std::uint16_t>(rng());
      else if (mode == 1) v[i] = 0;
      else v[i] = T::from_float(gauss(rng) * scale).bits;
    }
    if (mode == 7) v[b + rng() % 32 % (v.size() - b)] = specials[rng() % 6];
  }
  std::vector<std::uint8_t> bytes(n);
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), n / 2 * 2);
  return bytes;
}

/// Random contents of one buffer of a stash's source: random_bytes, or random_values for a compressed data buffer.
template <class Traits>
std::vector<std::uint8_t> random_source_bytes(BufferRole role, std::size_t n, std::mt19937& rng) {
  if constexpr (ps::compression_of<Traits>::compressed) {
    if (role == BufferRole::data) return random_values<typename Traits::layout::data_type>(n, rng);
  }
  return random_bytes(n, rng);
}

/// The bytes a reload must leave in one buffer of the destination: the source's live bytes
/// (whole buffer if kept), the poison elsewhere, or zero there when zero_tail clears it.
template <class Traits>
std::vector<std::uint8_t> expected_reload(const ps::GroupedView<typename Traits::layout>& v, BufferRole role,
                                          const std::vector<std::int32_t>& counts,
                                          const std::vector<std::uint8_t>& source,
                                          const std::vector<std::uint8_t>& poisoned, bool zero_tail) {
  const ps::Handling h = ps::handling_of<Traits>(role);
  if (h == ps::Handling::kept) return source;
  std::vector<std::uint8_t> out = poisoned;
  if (h == ps::Handling::dropped) return out;
  if (zero_tail) std::fill(out.begin(), out.end(), std::uint8_t{0});
  const ps::BufferGeometry geo = v.geometry(role);
  for (std::int64_t i = 0; i < ps::run_count(geo); ++i) {
    const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
    using Compression = ps::compression_of<Traits>;
    if (run.bytes == 0) continue;
    if constexpr (Compression::compressed) {  // the reference's dequantize(quantize(x)) of the run's values
      using T = typename Traits::layout::data_type;
      std::vector<T> in(static_cast<std::size_t>(run.bytes) / 2), back(in.size());
      std::memcpy(in.data(), source.data() + run.offset, static_cast<std::size_t>(run.bytes));
      ps::round_trip_blocks<typename Compression::format>(in.data(), static_cast<std::int64_t>(in.size()), back.data());
      std::memcpy(out.data() + run.offset, back.data(), static_cast<std::size_t>(run.bytes));
    } else {
      std::copy_n(source.begin() + run.offset, run.bytes, out.begin() + run.offset);
    }
  }
  return out;
}

/// The bytes a reload that does not restore (with poison on) leaves in one buffer of the
/// destination: every byte 0xFF where Traits pages or keeps it, the buffer as it was where it
/// drops it.
template <class Traits>
std::vector<std::uint8_t> expected_unrestored(BufferRole role, const std::vector<std::uint8_t>& before) {
  if (ps::handling_of<Traits>(role) == ps::Handling::dropped) return before;
  return std::vector<std::uint8_t>(before.size(), 0xFF);
}

/// Pages a stash of these counts takes: each segment's runs back to back, rounded up to 16
/// bytes, all paged buffers end to end, rounded up to pages.
template <class Traits>
std::int64_t expected_pages(const ps::GroupedView<typename Traits::layout>& v, const std::vector<std::int32_t>& counts,
                            std::int64_t page_bytes) {
  std::int64_t bytes = 0;
  for (BufferRole role : all_roles) {
    if (ps::handling_of<Traits>(role) != ps::Handling::paged) continue;
    const ps::BufferGeometry geo = v.geometry(role);
    for (std::int32_t s = 0; s < geo.segment_count(); ++s) {  // segments padded to 16, lines back to back
      const ps::Segment seg = geo.segment(s, counts.data());
      using Compression = ps::compression_of<Traits>;
      if constexpr (Compression::compressed) {  // a code a value, then 1 byte of scales per 32, padded to 128
        const std::int64_t values = seg.lines * seg.live / 2;
        bytes += ((values + 15) / 16 * 16 + values / 32 + 127) / 128 * 128;
      } else {
        bytes += (seg.lines * seg.live + 15) / 16 * 16;
      }
    }
  }
  return (bytes + page_bytes - 1) / page_bytes;
}

/// A pool of 256-byte pages with device pages for about half the largest stash of `shape`
/// and as many host pages: a large stash spills.
template <class Traits>
ps::PoolConfig spilling_config(const ps::GroupedView<typename Traits::layout>& shape) {
  ps::PoolConfig cfg;
  cfg.page_bytes = 256;
  cfg.device_pages = ps::pages_for(ps::work_bounds<Traits>(shape).stream_bytes, cfg.page_bytes) / 2 + 1;
  cfg.host_pages = cfg.device_pages;
  return cfg;
}

/// Counts the view cannot hold: one count beyond max_tokens (or the packed total), negative,
/// or off the packed alignment.
template <class L>
std::vector<std::int32_t> bad_counts(const ps::GroupedView<L>& v, std::mt19937& rng) {
  std::vector<std::int32_t> c(static_cast<std::size_t>(v.groups), 0);
  const auto g = std::uniform_int_distribution<std::size_t>(0, c.size() - 1)(rng);
  const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
  if (kind == 0) c[g] = static_cast<std::int32_t>(v.max_tokens + v.count_alignment());
  if (kind == 1) c[g] = -static_cast<std::int32_t>(v.count_alignment());
  if (kind == 2) c[g] = static_cast<std::int32_t>(v.count_alignment() > 1 ? v.count_alignment() / 2 : v.max_tokens + 1);
  return c;
}

/// Checks that the pool's free pages and the pages the holding records hold are each id
/// once, device pages first in every record.
template <class Traits>
void check_page_invariant(const ps::PagePool& pool,
                          const std::vector<std::unique_ptr<ps::StashRecord<Traits>>>& records,
                          const std::deque<std::size_t>& holding) {
  const ps::PoolConfig& cfg = pool.config();
  std::vector<int> seen(static_cast<std::size_t>(cfg.device_pages + cfg.host_pages), 0);
  bool in_range = true;
  auto mark = [&](std::int32_t id) {
    if (id < 0 || id >= static_cast<std::int32_t>(seen.size())) in_range = false;
    else ++seen[static_cast<std::size_t>(id)];
  };
  for (std::int32_t id : ps::free_pages(pool)) mark(id);
  for (std::size_t r : holding) {
    const ps::RecordStatus s = records[r]->status();
    CHECK(s.state == ps::RecordState::stashed);
    const std::vector<std::int32_t> ids = records[r]->page_ids();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      mark(ids[i]);
      // Device pages first, then host pages.
      const bool device_page = ids[i] < cfg.device_pages;
      in_range = in_range && device_page == (static_cast<std::int64_t>(i) < s.device_pages);
    }
  }
  CHECK(in_range);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

/// One seeded sequence of `ops` operations. Returns the number of operations checked.
template <class Traits, class Backend>
int run_stash_sequence(const ps::GroupedView<typename Traits::layout>& shape, Order order, int ops, std::uint32_t seed,
                       std::int64_t page_bytes) {
  using L = typename Traits::layout;
  using Record = ps::StashRecord<Traits>;
  std::mt19937 rng(seed);
  CAPTURE(name_of(order));
  CAPTURE(seed);

  // A pool that holds about two full stashes on the device and one more on the host (none,
  // every third sequence), so that spill and overflow both happen.
  const std::int64_t full = ps::work_bounds<Traits>(shape).stream_bytes;
  ps::PoolConfig cfg;
  cfg.page_bytes = page_bytes;
  cfg.device_pages = 2 * ps::pages_for(full, page_bytes);
  cfg.host_pages = seed % 3 == 0 ? 0 : ps::pages_for(full, page_bytes);
  ps::PagePool pool(cfg, Backend::space);

  std::vector<std::unique_ptr<Record>> records;
  for (int i = 0; i < 6; ++i) records.push_back(std::make_unique<Record>(pool, shape));
  Tensor<L, Backend> work(shape), dest(shape);

  struct Saved {
    std::vector<std::int32_t> counts;
    std::array<std::vector<std::uint8_t>, 3> bytes;
    std::int64_t pages = 0, device_pages = 0;
  };
  std::vector<Saved> saved(records.size());
  std::deque<std::size_t> stashed;  // in stash order
  std::vector<std::size_t> idle = {0, 1, 2, 3, 4, 5};
  std::int64_t device_free = cfg.device_pages, host_free = cfg.host_pages;
  bool overflow = false;  // capacity
  bool error = false;     // misuse (here: bad counts)
  int checked = 0;

  auto check_pool = [&] {
    const ps::PoolStats st = pool.stats();
    CHECK((st.flags.overflow != 0) == overflow);
    CHECK((st.flags.error != 0) == error);
    CHECK(st.flags.bad_counts == (error ? 1 : 0));
    CHECK(st.device_pages_free == device_free);
    CHECK(st.host_pages_free == host_free);
    check_page_invariant(pool, records, stashed);
  };

  for (int op = 0; op < ops; ++op) {
    CAPTURE(op);
    const int dice = std::uniform_int_distribution<int>(0, 99)(rng);
    const bool do_stash = stashed.empty() || (!idle.empty() && dice < 55);
    if (do_stash) {
      const std::size_t r = idle[std::uniform_int_distribution<std::size_t>(0, idle.size() - 1)(rng)];
      Saved& s = saved[r];
      const bool bad = dice % 31 == 0;
      s.counts = bad ? bad_counts(shape, rng) : random_counts(shape, rng);
      for (BufferRole role : all_roles) {
        s.bytes[static_cast<std::size_t>(role)] =
            random_source_bytes<Traits>(role, static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
        work.set(role, s.bytes[static_cast<std::size_t>(role)]);
      }
      work.set_counts(s.counts);
      Backend::stash(pool, work.view, *records[r]);
      // The static buffer is reused at once: the stash must not depend on it any more.
      const auto reuse = static_cast<std::uint8_t>(0x40 + op % 64);
      for (BufferRole role : all_roles)
        work.set(role, std::vector<std::uint8_t>(static_cast<std::size_t>(shape.buffer_bytes(role)), reuse));

      const ps::RecordStatus st = records[r]->status();
      if (bad) {
        CHECK(st.state == ps::RecordState::failed);
        CHECK(st.error == ps::Flag::bad_counts);
        CHECK(st.pages == 0);
        CHECK(st.live_bytes == 0);
        error = true;
      } else if (overflow) {
        CHECK(st.state == ps::RecordState::overflowed);
        CHECK(st.error == ps::Flag::overflow);
      } else {
        const std::int64_t need = expected_pages<Traits>(shape, s.counts, page_bytes);
        if (need > device_free + host_free) {
          CHECK(st.state == ps::RecordState::overflowed);
          CHECK(st.error == ps::Flag::overflow);
          overflow = true;
        } else {
          CHECK(st.state == ps::RecordState::stashed);
          CHECK(st.error == ps::Flag::none);
          CHECK(st.pages == need);
          s.pages = need;
          s.device_pages = std::min(need, device_free);
          CHECK(st.device_pages == s.device_pages);
          device_free -= s.device_pages;
          host_free -= need - s.device_pages;
          stashed.push_back(r);
          idle.erase(std::find(idle.begin(), idle.end(), r));
        }
      }
    } else {
      std::size_t k = 0;
      if (order == Order::lifo) k = stashed.size() - 1;
      if (order == Order::random) k = std::uniform_int_distribution<std::size_t>(0, stashed.size() - 1)(rng);
      const std::size_t r = stashed[k];
      stashed.erase(stashed.begin() + static_cast<std::ptrdiff_t>(k));
      idle.push_back(r);
      Saved& s = saved[r];
      if (dice < 90) {
        const bool zero_tail = dice % 2 == 0;
        std::array<std::vector<std::uint8_t>, 3> poisoned;
        for (BufferRole role : all_roles) {
          poisoned[static_cast<std::size_t>(role)] =
              random_bytes(static_cast<std::size_t>(shape.buffer_bytes(role)), rng);
          dest.set(role, poisoned[static_cast<std::size_t>(role)]);
        }
        Backend::reload(pool, *records[r], dest.view, zero_tail);
        CHECK(records[r]->status().state == ps::RecordState::reloaded);
        for (BufferRole role : all_roles) {
          CAPTURE(ps::name_of(role));
          CAPTURE(zero_tail);
          const auto i = static_cast<std::size_t>(role);
          CHECK(dest.bytes(role) == expected_reload<Traits>(shape, role, s.counts, s.bytes[i], poisoned[i], zero_tail));
        }
      } else {
        Backend::discard(pool, *records[r]);
        CHECK(records[r]->status().state == ps::RecordState::discarded);
      }
      device_free += s.device_pages;
      host_free += s.pages - s.device_pages;
    }
    check_pool();
    ++checked;

    if (overflow || error) {
      // What a trainer does: the records of the failed step are dropped, the pool is reset.
      // A reload of a record stashed before the reset is refused: it poisons dest, or, with
      // poison off, leaves it alone.
      if (!stashed.empty()) {
        const std::size_t r = stashed.front();
        Backend::reset(pool);
        std::array<std::vector<std::uint8_t>, 3> before;
        for (BufferRole role : all_roles) before[static_cast<std::size_t>(role)] = dest.bytes(role);
        Backend::reload(pool, *records[r], dest.view, true, false);
        CHECK(records[r]->status().error == ps::Flag::stale);
        for (BufferRole role : all_roles) CHECK(dest.bytes(role) == before[static_cast<std::size_t>(role)]);
        Backend::reload(pool, *records[r], dest.view, true);
        CHECK(records[r]->status().error == ps::Flag::stale);
        for (BufferRole role : all_roles)
          CHECK(dest.bytes(role) == expected_unrestored<Traits>(role, before[static_cast<std::size_t>(role)]));
      }
      Backend::reset(pool);
      for (std::size_t r : stashed) idle.push_back(r);
      stashed.clear();
      device_free = cfg.device_pages;
      host_free = cfg.host_pages;
      overflow = error = false;
      // Stale records hold no pages of the new generation.
      const ps::PoolStats st = pool.stats();
      CHECK(!st.flags.overflow);
      CHECK(!st.flags.error);
      CHECK(st.device_pages_free == device_free);
      CHECK(ps::free_pages(pool).size() == static_cast<std::size_t>(cfg.device_pages + cfg.host_pages));
    }
  }
  return checked;
}

}  // namespace pagestash_test
