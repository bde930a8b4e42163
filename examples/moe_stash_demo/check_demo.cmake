# Runs the demo with small settings and checks what it reports (ctest: "example: moe_stash_demo ...").
#   1. --json: every recipe and schedule restores every tensor bit for bit, and every page
#      is back at the step's end (end_step), in every run below too;
#   2. a pool factor too small: overflow is reported, tensors stashed before it still match;
#   3. --overflow 1e-3: the sizer's pool (its planned pages) holds the step, no overflow;
#   4. --compression mxfp8: bf16 stashed compressed next to its lossless run, its reload equal to the reference round
#      trip, on fewer pages; nvfp4, which cannot be compressed, lossless;
#   5. --grow: the step starts on a quarter of the pool and reaches it by growing (each overflowed step rerun after a
#      reset and a grow, no restart): the measured step bit-exact with no overflow, after at least one grow;
#   6. bad flags exit with 2 and a message, never a crash; --help exits 0, the flags on stdout;
#   7. a step that overflowed has no saving and no rates (n/a, JSON null); peak used is the device pages' (<= pool).
set(_small --layers 2 --microbatches 3 --tokens 256 --hidden 256 --experts 4 --page-kib 16)

function(run_demo out_var)
  execute_process(COMMAND "${DEMO}" --json ${_small} ${ARGN} OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "demo ${ARGN} exited with ${_rc}: ${_err}")
  endif()
  set(${out_var} "${_out}" PARENT_SCOPE)
endfunction()

function(results json prefix)
  string(JSON _n LENGTH "${json}" results)
  math(EXPR _last "${_n} - 1")
  set(_recipes "")
  set(_overflows 0)
  set(_lost 0)
  foreach(_i RANGE ${_last})
    string(JSON _recipe GET "${json}" results ${_i} recipe)
    string(JSON _parity GET "${json}" results ${_i} parity)
    string(JSON _ok GET "${json}" results ${_i} parity_ok)
    string(JSON _o GET "${json}" results ${_i} overflows)
    string(JSON _l GET "${json}" results ${_i} lost)
    string(JSON _held GET "${json}" results ${_i} pages_held_at_step_end)
    if(NOT _held EQUAL 0)
      message(FATAL_ERROR "${prefix}: ${_recipe} result ${_i}: ${_held} pages not back at the step's end")
    endif()
    if(NOT _parity STREQUAL "ON" AND NOT _parity STREQUAL "true")
      message(FATAL_ERROR "${prefix}: ${_recipe} result ${_i} lost parity")
    endif()
    list(APPEND _recipes "${_recipe}")
    math(EXPR _overflows "${_overflows} + ${_o}")
    math(EXPR _lost "${_lost} + ${_l}")
    if(_ok EQUAL 0)
      message(FATAL_ERROR "${prefix}: ${_recipe} result ${_i} checked no tensor")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _recipes)
  set(${prefix}_recipes "${_recipes}" PARENT_SCOPE)
  set(${prefix}_overflows ${_overflows} PARENT_SCOPE)
  set(${prefix}_lost ${_lost} PARENT_SCOPE)
endfunction()

run_demo(_json)
results("${_json}" ok)
list(LENGTH ok_recipes _count)
if(NOT _count EQUAL 4 OR NOT ok_overflows EQUAL 0 OR NOT ok_lost EQUAL 0)
  message(FATAL_ERROR "expected 4 recipes with parity and no overflow, got ${ok_recipes}, ${ok_overflows} overflows")
endif()

run_demo(_json --pool-factor 0.5)
results("${_json}" forced)
if(forced_overflows EQUAL 0 OR forced_lost EQUAL 0)
  message(FATAL_ERROR "a pool factor of 0.5 should overflow: ${forced_overflows} overflows, ${forced_lost} lost")
endif()

# A step that overflowed did not do its work: no saving, no rates.
string(JSON _n LENGTH "${_json}" results)
math(EXPR _last "${_n} - 1")
foreach(_i RANGE ${_last})
  string(JSON _o GET "${_json}" results ${_i} overflows)
  foreach(_field saved_percent stash_gbps reload_gbps)
    string(JSON _type TYPE "${_json}" results ${_i} ${_field})
    if(_o GREATER 0 AND NOT _type STREQUAL "NULL")
      message(FATAL_ERROR "--pool-factor 0.5: result ${_i} overflowed, yet its ${_field} is a ${_type}")
    endif()
  endforeach()
endforeach()

# Host spill (README): a device pool short of the step, spill pages for the rest. The step holds, spills, and peak used
# is the device pages' (at most the pool).
run_demo(_json --pool-factor 0.6 --spill-factor 0.5 --recipes bf16 --schedule lifo)
results("${_json}" spilled)
string(JSON _spill GET "${_json}" results 0 host_spill)
string(JSON _pool_bytes GET "${_json}" results 0 pool_bytes)
string(JSON _peak_bytes GET "${_json}" results 0 peak_pool_bytes)
if(NOT spilled_overflows EQUAL 0 OR NOT _spill STREQUAL "ON" OR _peak_bytes GREATER _pool_bytes)
  message(FATAL_ERROR "--pool-factor 0.6 --spill-factor 0.5: ${spilled_overflows} overflows, host spill ${_spill}, "
                      "peak used ${_peak_bytes} bytes of a pool of ${_pool_bytes}")
endif()

run_demo(_json --overflow 1e-3 --recipes bf16,nvfp4)
results("${_json}" planned)
if(NOT planned_overflows EQUAL 0 OR NOT planned_lost EQUAL 0)
  message(FATAL_ERROR "--overflow 1e-3: the sizer's pool overflowed (${planned_overflows})")
endif()
string(JSON _sizing GET "${_json}" results 0 sizing)
string(JSON _pool GET "${_json}" results 0 pool_pages)
string(JSON _planned GET "${_json}" results 0 planned_pages)
if(NOT _sizing STREQUAL "sizer" OR NOT _pool EQUAL _planned)
  message(FATAL_ERROR "--overflow 1e-3: the pool (${_pool} pages, sized by ${_sizing}) is not the sizer's (${_planned})")
endif()

run_demo(_json --compression mxfp8 --recipes bf16,nvfp4 --schedule lifo)
results("${_json}" compressed)
string(JSON _n LENGTH "${_json}" results)
if(NOT _n EQUAL 3 OR NOT compressed_overflows EQUAL 0)
  message(FATAL_ERROR "--compression mxfp8: expected 3 results (bf16 lossless, bf16 mxfp8, nvfp4 lossless), got ${_n}")
endif()
set(_expected "bf16/capacity lossless source true" "bf16/capacity mxfp8 round_trip_blocks true"
              "nvfp4/capacity/swizzled lossless source false")
set(_got "")
foreach(_i 0 1 2)
  set(_row "")
  foreach(_field recipe compression parity_reference compressible)
    string(JSON _v GET "${_json}" results ${_i} ${_field})
    if(_v STREQUAL "ON")  # cmake reads a JSON true as ON
      set(_v true)
    elseif(_v STREQUAL "OFF")
      set(_v false)
    endif()
    string(APPEND _row " ${_v}")
  endforeach()
  string(STRIP "${_row}" _row)
  list(APPEND _got "${_row}")
endforeach()
if(NOT _got STREQUAL _expected)
  message(FATAL_ERROR "--compression mxfp8: rows '${_got}', expected '${_expected}'")
endif()
# Per BF16 value (2 bytes) the compressed stream holds a code (1 byte) and 1/32 byte of scale: about half the
# pages, more with page rounding at this small shape.
string(JSON _lossless_pages GET "${_json}" results 0 peak_pages)
string(JSON _compressed_pages GET "${_json}" results 1 peak_pages)
math(EXPR _permille "${_compressed_pages} * 1000 / ${_lossless_pages}")
if(_permille LESS 505 OR _permille GREATER 650)
  message(FATAL_ERROR "--compression mxfp8: ${_compressed_pages} peak pages, lossless ${_lossless_pages}")
endif()

run_demo(_json --grow --recipes bf16,nvfp4 --schedule lifo)
results("${_json}" grown)
string(JSON _growths GET "${_json}" results 0 growths)
string(JSON _grown_pool GET "${_json}" results 0 pool_pages)
if(NOT grown_overflows EQUAL 0 OR NOT grown_lost EQUAL 0 OR _growths LESS 1)
  message(FATAL_ERROR "--grow: ${grown_overflows} overflows, ${_growths} grows (expected a grow and no overflow)")
endif()

foreach(_bad "--compress;zstd" "--compression;zstd" "--overflow;1.5" "--overflow;0" "--shape;gpt" "--recipes;fp7" "--experts;0" "--hidden;100" "--capacity-factor;-1" "--layers;x" "--bogus;1" "--recipes;mxfp8;--capacity;48")
  execute_process(COMMAND "${DEMO}" ${_bad} RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 2 OR NOT _err MATCHES "moe_stash_demo: ")
    message(FATAL_ERROR "demo ${_bad}: exit ${_rc}, expected 2 with a message; stderr: ${_err}")
  endif()
endforeach()
# --help: every flag with its default, on stdout, exit 0 (tests/docs/check_docs.py checks that the README names each).
execute_process(COMMAND "${DEMO}" --help RESULT_VARIABLE _rc OUTPUT_VARIABLE _help ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0 OR NOT _err STREQUAL "" OR NOT _help MATCHES "--overflow P .*--spill-factor X .*--json")
  message(FATAL_ERROR "demo --help: exit ${_rc}, expected 0 with the flags on stdout; stdout: ${_help}; stderr: ${_err}")
endif()
# --shape reads the sizer's table of model shapes: an unknown name is refused with the list.
execute_process(COMMAND "${DEMO}" --shape gpt RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
if(NOT _err MATCHES "unknown model shape 'gpt' \\(deepseek-v3, qwen3-moe")
  message(FATAL_ERROR "demo --shape gpt: the message does not list the model shapes: ${_err}")
endif()
message(STATUS "demo: 4 recipes bit-exact; forced overflow reported (${forced_overflows}); the sized pool "
               "(${_planned} pages) holds the step; mxfp8-compressed bf16 equals the round trip on "
               "${_compressed_pages} pages (lossless ${_lossless_pages}); --grow reached ${_grown_pool} pages in "
               "${_growths} grows; bad flags exit 2")
