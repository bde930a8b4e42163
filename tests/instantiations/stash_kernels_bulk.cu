// Stash kernels with the bulk mover (stash/bulk_copy.hpp: BulkCopy traits), which the shipped kernels leave off
// (StashPolicy::bulk): compiled, so that the compiled-kernel check holds their shape too. Layouts of aligned rows
// (BF16, packed and capacity-padded) and of data with scales (MXFP8 columnwise, swizzled).
#include "stash_kernels.inl"

PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash::BulkCopy<pagestash::StashTraits<pagestash_test::layouts::RuBf16>>)
PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash::BulkCopy<pagestash::StashTraits<pagestash_test::layouts::RuBf16Cap>>)
PAGESTASH_INSTANTIATE_STASH_TRAITS(pagestash::BulkCopy<pagestash::StashTraits<pagestash_test::layouts::ColMx4CapSw>>)
