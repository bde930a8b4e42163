#include <pagestash/layouts/layouts.hpp>
namespace ps = pagestash;
struct MyLayout {};
constexpr auto data = ps::StashTraits<MyLayout>::data;
