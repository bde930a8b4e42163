#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
using Bad = ps::BufferSelection<ps::RowwiseUnquantized<ps::BF16>, ps::Handling::paged, ps::Handling::paged>;
static_assert(ps::check_stash_traits<Bad>());
