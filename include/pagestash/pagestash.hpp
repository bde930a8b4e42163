#pragma once
// Host-capable part of pagestash: everything that compiles with a plain C++17 compiler
// (CUDA and CCCL headers on the include path, no nvcc). Include <pagestash/pagestash.cuh>
// from CUDA translation units to get the kernels as well.

#include <pagestash/config.hpp>
#include <pagestash/version.hpp>

#include <pagestash/formats/block.hpp>
#include <pagestash/formats/matrix.hpp>
#include <pagestash/formats/scalar.hpp>

#include <pagestash/layouts/layouts.hpp>
