#pragma once
// All grouped-tensor layout policies, their StashTraits, and views.

#include <pagestash/layouts/columnwise_quantized.hpp>
#include <pagestash/layouts/geometry.hpp>
#include <pagestash/layouts/plain.hpp>
#include <pagestash/layouts/rowwise_quantized.hpp>
#include <pagestash/layouts/rowwise_unquantized.hpp>
#include <pagestash/layouts/stash_traits.hpp>
#include <pagestash/layouts/view.hpp>
