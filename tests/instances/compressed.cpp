// The compressed layouts (tests/common/instances.hpp).
#include "../common/instances.hpp"

#define PAGESTASH_TEST_INSTANCE_DEFINE(T) PAGESTASH_TEST_INSTANCE_COMPRESSED(, T)
PAGESTASH_TEST_FOR_EACH_COMPRESSED_LAYOUT(PAGESTASH_TEST_INSTANCE_DEFINE)
