// Must compile: the same constructs as the failing cases, used correctly.
#include <pagestash/layouts/layouts.hpp>

namespace ps = pagestash;
using L = ps::ColumnwiseQuantized<ps::NVFP4>;
static_assert(ps::check_stash_traits<ps::StashTraits<L>>());
static_assert(
    ps::check_stash_traits<ps::BufferSelection<L, ps::Handling::paged, ps::Handling::dropped, ps::Handling::kept>>());
void validate_default(const ps::GroupedView<L>& v) { ps::validate<ps::StashTraits<L>>(v); }
