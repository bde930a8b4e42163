// CUDA consumer: the full umbrella header with nvcc; the kernel is compiled, and run only
// when a device is present.
#include <pagestash/pagestash.cuh>

#include <cstdio>

__global__ void encode(float x, unsigned char* out) { *out = pagestash::E4M3::from_float(x).bits; }

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("pagestash %d CUDA consumer: compiled; no device, kernel not run\n", PAGESTASH_VERSION);
    return pagestash::E4M3::from_float(300.0f).bits == 0x79 ? 0 : 1;
  }
  unsigned char* d = nullptr;
  unsigned char h = 0;
  PAGESTASH_CUDA_TRY(cudaMalloc(&d, 1));
  encode<<<1, 1>>>(300.0f, d);
  PAGESTASH_CUDA_CHECK_LAUNCH();
  PAGESTASH_CUDA_TRY(cudaMemcpy(&h, d, 1, cudaMemcpyDeviceToHost));
  PAGESTASH_CUDA_TRY(cudaFree(d));
  std::printf("pagestash %d CUDA consumer: device E4M3(300) = 0x%02x\n", PAGESTASH_VERSION, h);
  return h == 0x79 ? 0 : 1;
}
