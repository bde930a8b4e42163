// moe_stash_demo: a sync-free MoE training step with paged stashing, end to end.
//
// L MoE layers, G experts, M microbatches. A seeded router (the sizer's DirichletRouting,
// token by token: Dirichlet(0.5) over experts, top-k) draws per-expert token counts; each
// layer's forward makes its saved activation in the chosen recipe in an oversized
// [G, capacity, K] buffer (one static buffer, reused by every layer), stashes the live rows
// into a page pool, and backward reloads them and checks them bit for bit (with --compression, the bf16 and fp16
// recipes are stashed compressed, next to their lossless run, and checked against the reference round trip,
// round_trip_blocks: what a compressed stash gives back). The pool is
// sized from an eager step (every tensor fits) times a factor, or, with --overflow P, by
// the pool sizer (pagestash/sizing.hpp) for a per-step overflow probability P under the
// same router; the sizer's pool is printed either way.
// Runs the CUDA executor when a GPU is present, the host reference executor otherwise.
//
//   moe_stash_demo [flags]: `moe_stash_demo --help` lists every flag with its default (help_text below).

#include <pagestash/layouts/recipes.hpp>
#include <pagestash/pagestash.cuh>
#include <pagestash/sizing.hpp>
#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/reference.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ps = pagestash;
using std::int64_t;

namespace {

// ---- Options ------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> recipes = {"bf16", "fp16", "mxfp8", "nvfp4"};
  int layers = 4, experts = 8, microbatches = 4, topk = 2;
  int64_t tokens = 1024, hidden = 1024;
  int64_t capacity = 0;  ///< tokens per expert buffer; 0: from the capacity factor
  double capacity_factor = 2.0, pool_factor = 1.10, spill_factor = 0.0;
  double overflow =
      0.0;  ///< > 0 (--overflow, in (0, 1)): the pool is the sizer's for this per-step overflow probability
  int64_t page_kib = 64;
  std::vector<std::string> schedules = {"lifo", "1f1b"};
  unsigned seed = 7;
  std::string executor = "auto";
  std::string compression = ps::Lossless::name;  ///< of the bf16/fp16 recipes (compression_names())
  bool json = false;
  bool grow = false;  ///< the measured step starts on a quarter of the pool and grows on overflow
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// --help: asked for, not a usage error.
struct HelpRequested {};

/// Every flag, with its default and meaning (--help, on stdout). The README and docs name each (a test checks).
std::string help_text() {
  std::string compressions;
  for (const auto& n : ps::compression_names()) compressions += (compressions.empty() ? "" : "|") + n;
  return "usage: moe_stash_demo [flags]   (scripts/demo [flags] builds it, then runs it)\n"
         "A sync-free MoE training step with paged stashing: for each recipe and schedule, every layer's saved\n"
         "activation of every microbatch is stashed after its forward and reloaded in its backward, and checked.\n"
         "\n"
         "The step:\n"
         "  --shape " +
         ps::sizing::model_shape_names("|") +
         "\n"
         "                              a model's MoE layer on one rank (hidden, experts, top-k, tokens:\n"
         "                              sizing::model_shapes); flags after it override it\n"
         "  --layers N                  MoE layers (default 4)\n"
         "  --microbatches N            microbatches per step (default 4)\n"
         "  --experts N                 experts (default 8)\n"
         "  --topk N                    experts per token (default 2)\n"
         "  --tokens N                  tokens per microbatch (default 1024)\n"
         "  --hidden N                  hidden size (default 1024)\n"
         "  --seed N                    the router's and the activations' seed (default 7)\n"
         "  --schedule lifo|1f1b|both   forward-then-backward, an interleaved 1F1B, or both (default both)\n"
         "What is saved:\n"
         "  --recipes NAME|FAMILY,...   recipes (default bf16,fp16,mxfp8,nvfp4: a family's capacity recipe with\n"
         "                              swizzled scales; or a capacity recipe's name, as mxfp8/capacity/compact)\n"
         "  --compression " +
         compressions +
         "\n"
         "                              also stash the bf16 and fp16 recipes compressed, lossy (default lossless)\n"
         "  --capacity-factor X         tokens per expert buffer: the mean per expert (tokens x topk / experts)\n"
         "                              times X, rounded up to the layout's granule (default 2); no-stash, and\n"
         "                              so saved, grow with it\n"
         "  --capacity N                tokens per expert buffer, instead of the factor\n"
         "The pool (pages of the eager step: the same step, on a pool every tensor fits):\n"
         "  --pool-factor X             device pages: the eager step's peak pages x X (default 1.10)\n"
         "  --overflow P                device pages: the sizer's for overflow <= P per step, P in (0, 1),\n"
         "                              instead of the factor (default: the factor; the sizer's pool at 1e-3\n"
         "                              is shown either way)\n"
         "  --spill-factor X            host spill pages: the eager step's peak pages x X (default 0: none);\n"
         "                              used only when the device pages run out\n"
         "  --page-kib N                page size in KiB, a power of two (default 64)\n"
         "  --grow                      start on a quarter of the pool and grow it where a step overflows\n"
         "                              (the step rerun after a reset and a grow)\n"
         "Running:\n"
         "  --executor auto|host|cuda   auto: the CUDA executor where a GPU is, else the host reference\n"
         "                              executor (default auto)\n"
         "  --json                      JSON instead of the table\n"
         "  --help, -h                  print this and exit\n";
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

template <class T>
T parse_number(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  T x{};
  try {
    if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(std::stod(value, &used));
    else x = static_cast<T>(std::stoll(value, &used));
  } catch (const std::exception&) { used = 0; }
  if (used != value.size() || value.empty()) throw UsageError(flag + ": '" + value + "' is not a number");
  return x;
}

const ps::sizing::ModelShape& model_shape(const std::string& name) {
  try {
    return ps::sizing::model_shape(name);
  } catch (const std::invalid_argument& e) { throw UsageError(std::string("--shape: ") + e.what()); }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--json" || flag == "--grow") {
      (flag == "--json" ? o.json : o.grow) = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") throw HelpRequested{};
    const auto eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(flag + ": missing value");
    }
    if (flag == "--shape") {  // one rank's MoE layer of a known model; later flags override
      const ps::sizing::ModelShape& s = model_shape(value);
      o.hidden = s.hidden, o.experts = s.experts, o.topk = s.top_k, o.tokens = s.tokens;
    } else if (flag == "--recipes") o.recipes = split(value);
    else if (flag == "--layers") o.layers = parse_number<int>(flag, value);
    else if (flag == "--experts") o.experts = parse_number<int>(flag, value);
    else if (flag == "--microbatches") o.microbatches = parse_number<int>(flag, value);
    else if (flag == "--tokens") o.tokens = parse_number<int64_t>(flag, value);
    else if (flag == "--topk") o.topk = parse_number<int>(flag, value);
    else if (flag == "--hidden") o.hidden = parse_number<int64_t>(flag, value);
    else if (flag == "--capacity") o.capacity = parse_number<int64_t>(flag, value);
    else if (flag == "--capacity-factor") o.capacity_factor = parse_number<double>(flag, value);
    else if (flag == "--pool-factor") o.pool_factor = parse_number<double>(flag, value);
    else if (flag == "--overflow") {
      o.overflow = parse_number<double>(flag, value);
      if (!(o.overflow > 0 && o.overflow < 1)) throw UsageError("--overflow must be a probability in (0, 1)");
    } else if (flag == "--spill-factor") o.spill_factor = parse_number<double>(flag, value);
    else if (flag == "--page-kib") o.page_kib = parse_number<int64_t>(flag, value);
    else if (flag == "--schedule")
      o.schedules = value == "both" ? std::vector<std::string>{"lifo", "1f1b"} : split(value);
    else if (flag == "--seed") o.seed = parse_number<unsigned>(flag, value);
    else if (flag == "--executor") o.executor = value;
    else if (flag == "--compression" || flag == "--compress") o.compression = value;  // --compress: its old name

    else throw UsageError("unknown flag " + flag);
  }
  for (auto& r : o.recipes) {  // a family: its capacity recipe, swizzled scales
    try {
      r = ps::recipe_name(r, "capacity", "swizzled");
    } catch (const std::invalid_argument& e) { throw UsageError(std::string("--recipes: ") + e.what()); }
    if (r.find("/capacity") == std::string::npos)
      throw UsageError("--recipes: '" + r + "' is not a capacity recipe (the demo's buffers are [G, capacity, K])");
  }
  for (const auto& s : o.schedules)
    if (s != "lifo" && s != "1f1b") throw UsageError("--schedule: unknown schedule '" + s + "' (lifo, 1f1b, both)");
  if (o.recipes.empty()) throw UsageError("--recipes: name at least one recipe");
  if (o.layers < 1) throw UsageError("--layers must be at least 1");
  if (o.experts < 1) throw UsageError("--experts must be at least 1");
  if (o.microbatches < 1) throw UsageError("--microbatches must be at least 1");
  if (o.tokens < 1) throw UsageError("--tokens must be at least 1");
  if (o.topk < 1 || o.topk > o.experts) throw UsageError("--topk must be between 1 and --experts");
  if (o.hidden < 1) throw UsageError("--hidden must be positive");
  if (!(o.capacity_factor > 0)) throw UsageError("--capacity-factor must be positive");
  if (!(o.pool_factor >= 0) || !(o.spill_factor >= 0))
    throw UsageError("--pool-factor and --spill-factor must be >= 0");
  if (o.page_kib < 1 || (o.page_kib & (o.page_kib - 1)) != 0) throw UsageError("--page-kib must be a power of two");
  const std::vector<std::string> compressions = ps::compression_names();
  if (std::find(compressions.begin(), compressions.end(), o.compression) == compressions.end()) {
    std::string known;
    for (const auto& n : compressions) known += (known.empty() ? "" : ", ") + n;
    throw UsageError("--compression: unknown compression '" + o.compression + "' (" + known + ")");
  }
  if (o.executor != "auto" && o.executor != "host" && o.executor != "cuda")
    throw UsageError("--executor: 'auto', 'host' or 'cuda'");
  return o;
}

// ---- Memory and executors ---------------------------------------------------------------------

/// A buffer in host or device memory.
struct Buffer {
  ps::MemorySpace space;
  std::size_t bytes;
  void* ptr = nullptr;
  Buffer(ps::MemorySpace s, std::size_t n) : space(s), bytes(n) {
    if (space == ps::MemorySpace::host) ptr = std::calloc(n + 16, 1);
    else PAGESTASH_CUDA_TRY(cudaMalloc(&ptr, n + 16));
  }
  ~Buffer() {
    if (space == ps::MemorySpace::host) std::free(ptr);
    else cudaFree(ptr);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void upload(const void* src, std::size_t n) {
    if (space == ps::MemorySpace::host) {
      std::memcpy(ptr, src, n);
      return;
    }
    // From pageable memory on the legacy stream, cudaMemcpy may return before the copy
    // lands, and the step's non-blocking stream does not wait for it: wait here.
    PAGESTASH_CUDA_TRY(cudaMemcpy(ptr, src, n, cudaMemcpyHostToDevice));
    PAGESTASH_CUDA_TRY(cudaDeviceSynchronize());
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes);
    if (space == ps::MemorySpace::host) std::memcpy(out.data(), ptr, bytes);
    else PAGESTASH_CUDA_TRY(cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return out;
  }
};

// ---- Router ---------------------------------------------------------------------------------

/// The router's popularity concentration: imbalanced, as real routers are.
constexpr double router_alpha = 0.5;

/// The sizer's router, token by token: per (layer, microbatch), expert popularity from a
/// Dirichlet(router_alpha) draw, each token sent to `topk` distinct experts, every expert
/// capped at `capacity` (tokens beyond it dropped, as a capacity factor does).
ps::sizing::DirichletRouting dirichlet_router(const Options& o, int64_t capacity) {
  ps::sizing::Routing r;
  r.experts = o.experts;
  r.top_k = o.topk;
  r.tokens = o.tokens;
  r.alpha = router_alpha;
  r.capacity = capacity;
  r.sampler = ps::sizing::RoutingSampler::per_token;
  return ps::sizing::DirichletRouting(r);
}

// ---- The sizer's model of the step ----------------------------------------------------------

/// The sizer's pool for the overflow probability the demo sizes for (--overflow, or 1e-3
/// to show next to the eager sizing).
constexpr double shown_overflow = 1e-3;
constexpr std::int64_t sizing_samples = 20000;
/// Count vectors drawn from dirichlet_router() for the sizer, which draws each sampled stash's
/// counts from them with replacement: the demo's router itself, at the cost of drawing it
/// only this many times (token by token, it is too slow to draw for every sampled stash).
constexpr int router_draws = 4096;

/// Uncapped count vectors of the demo's router (a capacity of every token), from a seed of
/// their own (the step's draws are not among them). The sizer caps them at each recipe's
/// capacity, as the step's router does.
std::vector<std::vector<std::int32_t>> router_samples(const Options& o) {
  const ps::sizing::DirichletRouting uncapped = dirichlet_router(o, o.tokens);
  std::mt19937_64 rng(o.seed ^ 0x9E3779B9u);
  std::vector<std::vector<std::int32_t>> out(router_draws);
  for (auto& counts : out) uncapped.draw(rng, counts);
  return out;
}

/// The stashes one layer holds at the peak of the demo's schedule: all microbatches under
/// lifo; two under its 1F1B (a warm-up of two microbatches: the first of two stages).
ps::sizing::Schedule sizing_schedule(const std::string& name, const Options& o) {
  if (name == "lifo") return ps::sizing::Schedule::forward_then_backward(o.layers, o.microbatches);
  return ps::sizing::Schedule::one_f_one_b(o.layers, o.microbatches, 2);
}

/// Activations: a cheap deterministic generator (splitmix64), never zero.
std::vector<ps::BF16> activations(int64_t rows, int64_t hidden, const std::vector<std::int32_t>& counts,
                                  int64_t capacity, std::uint64_t seed) {
  std::vector<ps::BF16> s(static_cast<std::size_t>(rows * hidden), ps::BF16::from_float(0.0f));
  for (std::size_t g = 0; g < counts.size(); ++g) {
    for (int64_t i = 0; i < counts[g] * hidden; ++i) {
      std::uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = static_cast<float>(z >> 40) / static_cast<float>(1 << 24);  // [0, 1)
      const float x = (u - 0.5f) * 4.0f;
      s[static_cast<std::size_t>(static_cast<int64_t>(g) * capacity * hidden + i)] =
          ps::BF16::from_float(x == 0 ? 0.25f : x);
    }
  }
  return s;
}

/// FNV-1a over the live bytes of every buffer Traits saves (the whole buffer if kept).
template <class Traits>
std::uint64_t live_hash(const ps::GroupedView<typename Traits::layout>& v, const std::vector<std::int32_t>& counts,
                        const std::map<ps::BufferRole, std::vector<unsigned char>>& bytes) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& entry : bytes) {
    const ps::BufferRole role = entry.first;
    const std::vector<unsigned char>& b = entry.second;
    const ps::Handling handling = ps::handling_of<Traits>(role);
    if (handling == ps::Handling::dropped) continue;
    const ps::BufferGeometry geo = v.geometry(role);
    auto mix = [&](int64_t offset, int64_t n) {
      for (int64_t i = 0; i < n; ++i) h = (h ^ b[static_cast<std::size_t>(offset + i)]) * 1099511628211ull;
    };
    if (handling == ps::Handling::kept) mix(0, geo.total_bytes);
    else
      for (int64_t i = 0; i < ps::run_count(geo); ++i) {
        const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
        mix(run.offset, run.bytes);
      }
  }
  return h;
}

/// What a reload of a stash under Compression gives back: the buffers as they are, but for a compressed data
/// buffer, whose live runs become the reference round trip (round_trip_blocks: dequantize(quantize(x)) block by
/// block), the oracle a compressed reload must equal bit for bit.
template <class Layout, class Compression>
std::map<ps::BufferRole, std::vector<unsigned char>> reloaded_bytes(
    const ps::GroupedView<Layout>& v, const std::vector<std::int32_t>& counts,
    std::map<ps::BufferRole, std::vector<unsigned char>> bytes) {
  if constexpr (Compression::compressed) {
    using T = typename Layout::data_type;
    std::vector<unsigned char>& b = bytes.at(ps::BufferRole::data);
    const ps::BufferGeometry geo = v.geometry(ps::BufferRole::data);
    for (int64_t i = 0; i < ps::run_count(geo); ++i) {
      const ps::ByteRun run = ps::byte_run(geo, i, counts.data());
      const int64_t n = run.bytes / static_cast<int64_t>(sizeof(T));
      std::vector<T> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
      std::memcpy(in.data(), b.data() + run.offset, static_cast<std::size_t>(run.bytes));
      ps::round_trip_blocks<typename Compression::format>(in.data(), n, out.data());
      std::memcpy(b.data() + run.offset, out.data(), static_cast<std::size_t>(run.bytes));
    }
  }
  return bytes;
}

// ---- One recipe, one schedule -----------------------------------------------------------------

struct Result {
  std::string recipe, schedule, executor;
  std::string compression = ps::Lossless::name;  ///< how the stash paged the data
  bool compressible = false;                     ///< the recipe's data can be paged compressed (bf16, fp16)
  int64_t tensors = 0, capacity = 0, dropped_tokens = 0;
  int64_t oversized_bytes = 0;  ///< peak bytes of saved tensors held at full shape, no stashing
  int64_t pool_bytes = 0;       ///< device reserve of the sized pool
  int64_t host_pool_bytes = 0;  ///< host spill reserve
  int64_t peak_pool_bytes = 0;  ///< peak device pages used x page size (at most pool_bytes)
  int64_t eager_peak_pages = 0, pool_pages = 0;
  int64_t peak_pages = 0;                ///< device + host pages held at once, at most
  int64_t peak_device_pages = 0;         ///< device pages held at once, at most
  ps::sizing::QuantileEstimate planned;  ///< the sizer's pool (pages) for `planned_for`
  double planned_for = 0;                ///< its target overflow probability per step
  double planned_overflow = 0;           ///< its overflow rate on the sizer's samples
  bool sized_by_sizer = false;           ///< the measured step's pool is the sizer's
  int64_t live_bytes = 0;                ///< moved by all stashes
  bool host_spill = false;
  int64_t overflows = 0;               ///< stashes or reloads that could not do their work
  int64_t pages_held_at_step_end = 0;  ///< pages not back at the step's end (end_step): 0, or a leak
  int64_t lost = 0;                    ///< tensors not restored because their stash overflowed
  int64_t parity_ok = 0, parity_bad = 0;
  double stash_seconds = 0, reload_seconds = 0;
  std::vector<std::pair<int64_t, int64_t>> growths;  ///< --grow: each grow's pages, before and after
  double saved_percent() const {
    return oversized_bytes > 0 ? 100.0 * (1.0 - double(pool_bytes) / double(oversized_bytes)) : 0;
  }
};

/// The forward (F) and backward (B) events of one microbatch, in schedule order.
std::vector<std::pair<char, int>> schedule(const std::string& name, int microbatches) {
  std::vector<std::pair<char, int>> s;
  if (name == "lifo") {
    for (int m = 0; m < microbatches; ++m) s.push_back({'F', m});
    for (int m = microbatches - 1; m >= 0; --m) s.push_back({'B', m});
    return s;
  }
  // 1F1B with a warm-up of two microbatches: F0 F1 B0 F2 B1 ... frees out of stash order.
  const int warmup = std::min(2, microbatches);
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) s.push_back({'F', next_f});
  while (next_b < microbatches) {
    s.push_back({'B', next_b++});
    if (next_f < microbatches) s.push_back({'F', next_f++});
  }
  return s;
}

template <class L, class Compression>
class Step {
 public:
  using Traits = ps::CompressionTraits<L, Compression>;

  Step(const Options& o, bool cuda, const std::vector<std::vector<std::int32_t>>& router)
      : o_(o), cuda_(cuda), space_(cuda ? ps::MemorySpace::device : ps::MemorySpace::host), router_(router) {
    shape_.hidden = o.hidden;
    shape_.groups = o.experts;
    const int64_t granule = shape_.granule();
    const auto mean = static_cast<double>(o.tokens) * o.topk / o.experts;
    shape_.max_tokens =
        std::max<int64_t>(granule, static_cast<int64_t>(std::ceil(mean * o.capacity_factor / granule)) * granule);
    if (o.capacity != 0) shape_.max_tokens = o.capacity;
    // A hidden size or capacity the recipe's layout cannot hold: a clear error (exit 2).
    ps::validate_shape(shape_);
    if (shape_.max_tokens < 1) throw std::invalid_argument("--capacity must be positive");
    view_ = shape_;
    for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales, ps::BufferRole::amax})
      buffers_[role] = std::make_unique<Buffer>(space_, static_cast<std::size_t>(shape_.buffer_bytes(role)));
    counts_ = std::make_unique<Buffer>(space_, static_cast<std::size_t>(o.experts) * sizeof(std::int32_t));
    source_ =
        std::make_unique<Buffer>(space_, static_cast<std::size_t>(shape_.token_rows() * o.hidden) * sizeof(ps::BF16));
    view_.data = static_cast<typename L::data_type*>(buffers_[ps::BufferRole::data]->ptr);
    if constexpr (!std::is_void_v<typename L::scale_type>)
      view_.scales = static_cast<typename L::scale_type*>(buffers_[ps::BufferRole::scales]->ptr);
    if (L::has(ps::BufferRole::amax)) view_.amax = static_cast<float*>(buffers_[ps::BufferRole::amax]->ptr);
    view_.counts = static_cast<const std::int32_t*>(counts_->ptr);
    if (cuda_) PAGESTASH_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The router's draws for every (layer, microbatch), fixed by the seed.
    const ps::sizing::DirichletRouting capped = dirichlet_router(o, shape_.max_tokens);
    std::mt19937_64 rng(o.seed);
    routes_.resize(static_cast<std::size_t>(o.layers * o.microbatches));
    for (auto& counts : routes_) dropped_ += capped.draw(rng, counts);
  }
  ~Step() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Result run(const std::string& schedule_name) {
    Result r;
    r.recipe = ps::Recipe<L>::name();
    r.compression = Compression::name;
    r.compressible = ps::compressible<L>;
    r.schedule = schedule_name;
    r.executor = cuda_ ? "cuda" : "host";
    r.capacity = shape_.max_tokens;
    r.tensors = int64_t{o_.layers} * o_.microbatches;
    r.dropped_tokens = dropped_;
    const auto events = schedule(schedule_name, o_.microbatches);

    // Eager step: a pool every saved tensor fits in at once, to observe the peak.
    ps::PoolConfig generous;
    generous.page_bytes = o_.page_kib << 10;
    generous.device_pages = 1;  // a probe: the record's sizes depend only on the page size
    {
      ps::PagePool probe(generous, space_);
      const int64_t per_tensor = ps::make_record<Traits>(probe, shape_).max_pages();
      generous.device_pages = per_tensor * r.tensors;
    }
    ps::PoolStats observed{};
    {
      ps::PagePool eager(generous, space_);
      Pass(*this, eager, r, false).run(events);
      observed = eager.stats();
    }
    r.eager_peak_pages = observed.peak_pages_held;

    // The sizer's pool for the tensor the demo stashes (its layout and shape), the
    // schedule's peak and the demo's router.
    const ps::sizing::Schedule sizing_sched = sizing_schedule(schedule_name, o_);
    const ps::sizing::Layer layer({ps::sizing::SavedTensor::of<Traits>(shape_, r.recipe)}, shape_.max_tokens);
    // router_samples() does not cap: its counts are capped at each recipe's capacity here.
    const ps::sizing::MeasuredCounts router(router_, shape_.max_tokens, "the demo's router", ps::sizing::Excess::cap);
    ps::sizing::SizingSettings settings;
    settings.page_bytes = o_.page_kib << 10;
    settings.samples = sizing_samples;
    settings.seed = o_.seed;
    settings.overflow = o_.overflow > 0 ? o_.overflow : shown_overflow;
    const ps::sizing::PoolSizing sizer = ps::sizing::size_pool(layer, sizing_sched, router, settings);
    r.planned = sizer.pages;
    r.planned_for = settings.overflow;
    r.planned_overflow = sizer.overflow_probability;

    // The measured step, on a pool sized from the eager one or by the sizer.
    ps::PoolConfig sized = ps::size_from_peak(observed, o_.pool_factor, o_.spill_factor);
    r.sized_by_sizer = o_.overflow > 0;
    if (r.sized_by_sizer) sized.device_pages = sizer.pages.value;
    // --grow: the step starts on a quarter of that pool, with a reserve of twice it; a step that overflows is rerun
    // after a reset and a grow (doubling, up to the sized pool), as a trainer reruns it: no restart, no new pool.
    ps::PoolConfig start = sized;
    if (o_.grow) {
      start.device_pages = std::max<int64_t>(1, sized.device_pages / 4);
      start.device_reserve = 2 * sized.device_pages;
    }
    ps::PagePool pool(start, space_);
    for (;;) {
      Result attempt = r;  // a step that overflowed is not the measured one
      Pass(*this, pool, attempt, true).run(events);
      const int64_t from = pool.config().device_pages;
      if (!o_.grow || pool.stats().failures() == 0 || from >= sized.device_pages) {
        r = attempt;
        break;
      }
      const int64_t to = std::min(sized.device_pages, 2 * from);
      if (cuda_) {
        ps::reset(ps::on(stream_), pool);
        ps::grow(ps::on(stream_), pool, to, pool.config().host_pages);
        PAGESTASH_CUDA_TRY(cudaStreamSynchronize(stream_));
      } else {
        ps::reset(ps::host, pool);
        ps::grow(ps::host, pool, to, pool.config().host_pages);
      }
      r.growths.emplace_back(from, to);
    }
    const ps::PoolStats st = pool.stats();
    r.pool_pages = pool.config().device_pages;
    r.pool_bytes = pool.config().device_bytes();
    r.host_pool_bytes = pool.config().host_bytes();
    r.peak_pages = st.peak_pages_held;
    r.peak_device_pages = st.peak_device_pages_held;
    r.peak_pool_bytes = st.peak_device_pages_held * pool.config().page_bytes;
    r.host_spill = st.flags.host_spill != 0;
    r.overflows = st.failures();
    r.pages_held_at_step_end = st.pages_held_at_step_end;
    // Without stashing, every saved tensor keeps its full-shape buffers until its backward.
    int64_t per_tensor = 0;
    for (ps::BufferRole role : {ps::BufferRole::data, ps::BufferRole::scales, ps::BufferRole::amax})
      if (ps::handling_of<Traits>(role) != ps::Handling::dropped) per_tensor += shape_.buffer_bytes(role);
    int64_t held = 0, peak_held = 0;
    for (const auto& [kind, m] : events) {
      (void)m;
      held += (kind == 'F' ? 1 : -1) * o_.layers;
      peak_held = std::max(peak_held, held);
    }
    r.oversized_bytes = peak_held * per_tensor;
    if (peak_held != sizer.alive_stashes)  // the sizer's schedule must be the one run here
      throw std::logic_error("the sizer's schedule holds " + std::to_string(sizer.alive_stashes) +
                             " stashes, the demo's " + std::to_string(peak_held));
    return r;
  }

 private:
  /// One pass over the schedule against one pool.
  struct Pass {
    Step& s;
    ps::PagePool& pool;
    Result& r;
    bool measured;
    std::vector<ps::StashRecord<Traits>> records;
    std::vector<std::uint64_t> expected;

    Pass(Step& step, ps::PagePool& p, Result& result, bool m) : s(step), pool(p), r(result), measured(m) {
      for (int i = 0; i < s.o_.layers * s.o_.microbatches; ++i)
        records.push_back(ps::make_record<Traits>(pool, s.shape_));
      expected.resize(records.size());
    }

    void run(const std::vector<std::pair<char, int>>& events) {
      for (const auto& [kind, m] : events) {
        if (kind == 'F') {
          for (int l = 0; l < s.o_.layers; ++l) forward(l, m);
        } else {
          for (int l = s.o_.layers - 1; l >= 0; --l) backward(l, m);
        }
      }
      // The step's end: every record was reloaded, so every page must be back (a record
      // forgotten would raise `unbalanced`).
      if (s.cuda_) {
        ps::end_step(ps::on(s.stream_), pool);
        PAGESTASH_CUDA_TRY(cudaStreamSynchronize(s.stream_));
      } else {
        ps::end_step(ps::host, pool);
      }
    }

    std::size_t index(int l, int m) const { return static_cast<std::size_t>(m * s.o_.layers + l); }

    void forward(int l, int m) {
      const std::size_t i = index(l, m);
      const auto& counts = s.routes_[i];
      s.counts_->upload(counts.data(), counts.size() * sizeof(std::int32_t));
      if (measured) produce(i);  // the eager step only needs the counts: they decide the pages
      const auto t0 = std::chrono::steady_clock::now();
      if (s.cuda_) {
        ps::stash(ps::on(s.stream_), pool, s.view_, records[i]);
        PAGESTASH_CUDA_TRY(cudaStreamSynchronize(s.stream_));
      } else {
        ps::stash(ps::host, pool, s.view_, records[i]);
      }
      if (measured) {
        r.stash_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.live_bytes += records[i].status().live_bytes;
      }
    }

    /// The layer's forward: its saved activation, made in the recipe in the static buffer.
    void produce(std::size_t i) {
      const auto& counts = s.routes_[i];
      const auto source =
          activations(s.shape_.token_rows(), s.o_.hidden, counts, s.shape_.max_tokens, s.o_.seed * 7919 + i);
      if (s.cuda_) {
        s.source_->upload(source.data(), source.size() * sizeof(ps::BF16));
        ps::produce_on_device(s.view_, static_cast<const ps::BF16*>(s.source_->ptr), 0xEE, s.stream_);
        PAGESTASH_CUDA_TRY(cudaStreamSynchronize(s.stream_));
      } else {
        ps::produce(s.view_, source.data(), counts.data(), 0xEE);
      }
      expected[i] = live_hash<Traits>(s.shape_, counts, reloaded_bytes<L, Compression>(s.shape_, counts, s.download()));
    }

    void backward(int l, int m) {
      const std::size_t i = index(l, m);
      const bool held = records[i].status().state == ps::RecordState::stashed;
      const auto t0 = std::chrono::steady_clock::now();
      if (s.cuda_) {
        ps::reload(ps::on(s.stream_), pool, records[i], s.view_, ps::ReloadOptions{true});
        PAGESTASH_CUDA_TRY(cudaStreamSynchronize(s.stream_));
      } else {
        ps::reload(ps::host, pool, records[i], s.view_, ps::ReloadOptions{true});
      }
      if (!measured) return;
      r.reload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!held) {
        ++r.lost;  // its stash overflowed: reported, and the step would be rerun
        return;
      }
      const bool same = live_hash<Traits>(s.shape_, s.routes_[i], s.download()) == expected[i];
      (same ? r.parity_ok : r.parity_bad) += 1;
    }
  };

  std::map<ps::BufferRole, std::vector<unsigned char>> download() const {
    std::map<ps::BufferRole, std::vector<unsigned char>> out;
    for (const auto& [role, b] : buffers_) out[role] = b->download();
    return out;
  }

  const Options& o_;
  bool cuda_;
  ps::MemorySpace space_;
  ps::GroupedView<L> shape_, view_;
  std::map<ps::BufferRole, std::unique_ptr<Buffer>> buffers_;
  std::unique_ptr<Buffer> counts_, source_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::vector<std::int32_t>> routes_;
  const std::vector<std::vector<std::int32_t>>& router_;
  int64_t dropped_ = 0;
};

template <class L, class Compression>
std::vector<Result> run_recipe(const Options& o, bool cuda, const std::vector<std::vector<std::int32_t>>& router) {
  Step<L, Compression> step(o, cuda, router);
  std::vector<Result> out;
  for (const auto& s : o.schedules) out.push_back(step.run(s));
  return out;
}

// ---- Output ---------------------------------------------------------------------------------

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return b;
}

double gbps(int64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }

void print_table(const std::vector<Result>& results, const Options& o) {
  std::printf("\n%-28s %-10s %-5s %9s %10s %10s %10s %7s %6s %6s %6s %6s %5s %9s %9s  %s\n", "recipe", "stash", "sched",
              "capacity", "no-stash", "pool", "peak used", "saved", "pages", "eager", "sized", "spill", "ovfl", "stash",
              "reload", "parity");
  std::printf("%-28s %-10s %-5s %9s %10s %10s %10s %7s %6s %6s %6s %6s %5s %9s %9s\n", "", "", "", "tokens", "MiB",
              "MiB", "MiB", "%", "", "peak", "pages", "", "", "GB/s", "GB/s");
  for (const Result& r : results) {
    char parity[64];
    const bool compressed = r.compression != ps::Lossless::name;
    if (r.parity_bad == 0 && r.lost == 0)
      std::snprintf(parity, sizeof parity, "OK (%lld/%lld %s)", (long long)r.parity_ok, (long long)r.tensors,
                    compressed ? "= round trip" : "bit-exact");
    else
      std::snprintf(parity, sizeof parity, "%s (%lld ok, %lld bad, %lld lost to overflow)",
                    r.parity_bad ? "FAIL" : "OK", (long long)r.parity_ok, (long long)r.parity_bad, (long long)r.lost);
    // A step that overflowed did not do its work: its saving and its rates are no figures.
    char saved[16] = "n/a", stash[16] = "n/a", reload[16] = "n/a";
    if (r.overflows == 0) {
      std::snprintf(saved, sizeof saved, "%.1f%%", r.saved_percent());
      std::snprintf(stash, sizeof stash, "%.2f", gbps(r.live_bytes, r.stash_seconds));
      std::snprintf(reload, sizeof reload, "%.2f", gbps(r.live_bytes, r.reload_seconds));
    }
    std::printf("%-28s %-10s %-5s %9lld %10s %10s %10s %7s %6lld %6lld %6lld %6s %5lld %9s %9s  %s\n", r.recipe.c_str(),
                r.compression.c_str(), r.schedule.c_str(), (long long)r.capacity, mib(r.oversized_bytes).c_str(),
                mib(r.pool_bytes).c_str(), mib(r.peak_pool_bytes).c_str(), saved, (long long)r.pool_pages,
                (long long)r.eager_peak_pages, (long long)r.planned.value, r.host_spill ? "yes" : "no",
                (long long)r.overflows, stash, reload, parity);
  }
  char sizing[96];
  if (o.overflow > 0) std::snprintf(sizing, sizeof sizing, "the sizer's for overflow <= %g per step", o.overflow);
  else std::snprintf(sizing, sizeof sizing, "eager peak x %.2f", o.pool_factor);
  std::printf(
      "\n%d layers x %d microbatches of %lld tokens, top-%d of %d experts, hidden %lld; pool = %s "
      "(+ host spill = eager peak x %.2f), pages of %lld KiB.\n",
      o.layers, o.microbatches, (long long)o.tokens, o.topk, o.experts, (long long)o.hidden, sizing, o.spill_factor,
      (long long)o.page_kib);
  std::printf(
      "eager peak: the pages of an eager step (every tensor fits); sized: the pool sizer's pages for overflow "
      "<= %g per step (pagestash/sizing.hpp: %lld sampled steps, counts from %d draws of the demo's router).\n",
      o.overflow > 0 ? o.overflow : shown_overflow, (long long)sizing_samples, router_draws);
  std::printf(
      "no-stash: the saved tensors' full-shape buffers held at the schedule's peak; pool: the pool's device pages; "
      "peak used: the most of them in use at once (host spill pages apart).\n");
  char capacity[64];
  if (o.capacity != 0) std::snprintf(capacity, sizeof capacity, "--capacity %lld", (long long)o.capacity);
  else std::snprintf(capacity, sizeof capacity, "--capacity-factor %.2f", o.capacity_factor);
  std::printf(
      "saved = 1 - pool / no-stash: no-stash grows with the capacity (%s), the pool with the tokens kept and the "
      "pool's sizing, so saved is about 1 - (pool factor) x (tokens kept) / (capacity); n/a where the step "
      "overflowed, as are its GB/s.\n",
      capacity);
  if (o.compression != ps::Lossless::name) {
    std::printf(
        "stash %s: the data paged as FP8 codes and block scales, next to the lossless row; its parity is the reload "
        "against the reference round trip (round_trip_blocks), bit for bit; GB/s count the BF16/FP16 live bytes.\n",
        o.compression.c_str());
    std::vector<std::string> lossless_only;
    for (const Result& r : results)
      if (!r.compressible && std::find(lossless_only.begin(), lossless_only.end(), r.recipe) == lossless_only.end())
        lossless_only.push_back(r.recipe);
    for (const std::string& name : lossless_only)
      std::printf("%s: cannot be compressed (a compressed stash pages bf16 or fp16 data): ran lossless.\n",
                  name.c_str());
  }
  for (const Result& r : results)
    for (const auto& [from, to] : r.growths)
      std::printf("%s %s: grew %lld -> %lld pages (the step overflowed: pool reset, grown, step rerun; no restart)\n",
                  r.recipe.c_str(), r.schedule.c_str(), (long long)from, (long long)to);
  for (const Result& r : results) {
    if (r.overflows == 0) continue;
    std::printf(
        "%s %s: the pool overflowed (%lld stashes or reloads did nothing, reported in their records); the %lld "
        "tensors stashed before it reloaded bit-exactly. A trainer resets the pool and reruns the step.\n",
        r.recipe.c_str(), r.schedule.c_str(), (long long)r.overflows, (long long)r.parity_ok);
  }
  std::fflush(stdout);
}

void print_json(const std::vector<Result>& results) {
  std::printf("{\"results\": [");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    // A step that overflowed: its saving and rates are null (the table's n/a).
    const auto figure = [&](const char* format, double x) {
      char b[32] = "null";
      if (r.overflows == 0) std::snprintf(b, sizeof b, format, x);
      return std::string(b);
    };
    std::printf(
        "%s\n  {\"recipe\": \"%s\", \"compression\": \"%s\", \"compressible\": %s, "
        "\"parity_reference\": \"%s\", \"schedule\": \"%s\", \"executor\": \"%s\", \"tensors\": %lld, "
        "\"capacity_tokens\": %lld, \"dropped_tokens\": %lld, \"oversized_bytes\": %lld, \"pool_bytes\": %lld, "
        "\"host_pool_bytes\": %lld, \"peak_pool_bytes\": %lld, \"saved_percent\": %s, \"pool_pages\": %lld, "
        "\"eager_peak_pages\": %lld, \"peak_pages\": %lld, \"peak_device_pages\": %lld, \"host_spill\": %s, "
        "\"overflows\": %lld, \"lost\": %lld, \"live_bytes\": %lld, \"stash_gbps\": %s, \"reload_gbps\": %s, "
        "\"parity_ok\": %lld, \"parity_bad\": %lld, \"parity\": %s, \"sizing\": \"%s\", "
        "\"planned_pages\": %lld, \"planned_pages_low\": %lld, \"planned_pages_high\": %lld, "
        "\"planned_for_overflow\": %g, \"planned_overflow\": %.6f, \"pages_held_at_step_end\": %lld, "
        "\"growths\": %zu}",
        i ? "," : "", r.recipe.c_str(), r.compression.c_str(), r.compressible ? "true" : "false",
        r.compression == ps::Lossless::name ? "source" : "round_trip_blocks", r.schedule.c_str(), r.executor.c_str(),
        (long long)r.tensors, (long long)r.capacity, (long long)r.dropped_tokens, (long long)r.oversized_bytes,
        (long long)r.pool_bytes, (long long)r.host_pool_bytes, (long long)r.peak_pool_bytes,
        figure("%.3f", r.saved_percent()).c_str(), (long long)r.pool_pages, (long long)r.eager_peak_pages,
        (long long)r.peak_pages, (long long)r.peak_device_pages, r.host_spill ? "true" : "false",
        (long long)r.overflows, (long long)r.lost, (long long)r.live_bytes,
        figure("%.4f", gbps(r.live_bytes, r.stash_seconds)).c_str(),
        figure("%.4f", gbps(r.live_bytes, r.reload_seconds)).c_str(), (long long)r.parity_ok, (long long)r.parity_bad,
        r.parity_bad == 0 ? "true" : "false", r.sized_by_sizer ? "sizer" : "eager", (long long)r.planned.value,
        (long long)r.planned.low, (long long)r.planned.high, r.planned_for, r.planned_overflow,
        (long long)r.pages_held_at_step_end, r.growths.size());
  }
  std::printf("\n]}\n");
}

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const HelpRequested&) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moe_stash_demo: %s\nusage: moe_stash_demo [flags] (--help lists them)\n", e.what());
    return 2;
  }
  const bool gpu = gpu_present();
  if (o.executor == "cuda" && !gpu) {
    std::fprintf(stderr, "moe_stash_demo: --executor cuda, but no CUDA device is present\n");
    return 2;
  }
  const bool cuda = o.executor == "cuda" || (o.executor == "auto" && gpu);
  if (!o.json)
    std::printf("moe_stash_demo: %s executor (%s)\n", cuda ? "CUDA" : "host reference",
                cuda ? "GPU present" : "no GPU: the same algorithm, run on the CPU");
  std::vector<Result> results;
  try {
    const std::vector<std::vector<std::int32_t>> router = router_samples(o);
    for (const auto& recipe : o.recipes) {
      if (!o.json) std::fprintf(stderr, "  %s: eager step, then the measured step ...\n", recipe.c_str());
      std::vector<Result> r;
      bool compressible = false;
      ps::with_recipe(recipe, [&](auto rc) { compressible = ps::compressible<typename decltype(rc)::layout>; });
      // The capacity recipes of pagestash/layouts/recipes.hpp; compressed, after their lossless run (the rows to
      // compare), where the recipe can be (bf16, fp16), else lossless alone.
      ps::with_recipe(recipe, compressible ? o.compression : ps::Lossless::name, [&](auto rc, auto c) {
        using L = typename decltype(rc)::layout;
        using C = decltype(c);
        if constexpr (std::is_same_v<typename L::placement, ps::CapacityPadded>) {
          r = run_recipe<L, ps::Lossless>(o, cuda, router);
          if constexpr (C::compressed) {
            const std::vector<Result> compressed = run_recipe<L, C>(o, cuda, router);
            r.insert(r.end(), compressed.begin(), compressed.end());
          }
        }
      });
      results.insert(results.end(), r.begin(), r.end());
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "moe_stash_demo: %s\n", e.what());
    return 2;
  }
  if (o.json) print_json(results);
  else print_table(results, o);
  bool parity = true;
  for (const Result& r : results) parity = parity && r.parity_bad == 0;
  return parity ? 0 : 1;
}
