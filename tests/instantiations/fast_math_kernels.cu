// The compressed stashes' kernels again, compiled with --use_fast_math (a header-only library is compiled with the
// user's flags): check_kernels.py --fast-math finds each with the same instructions as in the instantiations, so the
// codec neither flushes subnormals nor approximates a division under those flags. One traits per element and scale
// format (MXFP8 E4M3 and E5M2 of BF16, FP8 1x128 of FP16): the codec's every path. The GPU test
// pagestash_fast_math_device_tests runs them against the reference quantizer (its own
// executable: these kernels' names are the library instantiations').
#define PAGESTASH_TEST_DEFINE_POOL_ENTRY_POINTS
#include "stash_kernels.inl"

PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash_test::traits::Bf16Mx4)
PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash_test::traits::Bf16Mx5)
PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash_test::traits::Fp16CapB128)
