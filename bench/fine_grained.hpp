#pragma once
// The fine-grained rows' tensors, one description for stash_bench's table and launch_cost's rounds table: a model
// shape's experts (sizing::model_shapes) of capacity twice the mean, rounded up to the layout's granule, and
// Dirichlet(1) counts (seeded by the row), clamped to it.

#include <pagestash/layouts/view.hpp>
#include <pagestash/sizing/model_shapes.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace pagestash_bench {

/// The row's tensor shape (no pointers).
template <class L>
pagestash::GroupedView<L> fine_view(const pagestash::sizing::ModelShape& fs, std::int64_t mean) {
  pagestash::GroupedView<L> v;
  v.groups = fs.experts;
  v.hidden = fs.hidden;
  v.max_tokens = 1;
  v.max_tokens = (2 * mean + v.granule() - 1) / v.granule() * v.granule();
  return v;
}

/// The row's counts: Dirichlet(1) shares of experts x mean tokens, none above the capacity.
inline std::vector<std::int32_t> fine_counts(const pagestash::sizing::ModelShape& fs, std::int64_t mean,
                                             std::int64_t capacity) {
  std::mt19937 rng(static_cast<std::uint32_t>(mean * 131 + fs.experts));
  std::gamma_distribution<double> gamma(1.0, 1.0);
  std::vector<double> w(static_cast<std::size_t>(fs.experts));
  double sum = 0;
  for (double& x : w) sum += (x = gamma(rng));
  std::vector<std::int32_t> counts;
  for (double x : w)
    counts.push_back(static_cast<std::int32_t>(
        std::min<double>(static_cast<double>(capacity), x / sum * fs.experts * static_cast<double>(mean))));
  return counts;
}

}  // namespace pagestash_bench
