// pagestash_size: how many pages a pool needs so that a training step overflows it with a
// chosen probability, from a MoE layer's shape and recipe, the pipeline schedule and a
// model of the router's counts (docs/sizing.md). Plain C++ on the host; no GPU.
//
//   pagestash_size [--shape NAME] [--hidden N --experts N --top-k N --tokens N]
//                  [--recipe NAME|FAMILY] [--placement capacity|packed|packed_padded]
//                  [--scales swizzled|compact] [--compression lossless|mxfp8|mxfp8_e5m2|fp8_1x128] [--ffn-hidden N]
//                  [--schedule lifo|1f1b:P[:V]|list:a,b,c]
//                  [--layers 4] [--microbatches 8] [--alpha 1 [--correlation 0] | --counts FILE [--cap-counts]]
//                  [--routing multinomial|per-token] [--drift hot|alpha|correlation|tokens:v1,v2,...]
//                  [--capacity-factor 2] [--overflow 1e-3] [--confidence 0.95]
//                  [--page-bytes 65536] [--host-pages 0] [--samples 20000] [--bootstrap 200] [--seed 1]
//                  (the settings' flags: sizing::SizingSettings's table, PAGESTASH_SIZING_SETTINGS)
//                  [--warmup-factors 1,1.02,1.1,1.25,1.5] [--points 24]
//                  [--plot FILE.png] [--json]

#include <pagestash/sizing.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifndef PAGESTASH_SIZING_PLOT_SCRIPT
#  define PAGESTASH_SIZING_PLOT_SCRIPT "plot_sizing.py"
#endif

namespace sizing = pagestash::sizing;

namespace {

struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

std::string compression_list() {
  std::string list;
  for (const std::string& n : pagestash::compression_names()) list += (list.empty() ? "" : "|") + n;
  return list;
}

/// A setting's flag: its name, dashes for underscores (page_bytes: --page-bytes).
std::string flag_of(const char* name) {
  std::string flag = std::string("--") + name;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

/// --help's lines of the sizer's settings, one a field of their table (PAGESTASH_SIZING_SETTINGS), with its default.
std::string settings_usage() {
  std::string lines;
  const sizing::SizingSettings defaults;
  sizing::for_each_field(defaults, [&](const char* name, const auto& value, const char* what) {
    std::ostringstream line;
    line << "  " << flag_of(name) << (std::is_floating_point_v<std::decay_t<decltype(value)>> ? " X" : " N");
    line << std::string(line.str().size() < 33 ? 33 - line.str().size() : 1, ' ') << what << " (default " << value
         << ")\n";
    lines += line.str();
  });
  return lines;
}

const std::string usage =
    "usage: pagestash_size [options]\n"
    "  --shape " +
    sizing::model_shape_names("|") +
    "  a rank's MoE layer (sizing::model_shapes; later flags override)\n"
    "  --hidden N --experts N --top-k N --tokens N   the layer: hidden size, experts on the rank,\n"
    "                                 experts per token, tokens per microbatch (default 1024, 8, 2, 1024)\n"
    "  --recipe NAME|FAMILY           what the layer saves: a recipe (mxfp8/capacity/swizzled; --list-recipes),\n"
    "                                 or a family (bf16, fp16, fp32, mxfp8, mxfp8_e5m2, nvfp4; default mxfp8)\n"
    "  --placement capacity|packed|packed_padded   of a family (default capacity)\n"
    "  --scales swizzled|compact      block-scale arrangement of mxfp8/nvfp4 (default swizzled)\n"
    "  --compression FORMAT           page a bf16/fp16 recipe's data compressed: " +
    compression_list() +
    "\n"
    "                                 (default lossless; docs/layouts.md \"Compressed stash\")\n"
    "  --ffn-hidden N                 also save the second expert GEMM's input, of hidden N\n"
    "  --schedule lifo|1f1b:P[:V]|list:a,b,c|order:S0.0,...,R0.0   the step's order of stashes and reloads\n"
    "                                 (default lifo; order: a rank's own, event by event, docs/sizing.md)\n"
    "  --layers N --microbatches N    MoE layers on the rank, microbatches per step (default 4, 8)\n"
    "  --alpha A                      router popularity ~ Dirichlet(A) over the experts (default 1)\n"
    "  --correlation C                share C in [0, 1] of the popularity common to a step's stashes\n"
    "                                 (default 0: independent stashes; docs/sizing.md)\n"
    "  --counts FILE                  measured counts instead: one vector per line, per layer and\n"
    "                                 microbatch; 'step' lines group whole steps (docs/sizing.md)\n"
    "  --cap-counts                   cap measured counts above the capacity (default: refuse them)\n"
    "  --routing multinomial|per-token   how the Dirichlet router routes (default multinomial)\n"
    "  --drift PARAMETER:v1,v2,...    phases the Dirichlet router drifts through, one value each, the rest\n"
    "                                 as above: hot (the share of the tokens expert 0 takes; 0 none, an even\n"
    "                                 router's top_k/experts), alpha, correlation or tokens; prints each\n"
    "                                 phase's pool and the reserve a growable pool needs (docs/sizing.md)\n"
    "  --capacity-factor X            tokens per expert buffer / mean (default 2)\n" +
    settings_usage() +
    "  --warmup-factors a,b,...       warm-up x factor sizings to compare\n"
    "                                 (default 1,1.02,1.1,1.25,1.5)\n"
    "  --points N                     points of the overflow curve (default 24)\n"
    "  --plot FILE.png                draw the curve (python3 with matplotlib; skipped without)\n"
    "  --json                         print JSON instead of text\n"
    "  --list-recipes                 print every recipe's name and exit\n";

struct Options {
  std::int64_t hidden = 1024, tokens = 1024;
  std::int32_t experts = 8, top_k = 2;
  std::string recipe = "mxfp8", placement = "capacity", scales = "swizzled";
  std::string compression = pagestash::Lossless::name;
  std::int64_t ffn_hidden = 0;
  std::string schedule = "lifo";
  std::int32_t layers = sizing::default_layers, microbatches = sizing::default_microbatches;
  double alpha = 1.0, correlation = 0.0;
  std::string counts_file, routing = "multinomial";
  std::string drift_spec;
  sizing::Drift drift;
  bool cap_counts = false;
  double capacity_factor = 2.0;
  sizing::SizingSettings settings;
  std::vector<double> warmup_factors = {1.0, 1.02, 1.1, 1.25, 1.5};
  std::int32_t points = 24;
  std::string plot;
  bool json = false;
};

template <class T>
T number(const std::string& flag, const std::string& value) {
  std::istringstream in(value);
  T x{};
  // An unsigned read takes "-1" as 2^64 - 1: a sign is no unsigned number.
  if (value.find('-') != std::string::npos && std::is_unsigned_v<T>)
    throw UsageError(flag + ": '" + value + "' is negative");
  if (!(in >> x) || !in.eof()) throw UsageError(flag + ": '" + value + "' is not a number");
  return x;
}

template <class T>
T at_least(const std::string& flag, const std::string& value, T least) {
  const T x = number<T>(flag, value);
  if (x < least) throw UsageError(flag + " " + value + ": must be at least " + std::to_string(least));
  return x;
}

std::vector<double> numbers(const std::string& flag, const std::string& list) {
  std::vector<double> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(number<double>(flag, item));
  if (out.empty()) throw UsageError(flag + ": empty list");
  return out;
}

const sizing::ModelShape& model_shape(const std::string& name) {
  try {
    return sizing::model_shape(name);
  } catch (const std::invalid_argument& e) { throw UsageError(std::string("--shape: ") + e.what()); }
}

/// Sets the setting whose flag is `flag` (settings_usage's); false when no setting has it.
bool set_setting(sizing::SizingSettings& settings, const std::string& flag, const std::string& value) {
  bool set = false;
  sizing::for_each_field(settings, [&](const char* name, auto& member, const char*) {
    if (flag == flag_of(name)) member = number<std::decay_t<decltype(member)>>(flag, value), set = true;
  });
  return set;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage.c_str(), stdout);
      std::exit(0);
    }
    if (flag == "--list-recipes") {  // every recipe of pagestash/layouts/recipes.hpp, one a line
      for (const std::string& name : pagestash::recipe_names()) std::printf("%s\n", name.c_str());
      std::exit(0);
    }
    if (flag == "--json" || flag == "--cap-counts") {
      (flag == "--json" ? o.json : o.cap_counts) = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError(flag + ": missing value (or unknown flag)");
    const std::string value = argv[++i];
    if (flag == "--shape") {
      const sizing::ModelShape& s = model_shape(value);
      o.hidden = s.hidden, o.experts = s.experts, o.top_k = s.top_k, o.tokens = s.tokens;
    } else if (flag == "--hidden") o.hidden = at_least<std::int64_t>(flag, value, 1);
    else if (flag == "--experts") o.experts = at_least<std::int32_t>(flag, value, 1);
    else if (flag == "--top-k") o.top_k = at_least<std::int32_t>(flag, value, 1);
    else if (flag == "--tokens") o.tokens = at_least<std::int64_t>(flag, value, 1);
    else if (flag == "--recipe") o.recipe = value;
    else if (flag == "--placement") o.placement = value;
    else if (flag == "--scales") o.scales = value;
    else if (flag == "--compression" || flag == "--compress") o.compression = value;  // --compress: its old name
    else if (flag == "--ffn-hidden") o.ffn_hidden = number<std::int64_t>(flag, value);
    else if (flag == "--schedule") o.schedule = value;
    else if (flag == "--layers") o.layers = at_least<std::int32_t>(flag, value, 1);
    else if (flag == "--microbatches") o.microbatches = at_least<std::int32_t>(flag, value, 1);
    else if (flag == "--alpha") o.alpha = number<double>(flag, value);
    else if (flag == "--correlation") o.correlation = number<double>(flag, value);
    else if (flag == "--counts") o.counts_file = value;
    else if (flag == "--routing") o.routing = value;
    else if (flag == "--drift") {
      try {
        o.drift = sizing::Drift::parse(o.drift_spec = value);
      } catch (const std::invalid_argument& e) { throw UsageError(std::string("--drift: ") + e.what()); }
    } else if (flag == "--capacity-factor") o.capacity_factor = number<double>(flag, value);
    else if (flag == "--warmup-factors") o.warmup_factors = numbers(flag, value);
    else if (flag == "--points") o.points = number<std::int32_t>(flag, value);
    else if (flag == "--plot") o.plot = value;
    else if (!set_setting(o.settings, flag, value)) throw UsageError("unknown flag " + flag);
  }
  if (o.routing != "multinomial" && o.routing != "per-token")
    throw UsageError("--routing: '" + o.routing + "' (multinomial, per-token)");
  if (o.points < 2) throw UsageError("--points must be at least 2");
  if (!(o.correlation >= 0 && o.correlation <= 1)) throw UsageError("--correlation must be in [0, 1]");
  if (!o.counts_file.empty() && o.correlation > 0)
    throw UsageError("--correlation models the Dirichlet router; measured --counts keep their own (whole steps)");
  if (!o.counts_file.empty() && !o.drift_spec.empty())
    throw UsageError("--drift varies the Dirichlet router; measured --counts are one phase (size each phase's file)");
  return o;
}

double mib(double bytes) { return bytes / double(1 << 20); }

/// Everything the run found, to print as text or JSON.
struct Report {
  Options o;
  sizing::Layer layer;
  sizing::PoolSizing sizing;
  std::vector<sizing::CurvePoint> curve;
  std::vector<sizing::WarmupSizing> warmup;
  std::optional<sizing::DriftSizing> drift;  ///< with --drift: every phase's pool; `sizing` is the first's
};

/// "2 MiB", "64 KiB": a power of two's size.
std::string size_name(std::int64_t bytes) {
  return bytes >= (1 << 20) && bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
         : bytes % 1024 == 0                          ? std::to_string(bytes >> 10) + " KiB"
                                                      : std::to_string(bytes) + " bytes";
}

/// The drift's phases and the reserve: the largest phase's pool, backed in whole granules.
void print_drift(const sizing::DriftSizing& d, const std::string& spec) {
  const sizing::PoolSizing& first = d.phases.front();
  const std::int64_t page = d.page_bytes();
  std::printf("drift %s: %zu phases, each sized for overflow <= %g per step (%lld sampled steps, the same seed)\n",
              spec.c_str(), d.phases.size(), first.settings.overflow, (long long)first.settings.samples);
  std::printf("%6s %12s %10s %14s %12s %16s %12s\n", "phase", d.drift.parameter.c_str(), "pages", "95% CI",
              "device MiB", "beyond phase 1", "P(overflow)");
  for (std::size_t i = 0; i < d.phases.size(); ++i) {
    const sizing::PoolSizing& p = d.phases[i];
    char ci[32];
    std::snprintf(ci, sizeof ci, "%.0f..%.0f", p.pages_interval.low, p.pages_interval.high);
    std::printf("%6zu %12g %10lld %14s %12.1f %16lld %12.5f\n", i + 1, d.drift.values[i], (long long)p.device_pages, ci,
                mib(double(p.device_bytes())), (long long)(p.device_pages - first.device_pages),
                p.overflow_probability);
  }
  const std::int64_t reserve = d.reserve_pages(), backed = d.reserve_bytes();
  std::printf("reserve (PoolConfig::device_reserve): %lld pages = %.1f MiB, phase %zu's pool\n", (long long)reserve,
              mib(double(reserve * page)), d.largest() + 1);
  const std::string granule =
      d.granule_pages() > 0
          ? std::to_string(d.granule_pages()) + " pages of " + size_name(page) + " each"
          : "a page of " + size_name(page) + " is " + std::to_string(page / d.granule_bytes) + " of them";
  std::printf("  backed in %s granules (%s): %.1f MiB = %lld pages, %lld pages of rounding\n",
              size_name(d.granule_bytes).c_str(), granule.c_str(), mib(double(backed)), (long long)(backed / page),
              (long long)(backed / page - reserve));
  std::printf("a pool sized for phase 1 (%lld pages) lacks %lld pages at phase %zu, the last",
              (long long)first.device_pages, (long long)d.first_lacks_at_last(), d.phases.size());
  if (d.largest() + 1 != d.phases.size())
    std::printf(", and %lld at phase %zu, the largest", (long long)(reserve - first.device_pages), d.largest() + 1);
  std::printf("\n");
}

void print_text(const Report& r) {
  const sizing::PoolSizing& p = r.sizing;
  const auto page = p.settings.page_bytes;
  std::printf("layer: %s (%s), %d experts, capacity %lld tokens per expert (count alignment %lld)\n",
              r.o.recipe.c_str(), r.o.compression.c_str(), r.layer.experts(), (long long)r.layer.capacity(),
              (long long)r.layer.count_alignment());
  for (const auto& t : r.layer.tensors())
    std::printf("  saves %s: hidden %lld, %.2f MiB at full shape\n", t.name().c_str(), (long long)t.hidden(),
                mib(double(t.full_bytes())));
  std::printf("schedule %s: %lld stashes held at each of %lld peaks of a step; counts: %s\n", p.schedule.c_str(),
              (long long)p.alive_stashes, (long long)p.peak_moments, p.count_model.c_str());
  std::printf("%lld sampled steps (seed %llu), pages of %lld bytes\n\n", (long long)p.peaks.samples(),
              (unsigned long long)p.settings.seed, (long long)page);
  if (r.drift) return print_drift(*r.drift, r.o.drift_spec);  // the phases' pools, not phase 1's curves
  std::printf("pool for overflow <= %g per step: %lld pages = %.1f MiB (%.0f%% CI %.0f..%.0f%s)\n", p.settings.overflow,
              (long long)p.pages.value, mib(double(p.bytes())), 100 * p.settings.confidence, p.pages_interval.low,
              p.pages_interval.high, p.pages.high_bounded ? "" : ", upper end unbounded: sample more");
  if (p.bootstrap_replicates > 0)
    std::printf(
        "  the interval: Monte Carlo %lld..%lld, bootstrap over the measured steps %.0f..%.0f (%lld replicates)\n",
        (long long)p.pages.low, (long long)p.pages.high, p.bootstrap_interval.low, p.bootstrap_interval.high,
        (long long)p.bootstrap_replicates);
  std::printf("  device %lld pages (%.1f MiB), host %lld pages\n", (long long)p.device_pages,
              mib(double(p.device_bytes())), (long long)p.host_pages);
  std::printf("  its overflow probability on the samples: %.5f (%.0f%% CI %.5f..%.5f)\n", p.overflow_probability,
              100 * p.settings.confidence, p.overflow_interval.low, p.overflow_interval.high);
  const auto& s = p.peaks.sorted();
  const auto at = [&](double q) {
    return (long long)s[std::min(s.size() - 1, static_cast<std::size_t>(q * double(s.size())))];
  };
  std::printf("peak pages per step: min %lld, median %lld, p99 %lld, max %lld; mean %.1f\n", (long long)p.peaks.min(),
              at(0.5), at(0.99), (long long)p.peaks.max(), p.mean_pages);
  // Compressed, the stream is codes and scales, smaller than the live bytes: its ratio, not a rounding.
  char stream[96];
  if (r.o.compression == pagestash::Lossless::name)
    std::snprintf(stream, sizeof stream, "%.3f MiB to 16-byte segments", mib(p.segment_rounding_bytes()));
  else
    std::snprintf(stream, sizeof stream, "stream / live = %.3f (%s)",
                  p.mean_live_bytes > 0 ? p.mean_stream_bytes / p.mean_live_bytes : 0.0, r.o.compression.c_str());
  std::printf(
      "per step on average: live %.1f MiB, stream %.1f MiB, pages %.1f MiB; rounding: %.2f MiB to pages, %s; "
      "%.1f tokens dropped\n",
      mib(p.mean_live_bytes), mib(p.mean_stream_bytes), mib(p.mean_pages * double(page)), mib(p.page_rounding_bytes()),
      stream, p.mean_dropped_tokens);
  std::printf("without stashing: %.1f MiB at full shape; the pool saves %.1f MiB (%.1f%%) of device memory\n\n",
              mib(double(p.full_bytes)), mib(double(p.saved_bytes())), 100 * p.saved_fraction());
  std::printf("%10s %10s %12s %25s\n", "pool pages", "MiB", "P(overflow)", "CI");
  for (const auto& c : r.curve)
    std::printf("%10lld %10.1f %12.5f %12.5f..%.5f\n", (long long)c.pages, mib(double(c.pages * page)), c.overflow,
                c.interval.low, c.interval.high);
  std::printf(
      "\nwarm-up sizing (one sampled step's peak pages x factor; every step taking its turn as the warm-up):\n");
  std::printf("%8s %12s %10s %20s %15s %22s\n", "factor", "median pages", "MiB", "P(overflow) at median",
              "mean P(overflow)", "warm-ups missing target");
  for (const auto& w : r.warmup)
    std::printf("%8.2f %12lld %10.1f %21.5f %16.5f %22.1f%%\n", w.factor, (long long)w.median_pages,
                mib(double(w.median_pages * page)), w.overflow_at_median, w.mean_overflow, 100 * w.missed_target);
  std::printf("%8s %12lld %10.1f %21.5f %16s %22s\n", "planned", (long long)p.pages.value, mib(double(p.bytes())),
              p.overflow_probability, "", "");
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string to_json(const Report& r) {
  const sizing::PoolSizing& p = r.sizing;
  std::ostringstream j;
  j.precision(10);
  j << "{\n  \"recipe\": " << json_string(r.o.recipe) << ", \"placement\": " << json_string(r.o.placement)
    << ", \"scales\": " << json_string(r.o.scales) << ", \"compression\": " << json_string(r.o.compression)
    << ",\n  \"hidden\": " << r.o.hidden << ", \"experts\": " << r.layer.experts() << ", \"top_k\": " << r.o.top_k
    << ", \"tokens\": " << r.o.tokens << ", \"capacity\": " << r.layer.capacity()
    << ", \"count_alignment\": " << r.layer.count_alignment() << ",\n  \"tensors\": [";
  for (std::size_t i = 0; i < r.layer.tensors().size(); ++i) {
    const auto& t = r.layer.tensors()[i];
    j << (i ? ", " : "") << "{\"name\": " << json_string(t.name()) << ", \"hidden\": " << t.hidden()
      << ", \"full_bytes\": " << t.full_bytes() << "}";
  }
  j << "],\n  \"peak_pages\": {\"min\": " << p.peaks.min() << ", \"max\": " << p.peaks.max() << "}";
  // PoolSizing's fields under their C++ names (the table Python's PoolSizing has too).
  sizing::for_each_field(p, [&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    j << ",\n  \"" << name << "\": ";
    if constexpr (std::is_same_v<T, bool>) j << (value ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>) j << json_string(value);
    else if constexpr (std::is_same_v<T, sizing::Interval>) j << "[" << value.low << ", " << value.high << "]";
    else if constexpr (std::is_arithmetic_v<T>) j << value;
    else j << "[" << value.first << ", " << value.second << "]";
  });
  j << ",\n  \"curve\": [";
  for (std::size_t i = 0; i < r.curve.size(); ++i) {
    const auto& c = r.curve[i];
    j << (i ? ",\n    " : "\n    ") << "{\"pages\": " << c.pages << ", \"overflow\": " << c.overflow << ", \"ci\": ["
      << c.interval.low << ", " << c.interval.high << "]}";
  }
  j << "],\n  \"warmup\": [";
  for (std::size_t i = 0; i < r.warmup.size(); ++i) {
    const auto& w = r.warmup[i];
    j << (i ? ",\n    " : "\n    ") << "{\"factor\": " << w.factor << ", \"median_pages\": " << w.median_pages
      << ", \"median_bytes\": " << w.median_pages * p.settings.page_bytes
      << ", \"overflow_at_median\": " << w.overflow_at_median << ", \"mean_overflow\": " << w.mean_overflow
      << ", \"missed_target\": " << w.missed_target << "}";
  }
  j << "]";
  if (r.drift) {  // each phase's pool, and the reserve that holds them all
    const sizing::DriftSizing& d = *r.drift;
    j << ",\n  \"drift\": " << json_string(r.o.drift_spec)
      << ", \"drift_parameter\": " << json_string(d.drift.parameter) << ",\n  \"phases\": [";
    for (std::size_t i = 0; i < d.phases.size(); ++i) {
      const sizing::PoolSizing& ph = d.phases[i];
      j << (i ? ",\n    " : "\n    ") << "{\"value\": " << d.drift.values[i] << ", \"pages\": " << ph.pages.value
        << ", \"pages_interval\": [" << ph.pages_interval.low << ", " << ph.pages_interval.high
        << "], \"device_pages\": " << ph.device_pages << ", \"device_bytes\": " << ph.device_bytes()
        << ", \"backed_bytes\": " << d.backed_bytes(ph.device_pages)
        << ", \"overflow_probability\": " << ph.overflow_probability
        << ", \"count_model\": " << json_string(ph.count_model) << "}";
    }
    j << "],\n  \"reserve_pages\": " << d.reserve_pages() << ", \"reserve_phase\": " << d.largest() + 1
      << ", \"reserve_bytes\": " << d.reserve_bytes() << ", \"granule_bytes\": " << d.granule_bytes
      << ", \"granule_pages\": " << d.granule_pages() << ", \"first_lacks_at_last\": " << d.first_lacks_at_last();
  }
  j << "\n}\n";
  return j.str();
}

Report run(Options o) {
  o.recipe = pagestash::recipe_name(o.recipe, o.placement, o.scales);  // a family: its recipe's name
  pagestash::with_recipe(o.recipe, [&](auto r) { o.placement = r.placement, o.scales = r.scales; });  // "": none
  const sizing::Layer layer = sizing::recipe_layer(o.recipe, o.hidden, o.experts, o.tokens, o.top_k, o.capacity_factor,
                                                   o.ffn_hidden, o.compression);
  const sizing::Schedule schedule = sizing::Schedule::parse(o.schedule, o.layers, o.microbatches);
  std::unique_ptr<sizing::CountModel> counts;
  std::optional<sizing::DriftSizing> drift;
  if (!o.counts_file.empty()) {
    counts = std::make_unique<sizing::MeasuredCounts>(sizing::MeasuredCounts::read(
        o.counts_file, o.experts, layer.capacity(), o.cap_counts ? sizing::Excess::cap : sizing::Excess::refuse));
  } else {
    sizing::Routing routing;
    routing.experts = o.experts;
    routing.top_k = o.top_k;
    routing.tokens = o.tokens;
    routing.alpha = o.alpha;
    routing.capacity = layer.capacity();
    routing.sampler =
        o.routing == "per-token" ? sizing::RoutingSampler::per_token : sizing::RoutingSampler::multinomial;
    routing.correlation = o.correlation;
    counts = std::make_unique<sizing::DirichletRouting>(routing);  // the base router checked before the phases
    if (!o.drift_spec.empty()) drift = sizing::size_drift(layer, schedule, routing, o.drift, o.settings);
  }
  sizing::PoolSizing p = drift ? drift->phases.front() : sizing::size_pool(layer, schedule, *counts, o.settings);
  auto curve = p.peaks.curve(o.points, o.settings.confidence);
  auto warmup = sizing::compare_warmup(p.peaks, o.warmup_factors, o.settings.overflow);
  return Report{o, layer, std::move(p), std::move(curve), std::move(warmup), std::move(drift)};
}

/// Draws the curve with plot_sizing.py; a missing python3 or matplotlib only warns.
void plot(const Report& r) {
  const std::string json_path = r.o.plot + ".json";
  {
    std::ofstream out(json_path);
    if (!out) throw std::invalid_argument("--plot: cannot write " + json_path);
    out << to_json(r);
  }
  const std::string command = "python3 \"" PAGESTASH_SIZING_PLOT_SCRIPT "\" \"" + json_path + "\" \"" + r.o.plot + "\"";
  if (std::system(command.c_str()) != 0)
    std::fprintf(stderr, "pagestash_size: the plot failed (%s)\n", command.c_str());
  std::remove(json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const Report r = run(o);
    if (o.json) std::fputs(to_json(r).c_str(), stdout);
    else print_text(r);
    if (!o.plot.empty()) plot(r);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "pagestash_size: %s\n%s", e.what(), usage.c_str());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "pagestash_size: %s\n", e.what());
    return 2;
  }
}
