#pragma once
// Count models: where the per-expert token counts of each (layer, microbatch) stash come
// from. DirichletRouting draws a router (expert popularity from a Dirichlet, top-k of T
// tokens, a capacity); MeasuredCounts replays count vectors measured in training.

#include <pagestash/plan/saved_tensor.hpp>

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
namespace plan {

class CountModel {
 public:
  virtual ~CountModel() = default;
  virtual std::int32_t experts() const = 0;
  /// Most tokens one expert holds: counts above it were dropped.
  virtual std::int64_t capacity() const = 0;
  /// Draws one stash's counts into `counts` (resized to experts()), each at most
  /// capacity(); returns the tokens dropped at the capacity.
  virtual std::int64_t draw(std::mt19937_64& rng, std::vector<std::int32_t>& counts) const = 0;
  virtual std::string describe() const = 0;
};

/// How DirichletRouting turns expert popularity into counts.
enum class RoutingSampler {
  /// Every token picks top_k distinct experts, each pick with probability proportional to
  /// the popularity of the experts not yet picked (as examples/moe_stash_demo routes):
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
  std::int64_t capacity = 0;   ///< tokens per expert kept (plan::capacity_for); the rest dropped
  RoutingSampler sampler = RoutingSampler::multinomial;
};

/// A router per stash: popularity p ~ Dirichlet(alpha) over the experts (one gamma(alpha)
/// draw per expert, normalised), then the routing of `tokens` tokens to top_k experts each,
/// then every count capped at the capacity (the tokens above it dropped).
class DirichletRouting final : public CountModel {
 public:
  explicit DirichletRouting(const Routing& r) : r_(r) {
    if (r.experts < 1 || r.top_k < 1 || r.top_k > r.experts)
      detail::invalid_plan("DirichletRouting: experts = " + std::to_string(r.experts) + ", top_k = " +
                           std::to_string(r.top_k) + " (need 1 <= top_k <= experts)");
    if (r.tokens < 1 || r.tokens > INT32_MAX)
      detail::invalid_plan("DirichletRouting: tokens = " + std::to_string(r.tokens) + " must be in [1, 2^31)");
    if (!(r.alpha > 0) || !std::isfinite(r.alpha)) detail::invalid_plan("DirichletRouting: alpha must be positive");
    if (r.capacity < 1) detail::invalid_plan("DirichletRouting: capacity = " + std::to_string(r.capacity) + " must be positive");
  }

  std::int32_t experts() const override { return r_.experts; }
  std::int64_t capacity() const override { return r_.capacity; }
  const Routing& routing() const { return r_; }

  std::int64_t draw(std::mt19937_64& rng, std::vector<std::int32_t>& counts) const override {
    const auto e_count = static_cast<std::size_t>(r_.experts);
    std::vector<double> p(e_count);
    popularity(rng, p);
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
      << (r_.sampler == RoutingSampler::per_token ? "per-token" : "multinomial") << ")";
    return s.str();
  }

 private:
  void popularity(std::mt19937_64& rng, std::vector<double>& p) const {
    std::gamma_distribution<double> gamma(r_.alpha, 1.0);
    double sum = 0;
    for (double& x : p) sum += (x = gamma(rng));
    if (!(sum > 0)) {  // every draw underflowed (tiny alpha): all the mass on one expert
      p[std::uniform_int_distribution<std::size_t>(0, p.size() - 1)(rng)] = sum = 1;
    }
    for (double& x : p) x /= sum;
  }

  void route_per_token(std::mt19937_64& rng, const std::vector<double>& p, std::vector<std::int64_t>& routed) const {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::vector<double> left(p.size());
    for (std::int64_t t = 0; t < r_.tokens; ++t) {
      left = p;
      double mass = 1.0;
      for (std::int32_t k = 0; k < r_.top_k; ++k) {
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
    const std::vector<double> pi = inclusion(p);
    std::int64_t n = r_.tokens * r_.top_k;
    double rest = 0;
    for (double x : pi) rest += x;
    for (std::size_t e = 0; e < pi.size() && n > 0; ++e) {
      const double q = rest > 0 ? std::clamp(pi[e] / rest, 0.0, 1.0) : 1.0;
      const std::int64_t c = e + 1 == pi.size() ? n : std::binomial_distribution<std::int64_t>(n, q)(rng);
      routed[e] = std::min(c, r_.tokens);  // an expert takes a token at most once
      n -= c;
      rest -= pi[e];
    }
  }

  /// pi_e = 1 - exp(-lambda p_e) summing to top_k. The sum is concave and increasing in
  /// lambda and at most lambda, so Newton's method from lambda = top_k climbs to the root
  /// from below, quadratically near it.
  std::vector<double> inclusion(const std::vector<double>& p) const {
    const double k = r_.top_k;
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

  Routing r_;
};

/// Count vectors measured in training, one per (step, layer) line, drawn uniformly with
/// replacement (a bootstrap of the measured steps); counts above the capacity are dropped.
class MeasuredCounts final : public CountModel {
 public:
  MeasuredCounts(std::vector<std::vector<std::int32_t>> lines, std::int64_t capacity, std::string source = "counts")
      : lines_(std::move(lines)), capacity_(capacity), source_(std::move(source)) {
    if (lines_.empty()) detail::invalid_plan(source_ + ": no count vectors");
    if (capacity_ < 1) detail::invalid_plan(source_ + ": capacity = " + std::to_string(capacity_) + " must be positive");
    for (std::size_t i = 0; i < lines_.size(); ++i)
      if (lines_[i].size() != lines_.front().size())
        detail::invalid_plan(source_ + ": vector " + std::to_string(i + 1) + " has " + std::to_string(lines_[i].size()) +
                             " counts, the first " + std::to_string(lines_.front().size()));
  }

  /// Parses one count vector per line: integers >= 0 separated by whitespace or commas;
  /// empty lines and lines starting with '#' are skipped. Every vector must have `experts`
  /// counts. Throws std::invalid_argument naming the source, line and what is wrong.
  static MeasuredCounts parse(std::istream& in, std::int32_t experts, std::int64_t capacity,
                              const std::string& source = "counts") {
    std::vector<std::vector<std::int32_t>> lines;
    std::string line;
    for (std::int64_t number = 1; std::getline(in, line); ++number) {
      const std::string where = source + ":" + std::to_string(number) + ": ";
      std::replace(line.begin(), line.end(), ',', ' ');
      std::istringstream fields(line);
      std::string field;
      std::vector<std::int32_t> counts;
      while (fields >> field) {
        if (counts.empty() && field[0] == '#') break;
        std::size_t used = 0;
        long long value = -1;
        try {
          value = std::stoll(field, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != field.size()) detail::invalid_plan(where + "'" + field + "' is not an integer");
        if (value < 0 || value > INT32_MAX) detail::invalid_plan(where + "count " + field + " is outside [0, 2^31)");
        counts.push_back(static_cast<std::int32_t>(value));
      }
      if (counts.empty()) continue;
      if (counts.size() != static_cast<std::size_t>(experts))
        detail::invalid_plan(where + std::to_string(counts.size()) + " counts, expected one per expert (" +
                             std::to_string(experts) + ")");
      lines.push_back(std::move(counts));
    }
    if (lines.empty()) detail::invalid_plan(source + ": no count vectors");
    return MeasuredCounts(std::move(lines), capacity, source);
  }

  static MeasuredCounts read(const std::string& path, std::int32_t experts, std::int64_t capacity) {
    std::ifstream in(path);
    if (!in) detail::invalid_plan("cannot open counts file '" + path + "'");
    return parse(in, experts, capacity, path);
  }

  std::int32_t experts() const override { return static_cast<std::int32_t>(lines_.front().size()); }
  std::int64_t capacity() const override { return capacity_; }
  const std::vector<std::vector<std::int32_t>>& lines() const { return lines_; }

  std::int64_t draw(std::mt19937_64& rng, std::vector<std::int32_t>& counts) const override {
    const auto& line = lines_[std::uniform_int_distribution<std::size_t>(0, lines_.size() - 1)(rng)];
    counts.resize(line.size());
    std::int64_t dropped = 0;
    for (std::size_t e = 0; e < line.size(); ++e) {
      const std::int64_t kept = std::min<std::int64_t>(line[e], capacity_);
      dropped += line[e] - kept;
      counts[e] = static_cast<std::int32_t>(kept);
    }
    return dropped;
  }

  std::string describe() const override {
    return std::to_string(lines_.size()) + " measured count vectors from " + source_ + ", capacity " +
           std::to_string(capacity_);
  }

 private:
  std::vector<std::vector<std::int32_t>> lines_;
  std::int64_t capacity_;
  std::string source_;
};

}  // namespace plan
PAGESTASH_NAMESPACE_END
