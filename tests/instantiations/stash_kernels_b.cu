// Stash kernels for the rowwise-quantized layouts.
#include "stash_kernels.inl"

PAGESTASH_TEST_QUANTIZED(PAGESTASH_INSTANTIATE_STASH, Row)
