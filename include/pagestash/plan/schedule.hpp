#pragma once
// Schedule: how many (layer, microbatch) stashes one rank holds at once at the peak of a
// step. Each stash holds its own routing's counts; the pool must hold them all together.

#include <pagestash/plan/saved_tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace plan {

class Schedule {
 public:
  /// Every microbatch's forward, then every backward (no pipeline): all layers x
  /// microbatches are alive at the peak.
  static Schedule forward_then_backward(std::int32_t layers, std::int32_t microbatches) {
    check_positive("layers", layers);
    check_positive("microbatches", microbatches);
    return Schedule("lifo", std::vector<std::int64_t>(static_cast<std::size_t>(layers), microbatches));
  }

  /// 1F1B over `stages` pipeline stages on the rank of the first stage (the one holding
  /// most), `layers` being the MoE layers of that rank (all its virtual chunks together).
  ///  - v = 1: the first stage runs `stages` forwards before its first backward, then
  ///    alternates: min(stages, microbatches) microbatches alive, each for all its layers.
  ///  - v > 1 (interleaved, Megatron's schedule): the rank holds v chunks of layers / v
  ///    layers; its warm-up runs (v - 1) * p + 2 * (p - 1) chunk forwards, and the first
  ///    steady forward one more, before the first backward: min(v * p + p - 1, v * M)
  ///    chunk-microbatches alive, i.e. layers * (p + (p - 1) / v) layer-microbatches, the
  ///    (1 + (p - 1) / (p v)) x p of the Megatron-LM paper (Narayanan et al., 2021).
  static Schedule one_f_one_b(std::int32_t layers, std::int32_t microbatches, std::int32_t stages,
                              std::int32_t virtual_stages = 1) {
    check_positive("layers", layers);
    check_positive("microbatches", microbatches);
    check_positive("pipeline stages", stages);
    check_positive("virtual stages", virtual_stages);
    const std::int64_t p = stages, v = virtual_stages, m = microbatches;
    std::ostringstream name;
    name << "1f1b:" << p;
    if (v == 1) return Schedule(name.str(), std::vector<std::int64_t>(static_cast<std::size_t>(layers), std::min(p, m)));
    name << ":" << v;
    if (layers % virtual_stages != 0)
      detail::invalid_plan("1F1B with " + std::to_string(virtual_stages) + " virtual stages needs layers (" +
                           std::to_string(layers) + ") divisible by them");
    const std::int64_t chunk_microbatches = std::min(v * p + p - 1, v * m);
    // Chunk c's layers hold the chunk-microbatches of that chunk: spread in order over chunks
    // (the warm-up runs chunk 0's microbatches first), as equal as the count allows.
    std::vector<std::int64_t> alive;
    const std::int64_t per_chunk = layers / v;
    for (std::int64_t c = 0; c < v; ++c) {
      const std::int64_t of_chunk = chunk_microbatches / v + (c < chunk_microbatches % v ? 1 : 0);
      alive.insert(alive.end(), static_cast<std::size_t>(per_chunk), of_chunk);
    }
    return Schedule(name.str(), alive);
  }

  /// An explicit list: entry i is how many microbatches' stashes layer i holds at the peak.
  static Schedule explicit_list(std::vector<std::int64_t> microbatches_per_layer) {
    if (microbatches_per_layer.empty()) detail::invalid_plan("Schedule: the list is empty");
    std::ostringstream name;
    name << "list:";
    for (std::size_t i = 0; i < microbatches_per_layer.size(); ++i) {
      if (microbatches_per_layer[i] < 0)
        detail::invalid_plan("Schedule: entry " + std::to_string(i) + " is negative (" +
                             std::to_string(microbatches_per_layer[i]) + ")");
      name << (i ? "," : "") << microbatches_per_layer[i];
    }
    return Schedule(name.str(), std::move(microbatches_per_layer));
  }

  /// Parses "lifo", "1f1b:P", "1f1b:P:V" or "list:a,b,c" (layers and microbatches apply to
  /// the first two). Throws std::invalid_argument saying what is wrong.
  static Schedule parse(const std::string& s, std::int32_t layers, std::int32_t microbatches) {
    if (s == "lifo") return forward_then_backward(layers, microbatches);
    const auto numbers = [&](const std::string& list, char sep) {
      std::vector<std::int64_t> out;
      std::stringstream in(list);
      std::string item;
      while (std::getline(in, item, sep)) {
        std::size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(item, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (item.empty() || used != item.size()) detail::invalid_plan("schedule '" + s + "': '" + item + "' is not a number");
        out.push_back(value);
      }
      return out;
    };
    if (s.rfind("1f1b:", 0) == 0) {
      const std::vector<std::int64_t> pv = numbers(s.substr(5), ':');
      if (pv.empty() || pv.size() > 2 || pv[0] > INT32_MAX || (pv.size() == 2 && pv[1] > INT32_MAX))
        detail::invalid_plan("schedule '" + s + "': expected 1f1b:P or 1f1b:P:V");
      return one_f_one_b(layers, microbatches, static_cast<std::int32_t>(pv[0]),
                         pv.size() == 2 ? static_cast<std::int32_t>(pv[1]) : 1);
    }
    if (s.rfind("list:", 0) == 0) return explicit_list(numbers(s.substr(5), ','));
    detail::invalid_plan("unknown schedule '" + s + "' (lifo, 1f1b:P, 1f1b:P:V, list:a,b,c)");
  }

  const std::string& name() const { return name_; }
  /// Per layer: the microbatches whose stashes it holds at the peak.
  const std::vector<std::int64_t>& microbatches_per_layer() const { return per_layer_; }
  /// The stashes alive at the peak (the sum over layers).
  std::int64_t alive_stashes() const {
    std::int64_t n = 0;
    for (std::int64_t m : per_layer_) n += m;
    return n;
  }

 private:
  Schedule(std::string name, std::vector<std::int64_t> per_layer) : name_(std::move(name)), per_layer_(std::move(per_layer)) {}
  static void check_positive(const char* what, std::int64_t n) {
    if (n < 1) detail::invalid_plan(std::string("Schedule: ") + what + " = " + std::to_string(n) + " must be at least 1");
  }
  std::string name_;
  std::vector<std::int64_t> per_layer_;
};

}  // namespace plan
PAGESTASH_NAMESPACE_END
