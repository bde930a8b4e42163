// Stash kernels for the rowwise-quantized layouts.
#include "stash_kernels.inl"

PAGESTASH_TEST_ROWWISE_QUANTIZED_LAYOUTS(PAGESTASH_INSTANTIATE_STASH)
