#pragma once
// The pool sizer (pagestash/sizing.hpp) over the extension's recipes. The saved tensors are
// built through with_recipe, the dispatch the ops use, so that the sizer's pages for a
// count vector are exactly the pages the ops' stashes of that vector take. No PyTorch here:
// ops.cpp binds it.

#include "recipes.hpp"

#include <pagestash/sizing.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pagestash_torch {
namespace sizing = ps::sizing;

/// Refuses a request as the sizer refuses its arguments (std::invalid_argument, ValueError in Python).
[[noreturn]] inline void refuse_request(const std::string& what) {
  throw std::invalid_argument("pagestash::sizing: " + what);
}

/// What size_pool is asked: the tensors one MoE layer saves, the schedule, and the router
/// (Dirichlet) or measured count vectors.
struct SizingRequest {
  std::vector<std::string> recipes;
  std::vector<Shape> shapes;              ///< one per recipe
  std::vector<std::string> compressions;  ///< one per recipe ("" or "lossless": none), or none at all: lossless
  std::string schedule = "lifo";
  std::int32_t layers = sizing::default_layers, microbatches = sizing::default_microbatches;
  // The router, when `counts` is empty.
  std::int64_t tokens = 0;
  std::int32_t top_k = 1;
  double alpha = 1.0;
  std::string sampler = "multinomial";
  double correlation = 0;
  std::int64_t capacity = 0;  ///< tokens an expert keeps; 0: what the layer's tensors hold
  // Measured counts, the first given: a file (MeasuredCounts::read), whole steps
  // ([step][stash][expert]), or independent vectors.
  std::string counts_file;
  std::vector<std::vector<std::vector<std::int32_t>>> count_steps;
  std::vector<std::vector<std::int32_t>> counts;
  bool cap_counts = false;  ///< cap counts above the capacity (else refused)
  sizing::SizingSettings settings;
  std::int32_t curve_points = 24;  ///< points of the overflow curve reported
};

/// fn(name, member) for every field of the request, by the keyword names pagestash.size_pool
/// sends (the settings' by their table's): the binding fills the request from this table and
/// gives Python its defaults, so a field added here is one Python may send.
template <class Request, class Fn>
void for_each_field(Request& r, Fn&& fn) {
  fn("recipes", r.recipes);
  fn("shapes", r.shapes);
  fn("compressions", r.compressions);
  fn("schedule", r.schedule);
  fn("layers", r.layers);
  fn("microbatches", r.microbatches);
  fn("tokens", r.tokens);
  fn("top_k", r.top_k);
  fn("alpha", r.alpha);
  fn("sampler", r.sampler);
  fn("correlation", r.correlation);
  fn("capacity", r.capacity);
  fn("counts_file", r.counts_file);
  fn("count_steps", r.count_steps);
  fn("counts", r.counts);
  fn("cap_counts", r.cap_counts);
  // The settings by their table (PAGESTASH_SIZING_SETTINGS): the command's flags are the same fields.
  sizing::for_each_field(r.settings, [&](const char* name, auto& member, const char*) { fn(name, member); });
  fn("curve_points", r.curve_points);
}

/// A saved tensor of one of the extension's recipes, of shape `s`, paged with `compression` (the traits a record of
/// them instantiates, so that its pages are the compressed stream's).
inline sizing::SavedTensor saved_tensor(const std::string& recipe, const std::string& compression, const Shape& s) {
  return with_recipe(recipe, compression, [&](auto tag, auto c) {
    using Layout = typename decltype(tag)::layout;
    using C = decltype(c);
    std::string name = recipe;
    if constexpr (C::compressed) name += std::string(" (") + C::name + ")";
    const std::string refusal = ps::compression_refusal<C>(s.hidden);
    if (!refusal.empty())
      refuse_request("size_pool: " + name + ": hidden = " + std::to_string(s.hidden) + " " + refusal);
    return sizing::SavedTensor::of<traits_of<decltype(tag), C>>(view_of<Layout>(s), name);
  });
}

/// The layer of the request's tensors. They must hold the same tokens per expert: the
/// sizer measures them at one capacity, and a layer whose shapes it changed would not
/// be the one the ops stash.
inline sizing::Layer layer_of(const SizingRequest& r) {
  if (r.recipes.empty()) refuse_request("size_pool: no saved tensors");
  if (r.recipes.size() != r.shapes.size())
    refuse_request("size_pool: " + std::to_string(r.recipes.size()) + " recipes and " +
                   std::to_string(r.shapes.size()) + " shapes: give one shape per recipe");
  if (!r.compressions.empty() && r.compressions.size() != r.recipes.size())
    refuse_request("size_pool: " + std::to_string(r.recipes.size()) + " recipes and " +
                   std::to_string(r.compressions.size()) + " compressions: give one per recipe, or none");
  std::vector<sizing::SavedTensor> tensors;
  for (std::size_t i = 0; i < r.recipes.size(); ++i) {
    const Shape& s = r.shapes[i];
    if (s.groups < 1)
      refuse_request("size_pool: saved[" + std::to_string(i) +
                     "]: Shape.groups (experts) = " + std::to_string(s.groups) + " must be at least 1");
    const std::string compression = r.compressions.empty() ? ps::Lossless::name : r.compressions[i];
    sizing::SavedTensor t = saved_tensor(r.recipes[i], compression, s);
    const std::string what = r.recipes[i] + " [" + std::to_string(s.groups) + ", " + std::to_string(s.tokens) + ", " +
                             std::to_string(s.hidden) + "]";
    if (recipe_info(kind_of(r.recipes[i], ps::Lossless::name), s).packed && s.tokens != t.capacity() * s.groups)
      refuse_request("size_pool: " + what + ": a packed tensor's tokens must be groups x capacity (" +
                     "a multiple of " + std::to_string(s.groups) + ")");
    if (!tensors.empty() && t.capacity() != tensors.front().capacity())
      refuse_request("size_pool: " + what + " holds " + std::to_string(t.capacity()) +
                     " tokens per expert, the first tensor " + std::to_string(tensors.front().capacity()) +
                     ": a layer's tensors share one capacity");
    tensors.push_back(std::move(t));
  }
  return sizing::Layer(tensors, tensors.front().capacity());
}

inline sizing::RoutingSampler sampler_of(const std::string& name) {
  if (name == "multinomial") return sizing::RoutingSampler::multinomial;
  if (name == "per_token") return sizing::RoutingSampler::per_token;
  refuse_request("size_pool: unknown sampler '" + name + "' (multinomial, per_token)");
}

/// The count model: the measured vectors when there are any, else the Dirichlet router.
inline std::unique_ptr<sizing::CountModel> count_model_of(const SizingRequest& r, const sizing::Layer& layer) {
  if (r.capacity < 0) refuse_request("size_pool: capacity = " + std::to_string(r.capacity) + " is negative");
  const std::int64_t capacity = r.capacity > 0 ? r.capacity : layer.capacity();
  const sizing::Excess excess = r.cap_counts ? sizing::Excess::cap : sizing::Excess::refuse;
  const bool measured = !r.counts_file.empty() || !r.count_steps.empty() || !r.counts.empty();
  if (measured && r.correlation > 0)
    refuse_request(
        "size_pool: correlation models the Dirichlet router; measured counts keep their own "
        "(give them as whole steps)");
  if (!r.counts_file.empty())
    return std::make_unique<sizing::MeasuredCounts>(
        sizing::MeasuredCounts::read(r.counts_file, layer.experts(), capacity, excess));
  if (!r.count_steps.empty())
    return std::make_unique<sizing::MeasuredCounts>(
        sizing::MeasuredCounts::whole_steps(r.count_steps, capacity, "counts", excess));
  if (!r.counts.empty()) return std::make_unique<sizing::MeasuredCounts>(r.counts, capacity, "counts", excess);
  if (r.tokens < 1)
    refuse_request("size_pool: tokens = " + std::to_string(r.tokens) +
                   ": give the router's tokens per microbatch (and top_k, alpha), or measured counts");
  sizing::Routing routing;
  routing.experts = layer.experts();
  routing.top_k = r.top_k;
  routing.tokens = r.tokens;
  routing.alpha = r.alpha;
  routing.capacity = capacity;
  routing.sampler = sampler_of(r.sampler);
  routing.correlation = r.correlation;
  return std::make_unique<sizing::DirichletRouting>(routing);
}

/// Samples the steps and sizes the pool. Throws std::invalid_argument for bad input.
inline sizing::PoolSizing sizing_of(const SizingRequest& r) {
  const sizing::Layer layer = layer_of(r);
  const std::unique_ptr<sizing::CountModel> counts = count_model_of(r, layer);
  const sizing::Schedule schedule = sizing::Schedule::parse(r.schedule, r.layers, r.microbatches);
  if (r.curve_points < 2)
    refuse_request("size_pool: curve_points = " + std::to_string(r.curve_points) + " must be at least 2");
  return sizing::size_pool(layer, schedule, *counts, r.settings);
}

}  // namespace pagestash_torch
