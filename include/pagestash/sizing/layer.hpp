#pragma once
// Layer: the tensors one MoE layer saves for backward. They share the layer's routing: one
// count per expert, at most the capacity, padded up to the largest count alignment of the
// tensors (as Megatron pads experts for packed quantized layouts) before they are measured.

#include <pagestash/sizing/saved_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// Tokens per expert buffer for a capacity factor: the mean tokens per expert
/// (tokens x top_k / experts) times the factor, rounded up to `multiple` (at least one
/// multiple), as examples/moe_stash_demo sizes its buffers.
inline std::int64_t capacity_for(std::int64_t tokens, std::int32_t top_k, std::int32_t experts, double capacity_factor,
                                 std::int64_t multiple) {
  if (tokens < 1 || top_k < 1 || experts < 1 || top_k > experts)
    detail::throw_invalid("pagestash::sizing",
                          "capacity_for: tokens = " + std::to_string(tokens) + ", top_k = " + std::to_string(top_k) +
                              ", experts = " + std::to_string(experts) + " (need tokens >= 1, 1 <= top_k <= experts)");
  if (!(capacity_factor > 0))
    detail::throw_invalid("pagestash::sizing", "capacity_for: capacity_factor must be positive");
  if (multiple < 1) detail::throw_invalid("pagestash::sizing", "capacity_for: multiple must be positive");
  const double mean = static_cast<double>(tokens) * top_k / experts;
  const auto units = static_cast<std::int64_t>(std::ceil(mean * capacity_factor / static_cast<double>(multiple)));
  return std::max<std::int64_t>(1, units) * multiple;
}

class Layer {
 public:
  /// The tensors, each made to hold `capacity` tokens per expert (a multiple of
  /// capacity_alignment(tensors)). They must have the same number of groups.
  Layer(const std::vector<SavedTensor>& tensors, std::int64_t capacity) : capacity_(capacity) {
    if (tensors.empty()) detail::throw_invalid("pagestash::sizing", "Layer: no saved tensors");
    for (const SavedTensor& t : tensors) {
      if (t.groups() != tensors.front().groups())
        detail::throw_invalid("pagestash::sizing", "Layer: " + t.name() + " has " + std::to_string(t.groups()) +
                                                       " groups, " + tensors.front().name() + " " +
                                                       std::to_string(tensors.front().groups()));
      tensors_.push_back(t.with_capacity(capacity));
      alignment_ = std::lcm(alignment_, t.count_alignment());
    }
  }

  /// The least common multiple of the tensors' capacity multiples: a capacity they all hold.
  static std::int64_t capacity_alignment(const std::vector<SavedTensor>& tensors) {
    std::int64_t m = 1;
    for (const SavedTensor& t : tensors) m = std::lcm(m, t.capacity_alignment());
    return m;
  }

  const std::vector<SavedTensor>& tensors() const { return tensors_; }
  std::int32_t experts() const { return tensors_.front().groups(); }
  std::int64_t capacity() const { return capacity_; }
  /// Every expert's count is padded up to a multiple of this before measuring.
  std::int64_t count_alignment() const { return alignment_; }
  /// Bytes the layer's tensors hold at full shape (no stashing).
  std::int64_t full_bytes() const {
    std::int64_t bytes = 0;
    for (const SavedTensor& t : tensors_) bytes += t.full_bytes();
    return bytes;
  }

  /// Each count rounded up to the alignment (the capacity is a multiple of it, so a count
  /// within capacity stays within). Throws for a count beyond the capacity or negative.
  std::vector<std::int32_t> padded(const std::vector<std::int32_t>& counts) const {
    if (counts.size() != static_cast<std::size_t>(experts()))
      detail::throw_invalid("pagestash::sizing", "Layer: " + std::to_string(counts.size()) + " counts for " +
                                                     std::to_string(experts()) + " experts");
    std::vector<std::int32_t> out(counts.size());
    for (std::size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] < 0 || counts[e] > capacity_)
        detail::throw_invalid("pagestash::sizing", "Layer: count " + std::to_string(counts[e]) + " of expert " +
                                                       std::to_string(e) + " is outside [0, capacity " +
                                                       std::to_string(capacity_) + "]");
      out[e] = static_cast<std::int32_t>((counts[e] + alignment_ - 1) / alignment_ * alignment_);
    }
    return out;
  }

  /// The pages and bytes the layer's stashes of `counts` take (counts padded first).
  TensorBytes measure(const std::vector<std::int32_t>& counts, std::int64_t page_bytes) const {
    const std::vector<std::int32_t> held = padded(counts);
    TensorBytes sum;
    for (const SavedTensor& t : tensors_) sum += t.measure(held, page_bytes);
    return sum;
  }

 private:
  std::vector<SavedTensor> tensors_;
  std::int64_t capacity_;
  std::int64_t alignment_ = 1;
};

}  // namespace sizing
PAGESTASH_NAMESPACE_END
