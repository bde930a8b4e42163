// The extension's torch side (g++): the pagestash:: op schemas, their CPU implementations
// (the host executor) and, when built with CUDA, their CUDA implementations, which hand the
// checked pointers to ops_cuda.cu (nvcc). Every check of a tensor happens here, on the host,
// before anything runs: ValueError for a bad argument, RuntimeError for a CUDA failure.

#include "sizing.hpp"
#include "recipes.hpp"

#include <torch/extension.h>
#include <ATen/Parallel.h>

#ifdef PAGESTASH_TORCH_CUDA
#  include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

namespace pagestash_torch {

#ifdef PAGESTASH_TORCH_CUDA
// ops_cuda.cu
void run_cuda(cudaStream_t stream, ps::Operation op, Kind k, const PoolParts& pool, const Shape& s,
              const RecordMemory& record, const Buffers& buffers, ps::ReloadOptions options);
void pool_step_cuda(cudaStream_t stream, const PoolParts& pool, PoolStep step);
void report_cuda(cudaStream_t stream, const PoolParts& pool, ps::PoolStats* dst);
void resize_cuda(cudaStream_t stream, ps::PagePool& pool, bool growing, std::int64_t device_pages,
                 std::int64_t host_pages);

/// The stream the op runs on: PyTorch's current one on the pool's device. PyTorch's default
/// stream is the legacy one, which pagestash refuses (it cannot be captured); the per-thread
/// default stream serialises with it, so the order of the caller's work is kept.
cudaStream_t stream_on(const at::Device& device) {
  const cudaStream_t s = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  return s == nullptr ? cudaStreamPerThread : s;
}
#else
// Built without CUDA (PAGESTASH_TORCH_CUDA undefined): a CUDA pool is refused when its stream is asked for.
// The stubs below are never reached.
cudaStream_t stream_on(const at::Device&) {
  TORCH_CHECK(false,
              "pagestash was built without the CUDA executor (no nvcc, or PAGESTASH_CUDA=0 at install): CUDA tensors "
              "need a build with it");
  return nullptr;
}
void run_cuda(cudaStream_t, ps::Operation, Kind, const PoolParts&, const Shape&, const RecordMemory&, const Buffers&,
              ps::ReloadOptions) {}
void pool_step_cuda(cudaStream_t, const PoolParts&, PoolStep) {}
void report_cuda(cudaStream_t, const PoolParts&, ps::PoolStats*) {}
void resize_cuda(cudaStream_t, ps::PagePool&, bool, std::int64_t, std::int64_t) {}
#endif
cudaStream_t stream_of(const at::Tensor& control) { return stream_on(control.device()); }

namespace {

/// Runs f, turning the library's std::invalid_argument into Python's ValueError.
template <class F>
decltype(auto) checked(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
    throw;  // not reached
  }
}

/// A dtype as Python spells it: torch.bfloat16, torch.float8_e4m3fnuz (c10's own table).
std::string torch_name(at::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

ps::MemorySpace space_of(const at::Tensor& control) {
  return control.is_cuda() ? ps::MemorySpace::device : ps::MemorySpace::host;
}

void check_state_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kByte, "pagestash: ", what, " must be a torch.uint8 tensor, not ",
                    torch_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.is_contiguous(), "pagestash: ", what, " must be contiguous");
}

/// The pool's three parts, checked: uint8, contiguous; the control and device arena on one
/// device (the pool's); a CUDA pool's host arena in pinned CPU memory (or empty).
PoolParts pool_parts(const at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
                     std::int64_t page_bytes) {
  check_state_tensor(control, "pool control");
  check_state_tensor(device_arena, "pool device arena");
  check_state_tensor(host_arena, "pool host arena");
  TORCH_CHECK_VALUE(device_arena.device() == control.device(), "pagestash: the pool's device arena is on ",
                    device_arena.device(), ", its control on ", control.device());
  if (control.is_cuda()) {
    TORCH_CHECK_VALUE(host_arena.numel() == 0 || (host_arena.is_cpu() && host_arena.is_pinned()),
                      "pagestash: a CUDA pool's host arena must be pinned CPU memory");
  } else {
    TORCH_CHECK_VALUE(host_arena.is_cpu() && control.is_cpu(), "pagestash: a CPU pool's parts must all be CPU tensors");
  }
  PoolParts p;
  p.control = control.data_ptr();
  p.device_arena = device_arena.numel() ? device_arena.data_ptr() : nullptr;
  p.host_arena = host_arena.numel() ? host_arena.data_ptr() : nullptr;
  p.control_bytes = control.numel();
  p.device_arena_bytes = device_arena.numel();
  p.host_arena_bytes = host_arena.numel();
  p.page_bytes = page_bytes;
  return p;
}

RecordMemory record_memory(const at::Tensor& record, const at::Tensor& control) {
  check_state_tensor(record, "record");
  TORCH_CHECK_VALUE(record.device() == control.device(), "pagestash: the record is on ", record.device(),
                    ", its pool on ", control.device());
  return RecordMemory{record.data_ptr(), record.numel()};
}

/// The torch dtype of a layout's data or scale type, written once; Undefined for raw bytes
/// (Plain's uint8: any dtype) and for no scales.
template <class T>
at::ScalarType torch_type() {
  if constexpr (std::is_same_v<T, ps::BF16>) return at::kBFloat16;
  else if constexpr (std::is_same_v<T, ps::FP16>) return at::kHalf;
  else if constexpr (std::is_same_v<T, float>) return at::kFloat;
  else if constexpr (std::is_same_v<T, ps::E4M3>) return at::kFloat8_e4m3fn;
  else if constexpr (std::is_same_v<T, ps::E5M2>) return at::kFloat8_e5m2;
  else if constexpr (std::is_same_v<T, ps::E2M1x2>) return at::kFloat4_e2m1fn_x2;
  else if constexpr (std::is_same_v<T, ps::E8M0>) return at::kFloat8_e8m0fnu;
  else return at::ScalarType::Undefined;
}

/// The element type of the recipe's data or scales (raw bytes, uint8, fit too); Undefined
/// for 'plain' data (any dtype: rows of bytes).
at::ScalarType element_type(Kind k, bool scales) {
  return with_kind(k, [&](auto r, auto) {
    using L = typename decltype(r)::layout;
    return scales ? torch_type<typename L::scale_type>() : torch_type<typename L::data_type>();
  });
}

void check_buffer(const std::optional<at::Tensor>& t, const char* what, std::int64_t bytes, const at::Device& device,
                  Kind k, bool scales) {
  const std::string& recipe = name_of(k);
  const bool is_amax = std::strcmp(what, "amax") == 0;
  if (bytes == 0) {
    TORCH_CHECK_VALUE(!t.has_value() || t->numel() == 0, "pagestash: recipe '", recipe, "' has no ", what,
                      "; pass None");
    return;
  }
  TORCH_CHECK_VALUE(t.has_value(), "pagestash: recipe '", recipe, "' needs ", what, " (", bytes, " bytes)");
  TORCH_CHECK_VALUE(t->device() == device, "pagestash: ", what, " is on ", t->device(), ", the pool on ", device);
  TORCH_CHECK_VALUE(t->is_contiguous(), "pagestash: ", what, " must be contiguous");
  if (is_amax) {
    TORCH_CHECK_VALUE(t->scalar_type() == at::kFloat, "pagestash: amax must be torch.float32 (one per group), not ",
                      torch_name(t->scalar_type()));
  } else if (const at::ScalarType want = element_type(k, scales); want != at::ScalarType::Undefined) {
    TORCH_CHECK_VALUE(t->scalar_type() == want || t->scalar_type() == at::kByte, "pagestash: ", what, " of recipe '",
                      recipe, "' must be ", torch_name(want), " (or torch.uint8 bytes), not ",
                      torch_name(t->scalar_type()));
  }
  // The library's own check names the layout and an address: name the tensor and the fix.
  const auto address = reinterpret_cast<std::uintptr_t>(t->data_ptr());
  TORCH_CHECK_VALUE(is_amax || address % ps::buffer_alignment == 0, "pagestash: ", what, " must be ",
                    ps::buffer_alignment, "-byte aligned (the ops copy ", ps::buffer_alignment,
                    "-byte vectors), but its data_ptr() % ", ps::buffer_alignment, " = ",
                    address % ps::buffer_alignment, " (storage_offset() = ", t->storage_offset(), "): pass ", what,
                    ".clone() (PyTorch's allocator aligns a new tensor), or a view that starts a multiple of ",
                    ps::buffer_alignment, " bytes into its storage");
  const std::int64_t got = t->numel() * t->element_size();
  TORCH_CHECK_VALUE(got == bytes, "pagestash: ", what, " has ", got, " bytes; recipe '", recipe,
                    "' of this shape needs ", bytes);
}

/// Unquantized data is rows of tokens: its last dimension must be one token's row (for
/// 'plain', `hidden` is the row's bytes), so that a transposed tensor of the right size is
/// refused rather than paged as rows.
void check_rows(const at::Tensor& data, Kind k, const Shape& s) {
  const std::int64_t row_bytes = with_kind(k, [&](auto r, auto) -> std::int64_t {
    using L = typename decltype(r)::layout;
    if constexpr (!std::is_void_v<typename L::scale_type>) return 0;  // quantized: bytes only
    else return s.hidden * static_cast<std::int64_t>(sizeof(typename L::data_type));
  });
  if (row_bytes == 0) return;
  TORCH_CHECK_VALUE(data.dim() >= 1 && data.size(-1) * data.element_size() == row_bytes, "pagestash: data's last ",
                    "dimension must be one token's row of ", row_bytes, " bytes (hidden = ", s.hidden, "), not ",
                    data.sizes(), " of ", torch_name(data.scalar_type()),
                    ": pass [groups, tokens, hidden] (capacity) or [tokens, hidden] (packed)");
}

/// The buffers of a grouped tensor, checked against the recipe's geometry for `s`.
Buffers buffers_of(Kind k, const Shape& s, const at::Device& device, const at::Tensor& data,
                   const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& amax,
                   const std::optional<at::Tensor>& counts) {
  const RecipeInfo info = checked([&] { return recipe_info(k, s); });
  check_buffer(data, "data", info.data_bytes, device, k, false);
  check_rows(data, k, s);
  check_buffer(scales, "scales", info.scales_bytes, device, k, true);
  check_buffer(amax, "amax", info.amax_bytes, device, k, false);
  Buffers b;
  b.data = data.data_ptr();
  if (info.scales_bytes) b.scales = scales->data_ptr();
  if (info.amax_bytes) b.amax = amax->data_ptr<float>();
  if (counts.has_value()) {
    TORCH_CHECK_VALUE(counts->device() == device, "pagestash: counts is on ", counts->device(), ", the pool on ",
                      device);
    TORCH_CHECK_VALUE(counts->scalar_type() == at::kInt, "pagestash: counts must be torch.int32, not ",
                      torch_name(counts->scalar_type()));
    TORCH_CHECK_VALUE(counts->is_contiguous() && counts->numel() == s.groups, "pagestash: counts must be ", s.groups,
                      " contiguous torch.int32 (one per group), not ", counts->sizes());
    b.counts = counts->data_ptr<std::int32_t>();
  }
  return b;
}

/// on_host() for a CPU pool (the host executor); on_cuda(stream) for a CUDA pool, on its
/// device and PyTorch's current stream there (the CUDA executor).
template <class OnHost, class OnCuda>
void on_executor(const at::Tensor& control, const OnHost& on_host, const OnCuda& on_cuda) {
  const at::OptionalDeviceGuard guard(at::device_of(control));
  if (control.is_cuda()) checked([&] { on_cuda(stream_of(control)); });
  else checked(on_host);
}

/// The host executor of a CPU pool's ops: PyTorch's intra-op threads (torch.get_num_threads()), as its own CPU ops,
/// a thread for each MiB of the stream at most (a compressed stash codes every value).
ps::HostExecutor host_executor() {
  ps::HostExecutor ex;
  ex.threads = static_cast<unsigned>(std::max(1, at::get_num_threads()));
  ex.bytes_per_thread = std::int64_t{1} << 20;
  return ex;
}

/// One stash, reload or discard.
void run_op(ps::Operation op, at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
            std::int64_t page_bytes, at::Tensor& record, Kind k, const Shape& s, const Buffers& buffers,
            ps::ReloadOptions options) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const RecordMemory rec = record_memory(record, control);
  on_executor(
      control, [&] { run(host_executor(), op, k, pool, s, rec, buffers, options); },
      [&](cudaStream_t stream) { run_cuda(stream, op, k, pool, s, rec, buffers, options); });
}

/// The recipe and compression named, resolved once per call (kind_of: the registry's names compared, no allocation);
/// ValueError for an unknown one.
Kind kind(const std::string& recipe, const std::string& compression) {
  return checked([&] { return kind_of(recipe, compression); });
}

/// A shape as the ops take it: [groups, tokens, hidden], the order of a capacity tensor's
/// dimensions.
Shape shape_of(at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(shape.size() == 3, "pagestash: shape must be [groups, tokens, hidden], not ", shape);
  return Shape{shape[0], shape[1], shape[2]};
}

/// `shape` for `recipe` and `compression`, checked in the ops' terms (shape[i], the recipe, the
/// fix) before the library's own check (validate_shape), whose message names the layout's fields.
/// The recipe and compression are resolved before (kind_of: an unknown compression, or one the recipe cannot take,
/// is refused there, with with_recipe's message).
Shape checked_shape(Kind k, at::IntArrayRef shape) {
  const Shape s = shape_of(shape);
  checked([&] {
    with_kind(k, [&](auto tag, auto c) {
      using C = decltype(c);
      using L = typename decltype(tag)::layout;
      const auto refuse = [&](const auto&... what) {
        TORCH_CHECK_VALUE(false, "pagestash: shape ", shape, " does not fit recipe '", name_of(k), "': ", what...);
      };
      if (s.groups < 1 || s.groups > INT32_MAX) refuse("shape[0] (groups) = ", s.groups, " must be in [1, 2^31)");
      if (s.tokens < 0) refuse("shape[1] (tokens) = ", s.tokens, " is negative");
      if (s.hidden < 1) refuse("shape[2] (hidden) = ", s.hidden, " must be positive");
      if (s.hidden % L::hidden_multiple != 0)
        refuse("shape[2] (hidden) = ", s.hidden, " must be a multiple of ", L::hidden_multiple,
               " for this recipe: pad hidden to ", (s.hidden / L::hidden_multiple + 1) * L::hidden_multiple);
      const std::string compression = ps::compression_refusal<C>(s.hidden);
      if (!compression.empty())
        refuse("shape[2] (hidden) = ", s.hidden, " ", compression, ", or pass compression 'lossless'");
      ps::GroupedView<L> v;
      v.max_tokens = s.tokens;
      v.hidden = s.hidden;
      v.groups = static_cast<std::int32_t>(s.groups);
      const std::int64_t granule = v.granule();
      if (s.tokens % granule != 0)
        refuse("shape[1] (tokens) = ", s.tokens, " must be a multiple of ", granule,
               " (the recipe's token granule for this hidden): pad the capacity (packed: the token buffer) to ",
               (s.tokens / granule + 1) * granule, " tokens");
      if (decltype(tag)::plain && s.groups != 1) refuse("shape[0] (groups) = ", s.groups, " must be 1");
    });
  });
  return s;
}

void stash_op(at::Tensor& control, at::Tensor& device_arena, at::Tensor& host_arena, std::int64_t page_bytes,
              at::Tensor& record, const std::string& recipe, at::IntArrayRef shape, const at::Tensor& data,
              const at::Tensor& counts, const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& amax,
              const std::string& compression) {
  const Kind k = kind(recipe, compression);
  const Shape s = checked_shape(k, shape);
  const Buffers b = buffers_of(k, s, control.device(), data, scales, amax, counts);
  run_op(ps::Operation::stash, control, device_arena, host_arena, page_bytes, record, k, s, b, {});
}

void reload_op(at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
               std::int64_t page_bytes, at::Tensor& record, const std::string& recipe, at::IntArrayRef shape,
               at::Tensor& data, const std::optional<at::Tensor>& scales, const std::optional<at::Tensor>& amax,
               bool zero_tail, bool poison, const std::string& compression) {
  const Kind k = kind(recipe, compression);
  const Shape s = checked_shape(k, shape);
  const Buffers b = buffers_of(k, s, control.device(), data, scales, amax, std::nullopt);
  run_op(ps::Operation::reload, control, device_arena, host_arena, page_bytes, record, k, s, b,
         ps::ReloadOptions{zero_tail, poison});
}

void discard_op(at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
                std::int64_t page_bytes, at::Tensor& record, const std::string& recipe, at::IntArrayRef shape,
                const std::string& compression) {
  const Kind k = kind(recipe, compression);
  const Shape s = checked_shape(k, shape);
  run_op(ps::Operation::discard, control, device_arena, host_arena, page_bytes, record, k, s, Buffers{}, {});
}

void pool_step_op(PoolStep step, at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
                  std::int64_t page_bytes) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  on_executor(
      control, [&] { run_pool_step(ps::host, pool, step); },
      [&](cudaStream_t stream) { pool_step_cuda(stream, pool, step); });
}

void reset_op(at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
              std::int64_t page_bytes) {
  pool_step_op(PoolStep::reset, control, device_arena, host_arena, page_bytes);
}

void end_step_op(at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
                 std::int64_t page_bytes) {
  pool_step_op(PoolStep::end_step, control, device_arena, host_arena, page_bytes);
}

void report_op(const at::Tensor& control, const at::Tensor& device_arena, const at::Tensor& host_arena,
               std::int64_t page_bytes, at::Tensor& out) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  TORCH_CHECK_VALUE(out.scalar_type() == at::kByte && out.is_contiguous() &&
                        out.numel() == static_cast<std::int64_t>(sizeof(ps::PoolStats)),
                    "pagestash: report's out must be ", sizeof(ps::PoolStats), " contiguous torch.uint8");
  TORCH_CHECK_VALUE(out.device() == control.device() || (control.is_cuda() && out.is_pinned()),
                    "pagestash: report's out must be on the pool's device (or pinned, for a CUDA pool)");
  TORCH_CHECK_VALUE(reinterpret_cast<std::uintptr_t>(out.data_ptr()) % alignof(ps::PoolStats) == 0,
                    "pagestash: report's out must be ", alignof(ps::PoolStats), "-byte aligned");
  auto* dst = static_cast<ps::PoolStats*>(out.data_ptr());
  on_executor(
      control, [&] { run_report(ps::host, pool, dst); }, [&](cudaStream_t stream) { report_cuda(stream, pool, dst); });
}

// ---- Helpers for the Python objects (not ops: made once, outside any graph) -------------

/// Every recipe, in the registry's order: its name, the names of its parts (family,
/// placement, scales: "" where none) and the torch dtype names of its data and scales
/// (None: raw bytes, or no scales). recipes.py builds its tables from these.
py::list recipe_table() {
  py::list table;
  const auto dtype = [](at::ScalarType t) -> py::object {
    if (t == at::ScalarType::Undefined) return py::none();
    return py::str(c10::getDtypeNames(t).first);
  };
  ps::for_each_recipe([&](auto r) {
    using R = decltype(r);
    py::dict d;
    d["name"] = R::name();
    d["family"] = R::family;
    d["placement"] = R::placement;
    d["scales"] = R::scales;
    d["data_dtype"] = dtype(torch_type<typename R::layout::data_type>());
    d["scales_dtype"] = dtype(torch_type<typename R::layout::scale_type>());
    d["compressible"] = ps::compressible<typename R::layout>;  // takes the lossy compressions (every recipe: lossless)
    table.append(d);
  });
  return table;
}

py::dict info_dict(const std::string& recipe, const std::vector<std::int64_t>& shape, const std::string& compression) {
  const Kind k = kind(recipe, compression);
  const RecipeInfo i = checked([&] { return recipe_info(k, checked_shape(k, shape)); });
  py::dict d;
  d["data_bytes"] = i.data_bytes;
  d["scales_bytes"] = i.scales_bytes;
  d["amax_bytes"] = i.amax_bytes;
  d["count_alignment"] = i.count_alignment;
  d["granule"] = i.granule;
  d["token_rows"] = i.token_rows;
  d["packed"] = i.packed;
  d["scales_paged"] = i.scales_paged;
  d["amax_kept"] = i.amax_kept;
  return d;
}

py::tuple pool_bytes(std::int64_t page_bytes, std::int64_t device_pages, std::int64_t host_pages) {
  ps::PoolConfig c;
  c.page_bytes = page_bytes;
  c.device_pages = device_pages;
  c.host_pages = host_pages;
  const ps::PoolMemorySizes s = checked([&] { return ps::PagePool::bytes_needed(c); });
  return py::make_tuple(s.control, s.device_arena, s.host_arena);
}

void init_pool_py(at::Tensor control, at::Tensor device_arena, at::Tensor host_arena, std::int64_t page_bytes) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const at::OptionalDeviceGuard guard(at::device_of(control));  // the pool's device current
  checked([&] { init_pool(pool, space_of(control)); });
}

std::int64_t record_bytes_py(at::Tensor control, at::Tensor device_arena, at::Tensor host_arena,
                             std::int64_t page_bytes, const std::string& recipe, const std::vector<std::int64_t>& shape,
                             const std::string& compression) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const at::OptionalDeviceGuard guard(at::device_of(control));  // the pool's device current
  const Kind k = kind(recipe, compression);
  return checked([&] { return record_bytes(k, pool, space_of(control), checked_shape(k, shape)); });
}

void init_record_py(at::Tensor control, at::Tensor device_arena, at::Tensor host_arena, std::int64_t page_bytes,
                    at::Tensor record, const std::string& recipe, const std::vector<std::int64_t>& shape,
                    const std::string& compression) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const RecordMemory rec = record_memory(record, control);
  const at::OptionalDeviceGuard guard(at::device_of(control));  // the pool's device current
  const Kind k = kind(recipe, compression);
  checked([&] { init_record(k, pool, space_of(control), checked_shape(k, shape), rec); });
}

/// A pool with a reserve (PagePool(reserve_bytes=...)): the library maps its memory as it grows, so the library owns
/// it, not PyTorch's allocator (which gives no address space to back later). Python holds its parts as tensors over
/// that memory (each keeping the pool alive), which the ops attach to as to any pool, its reserve as its pages.
struct ReservedPool {
  std::shared_ptr<ps::PagePool> pool;
  at::Device device;

  /// Grows (to at least the pages it has) or shrinks (after a balanced step) on the pool's executor: the host's, or
  /// PyTorch's current stream on its device.
  void resize(bool growing, std::int64_t device_pages, std::int64_t host_pages) {
    const at::OptionalDeviceGuard guard(device);
    checked([&] {
      if (device.is_cuda()) {
        resize_cuda(stream_on(device), *pool, growing, device_pages, host_pages);
      } else if (growing) {
        ps::grow(host_executor(), *pool, device_pages, host_pages);
      } else {
        ps::shrink(host_executor(), *pool, device_pages, host_pages);
      }
    });
  }
};

ReservedPool reserved_pool(std::int64_t page_bytes, std::int64_t device_pages, std::int64_t host_pages,
                           std::int64_t device_reserve, std::int64_t host_reserve, const std::string& device) {
  ReservedPool r{nullptr, at::Device(device)};
  if (r.device.is_cuda()) stream_on(r.device);  // a build without the CUDA executor refuses here
  ps::PoolConfig c;
  c.page_bytes = page_bytes;
  c.device_pages = device_pages;
  c.host_pages = host_pages;
  c.device_reserve = device_reserve;
  c.host_reserve = host_reserve;
  const at::OptionalDeviceGuard guard(r.device);  // a device pool lives on the current device
  r.pool = checked([&] {
    return std::make_shared<ps::PagePool>(c, r.device.is_cuda() ? ps::MemorySpace::device : ps::MemorySpace::host);
  });
  return r;
}

/// The pool's control, device arena and host arena as uint8 tensors over its memory, the arenas at the reserve's
/// size (only the pages grown so far are backed: nothing but the ops may read them).
py::tuple reserved_pool_parts(const ReservedPool& r) {
  const ps::PoolMemory m = r.pool->memory();
  const ps::PoolMemorySizes sizes = ps::PagePool::bytes_needed(r.pool->config());
  const auto part = [&](void* p, std::size_t bytes, bool host) {
    const at::Device on = host ? at::Device(at::kCPU) : r.device;
    if (bytes == 0) return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(on));
    return torch::from_blob(
        p, {static_cast<std::int64_t>(bytes)}, [keep = r.pool](void*) {},
        at::TensorOptions().dtype(at::kByte).device(on));
  };
  return py::make_tuple(part(m.control, sizes.control, false), part(m.device_arena, sizes.device_arena, false),
                        part(m.host_arena, sizes.host_arena, r.device.is_cuda()));
}

py::dict reserved_pool_memory(const ReservedPool& r) {
  const ps::PoolMemoryUse u = r.pool->memory_use();
  py::dict d;
  d["control_bytes"] = u.control;
  d["device_bytes"] = u.device_backed;
  d["host_bytes"] = u.host_backed;
  d["device_reserved_bytes"] = u.device_reserved;
  d["host_reserved_bytes"] = u.host_reserved;
  return d;
}

constexpr std::size_t flag_words = ps::flag_count;

py::dict flags_dict(ps::PoolFlags f) {
  py::dict d;
  for (int k = 0; k < ps::flag_count; ++k) d[ps::flag_names[k]] = f[ps::flag_at(k)];
  return d;
}

std::vector<std::string> flag_names() { return {std::begin(ps::flag_names), std::end(ps::flag_names)}; }
std::vector<std::string> flag_meanings() { return {std::begin(ps::flag_meanings), std::end(ps::flag_meanings)}; }
std::vector<std::string> flag_categories() {
  std::vector<std::string> out;
  for (int k = 0; k < ps::flag_count; ++k) out.push_back(ps::name_of(ps::category_of(ps::flag_at(k))));
  return out;
}

/// The flags and counters, by the library's own names (for_each_counter).
py::dict counters_dict(const ps::PoolCounters& c, const ps::PoolFlags& flags) {
  py::dict d;
  d["flags"] = flags_dict(flags);
  ps::for_each_counter(c, [&](const char* name, std::int64_t value) { d[name] = value; });
  return d;
}

py::dict pool_stats_py(at::Tensor control, at::Tensor device_arena, at::Tensor host_arena, std::int64_t page_bytes) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const at::OptionalDeviceGuard guard(at::device_of(control));  // the pool's device current
  const ps::PoolStats s = checked([&] { return attach_pool(pool, space_of(control)).stats(); });
  py::dict d = counters_dict(s, s.flags);
  d["page_bytes"] = s.config.page_bytes;  // the pages it has are counters (device_pages, host_pages); these its ids'
  d["device_reserve"] = s.config.reserved_device_pages();
  d["host_reserve"] = s.config.reserved_host_pages();
  return d;
}

py::dict record_status_py(at::Tensor control, at::Tensor device_arena, at::Tensor host_arena, std::int64_t page_bytes,
                          at::Tensor record, const std::string& recipe, const std::vector<std::int64_t>& shape,
                          const std::string& compression) {
  const PoolParts pool = pool_parts(control, device_arena, host_arena, page_bytes);
  const RecordMemory rec = record_memory(record, control);
  const at::OptionalDeviceGuard guard(at::device_of(control));  // the pool's device current
  const Kind k = kind(recipe, compression);
  const ps::RecordStatus s =
      checked([&] { return record_status(k, pool, space_of(control), checked_shape(k, shape), rec); });
  py::dict d;  // every field of the C++ table, under its name; states and flags by name
  ps::for_each_field(s, [&](const char* name, auto value) {
    if constexpr (std::is_enum_v<decltype(value)>) d[name] = ps::name_of(value);
    else d[name] = value;
  });
  return d;
}

py::dict decode_report(at::Tensor bytes) {
  TORCH_CHECK_VALUE(bytes.is_cpu() && bytes.scalar_type() == at::kByte &&
                        bytes.numel() == static_cast<std::int64_t>(sizeof(ps::PoolStats)),
                    "pagestash: a report is ", sizeof(ps::PoolStats), " uint8 on the CPU");
  ps::PoolStats r{};
  std::memcpy(&r, bytes.contiguous().data_ptr(), sizeof(r));
  py::dict d = counters_dict(r, r.flags);
  d["decision"] = ps::name_of(ps::decide(r.flags));
  return d;
}

/// The decision for flags read back as flag_count ints (e.g. after an all-reduce in Python).
std::string decide_py(const std::vector<std::int32_t>& words) {
  TORCH_CHECK_VALUE(words.size() == flag_words, "pagestash: the flags are ", flag_words, " int32 words");
  ps::PoolFlags f{};
  std::memcpy(&f, words.data(), sizeof(f));
  return ps::name_of(ps::decide(f));
}

/// A C++ value as Python has it: an Interval or a pair as a (low, high) tuple.
py::object to_python(const sizing::Interval& i) { return py::make_tuple(i.low, i.high); }
template <class T>
py::object to_python(const T& value) {
  return py::cast(value);
}

/// The pool sizer (csrc/sizing.hpp) for the Python wrapper pagestash.size_pool. The request
/// comes as keyword arguments, each a field of SizingRequest's table (an unknown one is an
/// error; one not given keeps the table's default); the result is PoolSizing's table as a
/// dict, and the overflow curve. `shapes` are [groups, tokens, hidden], one per recipe.
py::dict size_pool_py(const py::kwargs& request) {
  SizingRequest r;
  std::vector<std::string> known;
  for_each_field(r, [&](const char* name, auto& member) {
    known.emplace_back(name);
    if (!request.contains(name)) return;
    using T = std::decay_t<decltype(member)>;
    if constexpr (std::is_same_v<T, std::vector<Shape>>) {
      for (const auto& s : request[name].cast<std::vector<std::vector<std::int64_t>>>()) member.push_back(shape_of(s));
    } else {
      member = request[name].cast<T>();
    }
  });
  for (const auto& item : request) {
    const std::string name = py::str(item.first);
    TORCH_CHECK_VALUE(std::find(known.begin(), known.end(), name) != known.end(),
                      "pagestash: size_pool has no argument '", name, "'");
  }
  const sizing::PoolSizing p = [&] {
    const py::gil_scoped_release unlocked;  // seconds of sampling: let other Python threads run
    return checked([&] { return sizing_of(r); });
  }();
  py::dict d;
  sizing::for_each_field(p, [&](const char* name, const auto& value) { d[name] = to_python(value); });
  py::list curve;
  for (const sizing::CurvePoint& c : p.peaks.curve(r.curve_points, p.settings.confidence))
    curve.append(py::make_tuple(c.pages, c.overflow, c.interval.low, c.interval.high));
  d["curve"] = curve;
  return d;
}

}  // namespace

TORCH_LIBRARY(pagestash, m) {
  // Every op: the pool's state first, then the record, its recipe and shape [groups, tokens, hidden]; the record's
  // compression (pagestash's compression_names()) last, by name, as the record was made with it.
  m.def(
      "stash(Tensor(a!) control, Tensor(b!) device_arena, Tensor(c!) host_arena, int page_bytes, Tensor(d!) record, "
      "str recipe, int[] shape, Tensor data, Tensor counts, Tensor? scales=None, Tensor? amax=None, "
      "str compression='lossless') -> ()");
  m.def(
      "reload(Tensor(a!) control, Tensor device_arena, Tensor host_arena, int page_bytes, Tensor(d!) record, "
      "str recipe, int[] shape, Tensor(e!) data, Tensor(f!)? scales=None, Tensor(g!)? amax=None, "
      "bool zero_tail=False, bool poison=True, str compression='lossless') -> ()");
  m.def(
      "discard(Tensor(a!) control, Tensor device_arena, Tensor host_arena, int page_bytes, Tensor(d!) record, "
      "str recipe, int[] shape, str compression='lossless') -> ()");
  m.def("reset(Tensor(a!) control, Tensor device_arena, Tensor host_arena, int page_bytes) -> ()");
  m.def("end_step(Tensor(a!) control, Tensor device_arena, Tensor host_arena, int page_bytes) -> ()");
  m.def("report(Tensor control, Tensor device_arena, Tensor host_arena, int page_bytes, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(pagestash, CPU, m) {
  m.impl("stash", &stash_op);
  m.impl("reload", &reload_op);
  m.impl("discard", &discard_op);
  m.impl("reset", &reset_op);
  m.impl("end_step", &end_step_op);
  m.impl("report", &report_op);
}

#ifdef PAGESTASH_TORCH_CUDA
TORCH_LIBRARY_IMPL(pagestash, CUDA, m) {
  m.impl("stash", &stash_op);
  m.impl("reload", &reload_op);
  m.impl("discard", &discard_op);
  m.impl("reset", &reset_op);
  m.impl("end_step", &end_step_op);
  m.impl("report", &report_op);
}
#endif

}  // namespace pagestash_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace pagestash_torch;
  m.doc() = "pagestash: paged stashing of grouped MoE activations (ops in torch.ops.pagestash)";
  m.def("recipes", &recipe_names, "The recipes this build instantiates");
  m.def("recipe_table", &recipe_table, "Each recipe's name, family, placement, scales, dtypes and compressible");
  m.def("compression_names", &compression_names, "The compressions: 'lossless', then each format's name");
  m.def("recipe_info", &info_dict, "Buffer bytes and granules of a recipe for a shape", py::arg("recipe"),
        py::arg("shape"), py::arg("compression") = ps::Lossless::name);
  m.def("pool_bytes", &pool_bytes, "Bytes of a pool's control, device arena and host arena");
  py::class_<ReservedPool>(m, "ReservedPool", "A pool with a reserve, in memory the library maps as it grows")
      .def_property_readonly("device_pages", [](const ReservedPool& r) { return r.pool->config().device_pages; })
      .def_property_readonly("host_pages", [](const ReservedPool& r) { return r.pool->config().host_pages; })
      .def_property_readonly("device_reserve",
                             [](const ReservedPool& r) { return r.pool->config().reserved_device_pages(); })
      .def_property_readonly("host_reserve",
                             [](const ReservedPool& r) { return r.pool->config().reserved_host_pages(); })
      .def("parts", &reserved_pool_parts, "(control, device arena, host arena) as uint8 tensors over its memory")
      .def("memory", &reserved_pool_memory, "Bytes backed and reserved, by part")
      .def("grow", [](ReservedPool& r, std::int64_t d, std::int64_t h) { r.resize(true, d, h); })
      .def("shrink", [](ReservedPool& r, std::int64_t d, std::int64_t h) { r.resize(false, d, h); });
  m.def("reserved_pool", &reserved_pool, "A pool with a reserve (PoolConfig's device_reserve, host_reserve)");
  m.def("init_pool", &init_pool_py, "Writes a new pool's state into its memory");
  m.def("record_bytes", &record_bytes_py, "Bytes of a record's memory");
  m.def("init_record", &init_record_py, "Writes an empty record into its memory");
  m.def("pool_stats", &pool_stats_py, "The pool's flags and counters (synchronises)");
  m.def("record_status", &record_status_py, "A record's state (synchronises)");
  m.def("report_bytes", [] { return static_cast<std::int64_t>(sizeof(ps::PoolStats)); });
  m.def("decode_report", &decode_report, "A report written by torch.ops.pagestash.report, as a dict");
  m.def("flag_names", &flag_names, "The flags' names, in the order of their int32 words");
  m.def("flag_meanings", &flag_meanings, "What each flag means, in the order of flag_names()");
  m.def("flag_categories", &flag_categories,
        "Each flag's category (capacity, misuse, info), in the order of flag_names()");
  m.def("decide", &decide_py, "keep, rerun_without_paging or report_error, for agreed flags");
  m.def("size_pool", &size_pool_py, "The pool sizer (pagestash/sizing.hpp) for a layer of the recipes");
  {  // size_pool's request and defaults (the command's, pagestash_size): SizingRequest's table
    SizingRequest defaults;
    py::dict d;
    for_each_field(defaults, [&](const char* name, const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::vector<Shape>>) d[name] = py::list();
      else d[name] = py::cast(value);
    });
    m.attr("sizing_request") = d;
    py::list settings;  // the settings' table (PAGESTASH_SIZING_SETTINGS): (name, default, what), in its order
    sizing::for_each_field(defaults.settings, [&](const char* name, const auto& value, const char* what) {
      settings.append(py::make_tuple(name, value, what));
    });
    m.attr("sizing_settings") = settings;
    py::list fields;
    sizing::for_each_field(sizing::PoolSizing{}, [&](const char* name, const auto&) { fields.append(name); });
    m.attr("sizing_fields") = fields;
  }
#ifdef PAGESTASH_TORCH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("version") = std::to_string(PAGESTASH_VERSION_MAJOR) + "." + std::to_string(PAGESTASH_VERSION_MINOR) + "." +
                      std::to_string(PAGESTASH_VERSION_PATCH);
}
