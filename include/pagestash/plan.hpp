#pragma once
// The pool planner (host only, plain C++): how many pages a pool needs so that a step
// overflows it with a chosen probability, from the layer's saved tensors (exact pages by
// the library's own work plan), the pipeline schedule and a model of the router's counts.
// docs/planning.md describes it; examples/pagestash_plan is its command. Not included by
// pagestash.hpp.

#include <pagestash/plan/count_model.hpp>
#include <pagestash/plan/layer.hpp>
#include <pagestash/plan/planner.hpp>
#include <pagestash/plan/recipes.hpp>
#include <pagestash/plan/saved_tensor.hpp>
#include <pagestash/plan/schedule.hpp>
#include <pagestash/plan/statistics.hpp>
