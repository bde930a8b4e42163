# Checks which layer may include which (docs/design.md, "Layers"). Run with -P.
# Every header may include config.hpp and version.hpp; a .hpp never includes a .cuh (host-
# capable headers stay compilable by a plain C++ compiler). Besides, per layer:
#   headers matching              may include pagestash headers from these folders (the
#                                 product's layers, bottom up; reference/ on top of them all;
#                                 sizing/, the host-only pool sizer, beside execution/: it
#                                 sizes pools from the stash's work plan, runs nothing)
set(_rules
  "^pagestash/detail/"            "detail"
  "^pagestash/formats/"           "detail|formats"
  "^pagestash/cuda/"              "detail|cuda"
  "^pagestash/layouts/.*\\.hpp$"  "detail|formats|layouts"
  "^pagestash/layouts/.*\\.cuh$"  "detail|formats|layouts|cuda"
  "^pagestash/pool/"              "detail|cuda|pool"
  "^pagestash/stash/"             "detail|formats|layouts|pool|stash"
  "^pagestash/execution/"         "detail|formats|layouts|cuda|pool|stash|execution"
  "^pagestash/sizing/"            "detail|formats|layouts|pool|stash|sizing"
  "^pagestash/reference/"         "detail|formats|layouts|cuda|pool|stash|execution|reference"
  "^pagestash/[^/]+$"             "detail|formats|layouts|cuda|pool|stash|execution|sizing")
# The umbrella headers (pagestash/*.hpp, *.cuh) and every layer of the product stay apart
# from reference/ (the quantizers, producers and oracles of tests and examples).

file(GLOB_RECURSE _headers RELATIVE "${INCLUDE_ROOT}" "${INCLUDE_ROOT}/pagestash/*.hpp" "${INCLUDE_ROOT}/pagestash/*.cuh")
list(LENGTH _rules _length)
math(EXPR _last "${_length} - 1")
set(_errors "")
foreach(_header IN LISTS _headers)
  file(STRINGS "${INCLUDE_ROOT}/${_header}" _includes REGEX "^#include <pagestash/")
  foreach(_line IN LISTS _includes)
    string(REGEX REPLACE "^#include <(pagestash/[^>]+)>.*" "\\1" _dep "${_line}")
    if(_header MATCHES "\\.hpp$" AND _dep MATCHES "\\.cuh$")
      string(APPEND _errors "  ${_header} includes CUDA-only ${_dep}\n")
    endif()
    if(_header MATCHES "^pagestash/[^/]+$" AND _dep MATCHES "^pagestash/[^/]+$")
      continue()  # one umbrella header including another
    endif()
    foreach(_i RANGE 0 ${_last} 2)
      math(EXPR _j "${_i} + 1")
      list(GET _rules ${_i} _layer)
      list(GET _rules ${_j} _folders)
      if(_header MATCHES "${_layer}" AND NOT _dep MATCHES "^pagestash/(config|version)\\.hpp$|^pagestash/(${_folders})/")
        string(APPEND _errors "  ${_header} may include only (${_folders})/, not ${_dep}\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(_errors)
  message(FATAL_ERROR "Layering violations:\n${_errors}")
endif()
list(LENGTH _headers _count)
message(STATUS "layering OK (${_count} headers)")
