#pragma once
// SavedTensor: one tensor a layer saves for backward, type-erased (any StashTraits and
// GroupedView shape), measured for a count vector by the library's own work plan: the
// pages a stash of those counts takes are exactly the pages the executors take.

#include <pagestash/detail/errors.hpp>
#include <pagestash/layouts/view.hpp>
#include <pagestash/pool/pool_config.hpp>
#include <pagestash/stash/work.hpp>

#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

PAGESTASH_NAMESPACE_BEGIN
namespace sizing {

/// What a stash of one count vector holds, in bytes and pages (sums over tensors and steps).
struct TensorBytes {
  std::int64_t pages = 0;
  std::int64_t stream_bytes = 0;  ///< what the pages hold: live bytes, segments padded to 16
  std::int64_t live_bytes = 0;    ///< the live runs
  TensorBytes& operator+=(const TensorBytes& o) {
    pages += o.pages;
    stream_bytes += o.stream_bytes;
    live_bytes += o.live_bytes;
    return *this;
  }
};

namespace detail {

/// The work plan of a stash of `counts`: the only place the sizer asks the library for
/// its geometry, so that a change of the stash's plan changes the sizer with it.
template <class Traits>
WorkTotals planned_stash(const GroupedView<typename Traits::layout>& shape, const cuda::std::int32_t* counts) {
  return pagestash::plan_work<Traits>(shape, counts, false, nullptr);
}

/// The bytes and pages of a stash of `counts` in pages of `page_bytes`.
template <class Traits>
TensorBytes stash_bytes(const GroupedView<typename Traits::layout>& shape, const cuda::std::int32_t* counts,
                        std::int64_t page_bytes) {
  const WorkTotals work = planned_stash<Traits>(shape, counts);
  return TensorBytes{pages_for(work.stream_bytes, page_bytes), work.stream_bytes, work.live_bytes};
}

using pagestash::detail::throw_invalid;  // sizing::detail hides pagestash::detail

}  // namespace detail

/// One saved tensor of a layer: a layout and StashTraits with its shape (groups = experts,
/// hidden, and the capacity: tokens per expert), behind a value type, so that one layer
/// may save tensors of different layouts.
class SavedTensor {
 public:
  /// A tensor of `shape`'s shape (max_tokens, hidden, groups; pointers are not read), paged
  /// as Traits says. Throws std::invalid_argument for a shape the layout cannot hold.
  template <class Traits>
  static SavedTensor of(const GroupedView<typename Traits::layout>& shape, std::string name = {}) {
    static_assert(check_stash_traits<Traits>());
    validate_shape(shape);
    if (name.empty()) name = Traits::layout::name;
    return SavedTensor(std::make_shared<const Model<Traits>>(shape, std::move(name)));
  }

  const std::string& name() const { return model_->name; }
  cuda::std::int32_t groups() const { return model_->groups(); }
  std::int64_t hidden() const { return model_->hidden(); }
  /// Tokens one group (expert) may hold: capacity-padded, max_tokens; packed, max_tokens
  /// over the groups (the packed buffer holds `groups` experts at capacity).
  std::int64_t capacity() const { return model_->capacity(); }
  /// Every count must be a multiple of this (packed quantized layouts: 128).
  std::int64_t count_alignment() const { return model_->count_alignment(); }
  /// The capacity must be a multiple of this for the layout to hold it.
  std::int64_t capacity_alignment() const { return model_->capacity_alignment(); }
  /// Bytes of the buffers the tensor saves (paged or kept) at their full shape: what it
  /// holds until its backward without stashing.
  std::int64_t full_bytes() const { return model_->full_bytes(); }

  /// The same layout with room for `capacity` tokens per group (a multiple of
  /// capacity_alignment()).
  SavedTensor with_capacity(std::int64_t capacity) const { return SavedTensor(model_->with_capacity(capacity)); }

  /// The bytes and pages a stash of `counts` (one per group, each a count the layout holds)
  /// takes in pages of `page_bytes`. Throws std::invalid_argument for counts it cannot hold.
  TensorBytes measure(const std::vector<std::int32_t>& counts, std::int64_t page_bytes) const {
    if (counts.size() != static_cast<std::size_t>(groups()))
      detail::throw_invalid("pagestash::sizing", name() + ": " + std::to_string(counts.size()) + " counts for " +
                                                     std::to_string(groups()) + " groups");
    if (page_bytes < 1)
      detail::throw_invalid("pagestash::sizing", "page_bytes = " + std::to_string(page_bytes) + " must be positive");
    return model_->measure(counts.data(), page_bytes);
  }
  std::int64_t pages(const std::vector<std::int32_t>& counts, std::int64_t page_bytes) const {
    return measure(counts, page_bytes).pages;
  }

 private:
  struct Interface {
    explicit Interface(std::string n) : name(std::move(n)) {}
    virtual ~Interface() = default;
    virtual cuda::std::int32_t groups() const = 0;
    virtual std::int64_t hidden() const = 0;
    virtual std::int64_t capacity() const = 0;
    virtual std::int64_t count_alignment() const = 0;
    virtual std::int64_t capacity_alignment() const = 0;
    virtual std::int64_t full_bytes() const = 0;
    virtual std::shared_ptr<const Interface> with_capacity(std::int64_t capacity) const = 0;
    virtual TensorBytes measure(const cuda::std::int32_t* counts, std::int64_t page_bytes) const = 0;
    std::string name;
  };

  template <class Traits>
  struct Model final : Interface {
    using Layout = typename Traits::layout;
    static constexpr bool packed = Layout::placement::packed;
    Model(const GroupedView<Layout>& s, std::string n) : Interface(std::move(n)), shape(s) {}
    cuda::std::int32_t groups() const override { return shape.groups; }
    std::int64_t hidden() const override { return shape.hidden; }
    std::int64_t capacity() const override { return packed ? shape.max_tokens / shape.groups : shape.max_tokens; }
    std::int64_t count_alignment() const override { return shape.count_alignment(); }
    std::int64_t capacity_alignment() const override {
      // Packed: groups x capacity must be a multiple of the granule, each count of the alignment.
      const std::int64_t granule = shape.granule();
      return packed ? std::lcm(count_alignment(), granule / std::gcd(granule, std::int64_t{shape.groups})) : granule;
    }
    std::int64_t full_bytes() const override {
      std::int64_t bytes = 0;
      for_each_role([&](BufferRole role) {
        if (handling_of<Traits>(role) != Handling::dropped) bytes += shape.buffer_bytes(role);
      });
      return bytes;
    }
    std::shared_ptr<const Interface> with_capacity(std::int64_t c) const override {
      if (c < 1 || c % capacity_alignment() != 0)
        detail::throw_invalid("pagestash::sizing", name + ": capacity " + std::to_string(c) +
                                                       " is not a positive multiple of " +
                                                       std::to_string(capacity_alignment()));
      const auto s = shape.with_max_tokens(packed ? c * shape.groups : c);
      validate_shape(s);
      return std::make_shared<const Model>(s, name);
    }
    TensorBytes measure(const cuda::std::int32_t* counts, std::int64_t page_bytes) const override {
      const cuda::std::int32_t bad = check_counts(shape, counts).first_bad_group;
      if (bad >= 0)
        detail::throw_invalid("pagestash::sizing", name + ": count " + std::to_string(counts[bad]) + " of group " +
                                                       std::to_string(bad) + " does not fit (capacity " +
                                                       std::to_string(capacity()) + ", alignment " +
                                                       std::to_string(count_alignment()) + ")");
      return detail::stash_bytes<Traits>(shape, counts, page_bytes);
    }
    GroupedView<Layout> shape;
  };

  explicit SavedTensor(std::shared_ptr<const Interface> m) : model_(std::move(m)) {}
  std::shared_ptr<const Interface> model_;
};

}  // namespace sizing
PAGESTASH_NAMESPACE_END
