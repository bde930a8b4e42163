#pragma once
// Host-capable part of pagestash: everything that compiles with a plain C++17 compiler
// (CUDA and CCCL headers on the include path, cudart to link; no nvcc): formats, layouts,
// the page pool, stash records and the host reference executor (the reference quantizers
// and producers for tests are <pagestash/reference/reference.hpp>, not included). Include
// <pagestash/pagestash.cuh> from CUDA translation units to get the kernels as well.

#include <pagestash/config.hpp>
#include <pagestash/version.hpp>

#include <pagestash/formats/block.hpp>
#include <pagestash/formats/scalar.hpp>

#include <pagestash/layouts/layouts.hpp>

#include <pagestash/pool/page_pool.hpp>
#include <pagestash/stash/record.hpp>

#include <pagestash/execution/executor.hpp>
#include <pagestash/execution/host.hpp>
#include <pagestash/execution/operation.hpp>
