#pragma once
// Portability macros shared by every header. Host-only code (g++) and CUDA code (nvcc) see the same functions:
// PAGESTASH_HOST_DEVICE expands to __host__ __device__ only under a CUDA compiler.

#include <pagestash/version.hpp>

#if defined(__CUDACC__)
#  define PAGESTASH_HOST_DEVICE __host__ __device__
#else
#  define PAGESTASH_HOST_DEVICE
#endif

// Before a host+device template that calls a callable it is given (for_each_role): the callable's own execution space
// decides, so host-only code may pass host lambdas (as CUB's and Thrust's algorithms do).
#if defined(__CUDACC__)
#  define PAGESTASH_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#  define PAGESTASH_EXEC_CHECK_DISABLE
#endif

// Unrolls a loop over a layout's buffers on the device, so each buffer's block shape (granules, line counts) is a
// constant there and no runtime division remains (a 64-bit one is a call, forcing values onto the stack).
// PAGESTASH_NO_UNROLL keeps a loop rolled: a 1x128 block's batches, unrolled, held more than a lane's 64 registers
// on sm_100 (a stack frame and spills).
#if defined(__CUDA_ARCH__)
#  define PAGESTASH_UNROLL _Pragma("unroll")
#  define PAGESTASH_NO_UNROLL _Pragma("unroll 1")
#else
#  define PAGESTASH_UNROLL
#  define PAGESTASH_NO_UNROLL
#endif

#define PAGESTASH_PP_CAT_(a, b) a##b
#define PAGESTASH_PP_CAT(a, b) PAGESTASH_PP_CAT_(a, b)
#define PAGESTASH_ABI_NAMESPACE                                                       \
  PAGESTASH_PP_CAT(PAGESTASH_PP_CAT(PAGESTASH_PP_CAT(v, PAGESTASH_VERSION_MAJOR), _), \
                   PAGESTASH_PP_CAT(PAGESTASH_PP_CAT(PAGESTASH_VERSION_MINOR, _), PAGESTASH_VERSION_PATCH))

// Everything lives in a versioned inline namespace (as CUB does), so two libraries built against different pagestash
// versions never share a kernel or function symbol.
#define PAGESTASH_NAMESPACE_BEGIN \
  namespace pagestash {           \
  inline namespace PAGESTASH_ABI_NAMESPACE {
#define PAGESTASH_NAMESPACE_END \
  }                             \
  }
