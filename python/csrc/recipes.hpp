#pragma once
// What one operation does on memory it is handed, for each recipe. No PyTorch here: both
// the g++ translation unit (host executor, and every torch-facing check) and the nvcc one
// (CUDA executor) include it.
//
// The pool and the record are attached per call (PagePool::attach, StashRecord::attach):
// their state lives in the caller's tensors, so an operation is a function of its
// arguments, as torch.library's functionalization and opcheck expect.

// Every overload the templates below call, whatever the includer included before: with nvcc, the CUDA executor's
// (pagestash.cuh declares them beside the host's). Their calls are qualified (pagestash::stash), which sees only the
// overloads declared before the template, so this header declares them all itself rather than rely on the includer's
// order (issue 56).
#ifdef __CUDACC__
#  include <pagestash/pagestash.cuh>
#endif
#include <pagestash/layouts/recipes.hpp>
#include <pagestash/pagestash.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace pagestash_torch {
namespace ps = pagestash;

// The recipes are pagestash's (<pagestash/layouts/recipes.hpp>): with_recipe calls its
// function with a pagestash::Recipe<Layout>, whose `layout` and `traits` the ops use.
using ps::compression_names;
using ps::recipe_names;
using ps::with_recipe;

/// A recipe and a compression resolved to the registry's types once (kind_of): their indices in recipe_names() and
/// compression_names(), on which every function below dispatches (with_kind) by comparing integers, never names.
struct Kind {
  int recipe = 0;
  int compression = 0;  // 0: lossless
};

/// The registry's names and whether each recipe takes a lossy compression, made once (the first call).
struct Registry {
  std::vector<std::string> recipes = recipe_names(), compressions = compression_names();
  std::vector<bool> compressible;
  Registry() {
    ps::for_each_recipe([&](auto r) { compressible.push_back(ps::compressible<typename decltype(r)::layout>); });
  }
};
inline const Registry& registry() {
  static const Registry r;
  return r;
}

/// The recipe called `recipe` with `compression` ("" or "lossless": lossless): compares the names with the registry's,
/// made once (no allocation); throws with_recipe's std::invalid_argument for an unknown name or a pair it refuses.
inline Kind kind_of(const std::string& recipe, const std::string& compression) {
  const Registry& r = registry();
  const auto index = [](const std::vector<std::string>& names, const std::string& name) {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return static_cast<int>(i);
    return -1;
  };
  const Kind k{index(r.recipes, recipe), compression.empty() ? 0 : index(r.compressions, compression)};
  if (k.recipe < 0 || k.compression < 0 || (k.compression > 0 && !r.compressible[k.recipe]))
    with_recipe(recipe, compression, [](auto, auto) {});  // throws, naming the choices
  return k;
}

/// The recipe's name (the registry's: no allocation).
inline const std::string& name_of(Kind k) { return registry().recipes[k.recipe]; }

namespace by_index {
template <class R, class F>
decltype(auto) with_compression(R recipe, int compression, F& f) {
  if constexpr (ps::compressible<typename R::layout>) {
    int i = 1;
#define PAGESTASH_TORCH_COMPRESSION(Format) \
  if (compression == i++) return f(recipe, ps::Compressed<Format>{});
    PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_TORCH_COMPRESSION)
#undef PAGESTASH_TORCH_COMPRESSION
  }
  return f(recipe, ps::Lossless{});  // kind_of gives a compressed index only to a compressible recipe
}
}  // namespace by_index

/// f(Recipe<Layout>{}, Compression{}) for `k` (with_recipe(name, compression, f) by index).
template <class F>
decltype(auto) with_kind(Kind k, F&& f) {
  int i = 0;
#define PAGESTASH_TORCH_RECIPE(L) \
  if (k.recipe == i++) return by_index::with_compression(ps::Recipe<PAGESTASH_LAYOUT(L)>{}, k.compression, f);
  PAGESTASH_FOR_EACH_RECIPE(PAGESTASH_TORCH_RECIPE)
#undef PAGESTASH_TORCH_RECIPE
  throw std::invalid_argument("pagestash: no recipe " + std::to_string(k.recipe));
}

/// The traits an op instantiates for a recipe and a compression (with_recipe(recipe, compression, f)'s two tags).
template <class RecipeTag, class Compression>
using traits_of = ps::CompressionTraits<typename RecipeTag::layout, Compression>;

/// A pool's memory as the caller holds it: three parts and the page size (the page counts
/// follow from the arenas' sizes).
struct PoolParts {
  void* control = nullptr;
  void* device_arena = nullptr;
  void* host_arena = nullptr;
  std::int64_t control_bytes = 0, device_arena_bytes = 0, host_arena_bytes = 0;
  std::int64_t page_bytes = 0;
};

inline ps::PoolConfig config_of(const PoolParts& parts) {
  ps::PoolConfig c;
  c.page_bytes = parts.page_bytes;
  if (parts.page_bytes > 0) {
    c.device_pages = parts.device_arena_bytes / parts.page_bytes;
    c.host_pages = parts.host_arena_bytes / parts.page_bytes;
  }
  return c;
}

/// The pool over `parts`, which must hold one already (made by init_pool). Checks that
/// each part has exactly the size the config needs.
inline ps::PagePool attach_pool(const PoolParts& parts, ps::MemorySpace space) {
  const ps::PoolConfig config = config_of(parts);
  const ps::PoolMemorySizes sizes = ps::PagePool::bytes_needed(config);
  const auto check = [](const char* what, std::int64_t got, std::size_t want) {
    if (got != static_cast<std::int64_t>(want))
      throw std::invalid_argument(std::string("pagestash: the pool's ") + what + " has " + std::to_string(got) +
                                  " bytes, its config needs " + std::to_string(want));
  };
  check("control", parts.control_bytes, sizes.control);
  check("device arena", parts.device_arena_bytes, sizes.device_arena);
  check("host arena", parts.host_arena_bytes, sizes.host_arena);
  return ps::PagePool::attach(config, space, ps::PoolMemory{parts.control, parts.device_arena, parts.host_arena});
}

/// Writes a new pool's initial state into `parts`.
inline void init_pool(const PoolParts& parts, ps::MemorySpace space) {
  attach_pool(parts, space);  // the size checks
  const ps::PagePool made(config_of(parts), space, ps::PoolMemory{parts.control, parts.device_arena, parts.host_arena});
}

/// A grouped tensor's shape, in the tensor's order (Python's Shape(groups, tokens, hidden)).
struct Shape {
  std::int64_t groups = 1, tokens = 0, hidden = 0;
};

template <class Layout>
ps::GroupedView<Layout> view_of(const Shape& s) {
  if (s.groups < 1 || s.groups > INT32_MAX)
    throw std::invalid_argument("pagestash: groups = " + std::to_string(s.groups) + " is out of range");
  ps::GroupedView<Layout> v;
  v.max_tokens = s.tokens;
  v.hidden = s.hidden;
  v.groups = static_cast<std::int32_t>(s.groups);
  ps::validate_shape(v);
  return v;
}

/// The buffers of one grouped tensor (null where absent).
struct Buffers {
  void* data = nullptr;
  void* scales = nullptr;
  float* amax = nullptr;
  const std::int32_t* counts = nullptr;
};

template <class Layout>
ps::GroupedView<Layout> view_of(const Shape& s, const Buffers& b) {
  ps::GroupedView<Layout> v = view_of<Layout>(s);
  v.data = static_cast<typename Layout::data_type*>(b.data);
  if constexpr (!std::is_void_v<typename Layout::scale_type>)
    v.scales = static_cast<typename Layout::scale_type*>(b.scales);
  v.amax = b.amax;
  v.counts = b.counts;
  return v;
}

/// What a recipe needs of a shape: each buffer's bytes (0: the layout has none), the
/// count and token granules, the record's bytes for a pool, and how each buffer is handled.
struct RecipeInfo {
  std::int64_t data_bytes = 0, scales_bytes = 0, amax_bytes = 0;
  std::int64_t count_alignment = 1, granule = 1, token_rows = 0;
  bool packed = false, scales_paged = false, amax_kept = false;
};

inline RecipeInfo recipe_info(Kind k, const Shape& s) {
  return with_kind(k, [&](auto tag, auto c) {
    using L = typename decltype(tag)::layout;
    using Tr = traits_of<decltype(tag), decltype(c)>;
    const ps::GroupedView<L> v = view_of<L>(s);
    RecipeInfo info;
    info.data_bytes = v.buffer_bytes(ps::BufferRole::data);
    info.scales_bytes = v.buffer_bytes(ps::BufferRole::scales);
    info.amax_bytes = v.buffer_bytes(ps::BufferRole::amax);
    info.count_alignment = v.count_alignment();
    info.granule = v.granule();
    info.token_rows = v.token_rows();
    info.packed = L::placement::packed;
    info.scales_paged = ps::handling_of<Tr>(ps::BufferRole::scales) == ps::Handling::paged;
    info.amax_kept = ps::handling_of<Tr>(ps::BufferRole::amax) == ps::Handling::kept;
    return info;
  });
}

inline std::int64_t record_bytes(Kind k, const PoolParts& pool, ps::MemorySpace space, const Shape& s) {
  const ps::PagePool p = attach_pool(pool, space);
  return with_kind(k, [&](auto tag, auto c) {
    using L = typename decltype(tag)::layout;
    return static_cast<std::int64_t>(
        ps::StashRecord<traits_of<decltype(tag), decltype(c)>>::bytes_needed(p, view_of<L>(s)));
  });
}

/// A record's memory as the caller holds it.
struct RecordMemory {
  void* ptr = nullptr;
  std::int64_t bytes = 0;
};

/// Throws unless `record` has the bytes a record of `shape` in pool `p` takes.
template <class Traits>
void check_record_bytes(const ps::PagePool& p, const ps::GroupedView<typename Traits::layout>& shape,
                        const RecordMemory& record) {
  const auto need = static_cast<std::int64_t>(ps::StashRecord<Traits>::bytes_needed(p, shape));
  if (record.bytes != need)
    throw std::invalid_argument("pagestash: the record has " + std::to_string(record.bytes) + " bytes; a " +
                                Traits::layout::name + " record of this shape in this pool needs " +
                                std::to_string(need));
}

/// Writes an empty record's header into `record`.
inline void init_record(Kind k, const PoolParts& pool, ps::MemorySpace space, const Shape& s,
                        const RecordMemory& record) {
  const ps::PagePool p = attach_pool(pool, space);
  with_kind(k, [&](auto tag, auto c) {
    using L = typename decltype(tag)::layout;
    using Tr = traits_of<decltype(tag), decltype(c)>;
    check_record_bytes<Tr>(p, view_of<L>(s), record);
    const ps::StashRecord<Tr> made(p, view_of<L>(s), record.ptr);
  });
}

/// The record in `record`, taken for one of `shape` in pool `p`. A reload or discard of memory made for another
/// recipe, compression, shape or pool (its size may differ too) is refused in memory, as misuse (record_mismatch,
/// foreign_record), before it reads more than the record's header: only a header's bytes are required for them. A
/// stash (`writes`) needs the bytes of its own kind, so that its writes stay in the memory.
template <class Traits>
ps::StashRecord<Traits> attach_record(const ps::PagePool& p, const ps::GroupedView<typename Traits::layout>& shape,
                                      const RecordMemory& record, bool writes = false) {
  if (writes) check_record_bytes<Traits>(p, shape, record);
  if (record.bytes < static_cast<std::int64_t>(ps::StashRecord<Traits>::header_bytes))
    throw std::invalid_argument("pagestash: the record has " + std::to_string(record.bytes) +
                                " bytes, fewer than a record's header (" +
                                std::to_string(ps::StashRecord<Traits>::header_bytes) + "): it is no record");
  return ps::StashRecord<Traits>::attach(p, shape, record.ptr);
}

/// One operation with executor `exec` (pagestash::host, or pagestash::on(stream) from CUDA
/// code) on the pool in `pool` and the record in `record`, of kind `k` (its recipe and compression).
template <class Exec>
void run(const Exec& exec, ps::Operation op, Kind k, const PoolParts& pool, const Shape& s, const RecordMemory& record,
         const Buffers& buffers, ps::ReloadOptions options) {
  ps::PagePool p = attach_pool(pool, Exec::memory);
  with_kind(k, [&](auto tag, auto c) {
    using L = typename decltype(tag)::layout;
    using Tr = traits_of<decltype(tag), decltype(c)>;
    auto rec = attach_record<Tr>(p, view_of<L>(s), record, op == ps::Operation::stash);
    switch (op) {
      case ps::Operation::stash: ps::stash(exec, p, view_of<L>(s, buffers), rec); break;
      case ps::Operation::reload: ps::reload(exec, p, rec, view_of<L>(s, buffers), options); break;
      case ps::Operation::discard: ps::discard(exec, p, rec); break;
    }
  });
}

/// What a step does to the pool alone.
enum class PoolStep { reset, end_step };

template <class Exec>
void run_pool_step(const Exec& exec, const PoolParts& pool, PoolStep step) {
  ps::PagePool p = attach_pool(pool, Exec::memory);
  if (step == PoolStep::reset) ps::reset(exec, p);
  else ps::end_step(exec, p);
}

template <class Exec>
void run_report(const Exec& exec, const PoolParts& pool, ps::PoolStats* dst) {
  const ps::PagePool p = attach_pool(pool, Exec::memory);
  ps::report(exec, p, dst);
}

/// The record's status (synchronises, as StashRecord::status does), `stale` included.
inline ps::RecordStatus record_status(Kind k, const PoolParts& pool, ps::MemorySpace space, const Shape& s,
                                      const RecordMemory& record) {
  const ps::PagePool p = attach_pool(pool, space);
  return with_kind(k, [&](auto tag, auto c) {
    using L = typename decltype(tag)::layout;
    return attach_record<traits_of<decltype(tag), decltype(c)>>(p, view_of<L>(s), record).status(p);
  });
}

}  // namespace pagestash_torch
