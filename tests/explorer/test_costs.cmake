# The explorer's longest configurations start first (ctest -j starts the tests of highest COST
# first; the discovered tests have no timings of their own in a fresh build): seconds on a
# 2-core machine.
set_tests_properties([=[explorer:launch explorer: a pool grows while a discard returns pages and two stashes take them]=] PROPERTIES COST 34)
set_tests_properties([=[explorer:launch explorer: two launches of two blocks, every pair of operations]=] PROPERTIES COST 16)
set_tests_properties([=[explorer:launch explorer: a launch holds the record, three arrive, one of them straddling it]=] PROPERTIES COST 9)
