#pragma once
// Recipe presets: the tensors a MoE layer saves under each training recipe, as
// examples/moe_stash_demo saves them (bf16, fp16: rowwise data; mxfp8, nvfp4: columnwise
// data and scales, + amax kept for nvfp4), in a chosen placement and scale arrangement.

#include <pagestash/layouts/layouts.hpp>
#include <pagestash/sizing/layer.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

enum class Recipe { bf16, fp16, mxfp8, nvfp4 };
/// Placement tags of layouts/placement.hpp, as values.
enum class Placement { capacity_padded, packed, packed_padded };
enum class ScaleArrangement { swizzled, compact };

struct RecipeOptions {
  Placement placement = Placement::capacity_padded;  ///< the demo's
  ScaleArrangement scales = ScaleArrangement::swizzled;
  /// When positive, the layer also saves the second expert GEMM's input (hidden = ffn_hidden)
  /// in the same recipe; otherwise only the first's (hidden), as the demo does.
  std::int64_t ffn_hidden = 0;
};

inline const char* name_of(Recipe r) {
  switch (r) {
    case Recipe::bf16: return "bf16";
    case Recipe::fp16: return "fp16";
    case Recipe::mxfp8: return "mxfp8";
    case Recipe::nvfp4: return "nvfp4";
  }
  return "?";
}
inline const char* name_of(Placement p) {
  switch (p) {
    case Placement::capacity_padded: return "capacity-padded";
    case Placement::packed: return "packed";
    case Placement::packed_padded: return "packed-padded";
  }
  return "?";
}
inline const char* name_of(ScaleArrangement s) { return s == ScaleArrangement::swizzled ? "swizzled" : "compact"; }

/// Throws std::invalid_argument naming the choices.
inline Recipe parse_recipe(const std::string& s) {
  for (Recipe r : {Recipe::bf16, Recipe::fp16, Recipe::mxfp8, Recipe::nvfp4})
    if (s == name_of(r)) return r;
  detail::throw_invalid("pagestash::sizing", "unknown recipe '" + s + "' (bf16, fp16, mxfp8, nvfp4)");
}
inline Placement parse_placement(const std::string& s) {
  for (Placement p : {Placement::capacity_padded, Placement::packed, Placement::packed_padded})
    if (s == name_of(p)) return p;
  detail::throw_invalid("pagestash::sizing", "unknown placement '" + s + "' (capacity-padded, packed, packed-padded)");
}
inline ScaleArrangement parse_scales(const std::string& s) {
  for (ScaleArrangement a : {ScaleArrangement::swizzled, ScaleArrangement::compact})
    if (s == name_of(a)) return a;
  detail::throw_invalid("pagestash::sizing", "unknown scale arrangement '" + s + "' (swizzled, compact)");
}

namespace detail {

template <class Layout>
SavedTensor recipe_tensor(std::int64_t hidden, std::int32_t experts, const std::string& name) {
  return SavedTensor::of<StashTraits<Layout>>(make_view<Layout>().with_hidden(hidden).with_groups(experts), name);
}

template <class Format, class PlacementTag>
SavedTensor quantized_tensor(ScaleArrangement scales, std::int64_t hidden, std::int32_t experts, const std::string& name) {
  if (scales == ScaleArrangement::swizzled)
    return recipe_tensor<ColumnwiseQuantized<Format, PlacementTag, SwizzledScales>>(hidden, experts, name);
  return recipe_tensor<ColumnwiseQuantized<Format, PlacementTag, CompactScales>>(hidden, experts, name);
}

template <class PlacementTag>
SavedTensor tensor_in(Recipe recipe, ScaleArrangement scales, std::int64_t hidden, std::int32_t experts,
                      const std::string& name) {
  // Unquantized rows have no scales to pad: packed-padded is packed for them.
  using RowsPlacement = std::conditional_t<std::is_same_v<PlacementTag, PackedPadded>, Packed, PlacementTag>;
  switch (recipe) {
    case Recipe::bf16: return recipe_tensor<RowwiseUnquantized<BF16, RowsPlacement>>(hidden, experts, name);
    case Recipe::fp16: return recipe_tensor<RowwiseUnquantized<FP16, RowsPlacement>>(hidden, experts, name);
    case Recipe::mxfp8: return quantized_tensor<MXFP8_E4M3, PlacementTag>(scales, hidden, experts, name);
    case Recipe::nvfp4: return quantized_tensor<NVFP4, PlacementTag>(scales, hidden, experts, name);
  }
  throw_invalid("pagestash::sizing", "unknown recipe");
}

inline SavedTensor recipe_tensor_of(Recipe recipe, const RecipeOptions& o, std::int64_t hidden, std::int32_t experts,
                                    const std::string& role) {
  const std::string name = std::string(name_of(recipe)) + " " + role;
  switch (o.placement) {
    case Placement::capacity_padded: return tensor_in<CapacityPadded>(recipe, o.scales, hidden, experts, name);
    case Placement::packed: return tensor_in<Packed>(recipe, o.scales, hidden, experts, name);
    case Placement::packed_padded: return tensor_in<PackedPadded>(recipe, o.scales, hidden, experts, name);
  }
  throw_invalid("pagestash::sizing", "unknown placement");
}

}  // namespace detail

/// The tensors a layer of `experts` experts saves under `recipe` (their capacity is set
/// by Layer). Throws std::invalid_argument for a hidden size the recipe cannot hold.
inline std::vector<SavedTensor> recipe_tensors(Recipe recipe, std::int64_t hidden, std::int32_t experts,
                                               const RecipeOptions& options = {}) {
  std::vector<SavedTensor> tensors{detail::recipe_tensor_of(recipe, options, hidden, experts, "fc1 input")};
  if (options.ffn_hidden > 0)
    tensors.push_back(detail::recipe_tensor_of(recipe, options, options.ffn_hidden, experts, "fc2 input"));
  return tensors;
}

/// The layer of recipe_tensors with its capacity from a capacity factor (capacity_for,
/// rounded to what every tensor holds).
inline Layer recipe_layer(Recipe recipe, std::int64_t hidden, std::int32_t experts, std::int64_t tokens,
                          std::int32_t top_k, double capacity_factor, const RecipeOptions& options = {}) {
  const std::vector<SavedTensor> tensors = recipe_tensors(recipe, hidden, experts, options);
  return Layer(tensors, capacity_for(tokens, top_k, experts, capacity_factor, Layer::capacity_alignment(tensors)));
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
