#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
using Bad = ps::BufferSelection<ps::ColumnwiseQuantized<ps::MXFP8_E4M3>, ps::Handling::paged, ps::Handling::paged,
                                ps::Handling::kept>;
static_assert(ps::check_stash_traits<Bad>());
