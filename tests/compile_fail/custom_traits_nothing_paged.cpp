// A hand-written traits struct (not BufferSelection) is checked where it is used.
#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
struct MyTraits {
  using layout = ps::RowwiseUnquantized<ps::BF16>;
  static constexpr ps::Handling data = ps::Handling::kept;
  static constexpr ps::Handling scales = ps::Handling::dropped;
  static constexpr ps::Handling amax = ps::Handling::dropped;
};
void use(const ps::GroupedView<MyTraits::layout>& v) { ps::validate<MyTraits>(v); }
