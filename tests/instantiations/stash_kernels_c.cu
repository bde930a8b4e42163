// Stash kernels for the non-default traits (compressed stashes, selections).
#include "stash_kernels.inl"

PAGESTASH_TEST_FOR_EACH_NON_DEFAULT_TRAITS(PAGESTASH_INSTANTIATE_STASH_TRAITS)
