// Host-only consumer: the host umbrella header with a plain C++ compiler.
#include <pagestash/pagestash.hpp>

#include <cstdio>

int main() {
  const auto x = pagestash::E4M3::from_float(300.0f);
  std::printf("pagestash %d host consumer: E4M3(300) = %g\n", PAGESTASH_VERSION, x.to_float());
  return x.to_float() == 288.0f ? 0 : 1;
}
