// The compressed stashes' kernels compiled with --use_fast_math (tests/instantiations/
// fast_math_kernels.cu: a header-only library is compiled with its user's flags), run on the
// GPU against the reference quantizer: the reloads are dequantize(quantize(x)) bit for bit,
// as with the library's own flags (check_kernels.py --fast-math compares their instructions
// without a GPU). Their own executable: the kernels' names are those of the instantiations.

#include <pagestash/pagestash.hpp>

#include "../common/device_backend.hpp"
#include "../common/executor_suite.hpp"
#include "../common/layout_list.hpp"

#include <doctest/doctest.h>

using namespace pagestash_test;

TEST_CASE("compressed kernels compiled with --use_fast_math: random sequences reload the reference's round trip") {
  std::uint32_t seed = 7100;
  suite::sequences<traits::Bf16Mx4, DeviceBackend>(seed, 30);
  suite::sequences<traits::Bf16Mx5, DeviceBackend>(seed, 30);
  suite::sequences<traits::Fp16CapB128, DeviceBackend>(seed, 30);
}
