#pragma once
// Schedule: the order of one rank's stashes and reloads over a training step. Every
// forward of a (layer, microbatch) stashes its saved tensors, every backward reloads them;
// the pool must hold, at every moment of the step, the stashes stashed and not yet reloaded.

#include <pagestash/sizing/saved_tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// The command's and Python's defaults: MoE layers on the rank, microbatches per step.
inline constexpr std::int32_t default_layers = 4;
inline constexpr std::int32_t default_microbatches = 8;

/// One event of a step: a (layer, microbatch) stash or its reload.
struct StashEvent {
  bool stash = true;  ///< false: the reload
  std::int32_t layer = 0;
  std::int32_t microbatch = 0;
};

class Schedule {
 public:
  /// Every microbatch's forward, then every backward in reverse (no pipeline): every layer
  /// x microbatch is held at the one peak.
  static Schedule forward_then_backward(std::int32_t layers, std::int32_t microbatches) {
    check_positive("layers", layers);
    check_positive("microbatches", microbatches);
    Schedule s("lifo", layers, microbatches);
    for (std::int32_t m = 0; m < microbatches; ++m) s.forward(m, 0, layers);
    for (std::int32_t m = microbatches; m-- > 0;) s.backward(m, 0, layers);
    s.summarise();
    return s;
  }

  /// 1F1B over `stages` pipeline stages, in Megatron-LM's order, on the rank of the first
  /// stage (the one holding most); `layers` are that rank's MoE layers (all its virtual
  /// chunks together), a forward stashes them in order and a backward reloads them in reverse.
  ///  - v = 1: min(p - 1, M) warm-up forwards, then forward / backward pairs, then the
  ///    remaining backwards: min(p, M) microbatches held at each of max(1, M - p + 1) peaks.
  ///  - v > 1 (interleaved): v chunks of layers / v layers; the chunk-microbatches run in
  ///    Megatron's table (groups of p microbatches, chunk by chunk; backwards in reverse
  ///    chunk order), with (v - 1) p + 2 (p - 1) warm-up forwards (all of them when M = p),
  ///    then pairs: min(v p + p - 1, v M) chunk-microbatches held at a peak, the (1 + (p -
  ///    1) / (p v)) x p of Narayanan et al. (2021).
  static Schedule one_f_one_b(std::int32_t layers, std::int32_t microbatches, std::int32_t stages,
                              std::int32_t virtual_stages = 1) {
    check_positive("layers", layers);
    check_positive("microbatches", microbatches);
    check_positive("pipeline stages", stages);
    check_positive("virtual stages", virtual_stages);
    const std::int64_t p = stages, v = virtual_stages, m = microbatches;
    std::ostringstream name;
    name << "1f1b:" << p;
    if (v > 1) name << ":" << v;
    if (layers % virtual_stages != 0)
      detail::throw_invalid("pagestash::sizing", "1F1B with " + std::to_string(virtual_stages) +
                                                     " virtual stages needs layers (" + std::to_string(layers) +
                                                     ") divisible by them");
    Schedule s(name.str(), layers, microbatches);
    // Megatron's table of (microbatch, chunk) for the forwards, groups of p microbatches.
    std::vector<std::pair<std::int32_t, std::int32_t>> table;
    for (std::int64_t first = 0; first < m; first += p) {
      const std::int64_t last = first + p >= m ? m : first + p;
      for (std::int64_t c = 0; c < v; ++c)
        for (std::int64_t mb = first; mb < last; ++mb)
          table.emplace_back(static_cast<std::int32_t>(mb), static_cast<std::int32_t>(c));
    }
    const auto total = static_cast<std::int64_t>(table.size());
    const std::int64_t warmup =
        v == 1 ? std::min(p - 1, m) : (m == p ? total : std::min((p - 1) * 2 + (v - 1) * p, total));
    const std::int32_t per_chunk = layers / virtual_stages;
    const auto run = [&](std::int64_t k, bool forward) {
      const auto [mb, chunk] = table[static_cast<std::size_t>(k)];
      const std::int32_t c = forward ? chunk : virtual_stages - 1 - chunk;
      if (forward) s.forward(mb, c * per_chunk, per_chunk);
      else s.backward(mb, c * per_chunk, per_chunk);
    };
    for (std::int64_t k = 0; k < warmup; ++k) run(k, true);
    for (std::int64_t k = 0; k + warmup < total; ++k) {
      run(k + warmup, true);
      run(k, false);
    }
    for (std::int64_t k = total - warmup; k < total; ++k) run(k, false);
    s.summarise();
    return s;
  }

  /// An explicit list: entry i is how many microbatches' stashes layer i holds at the one
  /// peak (every stash, then every reload in reverse).
  static Schedule explicit_list(std::vector<std::int64_t> microbatches_per_layer) {
    if (microbatches_per_layer.empty()) detail::throw_invalid("pagestash::sizing", "Schedule: the list is empty");
    std::ostringstream name;
    name << "list:";
    std::int64_t most = 0, sum = 0;
    for (std::size_t i = 0; i < microbatches_per_layer.size(); ++i) {
      const std::int64_t n = microbatches_per_layer[i];
      if (n < 0 || n > INT32_MAX)
        detail::throw_invalid("pagestash::sizing", "Schedule: list entry " + std::to_string(i) + " = " +
                                                       std::to_string(n) + " is outside [0, 2^31)");
      name << (i ? "," : "") << n;
      most = std::max(most, n);
      sum += n;
    }
    if (sum == 0)
      detail::throw_invalid("pagestash::sizing",
                            "Schedule: " + name.str() + " holds no stash (a pool needs at least one page)");
    if (microbatches_per_layer.size() > INT32_MAX)
      detail::throw_invalid("pagestash::sizing", "Schedule: the list is too long");
    Schedule s(name.str(), static_cast<std::int32_t>(microbatches_per_layer.size()), static_cast<std::int32_t>(most));
    for (std::int32_t m = 0; m < most; ++m)
      for (std::size_t l = 0; l < microbatches_per_layer.size(); ++l)
        if (m < microbatches_per_layer[l]) s.events_.push_back({true, static_cast<std::int32_t>(l), m});
    for (std::size_t i = s.events_.size(); i-- > 0;)
      s.events_.push_back({false, s.events_[i].layer, s.events_[i].microbatch});
    s.summarise();
    return s;
  }

  /// A step's own order, event by event: "S<layer>.<microbatch>" a stash, "R<layer>.<microbatch>" its reload, e.g.
  /// "S0.0,S0.1,R0.0,R0.1" (Python's pipeline_schedule writes it from torch's pipeline engine's action order). Every
  /// stash is reloaded once, after it; layers and microbatches are the largest numbers named, plus one.
  static Schedule explicit_order(const std::string& list) {
    Schedule s("order:" + list, 0, 0);
    std::vector<std::pair<std::int64_t, std::int64_t>> seen;  // (layer, microbatch) per event
    std::size_t begin = 0;
    while (begin <= list.size()) {
      const std::size_t end = std::min(list.find(',', begin), list.size());
      const std::string item = list.substr(begin, end - begin);
      const std::size_t dot = item.find('.');
      long long layer = -1, microbatch = -1;
      std::size_t used_l = 0, used_m = 0;
      if (item.size() > 2 && (item[0] == 'S' || item[0] == 'R') && dot != std::string::npos) {
        try {
          layer = std::stoll(item.substr(1, dot - 1), &used_l);
          microbatch = std::stoll(item.substr(dot + 1), &used_m);
        } catch (const std::exception&) { layer = -1; }
      }
      if (layer < 0 || microbatch < 0 || layer >= INT32_MAX || microbatch >= INT32_MAX || used_l + 1 != dot ||
          used_m + dot + 1 != item.size())
        detail::throw_invalid("pagestash::sizing", "schedule 'order:...': '" + item +
                                                       "' is not S<layer>.<microbatch> or R<layer>.<microbatch>");
      s.layers_ = std::max(s.layers_, static_cast<std::int32_t>(layer + 1));
      s.microbatches_ = std::max(s.microbatches_, static_cast<std::int32_t>(microbatch + 1));
      s.events_.push_back({item[0] == 'S', static_cast<std::int32_t>(layer), static_cast<std::int32_t>(microbatch)});
      begin = end + 1;
    }
    std::vector<int> state(static_cast<std::size_t>(s.stashes()), 0);  // 0 never stashed, 1 held, 2 reloaded
    for (const StashEvent& e : s.events_) {
      int& st = state[static_cast<std::size_t>(s.stash_index(e))];
      if (st != (e.stash ? 0 : 1))
        detail::throw_invalid("pagestash::sizing", "schedule 'order:...': " + std::string(e.stash ? "S" : "R") +
                                                       std::to_string(e.layer) + "." + std::to_string(e.microbatch) +
                                                       (e.stash ? " stashed twice" : " reloaded before its stash"));
      st = e.stash ? 1 : 2;
    }
    if (std::find(state.begin(), state.end(), 1) != state.end())
      detail::throw_invalid("pagestash::sizing", "schedule 'order:...': a stash is never reloaded");
    s.summarise();
    return s;
  }

  /// Parses "lifo", "1f1b:P", "1f1b:P:V", "list:a,b,c" or "order:S0.0,..." (layers and microbatches apply to
  /// the first two). Throws std::invalid_argument saying what is wrong.
  static Schedule parse(const std::string& s, std::int32_t layers, std::int32_t microbatches) {
    if (s == "lifo") return forward_then_backward(layers, microbatches);
    const auto numbers = [&](const std::string& list, char sep) {
      std::vector<std::int64_t> out;
      std::size_t begin = 0;
      for (;;) {  // every field, the empty last one of "1f1b:4:" too
        const std::size_t end = list.find(sep, begin);
        const std::string item = list.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
        std::size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(item, &used);
        } catch (const std::exception&) { used = 0; }
        if (item.empty() || used != item.size())
          detail::throw_invalid("pagestash::sizing", "schedule '" + s + "': '" + item + "' is not a number");
        out.push_back(value);
        if (end == std::string::npos) return out;
        begin = end + 1;
      }
    };
    if (s.rfind("1f1b:", 0) == 0) {
      const std::vector<std::int64_t> pv = numbers(s.substr(5), ':');
      if (pv.size() > 2 || pv[0] > INT32_MAX || pv[0] < INT32_MIN ||
          (pv.size() == 2 && (pv[1] > INT32_MAX || pv[1] < INT32_MIN)))
        detail::throw_invalid("pagestash::sizing", "schedule '" + s + "': expected 1f1b:P or 1f1b:P:V");
      return one_f_one_b(layers, microbatches, static_cast<std::int32_t>(pv[0]),
                         pv.size() == 2 ? static_cast<std::int32_t>(pv[1]) : 1);
    }
    if (s.rfind("list:", 0) == 0) return explicit_list(numbers(s.substr(5), ','));
    if (s.rfind("order:", 0) == 0) return explicit_order(s.substr(6));
    detail::throw_invalid("pagestash::sizing",
                          "unknown schedule '" + s + "' (lifo, 1f1b:P, 1f1b:P:V, list:a,b,c, order:S0.0,...)");
  }

  const std::string& name() const { return name_; }
  std::int32_t layers() const { return layers_; }
  std::int32_t microbatches() const { return microbatches_; }
  /// The step's stashes and reloads, in order.
  const std::vector<StashEvent>& events() const { return events_; }
  /// Stash (layer, microbatch)'s index in a step: microbatch * layers + layer.
  std::int64_t stash_index(const StashEvent& e) const { return std::int64_t{e.microbatch} * layers_ + e.layer; }
  /// Indices a step's stashes take: layers x microbatches (a measured step's count vectors).
  std::int64_t stashes() const { return std::int64_t{layers_} * microbatches_; }
  /// The most stashes held at once.
  std::int64_t alive_stashes() const { return alive_; }
  /// The moments the held stashes peak (a stash followed by a reload or the step's end):
  /// the step overflows if the pool is short at any of them.
  std::int64_t peak_moments() const { return moments_; }
  /// Per layer: the microbatches it holds at the first moment the most stashes are held.
  const std::vector<std::int64_t>& microbatches_per_layer() const { return per_layer_; }

 private:
  Schedule(std::string name, std::int32_t layers, std::int32_t microbatches)
      : name_(std::move(name)), layers_(layers), microbatches_(microbatches) {}
  static void check_positive(const char* what, std::int64_t n) {
    if (n < 1)
      detail::throw_invalid("pagestash::sizing",
                            std::string("Schedule: ") + what + " = " + std::to_string(n) + " must be at least 1");
  }
  void forward(std::int32_t microbatch, std::int32_t first_layer, std::int32_t layers) {
    for (std::int32_t l = first_layer; l < first_layer + layers; ++l) events_.push_back({true, l, microbatch});
  }
  void backward(std::int32_t microbatch, std::int32_t first_layer, std::int32_t layers) {
    for (std::int32_t l = first_layer + layers; l-- > first_layer;) events_.push_back({false, l, microbatch});
  }
  void summarise() {
    std::vector<char> held(static_cast<std::size_t>(stashes()), 0);
    std::int64_t now = 0;
    alive_ = moments_ = 0;
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const StashEvent& e = events_[i];
      held[static_cast<std::size_t>(stash_index(e))] = e.stash;
      now += e.stash ? 1 : -1;
      if (e.stash && (i + 1 == events_.size() || !events_[i + 1].stash)) ++moments_;
      if (now > alive_) {
        alive_ = now;
        per_layer_.assign(static_cast<std::size_t>(layers_), 0);
        for (std::int64_t k = 0; k < stashes(); ++k)
          per_layer_[static_cast<std::size_t>(k % layers_)] += held[static_cast<std::size_t>(k)];
      }
    }
  }

  std::string name_;
  std::int32_t layers_ = 0, microbatches_ = 0;
  std::vector<StashEvent> events_;
  std::int64_t alive_ = 0, moments_ = 0;
  std::vector<std::int64_t> per_layer_;
};

}  // namespace sizing
PAGESTASH_NAMESPACE_END
