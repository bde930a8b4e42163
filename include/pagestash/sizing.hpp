#pragma once
// The pool sizer (host only, plain C++): how many pages a pool needs so that a step
// overflows it with a chosen probability, from the layer's saved tensors (exact pages by
// the library's own work plan), the pipeline schedule and a model of the router's counts.
// docs/sizing.md describes it; examples/pagestash_size is its command. Not included by
// pagestash.hpp.

#include <pagestash/sizing/count_model.hpp>
#include <pagestash/sizing/drift.hpp>
#include <pagestash/sizing/layer.hpp>
#include <pagestash/sizing/model_shapes.hpp>
#include <pagestash/sizing/pool_sizing.hpp>
#include <pagestash/sizing/recipes.hpp>
#include <pagestash/sizing/saved_tensor.hpp>
#include <pagestash/sizing/schedule.hpp>
#include <pagestash/sizing/statistics.hpp>
