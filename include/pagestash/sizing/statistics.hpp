#pragma once
// The statistics of the sizer: empirical quantiles of sampled peaks with an
// order-statistic confidence interval, and binomial proportions with Wilson intervals.

#include <pagestash/sizing/saved_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

struct Interval {
  double low = 0;
  double high = 0;
};

/// The standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
inline double normal_quantile(double p) {
  if (!(p > 0 && p < 1))
    detail::throw_invalid("pagestash::sizing", "normal_quantile: p = " + std::to_string(p) + " must be in (0, 1)");
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double low = 0.02425;
  if (p < low || p > 1 - low) {
    const double q = std::sqrt(-2 * std::log(p < low ? p : 1 - p));
    const double x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
                     ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    return p < low ? x : -x;
  }
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

/// Wilson score interval of a proportion of k successes in n trials at `confidence`.
inline Interval wilson_interval(std::int64_t k, std::int64_t n, double confidence = 0.95) {
  if (n < 1 || k < 0 || k > n)
    detail::throw_invalid("pagestash::sizing",
                          "wilson_interval: k = " + std::to_string(k) + ", n = " + std::to_string(n));
  const double z = normal_quantile(0.5 + confidence / 2), nn = static_cast<double>(n);
  const double p = static_cast<double>(k) / nn, z2 = z * z;
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

/// P(B <= j) for every j in [0, n], B ~ Binomial(n, p): exact, in log space (no underflow
/// trouble for the n of a Monte Carlo run).
inline std::vector<double> binomial_cdf(std::int64_t n, double p) {
  if (n < 0 || !(p >= 0 && p <= 1)) detail::throw_invalid("pagestash::sizing", "binomial_cdf: bad n or p");
  std::vector<double> cdf(static_cast<std::size_t>(n) + 1);
  const double nn = static_cast<double>(n), log_p = std::log(p), log_q = std::log1p(-p), log_n = std::lgamma(nn + 1);
  double sum = 0;
  for (std::int64_t j = 0; j <= n; ++j) {
    const double jj = static_cast<double>(j);
    double term;
    if (p == 0) term = j == 0 ? 1 : 0;
    else if (p == 1) term = j == n ? 1 : 0;
    else term = std::exp(log_n - std::lgamma(jj + 1) - std::lgamma(nn - jj + 1) + jj * log_p + (nn - jj) * log_q);
    sum += term;
    cdf[static_cast<std::size_t>(j)] = std::min(sum, 1.0);
  }
  return cdf;
}

/// An empirical quantile of sorted samples with its confidence interval.
struct QuantileEstimate {
  std::int64_t value = 0;  ///< the smallest sample x with at least `level` of the samples <= x
  std::int64_t low = 0;    ///< the interval's order statistics: [X_(l), X_(u)]
  std::int64_t high = 0;
  bool low_bounded = true;   ///< false: too few samples below for the interval (low = the minimum)
  bool high_bounded = true;  ///< false: too few samples above (high = the maximum): sample more
};

/// The smallest of `sorted` (ascending, not empty) with at least `level` of them at or below it.
inline std::int64_t quantile_value(const std::vector<std::int64_t>& sorted, double level) {
  const auto n = static_cast<std::int64_t>(sorted.size());
  const auto rank = static_cast<std::int64_t>(std::ceil(level * static_cast<double>(n) - 1e-9));
  return sorted[static_cast<std::size_t>(std::clamp<std::int64_t>(rank, 1, n) - 1)];
}

/// The `level` quantile of `sorted` (ascending) and its distribution-free interval: with B
/// ~ Binomial(n, level) the samples at or below the true quantile, [X_(l), X_(u)] covers it
/// with probability >= P(l <= B < u) >= confidence, l the largest rank with P(B < l) <=
/// (1 - confidence) / 2, u the smallest with P(B >= u) <= (1 - confidence) / 2.
inline QuantileEstimate quantile_estimate(const std::vector<std::int64_t>& sorted, double level,
                                          double confidence = 0.95) {
  if (sorted.empty()) detail::throw_invalid("pagestash::sizing", "quantile_estimate: no samples");
  if (!(level > 0 && level < 1))
    detail::throw_invalid("pagestash::sizing", "quantile_estimate: level must be in (0, 1)");
  if (!(confidence > 0 && confidence < 1))
    detail::throw_invalid("pagestash::sizing", "quantile_estimate: confidence must be in (0, 1)");
  const auto n = static_cast<std::int64_t>(sorted.size());
  const auto at = [&](std::int64_t rank) { return sorted[static_cast<std::size_t>(rank - 1)]; };  // 1-based
  QuantileEstimate q;
  q.value = quantile_value(sorted, level);
  const std::vector<double> cdf = binomial_cdf(n, level);
  const double tail = (1 - confidence) / 2;
  const auto below = [&](std::int64_t r) { return r <= 0 ? 0.0 : cdf[static_cast<std::size_t>(r - 1)]; };  // P(B < r)
  std::int64_t l = 0;
  while (l + 1 <= n && below(l + 1) <= tail) ++l;
  std::int64_t u = 1;
  while (u <= n && 1 - below(u) > tail) ++u;
  q.low_bounded = l >= 1;
  q.high_bounded = u <= n;
  q.low = at(std::max<std::int64_t>(l, 1));
  q.high = at(std::min(u, n));
  return q;
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
