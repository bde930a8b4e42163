// The buffer selections (tests/common/instances.hpp).
#include "../common/instances.hpp"

#define PAGESTASH_TEST_INSTANCE_DEFINE(Tr) PAGESTASH_TEST_INSTANCE_OPS(, Tr)
PAGESTASH_TEST_FOR_EACH_SELECTION_TRAITS(PAGESTASH_TEST_INSTANCE_DEFINE)
