#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
ps::GroupedView<ps::ColumnwiseQuantized<ps::E4M3>> view;
