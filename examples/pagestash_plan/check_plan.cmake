# Runs pagestash_plan with few samples and checks that --json prints JSON that python3
# parses, with a pool of pages in it; and that a bad flag exits 2. Run with -P, PLAN set.
execute_process(COMMAND "${PLAN}" --shape qwen3-moe --recipe nvfp4 --schedule 1f1b:4:2 --samples 2000 --overflow 0.01 --json
                OUTPUT_VARIABLE _json RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_plan --json exited ${_rc}")
endif()
set(_file "${CMAKE_CURRENT_BINARY_DIR}/pagestash_plan_check.json")
file(WRITE "${_file}" "${_json}")
execute_process(COMMAND python3 -c "import json, sys; p = json.load(open(sys.argv[1])); assert p['pool_pages'] > 0 and p['curve'] and p['warmup'], p" "${_file}"
                RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_plan --json is not the JSON expected: ${_err}\n${_json}")
endif()
execute_process(COMMAND "${PLAN}" --recipe fp8 RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 2 OR NOT _err MATCHES "unknown recipe 'fp8'")
  message(FATAL_ERROR "pagestash_plan --recipe fp8: exit ${_rc}, '${_err}'")
endif()
message(STATUS "pagestash_plan: JSON parses; a bad recipe is refused")
