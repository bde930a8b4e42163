#pragma once
// The reference code with its CUDA part (the device producer): see reference.hpp.

#include <pagestash/reference/producer.cuh>
#include <pagestash/reference/reference.hpp>
