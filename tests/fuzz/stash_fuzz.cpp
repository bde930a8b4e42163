// libFuzzer target: stash and reload from fuzzed inputs, compared byte for byte with a plain
// copy. The first byte picks what is fuzzed:
//   even  the copy engine on hand-made segments (tests/common/engine_check.hpp): page size,
//         lanes, buffer alignment, lines of any length, pitch and offset;
//   odd   a layout configuration (all of tests/common/layout_list.hpp, and the compressed
//         stashes: their oracle is the reference quantizer's round trip), its shape, counts
//         (some the view cannot hold), page size and pool size, through the host executor
//         (1-3 threads) and the grid emulator (1-3 blocks of 32 or 64 threads), which must
//         agree with each other and with the oracle.
// A mismatch prints what differed and aborts. scripts/test runs it for a minute from the
// seed corpus in tests/fuzz/corpus.
// The shared test helpers include doctest; the fuzzer only uses their plain functions.
#define DOCTEST_CONFIG_DISABLE
#include <fuzzer/FuzzedDataProvider.h>

#include "../common/engine_check.hpp"
#include "../common/grid_emulator.hpp"
#include "../common/host_tensor.hpp"
#include "../common/layout_list.hpp"
#include "../common/stash_sequence.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace {

namespace ps = pagestash;
using namespace pagestash_test;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "stash_fuzz: %s\n", what.c_str());
  std::abort();
}

void fuzz_engine(FuzzedDataProvider& in) {
  EngineCase c;
  c.page_shift = in.ConsumeIntegralInRange(8, 17);
  c.executor_tile_shift = in.ConsumeBool() ? ps::HostPolicy::tile_shift : ps::StashPolicy::tile_shift;
  c.lanes = in.ConsumeIntegralInRange(1, 32);
  c.zero_tail = in.ConsumeBool();
  c.base_misalign = in.ConsumeIntegralInRange(0u, 31u);
  c.seed = in.ConsumeIntegral<std::uint32_t>();
  const int segments = in.ConsumeIntegralInRange(1, 6);
  std::int64_t at = in.ConsumeIntegralInRange(0, 40);
  for (int i = 0; i < segments; ++i) {
    ps::Segment s;
    s.live = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(0, 9000)
                              : in.ConsumeIntegralInRange<std::int64_t>(0, 40);
    s.lines = in.ConsumeIntegralInRange<std::int64_t>(0, s.live <= 16 ? 400 : 24);
    s.pitch = std::max<std::int64_t>(1, s.live + in.ConsumeIntegralInRange<std::int64_t>(0, 48));
    s.offset = at;
    c.segments.push_back(s);
    at += s.lines * s.pitch + in.ConsumeIntegralInRange(0, 40);
  }
  const std::string why = check_engine(c);
  if (!why.empty())
    fail("engine, page_shift " + std::to_string(c.page_shift) + ", lanes " + std::to_string(c.lanes) + ": " + why);
}

struct Outcome {
  ps::RecordStatus stashed;
  std::vector<std::vector<std::uint8_t>> reloaded;  // per role
};

template <class Tr, class Run>
Outcome run_once(const ps::GroupedView<typename Tr::layout>& shape, const std::vector<std::int32_t>& counts,
                 const ps::PoolConfig& cfg, bool zero_tail, std::uint32_t seed, const Run& run) {
  using L = typename Tr::layout;
  std::mt19937 rng(seed);
  HostTensor<L> src(shape.max_tokens, shape.hidden, shape.groups, counts),
      dst(shape.max_tokens, shape.hidden, shape.groups, counts);
  for (BufferRole role : all_roles) {
    const auto n = static_cast<std::size_t>(shape.buffer_bytes(role));
    const std::vector<std::uint8_t> a = random_source_bytes<Tr>(role, n, rng), b = random_bytes(n, rng);
    std::copy(a.begin(), a.end(), src.bytes(role));
    std::copy(b.begin(), b.end(), dst.bytes(role));
  }
  ps::PagePool pool(cfg, ps::MemorySpace::host);
  ps::StashRecord<Tr> rec(pool, shape);
  Outcome out;
  run(pool, src.view, dst.view, rec, zero_tail);
  out.stashed = rec.status();  // after the reload: what the stash left, then the reload
  for (BufferRole role : all_roles) {
    const auto n = static_cast<std::size_t>(shape.buffer_bytes(role));
    out.reloaded.emplace_back(dst.bytes(role), dst.bytes(role) + n);
  }
  return out;
}

template <class Tr>
void fuzz_traits(FuzzedDataProvider& in, const char* name) {
  using L = typename Tr::layout;
  ps::GroupedView<L> shape;
  shape.groups = in.ConsumeIntegralInRange(1, 4);
  shape.hidden = 32 * in.ConsumeIntegralInRange(1, 12);
  shape.max_tokens = 1;
  const std::int64_t granule = shape.granule();
  shape.max_tokens = granule * in.ConsumeIntegralInRange(1, 3) * (L::placement::packed ? shape.groups : 1);
  try {
    ps::validate_shape(shape);
    ps::validate_compression<Tr>(shape);
  } catch (const std::invalid_argument&) {
    return;  // a shape the layout refuses (e.g. hidden off its block)
  }
  std::vector<std::int32_t> counts(static_cast<std::size_t>(shape.groups));
  const std::int64_t align = shape.count_alignment();
  const std::int64_t cap = L::placement::packed ? shape.max_tokens / shape.groups : shape.max_tokens;
  for (auto& m : counts) {
    m = static_cast<std::int32_t>(in.ConsumeIntegralInRange<std::int64_t>(0, cap) / align * align);
    if (in.ConsumeProbability<float>() < 0.05f) m = in.ConsumeIntegral<std::int32_t>();  // perhaps one it cannot hold
  }
  ps::PoolConfig cfg;
  cfg.page_bytes = std::int64_t{1} << in.ConsumeIntegralInRange(8, 12);
  const std::int64_t most = ps::pages_for(ps::work_bounds<Tr>(shape).stream_bytes, cfg.page_bytes);
  cfg.device_pages = std::max<std::int64_t>(1, in.ConsumeBool() ? most : most / 2);
  const bool zero_tail = in.ConsumeBool();
  const std::uint32_t seed = in.ConsumeIntegral<std::uint32_t>();
  const unsigned threads = in.ConsumeIntegralInRange(1u, 3u);
  Emulator emulator;
  emulator.shape.blocks = in.ConsumeIntegralInRange(1, 3);
  emulator.shape.threads = in.ConsumeBool() ? 64 : 32;
  emulator.shape.slots = in.ConsumeIntegralInRange(1, 3);
  emulator.shape.random_delays = false;
  emulator.shape.seed = seed;

  const Outcome host = run_once<Tr>(shape, counts, cfg, zero_tail, seed,
                                    [&](ps::PagePool& pool, const auto& src, const auto& dst, auto& rec, bool zt) {
                                      const ps::HostExecutor ex{threads};
                                      ps::stash(ex, pool, src, rec);
                                      ps::reload(ex, pool, rec, dst, ps::ReloadOptions{zt});
                                    });
  const Outcome grid = run_once<Tr>(shape, counts, cfg, zero_tail, seed,
                                    [&](ps::PagePool& pool, const auto& src, const auto& dst, auto& rec, bool zt) {
                                      emulator.stash(pool, src, rec);
                                      emulator.reload(pool, rec, dst, zt);
                                    });
  const std::string where = std::string(name) + ", groups " + std::to_string(shape.groups) + ", hidden " +
                            std::to_string(shape.hidden) + ", max_tokens " + std::to_string(shape.max_tokens);
  if (host.stashed.state != grid.stashed.state || host.stashed.error != grid.stashed.error ||
      host.stashed.stream_bytes != grid.stashed.stream_bytes)
    fail(where + ": the host executor and the emulator disagree (" + ps::name_of(host.stashed.state) + " / " +
         ps::name_of(grid.stashed.state) + ")");
  const bool valid = ps::check_counts(shape, counts.data()).verdict() == ps::Flag::none;
  if (!valid && host.stashed.state != ps::RecordState::failed) fail(where + ": bad counts not reported");

  // The oracle: the source's live bytes (when the stash happened), the destination's bytes
  // elsewhere; a reload that did not restore poisons the paged and kept buffers.
  std::mt19937 rng(seed);
  const bool reloaded = host.stashed.state == ps::RecordState::reloaded;
  for (std::size_t r = 0; r < all_roles.size(); ++r) {
    const auto n = static_cast<std::size_t>(shape.buffer_bytes(all_roles[r]));
    const std::vector<std::uint8_t> source = random_source_bytes<Tr>(all_roles[r], n, rng),
                                    poison = random_bytes(n, rng);
    const std::vector<std::uint8_t> expected =
        reloaded ? expected_reload<Tr>(shape, all_roles[r], counts, source, poison, zero_tail)
                 : expected_unrestored<Tr>(all_roles[r], poison);
    if (host.reloaded[r] != expected)
      fail(where + ": host executor reload differs from the oracle, role " + std::to_string(r));
    if (grid.reloaded[r] != expected)
      fail(where + ": emulator reload differs from the oracle, role " + std::to_string(r));
  }
}

using LayoutFuzzer = void (*)(FuzzedDataProvider&, const char*);
struct NamedFuzzer {
  LayoutFuzzer fn;
  const char* name;
};
using namespace pagestash_test::layouts;
#define PAGESTASH_FUZZ_ENTRY(L) NamedFuzzer{&fuzz_traits<ps::StashTraits<PAGESTASH_LAYOUT(L)>>, #L},
#define PAGESTASH_FUZZ_TRAITS_ENTRY(T) NamedFuzzer{&fuzz_traits<PAGESTASH_LAYOUT(T)>, #T},
const NamedFuzzer layout_fuzzers[] = {PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_FUZZ_ENTRY)
                                          PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(PAGESTASH_FUZZ_TRAITS_ENTRY)};
#undef PAGESTASH_FUZZ_TRAITS_ENTRY
#undef PAGESTASH_FUZZ_ENTRY

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const auto mode = in.ConsumeIntegral<std::uint8_t>();
  if (mode % 2 == 0) {
    fuzz_engine(in);
  } else {
    const NamedFuzzer& f = layout_fuzzers[(mode / 2) % (sizeof(layout_fuzzers) / sizeof(layout_fuzzers[0]))];
    f.fn(in, f.name);
  }
  return 0;
}
