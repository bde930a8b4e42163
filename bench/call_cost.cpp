// The host cost of one call (issue 56): a stash and a reload of a record whose every count is zero, so that no row is
// copied and the op is only its call, on the host executor, in us per op (best and median of many calls, each timed
// alone) and heap allocations per op (operator new counted). Three ways in:
//   C++ API     pagestash::stash / reload on a pool and a record made once (what a C++ caller pays)
//   op's run    python/csrc's run(): the pool and the record attached from their memory, the recipe resolved
//               from its name (kind_of) - what torch.ops.pagestash.stash does after its tensor checks
//   by name     the recipe resolved from its name alone: kind_of (once per op) beside with_recipe x 3 (what the op
//               did per call before issue 56: checked_shape, recipe_info and run each compared the names, built as
//               strings)
// For bf16/capacity (the registry's 3rd recipe) and nvfp4/capacity/swizzled (its last), [8, 128, 7168].
//
//   build/bench/pagestash_call_cost [calls]   (the target pagestash_call_cost; docs/benchmarks.md, "Call cost")
#include "recipes.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

// The counting operator new below pairs malloc with free; GCC sees the replaced operators inlined and warns.
#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<long> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {
namespace pt = pagestash_torch;
namespace ps = pagestash;

/// Bytes aligned as the ops want their buffers, zeroed, freed at exit (a bench's lifetime).
void* zeroed(std::int64_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t n = (static_cast<std::size_t>(bytes) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, n);
  std::fill_n(static_cast<unsigned char*>(p), n, 0);
  return p;
}

struct Times {
  std::vector<double> ns;
  long allocations = 0;
  void print(const char* recipe, const char* way, const char* op) {
    std::sort(ns.begin(), ns.end());
    std::printf("| %s | %s | %s | %.3f | %.3f | %.2f |\n", recipe, way, op, ns.front() / 1e3, ns[ns.size() / 2] / 1e3,
                static_cast<double>(allocations) / static_cast<double>(ns.size()));
  }
};

template <class F>
void timed(Times& t, F&& f) {
  const long before = allocations.load();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const auto t1 = std::chrono::steady_clock::now();
  t.allocations += allocations.load() - before;
  t.ns.push_back(static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
}

template <class Layout>
void bench(const char* name, int calls) {
  const ps::HostExecutor ex{2, std::int64_t{1} << 20};  // as the op's host_executor() with 2 torch threads
  const pt::Shape s{8, 128, 7168};
  const pt::Kind k = pt::kind_of(name, "lossless");
  const pt::RecipeInfo info = pt::recipe_info(k, s);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(s.groups), 0);
  pt::Buffers b;
  b.data = zeroed(info.data_bytes);
  b.scales = zeroed(info.scales_bytes);
  b.amax = static_cast<float*>(zeroed(info.amax_bytes));
  b.counts = counts.data();

  // The C++ API.
  {
    ps::PagePool pool(ps::PoolConfig{64 << 10, 64, 0}, ps::MemorySpace::host);
    const ps::GroupedView<Layout> view = pt::view_of<Layout>(s, b);
    auto rec = ps::make_record<ps::StashTraits<Layout>>(pool, view);
    Times st, re;
    for (int i = 0; i < calls; ++i) {
      timed(st, [&] { ps::stash(ex, pool, view, rec); });
      timed(re, [&] { ps::reload(ex, pool, rec, view); });
    }
    st.print(name, "C++ API", "stash");
    re.print(name, "C++ API", "reload");
  }
  // The op's run(), on a pool and a record in memory as the tensors hold them.
  {
    const ps::PoolMemorySizes sizes = ps::PagePool::bytes_needed(ps::PoolConfig{64 << 10, 64, 0});
    pt::PoolParts parts;
    parts.control = zeroed(static_cast<std::int64_t>(sizes.control));
    parts.device_arena = zeroed(static_cast<std::int64_t>(sizes.device_arena));
    parts.control_bytes = static_cast<std::int64_t>(sizes.control);
    parts.device_arena_bytes = static_cast<std::int64_t>(sizes.device_arena);
    parts.page_bytes = 64 << 10;
    pt::init_pool(parts, ps::MemorySpace::host);
    pt::RecordMemory rec;
    rec.bytes = pt::record_bytes(k, parts, ps::MemorySpace::host, s);
    rec.ptr = zeroed(rec.bytes);
    pt::init_record(k, parts, ps::MemorySpace::host, s, rec);
    const std::string recipe = name, compression = "lossless";  // the op's arguments, made once
    Times st, re;
    for (int i = 0; i < calls; ++i) {
      timed(st, [&] { pt::run(ex, ps::Operation::stash, pt::kind_of(recipe, compression), parts, s, rec, b, {}); });
      timed(re, [&] { pt::run(ex, ps::Operation::reload, pt::kind_of(recipe, compression), parts, s, rec, b, {}); });
    }
    st.print(name, "op's run()", "stash");
    re.print(name, "op's run()", "reload");
  }
  // The recipe by name: now (kind_of, once) and before (with_recipe, three times).
  {
    const std::string recipe = name, compression = "lossless";
    Times now, before;
    volatile int sink = 0;
    for (int i = 0; i < calls; ++i) {
      timed(now, [&] { sink = sink + pt::kind_of(recipe, compression).recipe; });
      timed(before, [&] {
        for (int j = 0; j < 3; ++j) ps::with_recipe(recipe, compression, [&](auto, auto) { sink = sink + 1; });
      });
    }
    now.print(name, "by name", "kind_of (now)");
    before.print(name, "by name", "with_recipe x 3 (before)");
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  std::printf("us per op, best / median of %d calls; heap allocations per op\n", calls);
  std::printf("| recipe | way in | op | best us | median us | allocations |\n| --- | --- | --- | --- | --- | --- |\n");
  bench<ps::RowwiseUnquantized<ps::BF16, ps::CapacityPadded>>("bf16/capacity", calls);
  bench<ps::ColumnwiseQuantized<ps::NVFP4, ps::CapacityPadded, ps::SwizzledScales>>("nvfp4/capacity/swizzled", calls);
}
