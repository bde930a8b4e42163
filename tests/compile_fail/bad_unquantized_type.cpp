#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
ps::GroupedView<ps::RowwiseUnquantized<double>> view;
