#pragma once
// Model shapes: one rank's MoE layer of a known model, by name. The one table the commands'
// `--shape` reads (examples/pagestash_size, examples/moe_stash_demo) and their usage lists.

#include <pagestash/sizing/saved_tensor.hpp>

#include <cstdint>
#include <string>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// One rank's MoE layer: the sizes a Layer and a Routing take.
struct ModelShape {
  const char* name;
  std::int64_t hidden;
  std::int32_t experts;  ///< experts on the rank
  std::int32_t top_k;
  std::int64_t tokens;  ///< tokens of one microbatch on the rank
};

/// Fine-grained layers, a mean of 128 tokens per expert (tokens * top_k / experts).
inline constexpr ModelShape model_shapes[] = {
    {"deepseek-v3", 7168, 32, 8, 512},  // 256 experts at 8-way expert parallelism
    {"qwen3-moe", 2048, 128, 8, 2048},
};

/// The names of model_shapes, `separator` between them ("deepseek-v3|qwen3-moe" for a usage line).
inline std::string model_shape_names(const std::string& separator = ", ") {
  std::string names;
  for (const ModelShape& s : model_shapes) names += (names.empty() ? "" : separator) + s.name;
  return names;
}

/// The model shape named `name`; throws std::invalid_argument listing the names.
inline const ModelShape& model_shape(const std::string& name) {
  for (const ModelShape& s : model_shapes)
    if (name == s.name) return s;
  detail::throw_invalid("pagestash::sizing", "unknown model shape '" + name + "' (" + model_shape_names() + ")");
}

}  // namespace sizing
PAGESTASH_NAMESPACE_END
