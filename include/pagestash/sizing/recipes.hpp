#pragma once
// What a MoE layer saves under a recipe (<pagestash/layouts/recipes.hpp>, chosen by name,
// or by family, placement and scales with pagestash::recipe_name): the first expert GEMM's
// input, and the second's when ffn_hidden is given, as examples/moe_stash_demo saves them; lossless or compressed
// (compression_names(): a BF16 or FP16 recipe's data paged as FP8 codes and block scales).

#include <pagestash/layouts/recipes.hpp>
#include <pagestash/sizing/layer.hpp>

#include <cstdint>
#include <string>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// The tensors a layer of `experts` experts saves under `recipe` (their capacity is set by
/// Layer): the fc1 input (hidden), and with ffn_hidden > 0 the fc2 input (ffn_hidden), paged under `compression`
/// ("lossless" or a format's name: CompressionTraits). Throws std::invalid_argument for an unknown recipe or
/// compression, a recipe the compression cannot page, or a hidden size the recipe cannot hold.
inline std::vector<SavedTensor> recipe_tensors(const std::string& recipe, std::int64_t hidden, std::int32_t experts,
                                               std::int64_t ffn_hidden = 0,
                                               const std::string& compression = Lossless::name) {
  return with_recipe(recipe, compression, [&](auto r, auto c) {
    using R = decltype(r);
    using Traits = CompressionTraits<typename R::layout, decltype(c)>;
    const std::string prefix = decltype(c)::compressed ? recipe + " (" + c.name + ")" : recipe;
    const auto tensor = [&](std::int64_t width, const char* role) {
      const auto view = make_view<typename R::layout>().with_hidden(width).with_groups(experts);
      return SavedTensor::of<Traits>(view, prefix + " " + role);
    };
    std::vector<SavedTensor> tensors{tensor(hidden, "fc1 input")};
    if (ffn_hidden > 0) tensors.push_back(tensor(ffn_hidden, "fc2 input"));
    return tensors;
  });
}

/// The layer of recipe_tensors with its capacity from a capacity factor (capacity_for,
/// rounded to what every tensor holds).
inline Layer recipe_layer(const std::string& recipe, std::int64_t hidden, std::int32_t experts, std::int64_t tokens,
                          std::int32_t top_k, double capacity_factor, std::int64_t ffn_hidden = 0,
                          const std::string& compression = Lossless::name) {
  const std::vector<SavedTensor> tensors = recipe_tensors(recipe, hidden, experts, ffn_hidden, compression);
  return Layer(tensors, capacity_for(tokens, top_k, experts, capacity_factor, Layer::capacity_alignment(tensors)));
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
