#pragma once
// The recipes: the layouts offered by name, one line each. Python's ops, the sizer, the
// bench and the tests read this list; a recipe's name and its parts' names come from its
// layout's tags (Recipe), so adding a recipe is adding its line here.

#include <pagestash/layouts/layouts.hpp>

#include <stdexcept>
#include <string>
#include <vector>

/// Every recipe, as X((layout)).
#define PAGESTASH_FOR_EACH_RECIPE(X)                                                                               \
  X((pagestash::Plain<cuda::std::uint8_t>))                                                                        \
  X((pagestash::RowwiseUnquantized<pagestash::BF16, pagestash::Packed>))                                           \
  X((pagestash::RowwiseUnquantized<pagestash::BF16, pagestash::CapacityPadded>))                                   \
  X((pagestash::RowwiseUnquantized<pagestash::FP16, pagestash::Packed>))                                           \
  X((pagestash::RowwiseUnquantized<pagestash::FP16, pagestash::CapacityPadded>))                                   \
  X((pagestash::RowwiseUnquantized<float, pagestash::Packed>))                                                     \
  X((pagestash::RowwiseUnquantized<float, pagestash::CapacityPadded>))                                             \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::Packed, pagestash::CompactScales>))          \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::Packed, pagestash::SwizzledScales>))         \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::PackedPadded, pagestash::CompactScales>))    \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::PackedPadded, pagestash::SwizzledScales>))   \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::CapacityPadded, pagestash::CompactScales>))  \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E4M3, pagestash::CapacityPadded, pagestash::SwizzledScales>)) \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::Packed, pagestash::CompactScales>))          \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::Packed, pagestash::SwizzledScales>))         \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::PackedPadded, pagestash::CompactScales>))    \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::PackedPadded, pagestash::SwizzledScales>))   \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::CapacityPadded, pagestash::CompactScales>))  \
  X((pagestash::ColumnwiseQuantized<pagestash::MXFP8_E5M2, pagestash::CapacityPadded, pagestash::SwizzledScales>)) \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::Packed, pagestash::CompactScales>))               \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::Packed, pagestash::SwizzledScales>))              \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::PackedPadded, pagestash::CompactScales>))         \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::PackedPadded, pagestash::SwizzledScales>))        \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::CapacityPadded, pagestash::CompactScales>))       \
  X((pagestash::ColumnwiseQuantized<pagestash::NVFP4, pagestash::CapacityPadded, pagestash::SwizzledScales>))

/// The layout type of an entry, (T) -> T.
#define PAGESTASH_LAYOUT(L) typename ::pagestash::detail::Unparen<void L>::type

PAGESTASH_NAMESPACE_BEGIN
namespace detail {
template <class T>
struct Unparen;
template <class T>
struct Unparen<void(T)> {
  using type = T;
};

template <class Layout>
constexpr const char* family_name() {  // the number format
  if constexpr (cuda::std::is_same_v<Layout, Plain<typename Layout::data_type>>) return "plain";
  else if constexpr (cuda::std::is_void_v<typename Layout::scale_type>)
    return element_name<typename Layout::data_type>();
  else return Layout::format::name;
}
template <class Layout>
constexpr const char* scales_name() {
  if constexpr (cuda::std::is_void_v<typename Layout::scale_type>) return "";
  else return Layout::scale_arrangement::name;
}
}  // namespace detail

/// A recipe: its layout, the default traits (data and scales paged, amax kept), and the
/// names of its parts, from the layout's tags ("" where it has none).
template <class Layout>
struct Recipe {
  using layout = Layout;
  using traits = StashTraits<Layout>;
  static constexpr bool plain = cuda::std::is_same_v<Layout, Plain<typename Layout::data_type>>;
  static constexpr const char* family = detail::family_name<Layout>();
  static constexpr const char* placement = plain ? "" : Layout::placement::name;
  static constexpr const char* scales = detail::scales_name<Layout>();
  /// family[/placement[/scales]], e.g. "plain", "bf16/capacity", "nvfp4/packed/swizzled".
  static std::string name() {
    std::string n = family;
    for (const char* part : {placement, scales})
      if (*part != '\0') n = n + "/" + part;
    return n;
  }
};

/// Calls f(Recipe<Layout>{}) for every recipe, in the list's order.
template <class F>
void for_each_recipe(F&& f) {
#define PAGESTASH_RECIPE_CALL(L) f(Recipe<PAGESTASH_LAYOUT(L)>{});
  PAGESTASH_FOR_EACH_RECIPE(PAGESTASH_RECIPE_CALL)
#undef PAGESTASH_RECIPE_CALL
}

inline std::vector<std::string> recipe_names() {
  std::vector<std::string> names;
  for_each_recipe([&](auto r) { names.push_back(r.name()); });
  return names;
}

/// The recipe of `family`, `placement` and `scales`, each ignored where the recipe has none
/// ("bf16", "capacity", any: "bf16/capacity"); a recipe's own name is itself. Throws
/// std::invalid_argument listing the names for anything else.
inline std::string recipe_name(const std::string& family, const std::string& placement = "capacity",
                               const std::string& scales = "swizzled") {
  std::string found, known;
  for_each_recipe([&](auto r) {
    const std::string name = r.name();
    known += (known.empty() ? "" : ", ") + name;
    const auto fits = [](const char* part, const std::string& want) { return *part == '\0' || want == part; };
    if (name == family || (family == r.family && fits(r.placement, placement) && fits(r.scales, scales))) found = name;
  });
  if (found.empty())
    throw std::invalid_argument("pagestash: unknown recipe '" + family + "' (placement '" + placement + "', scales '" +
                                scales + "'; known: " + known + ")");
  return found;
}

/// Calls f(Recipe<Layout>{}) for the recipe called `name`; throws std::invalid_argument
/// listing the names for any other.
template <class F>
decltype(auto) with_recipe(const std::string& name, F&& f) {
#define PAGESTASH_RECIPE_MATCH(L) \
  if (name == Recipe<PAGESTASH_LAYOUT(L)>::name()) return f(Recipe<PAGESTASH_LAYOUT(L)>{});
  PAGESTASH_FOR_EACH_RECIPE(PAGESTASH_RECIPE_MATCH)
#undef PAGESTASH_RECIPE_MATCH
  std::string known;
  for (const std::string& n : recipe_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("pagestash: unknown recipe '" + name + "' (known: " + known + ")");
}

/// The compressions by name: "lossless", then each format's name ("mxfp8", "mxfp8_e5m2", "fp8_1x128").
inline std::vector<std::string> compression_names() {
  std::vector<std::string> names{Lossless::name};
#define PAGESTASH_COMPRESSION_NAME(F) names.emplace_back(F::name);
  PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_COMPRESSION_NAME)
#undef PAGESTASH_COMPRESSION_NAME
  return names;
}

/// The traits of a recipe's layout under a compression: the default traits when lossless, else its data paged
/// compressed (CompressedTraits).
template <class Layout, class Compression>
using CompressionTraits = cuda::std::conditional_t<
    Compression::compressed,
    BufferSelection<Layout, Handling::paged, Handling::dropped, Handling::dropped, Compression>, StashTraits<Layout>>;

/// f(Recipe<Layout>{}, Compression{}) for the recipe and the compression named (`compression` "" or "lossless":
/// Lossless); throws std::invalid_argument naming the choices when either is unknown, or when the recipe cannot be
/// compressed (a compressed stash pages BF16 or FP16 Plain or RowwiseUnquantized data only). The traits of the pair are
/// CompressionTraits<Layout, Compression>.
template <class F>
decltype(auto) with_recipe(const std::string& name, const std::string& compression, F&& f) {
  return with_recipe(name, [&](auto recipe) -> decltype(f(recipe, Lossless{})) {
    using Layout = typename decltype(recipe)::layout;
    if (compression.empty() || compression == Lossless::name) return f(recipe, Lossless{});
    if constexpr (compressible<Layout>) {
#define PAGESTASH_COMPRESSION_MATCH(F) \
  if (compression == F::name) return f(recipe, Compressed<F>{});
      PAGESTASH_FOR_EACH_COMPRESSION(PAGESTASH_COMPRESSION_MATCH)
#undef PAGESTASH_COMPRESSION_MATCH
    }
    std::string known;
    for (const std::string& n : compression_names()) known += (known.empty() ? "" : ", ") + n;
    for (const std::string& n : compression_names())
      if (n == compression)
        throw std::invalid_argument("pagestash: compression '" + compression + "' needs a bf16 or fp16 recipe, not '" +
                                    name + "'");
    throw std::invalid_argument("pagestash: unknown compression '" + compression + "' (known: " + known + ")");
  });
}

PAGESTASH_NAMESPACE_END
