// Every layout's default traits (tests/common/instances.hpp).
#include "../common/instances.hpp"

#define PAGESTASH_TEST_INSTANCE_DEFINE(L) PAGESTASH_TEST_INSTANCE_LAYOUT(, L)
PAGESTASH_TEST_FOR_EACH_LAYOUT(PAGESTASH_TEST_INSTANCE_DEFINE)
