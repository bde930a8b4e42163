#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
using Bad = ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4>, ps::Handling::paged, ps::Handling::paged,
                                ps::Handling::paged>;
static_assert(ps::check_stash_traits<Bad>());
