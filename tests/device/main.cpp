// doctest main for the GPU tests. Without a CUDA device the binary prints why and exits
// with 77, which ctest reports as "Skipped". Listing test cases works without a device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    listing |= std::strstr(argv[i], "list-test") != nullptr || std::strcmp(argv[i], "-ltc") == 0;
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (!listing && (status != cudaSuccess || devices == 0)) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d devices); GPU tests run on a machine with one\n",
                cudaGetErrorName(status), devices);
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
