# Runs pagestash_size with few samples and checks that --json prints JSON that python3
# parses, with a pool of pages in it; and that a bad flag exits 2. Run with -P, SIZER set.
execute_process(COMMAND "${SIZER}" --shape qwen3-moe --recipe nvfp4 --schedule 1f1b:4:2 --samples 2000 --overflow 0.01 --json
                OUTPUT_VARIABLE _json RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_size --json exited ${_rc}")
endif()
set(_file "${CMAKE_CURRENT_BINARY_DIR}/pagestash_size_check.json")
file(WRITE "${_file}" "${_json}")
# What the JSON must say of itself: the pool within its intervals and the sampled peaks, its
# pages' bytes, device + host, the overflow at the pool under the target (within the
# interval's reach), the curve falling, the saving consistent with the bytes.
set(_check [=[
import json, sys
p = json.load(open(sys.argv[1]))
pages = p["pages"]
assert 0 < p["peak_pages"]["min"] <= pages <= p["peak_pages"]["max"], p["peak_pages"]
assert p["pages_interval"][0] <= pages <= p["pages_interval"][1], p["pages_interval"]
assert p["bytes"] == pages * p["page_bytes"] and p["device_pages"] + p["host_pages"] == pages
assert p["overflow_probability"] <= p["overflow"] and p["overflow_interval"][0] <= p["overflow_probability"]
curve = p["curve"]
assert curve and all(a["pages"] < b["pages"] and a["overflow"] >= b["overflow"] for a, b in zip(curve, curve[1:])), curve
assert p["saved_bytes"] == p["full_bytes"] - p["device_bytes"] and p["warmup"]
]=])
execute_process(COMMAND python3 -c "${_check}" "${_file}"
                RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_size --json is not the JSON expected: ${_err}\n${_json}")
endif()
execute_process(COMMAND "${SIZER}" --recipe fp8 RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 2 OR NOT _err MATCHES "unknown recipe 'fp8'")
  message(FATAL_ERROR "pagestash_size --recipe fp8: exit ${_rc}, '${_err}'")
endif()
# A recipe by its name (pagestash/layouts/recipes.hpp, --list-recipes) or by its parts.
execute_process(COMMAND "${SIZER}" --list-recipes OUTPUT_VARIABLE _names RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _names MATCHES "\nmxfp8/packed_padded/compact\n")
  message(FATAL_ERROR "pagestash_size --list-recipes: exit ${_rc}, '${_names}'")
endif()
foreach(_args "--recipe;mxfp8/packed_padded/compact" "--recipe;mxfp8;--placement;packed_padded;--scales;compact")
  execute_process(COMMAND "${SIZER}" ${_args} --samples 200 --json OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0 OR NOT _out MATCHES "\"recipe\": \"mxfp8/packed_padded/compact\"")
    message(FATAL_ERROR "pagestash_size ${_args}: exit ${_rc}, '${_out}'")
  endif()
endforeach()
# --compression: a bf16 deepseek-v3 layer paged as FP8 codes and block scales. Per BF16 value (2 bytes) a compressed
# stream holds a 1-byte code and 1/32 byte of scale (an E8M0 per 32, or an FP32 per 128), so its pool, with the same
# seed and so the same counts, is (1 + 1/32) / 2 = 0.516 of the lossless pool's pages, give or take page rounding.
set(_deepseek --shape deepseek-v3 --recipe bf16 --samples 1000 --seed 3 --json)
execute_process(COMMAND "${SIZER}" ${_deepseek} OUTPUT_VARIABLE _lossless RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_size ${_deepseek}: exit ${_rc}")
endif()
string(JSON _lossless_pages GET "${_lossless}" pages)
string(JSON _lossless_name GET "${_lossless}" compression)
foreach(_format mxfp8 mxfp8_e5m2 fp8_1x128)
  execute_process(COMMAND "${SIZER}" ${_deepseek} --compression ${_format} OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pagestash_size ${_deepseek} --compression ${_format}: exit ${_rc}")
  endif()
  string(JSON _pages GET "${_out}" pages)
  string(JSON _name GET "${_out}" compression)
  string(JSON _full GET "${_out}" full_bytes)
  string(JSON _lossless_full GET "${_lossless}" full_bytes)
  # cmake's math is integer: the ratio in thousandths.
  math(EXPR _permille "${_pages} * 1000 / ${_lossless_pages}")
  if(NOT _name STREQUAL "${_format}" OR NOT _lossless_name STREQUAL "lossless" OR _permille LESS 505
     OR _permille GREATER 530 OR NOT _full EQUAL _lossless_full)
    message(FATAL_ERROR "pagestash_size --compression ${_format}: ${_pages} pages (${_name}), lossless ${_lossless_pages} "
                        "(${_lossless_name}): ${_permille}/1000, expected about 516; full bytes ${_full}, lossless "
                        "${_lossless_full}")
  endif()
endforeach()
message(STATUS "pagestash_size: bf16 deepseek-v3 compressed: ${_pages} pages, lossless ${_lossless_pages} "
               "(${_permille}/1000)")

# --drift: each phase's pool at the target, and the reserve that holds them all (the top level is phase 1's).
# Under a capacity a hot expert within it (0.4 of the tokens, 410 of 512) needs more pages (the other experts drop
# fewer); past it (0.7) fewer (it drops); a router that evens out (alpha 0.5 -> 2) keeps more tokens.
set(_drift_check [=[
import json, sys
p = json.load(open(sys.argv[1]))
ph = p["phases"]
pages = [x["device_pages"] for x in ph]
values = {"hot": [0, 0.4, 0.7], "alpha": [0.5, 2]}[p["drift_parameter"]]
assert [x["value"] for x in ph] == values and p["drift"] == p["drift_parameter"] + ":" + ",".join(sys.argv[2:]), p["drift"]
assert ph[0]["pages"] == p["pages"] and all(x["overflow_probability"] <= p["overflow"] for x in ph), ph
assert p["reserve_pages"] == max(pages) and all(p["reserve_pages"] >= n for n in pages), (p["reserve_pages"], pages)
assert pages[p["reserve_phase"] - 1] == p["reserve_pages"], p["reserve_phase"]
g = p["granule_bytes"]
assert g == 2 << 20 and p["granule_pages"] == g // p["page_bytes"] == 32, (g, p["granule_pages"])
assert p["reserve_bytes"] % g == 0 and 0 <= p["reserve_bytes"] - p["reserve_pages"] * p["page_bytes"] < g
assert all(x["backed_bytes"] % g == 0 and x["backed_bytes"] >= x["device_bytes"] for x in ph), ph
assert p["first_lacks_at_last"] == max(0, pages[-1] - pages[0]), p["first_lacks_at_last"]
# more pages, beyond both intervals
more = lambda a, b: ph[a]["pages_interval"][0] > ph[b]["pages_interval"][1]
if p["drift_parameter"] == "hot":
    assert more(1, 0) and more(0, 2) and p["reserve_phase"] == 2 and p["first_lacks_at_last"] == 0, pages
else:
    assert more(1, 0) and p["first_lacks_at_last"] == pages[1] - pages[0] > 0, pages
]=])
foreach(_drift "hot;0;0.4;0.7" "alpha;0.5;2")
  list(POP_FRONT _drift _parameter)
  string(REPLACE ";" "," _values "${_drift}")
  execute_process(COMMAND "${SIZER}" --samples 2000 --drift ${_parameter}:${_values} --json
                  OUTPUT_VARIABLE _json RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pagestash_size --drift ${_parameter}:${_values}: exit ${_rc}: ${_err}")
  endif()
  file(WRITE "${_file}" "${_json}")
  execute_process(COMMAND python3 -c "${_drift_check}" "${_file}" ${_drift} RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pagestash_size --drift ${_parameter}:${_values}: not the JSON expected: ${_err}\n${_json}")
  endif()
endforeach()
execute_process(COMMAND "${SIZER}" --samples 2000 --drift hot:0,0.4 OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "reserve \\(PoolConfig::device_reserve\\): [0-9]+ pages"
   OR NOT _out MATCHES "backed in 2 MiB granules \\(32 pages of 64 KiB each\\)" OR NOT _out MATCHES "lacks [0-9]+ pages")
  message(FATAL_ERROR "pagestash_size --drift hot:0,0.4: exit ${_rc}, '${_out}'")
endif()
message(STATUS "pagestash_size --drift: the reserve is the largest phase's pool, in whole 2 MiB granules")

# Bad input: exit 2 and a message naming it.
set(_dir "${CMAKE_CURRENT_BINARY_DIR}")
file(WRITE "${_dir}/counts_over.txt" "1 2 3 4 5 6 7 8\n3000 0 0 0 0 0 0 0\n")
file(WRITE "${_dir}/counts_comment.txt" "1 2 3 4 5 6 7 8 # a trailing comment\n")
function(refused message)
  execute_process(COMMAND "${SIZER}" --samples 10 ${ARGN} RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_QUIET)
  string(FIND "${_err}" "${message}" _at)
  if(NOT _rc EQUAL 2 OR _at EQUAL -1)
    message(FATAL_ERROR "pagestash_size ${ARGN}: exit ${_rc}, not 2 with '${message}': '${_err}'")
  endif()
endfunction()
refused("--experts 0: must be at least 1" --experts 0)
refused("--microbatches 0: must be at least 1" --microbatches 0)
refused("--seed: '-1' is negative" --seed -1)
refused("schedule '1f1b:4:': '' is not a number" --schedule 1f1b:4:)
refused("list:0,0 holds no stash" --schedule list:0,0)
refused("--correlation must be in [0, 1]" --correlation 1.5)
refused("--shape: pagestash::sizing: unknown model shape 'gpt' (deepseek-v3, " --shape gpt)
refused("unknown compression 'zstd' (known: lossless, mxfp8, mxfp8_e5m2, fp8_1x128)" --recipe bf16 --compression zstd)
refused("compression 'mxfp8' needs a bf16 or fp16 recipe, not 'nvfp4/capacity/swizzled'" --recipe nvfp4 --compress mxfp8)
refused("counts_over.txt:2: count 3000 of expert 0 exceeds the capacity" --counts "${_dir}/counts_over.txt")
refused("drift 'heat:0.5': unknown parameter 'heat'" --drift heat:0.5)
refused("drift 'hot:0.2,x': 'x' is not a number" --drift hot:0.2,x)
refused("drift 'hot:': no phases" --drift hot:)
refused("drift phase 2 (hot 1.5): DirichletRouting: hot_share = 1.500000 must be in [0, 1]" --drift hot:0,1.5)
refused("drift phase 1 (tokens 10.5): tokens must be a whole number" --drift tokens:10.5)
refused("hot_share = 0.500000 needs top_k = 2 experts besides the hot one, of 1" --experts 2 --drift hot:0.5)
refused("--drift varies the Dirichlet router" --drift hot:0.5 --counts "${_dir}/counts_comment.txt")
execute_process(COMMAND "${SIZER}" --samples 10 --counts "${_dir}/counts_over.txt" --cap-counts --layers 1 --microbatches 1
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0 OR NOT _out MATCHES "(capped)")
  message(FATAL_ERROR "pagestash_size --cap-counts: exit ${_rc}: ${_err}${_out}")
endif()
execute_process(COMMAND "${SIZER}" --samples 10 --counts "${_dir}/counts_comment.txt" RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_QUIET)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "pagestash_size: a trailing # comment is refused: ${_err}")
endif()
# --compress, the flag's old name, is still taken.
refused("compression 'fp8_1x128' needs a bf16 or fp16 recipe" --recipe fp32 --compress fp8_1x128)

# --help lists each field of the sizer's settings table (PAGESTASH_SIZING_SETTINGS in SETTINGS_HEADER) as its flag
# (dashes for underscores) with its default, and the command takes it.
file(READ "${SETTINGS_HEADER}" _header)
string(REGEX MATCHALL "\n  X\\([^,]+, [a-z_]+," _rows "${_header}")
list(LENGTH _rows _settings)
if(_settings LESS 7)
  message(FATAL_ERROR "${SETTINGS_HEADER}: ${_settings} settings in PAGESTASH_SIZING_SETTINGS, expected at least 7")
endif()
execute_process(COMMAND "${SIZER}" --help OUTPUT_VARIABLE _help RESULT_VARIABLE _rc)
foreach(_row IN LISTS _rows)
  string(REGEX REPLACE "^\n  X\\([^,]+, ([a-z_]+),$" "\\1" _name "${_row}")
  string(REPLACE "_" "-" _flag "--${_name}")
  if(NOT _help MATCHES "\n  ${_flag} [NX] +[^\n]*\\(default ([^)]+)\\)\n")
    message(FATAL_ERROR "pagestash_size --help lists no '${_flag}' with its default (the setting ${_name}):\n${_help}")
  endif()
  execute_process(COMMAND "${SIZER}" --samples 100 ${_flag} ${CMAKE_MATCH_1} --json RESULT_VARIABLE _rc
                  OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pagestash_size ${_flag} ${CMAKE_MATCH_1} (its default): exit ${_rc}: ${_err}")
  endif()
endforeach()
message(STATUS "pagestash_size --help: the ${_settings} settings of the sizer's table, each with its default")
message(STATUS "pagestash_size: JSON parses; bad recipes, options, schedules, counts and drifts are refused, naming them")
