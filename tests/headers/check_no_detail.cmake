# No use of the detail namespace outside include/ (run with -P, SOURCE_ROOT set): the tests, the bench, the
# examples and the Python package use public names; what they need of the library's
# internals is public (a glossary word) or lives in reference/ or tests/common.
set(_errors "")
foreach(_dir tests bench examples python)
  file(GLOB_RECURSE _files "${SOURCE_ROOT}/${_dir}/*.cpp" "${SOURCE_ROOT}/${_dir}/*.hpp" "${SOURCE_ROOT}/${_dir}/*.cu"
       "${SOURCE_ROOT}/${_dir}/*.cuh" "${SOURCE_ROOT}/${_dir}/*.h" "${SOURCE_ROOT}/${_dir}/*.py")
  foreach(_file IN LISTS _files)
    file(STRINGS "${_file}" _hits REGEX "detail[:][:]|[ =:]detail;")  # a use, or an alias of the namespace
    foreach(_hit IN LISTS _hits)
      file(RELATIVE_PATH _rel "${SOURCE_ROOT}" "${_file}")
      string(APPEND _errors "  ${_rel}: ${_hit}\n")
    endforeach()
  endforeach()
endforeach()
if(_errors)
  message(FATAL_ERROR "the detail namespace used outside include/ (make the name public or test through the API):\n${_errors}")
endif()
