#pragma once
// The reference code, for tests, examples and benchmarks, apart from the product: the
// quantizers, the producers that fill any layout, the byte-run oracle of the geometry, the
// serial oracles of the count check and the plan, the pool's free pages read back, and a
// record header's words.
// Host-capable (g++); reference.cuh adds the device producer. Neither umbrella header
// (pagestash.hpp, pagestash.cuh) includes it.

#include <pagestash/reference/byte_runs.hpp>
#include <pagestash/reference/pool_pages.hpp>
#include <pagestash/reference/producer.hpp>
#include <pagestash/reference/quantize.hpp>
#include <pagestash/reference/record_words.hpp>
#include <pagestash/reference/serial_plan.hpp>
