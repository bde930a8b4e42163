#pragma once
// The pool sizer: a Monte Carlo over sampled steps. A step is the schedule's whole event
// sequence: each stash draws its counts and takes their exact pages (the library's work
// plan, sizing/saved_tensor.hpp), each reload gives them back, and the step's peak is the most
// pages held at any moment. The pool for a target per-step overflow probability is the
// empirical quantile of those peaks, with its order-statistic confidence interval, widened
// by a bootstrap over the measured steps when the counts are measured.

#include <pagestash/sizing/count_model.hpp>
#include <pagestash/sizing/layer.hpp>
#include <pagestash/sizing/schedule.hpp>
#include <pagestash/sizing/statistics.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// The sizer's settings, one table: X(type, name, default, what it is). SizingSettings is made of it and
/// for_each_field(settings, fn) walks it; the command (examples/pagestash_size) takes each as --name (dashes for its
/// underscores) and lists it in --help, the Python binding as size_pool's keyword `name`, both with this default.
#define PAGESTASH_SIZING_SETTINGS(X)                                                                     \
  X(std::int64_t, page_bytes, std::int64_t{64} << 10, "the pool's page size, as PoolConfig::page_bytes") \
  X(std::int64_t, host_pages, 0, "spill pages in host memory: the device holds the pool's rest")         \
  X(std::int64_t, samples, 20000, "steps sampled (Monte Carlo)")                                         \
  X(std::uint64_t, seed, 1, "the sampler's seed")                                                        \
  X(double, overflow, 1e-3, "target probability that a step overflows the pool")                         \
  X(double, confidence, 0.95, "the confidence level of the intervals")                                   \
  X(std::int64_t, bootstrap, 200, "with measured counts: bootstrap replicates for the interval (0: none)")

struct SizingSettings {
#define PAGESTASH_SIZING_SETTING(type, name, value, what) type name = value;
  PAGESTASH_SIZING_SETTINGS(PAGESTASH_SIZING_SETTING)
#undef PAGESTASH_SIZING_SETTING
};

/// fn(name, member, what) for every setting, in the table's order (PAGESTASH_SIZING_SETTINGS).
template <class Settings, class Fn,
          std::enable_if_t<std::is_same_v<std::remove_const_t<Settings>, SizingSettings>, int> = 0>
void for_each_field(Settings& s, Fn&& fn) {
#define PAGESTASH_SIZING_SETTING(type, name, value, what) fn(#name, s.name, what);
  PAGESTASH_SIZING_SETTINGS(PAGESTASH_SIZING_SETTING)
#undef PAGESTASH_SIZING_SETTING
}

/// One point of the curve of overflow probability against pool size.
struct CurvePoint {
  std::int64_t pages = 0;
  double overflow = 0;  ///< the fraction of sampled steps whose peak exceeds `pages`
  Interval interval;    ///< Wilson, at the settings' confidence
};

/// The sampled steps' peak pages, sorted, and what follows from them.
class PeakDistribution {
 public:
  explicit PeakDistribution(std::vector<std::int64_t> peaks) : sorted_(std::move(peaks)) {
    if (sorted_.empty()) detail::throw_invalid("pagestash::sizing", "PeakDistribution: no samples");
    std::sort(sorted_.begin(), sorted_.end());
  }
  const std::vector<std::int64_t>& sorted() const { return sorted_; }
  std::int64_t samples() const { return static_cast<std::int64_t>(sorted_.size()); }
  std::int64_t min() const { return sorted_.front(); }
  std::int64_t max() const { return sorted_.back(); }

  /// Steps whose peak exceeds a pool of `pages` pages (they overflow it).
  std::int64_t overflowing(std::int64_t pages) const {
    return static_cast<std::int64_t>(sorted_.end() - std::upper_bound(sorted_.begin(), sorted_.end(), pages));
  }
  double overflow_probability(std::int64_t pages) const {
    return static_cast<double>(overflowing(pages)) / static_cast<double>(samples());
  }
  Interval overflow_interval(std::int64_t pages, double confidence = 0.95) const {
    return wilson_interval(overflowing(pages), samples(), confidence);
  }
  /// The smallest pool whose empirical overflow probability is at most `overflow`, with the
  /// interval of the 1 - overflow quantile it estimates.
  QuantileEstimate pool_for(double overflow, double confidence = 0.95) const {
    if (!(overflow > 0 && overflow < 1))
      detail::throw_invalid("pagestash::sizing", "pool_for: overflow must be in (0, 1)");
    return quantile_estimate(sorted_, 1 - overflow, confidence);
  }
  /// `points` pool sizes evenly from the smallest peak to the largest, and where each
  /// overflow probability falls.
  std::vector<CurvePoint> curve(std::int32_t points = 24, double confidence = 0.95) const {
    std::vector<CurvePoint> out;
    const std::int64_t span = max() - min();
    for (std::int32_t i = 0; i < std::max(points, 2); ++i) {
      const std::int64_t pages = min() - 1 + (span + 1) * i / (std::max(points, 2) - 1);
      if (!out.empty() && out.back().pages == pages) continue;
      out.push_back({pages, overflow_probability(pages), overflow_interval(pages, confidence)});
    }
    return out;
  }

 private:
  std::vector<std::int64_t> sorted_;
};

/// A pool sized from a warm-up step: its peak pages times a factor (pagestash::size_pool's
/// rule), judged on the same sampled steps, every sampled step taking its turn as the warm-up.
struct WarmupSizing {
  double factor = 1;
  std::int64_t median_pages = 0;  ///< the pool of the median warm-up step
  double overflow_at_median = 0;  ///< that pool's overflow probability
  double mean_overflow = 0;       ///< over the warm-up step drawn at random
  double missed_target = 0;       ///< fraction of warm-up steps whose pool overflows more often than the target
};

inline std::vector<WarmupSizing> compare_warmup(const PeakDistribution& peaks, const std::vector<double>& factors,
                                                double target) {
  std::vector<WarmupSizing> out;
  const auto n = static_cast<double>(peaks.samples());
  for (double f : factors) {
    if (!(f > 0)) detail::throw_invalid("pagestash::sizing", "compare_warmup: factors must be positive");
    const auto pool_of = [&](std::int64_t warm) {
      return static_cast<std::int64_t>(std::ceil(static_cast<double>(warm) * f));
    };
    WarmupSizing w;
    w.factor = f;
    w.median_pages = pool_of(peaks.sorted()[peaks.sorted().size() / 2]);
    w.overflow_at_median = peaks.overflow_probability(w.median_pages);
    double sum = 0, missed = 0;
    for (std::int64_t warm : peaks.sorted()) {
      const double rate = peaks.overflow_probability(pool_of(warm));
      sum += rate;
      missed += rate > target ? 1 : 0;
    }
    w.mean_overflow = sum / n;
    w.missed_target = missed / n;
    out.push_back(w);
  }
  return out;
}

/// What the sizer found.
struct PoolSizing {
  SizingSettings settings;
  std::string schedule;
  std::string count_model;         ///< the count model, described
  std::int64_t alive_stashes = 0;  ///< the most stashes held at once
  std::int64_t peak_moments = 0;   ///< moments of the step the held stashes peak (Schedule::peak_moments)
  PeakDistribution peaks{{0}};
  QuantileEstimate pages;  ///< pages of the pool (device + host) for the target; its interval: Monte Carlo error
  /// The interval reported: pages', widened to the bootstrap's percentile interval
  /// over the measured steps (the file's own sampling error) when the counts are measured.
  Interval pages_interval;
  std::int64_t bootstrap_replicates = 0;  ///< 0: no bootstrap (a Dirichlet router, or settings.bootstrap = 0)
  Interval bootstrap_interval;            ///< the replicates' pools' percentile interval
  std::int64_t device_pages = 0;          ///< pages.value - host pages (at least 0)
  std::int64_t host_pages = 0;
  double overflow_probability = 0;  ///< the sized pool's empirical overflow probability
  Interval overflow_interval;
  // Means per step at the peak, over the sampled steps.
  double mean_pages = 0;
  double mean_stream_bytes = 0;
  double mean_live_bytes = 0;
  double mean_dropped_tokens = 0;
  std::int64_t full_bytes = 0;  ///< the alive stashes' tensors at full shape: held without stashing

  std::int64_t bytes() const { return pages.value * settings.page_bytes; }
  std::int64_t device_bytes() const { return device_pages * settings.page_bytes; }
  /// Device bytes the sized pool saves against holding every tensor at full shape.
  std::int64_t saved_bytes() const { return full_bytes - device_bytes(); }
  double saved_fraction() const {
    return full_bytes > 0 ? static_cast<double>(saved_bytes()) / static_cast<double>(full_bytes) : 0;
  }
  /// Rounding, per step at the peak on average: of streams to whole pages, and of live runs
  /// to 16-byte stream segments (a compressed stash's stream is smaller than its live bytes: then negative).
  double page_rounding_bytes() const {
    return mean_pages * static_cast<double>(settings.page_bytes) - mean_stream_bytes;
  }
  double segment_rounding_bytes() const { return mean_stream_bytes - mean_live_bytes; }
};

/// What a caller reads of a PoolSizing, as fn(name, value): the Python package's PoolSizing
/// has exactly these fields, named so (a field added here reaches it, and its test fails
/// until Python declares it). A member reported whole keeps its name; `pages` is the
/// estimate's value, `pages_monte_carlo` its interval (the Monte Carlo error) and
/// `pages_high_bounded` whether that interval's top is bounded; settings keep theirs.
/// Page counts are integers; other intervals are Interval (low, high).
template <class Fn>
void for_each_field(const PoolSizing& p, Fn&& fn) {
  using Pages = std::pair<std::int64_t, std::int64_t>;
  fn("pages", p.pages.value);
  fn("pages_interval",
     Pages{static_cast<std::int64_t>(p.pages_interval.low), static_cast<std::int64_t>(p.pages_interval.high)});
  fn("pages_high_bounded", p.pages.high_bounded);
  fn("pages_monte_carlo", Pages{p.pages.low, p.pages.high});
  fn("bootstrap_replicates", p.bootstrap_replicates);
  fn("bootstrap_interval", p.bootstrap_interval);
  fn("page_bytes", p.settings.page_bytes);
  fn("device_pages", p.device_pages);
  fn("host_pages", p.host_pages);
  fn("bytes", p.bytes());
  fn("device_bytes", p.device_bytes());
  fn("full_bytes", p.full_bytes);
  fn("saved_bytes", p.saved_bytes());
  fn("saved_fraction", p.saved_fraction());
  fn("overflow", p.settings.overflow);
  fn("overflow_probability", p.overflow_probability);
  fn("overflow_interval", p.overflow_interval);
  fn("alive_stashes", p.alive_stashes);
  fn("peak_moments", p.peak_moments);
  fn("schedule", p.schedule);
  fn("count_model", p.count_model);
  fn("samples", p.settings.samples);
  fn("seed", p.settings.seed);
  fn("confidence", p.settings.confidence);
  fn("mean_pages", p.mean_pages);
  fn("mean_stream_bytes", p.mean_stream_bytes);
  fn("mean_live_bytes", p.mean_live_bytes);
  fn("mean_dropped_tokens", p.mean_dropped_tokens);
  fn("page_rounding_bytes", p.page_rounding_bytes());
  fn("segment_rounding_bytes", p.segment_rounding_bytes());
}

namespace detail {
inline void check_settings(const SizingSettings& s) {
  if (s.page_bytes < 256 || (s.page_bytes & (s.page_bytes - 1)) != 0)
    throw_invalid("pagestash::sizing",
                  "page_bytes = " + std::to_string(s.page_bytes) + " must be a power of two >= 256");
  if (s.host_pages < 0) throw_invalid("pagestash::sizing", "host_pages must not be negative");
  if (s.samples < 1) throw_invalid("pagestash::sizing", "samples must be at least 1");
  if (!(s.overflow > 0 && s.overflow < 1)) throw_invalid("pagestash::sizing", "overflow must be in (0, 1)");
  if (!(s.confidence > 0 && s.confidence < 1)) throw_invalid("pagestash::sizing", "confidence must be in (0, 1)");
  if (s.bootstrap < 0)
    throw_invalid("pagestash::sizing", "bootstrap = " + std::to_string(s.bootstrap) + " must not be negative");
}
}  // namespace detail

/// One sampled step: at its peak (the first moment the most pages are held), the held
/// stashes' bytes and the tokens they dropped.
struct StepDraw {
  TensorBytes bytes;
  std::int64_t dropped_tokens = 0;
};

/// Walks the schedule's events: `take(stash)` gives a stash's bytes and dropped tokens as it
/// is stashed; returns the step at its peak.
template <class Take>
StepDraw walk_step(const Schedule& schedule, std::vector<StepDraw>& held, Take&& take) {
  held.resize(static_cast<std::size_t>(schedule.stashes()));
  StepDraw now, peak;
  peak.bytes.pages = -1;
  for (const StashEvent& e : schedule.events()) {
    const std::int64_t i = schedule.stash_index(e);
    StepDraw& h = held[static_cast<std::size_t>(i)];
    if (e.stash) {
      h = take(i);
      now.bytes += h.bytes;
      now.dropped_tokens += h.dropped_tokens;
      if (now.bytes.pages > peak.bytes.pages) peak = now;
    } else {
      now.bytes.pages -= h.bytes.pages;
      now.bytes.stream_bytes -= h.bytes.stream_bytes;
      now.bytes.live_bytes -= h.bytes.live_bytes;
      now.dropped_tokens -= h.dropped_tokens;
    }
  }
  return peak;
}

namespace detail {

inline void check_fits(const Layer& layer, const Schedule& schedule, const CountModel& counts) {
  if (counts.experts() != layer.experts())
    throw_invalid("pagestash::sizing", "size_pool: the count model has " + std::to_string(counts.experts()) +
                                           " experts, the layer " + std::to_string(layer.experts()));
  if (counts.capacity() > layer.capacity())
    throw_invalid("pagestash::sizing", "size_pool: the count model's capacity " + std::to_string(counts.capacity()) +
                                           " exceeds the layer's " + std::to_string(layer.capacity()));
  if (counts.stashes_per_step() != 0 && counts.stashes_per_step() != schedule.stashes())
    throw_invalid("pagestash::sizing", "size_pool: a measured step holds " + std::to_string(counts.stashes_per_step()) +
                                           " count vectors, a step of the schedule " +
                                           std::to_string(schedule.stashes()) + " (" +
                                           std::to_string(schedule.layers()) + " layers x " +
                                           std::to_string(schedule.microbatches()) + " microbatches)");
}

/// Measured counts: every vector's bytes once, then steps by lookup.
struct MeasuredPages {
  std::vector<StepDraw> per_line;
  MeasuredPages(const MeasuredCounts& m, const Layer& layer, std::int64_t page_bytes) {
    std::vector<std::int32_t> c;
    for (std::size_t l = 0; l < m.lines().size(); ++l) {
      const std::int64_t dropped = m.counts_of(static_cast<std::int64_t>(l), c);
      per_line.push_back({layer.measure(c, page_bytes), dropped});
    }
  }
};

/// The bootstrap over the measured steps: each replicate resamples the file's units (steps,
/// or vectors) with replacement and sizes the pool from `samples` steps drawn from the
/// resample; the replicates' pools' percentile interval at `confidence`.
inline Interval bootstrap_pool(const Schedule& schedule, const MeasuredCounts& m, const MeasuredPages& pages,
                               const SizingSettings& s) {
  std::mt19937_64 rng(s.seed ^ 0x9e3779b97f4a7c15ULL);  // a sequence apart from the sampled steps' own
  std::vector<std::int64_t> pools, units(static_cast<std::size_t>(m.units())),
      peaks(static_cast<std::size_t>(s.samples));
  std::vector<StepDraw> held;
  for (std::int64_t b = 0; b < s.bootstrap; ++b) {
    for (auto& u : units) u = m.draw_unit(rng);
    for (auto& peak : peaks) {
      const std::int64_t unit = units[std::uniform_int_distribution<std::size_t>(0, units.size() - 1)(rng)];
      peak = walk_step(schedule, held, [&](std::int64_t stash) {
               return pages.per_line[static_cast<std::size_t>(m.line_of(rng, unit, stash, units))];
             }).bytes.pages;
    }
    std::sort(peaks.begin(), peaks.end());
    pools.push_back(quantile_value(peaks, 1 - s.overflow));
  }
  std::sort(pools.begin(), pools.end());
  const double tail = (1 - s.confidence) / 2;
  const auto at = [&](double level) {
    const auto rank = static_cast<std::size_t>(
        std::clamp<double>(std::ceil(level * static_cast<double>(pools.size())), 1, static_cast<double>(pools.size())));
    return static_cast<double>(pools[rank - 1]);
  };
  return {at(tail), at(1 - tail)};
}
}  // namespace detail

/// One sampled step of the schedule, its counts drawn from `counts` by `rng`.
inline StepDraw draw_step(const Layer& layer, const Schedule& schedule, const CountModel& counts,
                          std::int64_t page_bytes, std::mt19937_64& rng) {
  StepState step;
  counts.start_step(rng, step);
  std::vector<StepDraw> held;
  std::vector<std::int32_t> c;
  return walk_step(schedule, held, [&](std::int64_t stash) {
    const std::int64_t dropped = counts.draw_stash(rng, step, stash, c);
    return StepDraw{layer.measure(c, page_bytes), dropped};
  });
}

/// Samples settings.samples steps and sizes the pool for settings.overflow. Throws
/// std::invalid_argument for settings or a count model that do not fit the layer or the
/// schedule.
inline PoolSizing size_pool(const Layer& layer, const Schedule& schedule, const CountModel& counts,
                            const SizingSettings& settings = {}) {
  detail::check_settings(settings);
  detail::check_fits(layer, schedule, counts);
  PoolSizing result;
  result.settings = settings;
  result.schedule = schedule.name();
  result.count_model = counts.describe();
  result.alive_stashes = schedule.alive_stashes();
  result.peak_moments = schedule.peak_moments();
  result.full_bytes = result.alive_stashes * layer.full_bytes();
  const auto* measured = dynamic_cast<const MeasuredCounts*>(&counts);
  std::unique_ptr<detail::MeasuredPages> lookup;
  if (measured) lookup = std::make_unique<detail::MeasuredPages>(*measured, layer, settings.page_bytes);
  std::mt19937_64 rng(settings.seed);
  std::vector<std::int64_t> peaks;
  peaks.reserve(static_cast<std::size_t>(settings.samples));
  std::vector<StepDraw> held;
  std::vector<std::int32_t> c;
  StepState step;
  double pages = 0, stream = 0, live = 0, dropped = 0;
  for (std::int64_t i = 0; i < settings.samples; ++i) {
    counts.start_step(rng, step);
    const StepDraw peak = walk_step(schedule, held, [&](std::int64_t stash) {
      if (lookup) return lookup->per_line[static_cast<std::size_t>(measured->line_of(rng, step, stash))];
      const std::int64_t d = counts.draw_stash(rng, step, stash, c);
      return StepDraw{layer.measure(c, settings.page_bytes), d};
    });
    peaks.push_back(peak.bytes.pages);
    pages += static_cast<double>(peak.bytes.pages);
    stream += static_cast<double>(peak.bytes.stream_bytes);
    live += static_cast<double>(peak.bytes.live_bytes);
    dropped += static_cast<double>(peak.dropped_tokens);
  }
  const auto n = static_cast<double>(settings.samples);
  result.mean_pages = pages / n;
  result.mean_stream_bytes = stream / n;
  result.mean_live_bytes = live / n;
  result.mean_dropped_tokens = dropped / n;
  result.peaks = PeakDistribution(std::move(peaks));
  result.pages = result.peaks.pool_for(settings.overflow, settings.confidence);
  result.pages_interval = {static_cast<double>(result.pages.low), static_cast<double>(result.pages.high)};
  if (measured && settings.bootstrap > 0) {
    result.bootstrap_replicates = settings.bootstrap;
    result.bootstrap_interval = detail::bootstrap_pool(schedule, *measured, *lookup, settings);
    result.pages_interval.low = std::min(result.pages_interval.low, result.bootstrap_interval.low);
    result.pages_interval.high = std::max(result.pages_interval.high, result.bootstrap_interval.high);
  }
  result.host_pages = std::min(settings.host_pages, result.pages.value);
  result.device_pages = result.pages.value - result.host_pages;
  result.overflow_probability = result.peaks.overflow_probability(result.pages.value);
  result.overflow_interval = result.peaks.overflow_interval(result.pages.value, settings.confidence);
  return result;
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
