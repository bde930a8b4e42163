// A format outside PAGESTASH_FOR_EACH_COMPRESSION: Compressed<Format> refuses it, naming the list.
#include <pagestash/layouts/compression.hpp>
namespace ps = pagestash;
ps::Compressed<ps::NVFP4> compression;
