#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
using Bad = ps::BufferSelection<ps::ColumnwiseQuantized<ps::NVFP4>, ps::Handling::dropped, ps::Handling::kept,
                                ps::Handling::kept>;
static_assert(ps::check_stash_traits<Bad>());
