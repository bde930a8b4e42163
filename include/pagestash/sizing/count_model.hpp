#pragma once
// Count models: where the per-expert token counts of each (layer, microbatch) stash come
// from. DirichletRouting draws a router (expert popularity from a Dirichlet, top-k of T
// tokens, a capacity); MeasuredCounts replays count vectors measured in training.

#include <pagestash/sizing/saved_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <istream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// What one sampled step's stashes share: the step's expert popularity (correlated
/// routing) or the measured step drawn.
struct StepState {
  std::vector<double> shared;
  std::int64_t step = -1;
};

class CountModel {
 public:
  virtual ~CountModel() = default;
  virtual std::int32_t experts() const = 0;
  /// Most tokens one expert holds: counts above it were dropped.
  virtual std::int64_t capacity() const = 0;
  /// Starts a sampled step: draws what its stashes share.
  virtual void start_step(std::mt19937_64& rng, StepState& step) const = 0;
  /// Draws the counts of the step's stash `stash` (microbatch * layers + layer, as
  /// Schedule::stash_index) into `counts` (resized to experts()), each at most capacity();
  /// returns the tokens dropped at the capacity.
  virtual std::int64_t draw_stash(std::mt19937_64& rng, const StepState& step, std::int64_t stash,
                                  std::vector<std::int32_t>& counts) const = 0;
  /// Count vectors a step of the model holds (0: any number).
  virtual std::int64_t stashes_per_step() const { return 0; }
  virtual std::string describe() const = 0;

  /// One stash of a fresh step.
  std::int64_t draw(std::mt19937_64& rng, std::vector<std::int32_t>& counts) const {
    StepState step;
    start_step(rng, step);
    return draw_stash(rng, step, 0, counts);
  }
};

/// How DirichletRouting turns expert popularity into counts.
enum class RoutingSampler {
  /// Every token picks top_k distinct experts, each pick with probability proportional to
  /// the popularity of the experts not yet picked (examples/moe_stash_demo routes with it):
  /// exact, tokens x top_k x experts work per draw.
  per_token,
  /// The tokens x top_k assignments drawn at once, multinomial over the experts' top-k
  /// inclusion probabilities pi_e = 1 - exp(-lambda p_e), sum pi_e = top_k (Rosen's
  /// approximation of that sampling without replacement), none above tokens: experts
  /// binomial draws per stash. Its tokens kept at a capacity are within 0.5% of
  /// per_token's on average for 32 experts and top-8, 3% for 8 experts and top-2 (the
  /// tests check it).
  multinomial,
};

struct Routing {
  std::int32_t experts = 8;
  std::int32_t top_k = 2;
  std::int64_t tokens = 1024;  ///< tokens of one microbatch on the rank
  double alpha = 1.0;          ///< Dirichlet concentration: smaller, more imbalanced
  std::int64_t capacity = 0;   ///< tokens per expert kept (sizing::capacity_for); the rest dropped
  RoutingSampler sampler = RoutingSampler::multinomial;
  /// In [0, 1]: the share of the popularity a step's stashes have in common (0: every
  /// stash its own, 1: one popularity per step). Each stash's popularity stays Dirichlet(alpha).
  double correlation = 0;
  /// In [0, 1]: the share of the tokens routed to a hot expert, expert 0 (each token picks it with this probability;
  /// an even router's share is top_k / experts); the others are routed by the Dirichlet(alpha) popularity over the
  /// rest. 0: none.
  double hot_share = 0;
};

/// A router per stash: popularity p ~ Dirichlet(alpha) over the experts (one gamma(alpha)
/// draw per expert, normalised), then the routing of `tokens` tokens to top_k experts each,
/// then every count capped at the capacity (the tokens above it dropped). With correlation
/// c, expert e's gamma is the sum of a gamma(c alpha) drawn once per step and a gamma((1 -
/// c) alpha) per stash: still gamma(alpha), so each stash is still Dirichlet(alpha), and two
/// stashes of a step share a fraction c of it (the gammas' correlation is c): the same
/// experts run hot in every microbatch and layer of the step.
class DirichletRouting final : public CountModel {
 public:
  explicit DirichletRouting(const Routing& r) : r_(r) {
    if (r.experts < 1 || r.top_k < 1 || r.top_k > r.experts)
      detail::throw_invalid("pagestash::sizing", "DirichletRouting: experts = " + std::to_string(r.experts) +
                                                     ", top_k = " + std::to_string(r.top_k) +
                                                     " (need 1 <= top_k <= experts)");
    if (r.tokens < 1 || r.tokens > INT32_MAX)
      detail::throw_invalid("pagestash::sizing",
                            "DirichletRouting: tokens = " + std::to_string(r.tokens) + " must be in [1, 2^31)");
    if (!(r.alpha > 0) || !std::isfinite(r.alpha))
      detail::throw_invalid("pagestash::sizing", "DirichletRouting: alpha must be positive");
    if (r.capacity < 1)
      detail::throw_invalid("pagestash::sizing",
                            "DirichletRouting: capacity = " + std::to_string(r.capacity) + " must be positive");
    if (!(r.correlation >= 0 && r.correlation <= 1))
      detail::throw_invalid("pagestash::sizing",
                            "DirichletRouting: correlation = " + std::to_string(r.correlation) + " must be in [0, 1]");
    if (!(r.hot_share >= 0 && r.hot_share <= 1))
      detail::throw_invalid("pagestash::sizing",
                            "DirichletRouting: hot_share = " + std::to_string(r.hot_share) + " must be in [0, 1]");
    // A token passing the hot expert over picks top_k others.
    if (r.hot_share > 0 && (r.experts < 2 || (r.hot_share < 1 && r.top_k > r.experts - 1)))
      detail::throw_invalid("pagestash::sizing", "DirichletRouting: hot_share = " + std::to_string(r.hot_share) +
                                                     " needs top_k = " + std::to_string(r.top_k) +
                                                     " experts besides the hot one, of " +
                                                     std::to_string(r.experts - 1));
  }

  std::int32_t experts() const override { return r_.experts; }
  std::int64_t capacity() const override { return r_.capacity; }
  const Routing& routing() const { return r_; }

  void start_step(std::mt19937_64& rng, StepState& step) const override {
    step.shared.assign(static_cast<std::size_t>(r_.experts), 0.0);
    if (r_.correlation > 0)
      for (double& x : step.shared) x = gamma(rng, r_.correlation * r_.alpha);
  }

  std::int64_t draw_stash(std::mt19937_64& rng, const StepState& step, std::int64_t /*stash*/,
                          std::vector<std::int32_t>& counts) const override {
    const auto e_count = static_cast<std::size_t>(r_.experts);
    std::vector<double> p(e_count);
    popularity(rng, step, p);
    std::vector<std::int64_t> routed(e_count, 0);
    if (r_.sampler == RoutingSampler::per_token) route_per_token(rng, p, routed);
    else route_multinomial(rng, p, routed);
    counts.assign(e_count, 0);
    std::int64_t dropped = 0;
    for (std::size_t e = 0; e < e_count; ++e) {
      const std::int64_t kept = std::min(routed[e], r_.capacity);
      dropped += routed[e] - kept;
      counts[e] = static_cast<std::int32_t>(kept);
    }
    return dropped;
  }

  std::string describe() const override {
    std::ostringstream s;
    s << "Dirichlet(" << r_.alpha << ") over " << r_.experts << " experts, top-" << r_.top_k << " of " << r_.tokens
      << " tokens, capacity " << r_.capacity << " ("
      << (r_.sampler == RoutingSampler::per_token ? "per-token" : "multinomial");
    if (r_.correlation > 0) s << ", correlation " << r_.correlation << " within a step";
    if (r_.hot_share > 0) s << ", expert 0 hot: " << r_.hot_share << " of the tokens";
    s << ")";
    return s.str();
  }

 private:
  /// gamma(shape, 1); shape 1 (the default alpha) as an exponential: one log, a third of
  /// the time of std::gamma_distribution's normal-based method.
  static double gamma(std::mt19937_64& rng, double shape) {
    if (shape == 1) return std::exponential_distribution<double>(1.0)(rng);
    return std::gamma_distribution<double>(shape, 1.0)(rng);
  }

  void popularity(std::mt19937_64& rng, const StepState& step, std::vector<double>& p) const {
    const double own = (1 - r_.correlation) * r_.alpha;
    const std::size_t first = hot();  // a hot expert 0 is routed apart: the rest are Dirichlet(alpha) among themselves
    double sum = 0;
    for (std::size_t e = first; e < p.size(); ++e) sum += (p[e] = (own > 0 ? gamma(rng, own) : 0.0) + step.shared[e]);
    if (!(sum > 0)) {  // every draw underflowed (tiny alpha): all the mass on one expert
      p[std::uniform_int_distribution<std::size_t>(first, p.size() - 1)(rng)] = sum = 1;
    }
    for (double& x : p) x /= sum;
  }

  void route_per_token(std::mt19937_64& rng, const std::vector<double>& p, std::vector<std::int64_t>& routed) const {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::vector<double> left(p.size());
    std::bernoulli_distribution picks_hot(r_.hot_share);
    for (std::int64_t t = 0; t < r_.tokens; ++t) {
      left = p;
      double mass = 1.0;
      std::int32_t k = 0;
      if (hot()) {
        left[0] = -1;  // picked, or passed over: the rest by popularity
        if (picks_hot(rng)) ++routed[0], ++k;
      }
      for (; k < r_.top_k; ++k) {
        std::size_t pick = p.size();
        if (mass > 1e-12) {
          double u = unit(rng) * mass;
          for (std::size_t e = 0; e < left.size(); ++e)
            if (left[e] > 0 && (u -= left[e]) < 0) {
              pick = e;
              break;
            }
        }
        if (pick == p.size()) {  // rounding, or fewer popular experts than top_k: a free one at random
          std::vector<std::size_t> free;
          for (std::size_t e = 0; e < left.size(); ++e)
            if (left[e] >= 0) free.push_back(e);
          pick = free[std::uniform_int_distribution<std::size_t>(0, free.size() - 1)(rng)];
        }
        mass -= std::max(left[pick], 0.0);
        left[pick] = -1;  // picked
        ++routed[pick];
      }
    }
  }

  void route_multinomial(std::mt19937_64& rng, const std::vector<double>& p, std::vector<std::int64_t>& routed) const {
    const std::vector<double> pi = inclusion(p, r_.top_k - r_.hot_share);
    std::int64_t n = r_.tokens * r_.top_k;
    if (hot()) n -= (routed[0] = std::binomial_distribution<std::int64_t>(r_.tokens, r_.hot_share)(rng));  // exact
    double rest = 0;
    for (double x : pi) rest += x;
    for (std::size_t e = hot(); e < pi.size() && n > 0; ++e) {
      const double q = rest > 0 ? std::clamp(pi[e] / rest, 0.0, 1.0) : 1.0;
      const std::int64_t c = e + 1 == pi.size() ? n : std::binomial_distribution<std::int64_t>(n, q)(rng);
      routed[e] = std::min(c, r_.tokens);  // an expert takes a token at most once
      n -= c;
      rest -= pi[e];
    }
  }

  /// pi_e = 1 - exp(-lambda p_e) summing to k (top_k, less a hot expert's share). The sum is
  /// concave and increasing in lambda and at most lambda, so Newton's method from lambda = k
  /// climbs to the root from below, quadratically near it.
  static std::vector<double> inclusion(const std::vector<double>& p, double k) {
    std::vector<double> pi(p.size());
    double lambda = k;
    for (int i = 0; i < 100; ++i) {
      double sum = 0, slope = 0;
      for (std::size_t e = 0; e < p.size(); ++e) {
        const double kept = std::exp(-lambda * p[e]);
        sum += (pi[e] = 1 - kept);
        slope += p[e] * kept;
      }
      if (sum >= k * (1 - 1e-12) || !(slope > 0)) break;
      lambda += (k - sum) / slope;
    }
    return pi;
  }

  std::size_t hot() const { return r_.hot_share > 0 ? 1 : 0; }

  Routing r_;
};

/// What MeasuredCounts does with a count above the capacity.
enum class Excess {
  refuse,  ///< throw, naming the vector: a capacity other than training's is a mistake
  cap,     ///< keep the capacity, the rest dropped (a sizing capacity smaller than training's)
};

/// Count vectors measured in training. In whole steps (each step's vectors for every
/// stash index, microbatch * layers + layer), a sampled step is one measured step drawn
/// uniformly with replacement (a bootstrap of the steps): what was correlated within a
/// step in training stays correlated. As independent vectors (no steps), every stash draws
/// its own vector, which models routing independent from stash to stash.
class MeasuredCounts final : public CountModel {
 public:
  /// Independent vectors.
  MeasuredCounts(std::vector<std::vector<std::int32_t>> lines, std::int64_t capacity, std::string source = "counts",
                 Excess excess = Excess::refuse)
      : MeasuredCounts(std::move(lines), {}, capacity, std::move(source), excess) {}

  /// Whole steps: steps[s][i] is step s's vector for stash index i; every step has as many.
  static MeasuredCounts whole_steps(const std::vector<std::vector<std::vector<std::int32_t>>>& steps,
                                    std::int64_t capacity, std::string source = "counts",
                                    Excess excess = Excess::refuse) {
    std::vector<std::vector<std::int32_t>> lines;
    std::vector<std::int64_t> sizes;
    for (const auto& step : steps) {
      sizes.push_back(static_cast<std::int64_t>(step.size()));
      lines.insert(lines.end(), step.begin(), step.end());
    }
    if (steps.empty()) detail::throw_invalid("pagestash::sizing", source + ": no steps");
    return MeasuredCounts(std::move(lines), std::move(sizes), capacity, std::move(source), excess);
  }

  /// Parses one count vector per line: integers >= 0 separated by whitespace or commas;
  /// '#' starts a comment (to the line's end); empty lines are skipped. A line whose first
  /// word is `step` starts a step: with any, the file is whole steps (every vector in one,
  /// every step as many vectors), without, independent vectors. Every vector must have
  /// `experts` counts. Throws std::invalid_argument naming the source, line and what is wrong.
  static MeasuredCounts parse(std::istream& in, std::int32_t experts, std::int64_t capacity,
                              const std::string& source = "counts", Excess excess = Excess::refuse) {
    std::vector<std::vector<std::int32_t>> lines;
    std::vector<std::int64_t> sizes;  // vectors per step
    std::int64_t first_loose = 0;     // the first vector's line, outside any step
    std::string line;
    for (std::int64_t number = 1; std::getline(in, line); ++number) {
      const std::string where = source + ":" + std::to_string(number) + ": ";
      line = line.substr(0, line.find('#'));
      std::replace(line.begin(), line.end(), ',', ' ');
      std::istringstream fields(line);
      std::string field;
      std::vector<std::int32_t> counts;
      if (fields >> field && field == "step") {
        if (sizes.empty() && !lines.empty())
          detail::throw_invalid("pagestash::sizing", where + "a step after count vectors outside any (from line " +
                                                         std::to_string(first_loose) +
                                                         "): put every vector in a step, or none");
        if (!sizes.empty() && sizes.back() == 0)
          detail::throw_invalid("pagestash::sizing", where + "the step before has no count vectors");
        sizes.push_back(0);
        continue;
      }
      for (fields.clear(), fields.str(line); fields >> field;) {
        std::size_t used = 0;
        long long value = -1;
        try {
          value = std::stoll(field, &used);
        } catch (const std::exception&) { used = 0; }
        if (used != field.size())
          detail::throw_invalid("pagestash::sizing", where + "'" + field + "' is not an integer");
        if (value < 0 || value > INT32_MAX)
          detail::throw_invalid("pagestash::sizing", where + "count " + field + " is outside [0, 2^31)");
        if (value > capacity && excess == Excess::refuse)
          detail::throw_invalid("pagestash::sizing", where + "count " + field + " of expert " +
                                                         std::to_string(counts.size()) + " exceeds the capacity " +
                                                         std::to_string(capacity) + excess_hint);
        counts.push_back(static_cast<std::int32_t>(value));
      }
      if (counts.empty()) continue;
      if (counts.size() != static_cast<std::size_t>(experts))
        detail::throw_invalid("pagestash::sizing", where + std::to_string(counts.size()) +
                                                       " counts, expected one per expert (" + std::to_string(experts) +
                                                       ")");
      if (!sizes.empty()) ++sizes.back();
      else if (lines.empty()) first_loose = number;
      lines.push_back(std::move(counts));
    }
    if (lines.empty()) detail::throw_invalid("pagestash::sizing", source + ": no count vectors");
    return MeasuredCounts(std::move(lines), std::move(sizes), capacity, source, excess);
  }

  static MeasuredCounts read(const std::string& path, std::int32_t experts, std::int64_t capacity,
                             Excess excess = Excess::refuse) {
    std::ifstream in(path);
    if (!in) detail::throw_invalid("pagestash::sizing", "cannot open counts file '" + path + "'");
    return parse(in, experts, capacity, path, excess);
  }

  std::int32_t experts() const override { return static_cast<std::int32_t>(lines_.front().size()); }
  std::int64_t capacity() const override { return capacity_; }
  const std::vector<std::vector<std::int32_t>>& lines() const { return lines_; }
  /// Measured steps (0: independent vectors).
  std::int64_t steps() const { return static_cast<std::int64_t>(first_.size()); }
  std::int64_t stashes_per_step() const override { return per_step_; }
  /// The units a bootstrap resamples: the steps, or the vectors when there are none.
  std::int64_t units() const { return steps() > 0 ? steps() : static_cast<std::int64_t>(lines_.size()); }

  void start_step(std::mt19937_64& rng, StepState& step) const override { step.step = draw_unit(rng); }
  /// The vector stash `stash` of the step takes: the measured step's, or one drawn for it.
  std::int64_t line_of(std::mt19937_64& rng, const StepState& step, std::int64_t stash) const {
    return steps() > 0 ? first_[static_cast<std::size_t>(step.step)] + stash : draw_unit(rng);
  }
  /// The same, for a step drawn from `units` (a bootstrap's resample of units()).
  std::int64_t line_of(std::mt19937_64& rng, std::int64_t unit, std::int64_t stash,
                       const std::vector<std::int64_t>& units) const {
    const auto pick = [&] { return units[std::uniform_int_distribution<std::size_t>(0, units.size() - 1)(rng)]; };
    return steps() > 0 ? first_[static_cast<std::size_t>(unit)] + stash : pick();
  }
  std::int64_t draw_unit(std::mt19937_64& rng) const {
    return static_cast<std::int64_t>(
        std::uniform_int_distribution<std::size_t>(0, static_cast<std::size_t>(units()) - 1)(rng));
  }
  /// Vector `line` capped at the capacity; returns the tokens dropped.
  std::int64_t counts_of(std::int64_t line, std::vector<std::int32_t>& counts) const {
    const auto& v = lines_[static_cast<std::size_t>(line)];
    counts.resize(v.size());
    std::int64_t dropped = 0;
    for (std::size_t e = 0; e < v.size(); ++e) {
      const std::int64_t kept = std::min<std::int64_t>(v[e], capacity_);
      dropped += v[e] - kept;
      counts[e] = static_cast<std::int32_t>(kept);
    }
    return dropped;
  }

  std::int64_t draw_stash(std::mt19937_64& rng, const StepState& step, std::int64_t stash,
                          std::vector<std::int32_t>& counts) const override {
    if (steps() > 0 && (stash < 0 || stash >= per_step_))
      detail::throw_invalid("pagestash::sizing", source_ + ": stash " + std::to_string(stash) + " of a step of " +
                                                     std::to_string(per_step_) + " count vectors");
    return counts_of(line_of(rng, step, stash), counts);
  }

  std::string describe() const override {
    const std::string what =
        steps() > 0 ? std::to_string(steps()) + " measured steps of " + std::to_string(per_step_) + " count vectors"
                    : std::to_string(lines_.size()) + " measured count vectors (independent)";
    return what + " from " + source_ + ", capacity " + std::to_string(capacity_) +
           (excess_ == Excess::cap ? " (capped)" : "");
  }

 private:
  static constexpr const char* excess_hint =
      " (a capacity smaller than training's? cap the counts to size with the excess dropped: Excess::cap, "
      "--cap-counts, cap_counts=True)";

  MeasuredCounts(std::vector<std::vector<std::int32_t>> lines, std::vector<std::int64_t> sizes, std::int64_t capacity,
                 std::string source, Excess excess)
      : lines_(std::move(lines)), capacity_(capacity), source_(std::move(source)), excess_(excess) {
    if (lines_.empty()) detail::throw_invalid("pagestash::sizing", source_ + ": no count vectors");
    if (capacity_ < 1)
      detail::throw_invalid("pagestash::sizing",
                            source_ + ": capacity = " + std::to_string(capacity_) + " must be positive");
    std::int64_t first = 0;
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      if (sizes[s] != sizes.front())
        detail::throw_invalid("pagestash::sizing", source_ + ": step " + std::to_string(s + 1) + " has " +
                                                       std::to_string(sizes[s]) + " count vectors, step 1 " +
                                                       std::to_string(sizes.front()) +
                                                       ": every step has one per stash");
      if (sizes[s] == 0)
        detail::throw_invalid("pagestash::sizing",
                              source_ + ": step " + std::to_string(s + 1) + " has no count vectors");
      first_.push_back(first);
      first += sizes[s];
    }
    if (!sizes.empty() && first != static_cast<std::int64_t>(lines_.size()))
      detail::throw_invalid("pagestash::sizing", source_ + ": " +
                                                     std::to_string(static_cast<std::int64_t>(lines_.size()) - first) +
                                                     " count vectors before the first step");
    per_step_ = sizes.empty() ? 0 : sizes.front();
    for (std::size_t i = 0; i < lines_.size(); ++i) {
      if (lines_[i].size() != lines_.front().size())
        detail::throw_invalid("pagestash::sizing", source_ + ": vector " + std::to_string(i + 1) + " has " +
                                                       std::to_string(lines_[i].size()) + " counts, the first " +
                                                       std::to_string(lines_.front().size()));
      for (std::size_t e = 0; e < lines_[i].size(); ++e) {
        if (lines_[i][e] < 0)
          detail::throw_invalid("pagestash::sizing", source_ + ": vector " + std::to_string(i + 1) + ", expert " +
                                                         std::to_string(e) + ": count " + std::to_string(lines_[i][e]) +
                                                         " is negative");
        if (lines_[i][e] > capacity_ && excess_ == Excess::refuse)
          detail::throw_invalid("pagestash::sizing", source_ + ": vector " + std::to_string(i + 1) + ", expert " +
                                                         std::to_string(e) + ": count " + std::to_string(lines_[i][e]) +
                                                         " exceeds the capacity " + std::to_string(capacity_) +
                                                         excess_hint);
      }
    }
  }

  std::vector<std::vector<std::int32_t>> lines_;
  std::vector<std::int64_t> first_;  ///< each step's first vector
  std::int64_t per_step_ = 0;
  std::int64_t capacity_;
  std::string source_;
  Excess excess_;
};

}  // namespace sizing
PAGESTASH_NAMESPACE_END
