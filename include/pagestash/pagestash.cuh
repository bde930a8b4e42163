#pragma once
// Everything in pagestash, for CUDA translation units (nvcc).

#include <pagestash/pagestash.hpp>

#include <pagestash/cuda/error.hpp>
#include <pagestash/execution/cuda.cuh>
