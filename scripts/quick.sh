# The quick loop's build and tests (`scripts/test quick`), sourced by scripts/test and read by the
# check that every file its tests read is built by its targets (tests/quick_loop/check_quick_loop.py,
# the ctest "scripts: the quick loop builds every file its tests read", run by the full command).
quick_cmake_options=(-DCMAKE_BUILD_TYPE=Release -DPAGESTASH_WERROR=ON -DCMAKE_CXX_FLAGS=-DPAGESTASH_TEST_FEW_LAYOUTS
  -DPAGESTASH_BUILD_EXAMPLES=OFF -DPAGESTASH_BUILD_BENCH=OFF)
# The kernels' shape check reads the instantiations' library and the fast-math kernels' object.
quick_targets=(pagestash_host_tests pagestash_instantiations pagestash_fast_math_kernels)
quick_tests='^host: ?|^kernels: '
