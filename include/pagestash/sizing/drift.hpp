#pragma once
// A drift scenario: training's routing changes over a run (an expert runs hot after some thousands of steps, the
// popularity skews or evens out, a microbatch holds more tokens), so a pool sized for the first steps overflows later.
// Each phase is a router (Routing) sized at the same overflow target; the reserve a growable pool needs
// (PoolConfig::device_reserve) is the largest phase's pool, backed in whole granules of device memory.

#include <pagestash/sizing/count_model.hpp>
#include <pagestash/sizing/layer.hpp>
#include <pagestash/sizing/pool_sizing.hpp>
#include <pagestash/sizing/schedule.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// CUDA's virtual memory granularity on current GPUs: a device pool's reserve is backed in whole granules of it
/// (pool/reserved_memory.hpp asks the driver; a host pool's, in 2 MiB chunks too).
inline constexpr std::int64_t device_granule_bytes = std::int64_t{2} << 20;

/// One routing parameter's value in each phase of a run, in the run's order; the rest is the base router's.
/// "hot:0,0.25,0.5" (Routing::hot_share), "alpha:4,1,0.5", "correlation:0,0.7", "tokens:512,768".
struct Drift {
  std::string parameter;
  std::vector<double> values;

  static const std::vector<std::string>& parameters() {
    static const std::vector<std::string> names = {"hot", "alpha", "correlation", "tokens"};
    return names;
  }

  /// Throws std::invalid_argument naming the spec and what is wrong.
  static Drift parse(const std::string& spec) {
    const auto refuse = [&](const std::string& what) {
      detail::throw_invalid("pagestash::sizing", "drift '" + spec + "': " + what +
                                                     " (PARAMETER:v1,v2,... with PARAMETER hot, alpha, correlation "
                                                     "or tokens: one value per phase)");
    };
    const std::size_t colon = spec.find(':');
    Drift d;
    d.parameter = spec.substr(0, colon);
    const auto& names = parameters();
    if (colon == std::string::npos) refuse("no ':' before the values");
    if (std::find(names.begin(), names.end(), d.parameter) == names.end())
      refuse("unknown parameter '" + d.parameter + "'");
    std::stringstream list(spec.substr(colon + 1));
    for (std::string item; std::getline(list, item, ',');) {
      std::size_t used = 0;
      double x = 0;
      try {
        x = std::stod(item, &used);
      } catch (const std::exception&) { used = 0; }
      if (item.empty() || used != item.size() || !std::isfinite(x)) refuse("'" + item + "' is not a number");
      d.values.push_back(x);
    }
    if (d.values.empty()) refuse("no phases");
    if (spec.back() == ',') refuse("an empty phase after the last ','");
    Routing probe;  // each value in its range (the base router is checked once known)
    probe.capacity = 1;
    for (std::size_t i = 0; i < d.values.size(); ++i) d.phase(probe, i);
    return d;
  }

  std::size_t phases() const { return values.size(); }

  /// Phase i's router: `base` with the parameter set. Throws std::invalid_argument for a value the router refuses.
  Routing phase(Routing base, std::size_t i) const {
    const double x = values.at(i);
    const auto refuse = [&](const std::string& what) {
      detail::throw_invalid("pagestash::sizing",
                            "drift phase " + std::to_string(i + 1) + " (" + label(i) + "): " + what);
    };
    if (parameter == "hot") base.hot_share = x;
    else if (parameter == "alpha") base.alpha = x;
    else if (parameter == "correlation") base.correlation = x;
    else if (parameter == "tokens") {
      if (!(x >= 1 && x < 2147483648.0) || x != std::floor(x)) refuse("tokens must be a whole number in [1, 2^31)");
      base.tokens = static_cast<std::int64_t>(x);
    } else refuse("unknown parameter");
    try {
      DirichletRouting check(base);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what(), who = "pagestash::sizing: ";
      refuse(what.compare(0, who.size(), who) == 0 ? what.substr(who.size()) : what);
    }
    return base;
  }

  /// "hot 0.25": the phase's parameter and value.
  std::string label(std::size_t i) const {
    std::ostringstream s;
    s << parameter << " " << values.at(i);
    return s.str();
  }
};

/// Each phase's pool at the same overflow target, and the reserve that holds them all.
struct DriftSizing {
  Drift drift;
  std::vector<PoolSizing> phases;  ///< one per phase, each sized as size_pool sizes it, with the same seed
  std::int64_t granule_bytes = device_granule_bytes;

  /// The phase whose pool is largest (the first of equals).
  std::size_t largest() const {
    std::size_t at = 0;
    for (std::size_t i = 1; i < phases.size(); ++i)
      if (phases[i].device_pages > phases[at].device_pages) at = i;
    return at;
  }
  /// PoolConfig::device_reserve: the largest phase's device pages (host spill pages are fixed in a device pool).
  std::int64_t reserve_pages() const { return phases.at(largest()).device_pages; }
  std::int64_t page_bytes() const { return phases.at(0).settings.page_bytes; }
  /// The reserve's bytes, rounded up to whole granules: what a grow to it backs.
  std::int64_t reserve_bytes() const { return backed_bytes(reserve_pages()); }
  std::int64_t backed_bytes(std::int64_t pages) const {
    return (pages * page_bytes() + granule_bytes - 1) / granule_bytes * granule_bytes;
  }
  /// Pages of one granule (0 when a page is larger than a granule).
  std::int64_t granule_pages() const { return granule_bytes / page_bytes(); }
  /// Pages a pool sized for the first phase lacks at the last (0: none).
  std::int64_t first_lacks_at_last() const {
    return std::max<std::int64_t>(0, phases.back().device_pages - phases.front().device_pages);
  }
};

/// Sizes the pool of every phase of `drift`, its routers `base` with the drift's parameter set; `base` gives the
/// experts, top_k, capacity and the rest. Throws std::invalid_argument as size_pool and Drift::phase do.
inline DriftSizing size_drift(const Layer& layer, const Schedule& schedule, const Routing& base, const Drift& drift,
                              const SizingSettings& settings = {}, std::int64_t granule_bytes = device_granule_bytes) {
  if (granule_bytes < 1)
    detail::throw_invalid("pagestash::sizing",
                          "size_drift: granule_bytes = " + std::to_string(granule_bytes) + " must be positive");
  if (drift.phases() == 0) detail::throw_invalid("pagestash::sizing", "size_drift: a drift of no phases");
  DriftSizing out;
  out.drift = drift;
  out.granule_bytes = granule_bytes;
  for (std::size_t i = 0; i < drift.phases(); ++i)
    out.phases.push_back(size_pool(layer, schedule, DirichletRouting(drift.phase(base, i)), settings));
  return out;
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
