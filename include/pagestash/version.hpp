#pragma once
// Single source of the library version; CMakeLists.txt parses these three lines.
#define PAGESTASH_VERSION_MAJOR 0
#define PAGESTASH_VERSION_MINOR 1
#define PAGESTASH_VERSION_PATCH 0

#define PAGESTASH_VERSION (PAGESTASH_VERSION_MAJOR * 10000 + PAGESTASH_VERSION_MINOR * 100 + PAGESTASH_VERSION_PATCH)
