# Included by ctest after the discovered host tests (tests/CMakeLists.txt): with -j, ctest
# starts the tests of highest COST first, and a fresh build has no timings of its own, so the
# slowest host tests would start last (doctest lists them by file) and run alone at the end.
# Their seconds under ASan + UBSan on 2 cores (scripts/test, step 2); a name that no longer
# matches only loses its place in the order.
set_tests_properties([=[host:emulated grid of 4 blocks x 64 threads: every layout's sequences match a byte-for-byte copy]=] PROPERTIES COST 84)
set_tests_properties([=[host:packed placements: offsets, sizes and produced bytes equal TransformerEngine's]=] PROPERTIES COST 52)
set_tests_properties([=[host:every layout: random stash / reload / discard sequences match a byte-for-byte copy]=] PROPERTIES COST 50)
set_tests_properties([=[host:every layout: geometry matches the producer, and the produced tensor dequantizes back]=] PROPERTIES COST 28)
set_tests_properties([=[host:emulated grid: the same page ids and page bytes as the host executor, for every layout]=] PROPERTIES COST 28)
set_tests_properties([=[host:emulated grid, adversarial schedules: two launches on one record are each done or refused as a whole]=] PROPERTIES COST 24)
set_tests_properties([=[host:compressed stash: random sequences reload the reference's dequantize(quantize(x)) bit for bit]=] PROPERTIES COST 16)
set_tests_properties([=[host:copy engine: random segments (short, misaligned and long lines, 256 B to 8 KiB pages) match a plain copy]=] PROPERTIES COST 15)
set_tests_properties([=[host:emulated grid: compressed stash, random sequences reload the reference's round trip (the GPU test's body)]=] PROPERTIES COST 9)
set_tests_properties([=[host:emulated grid: every layout at odd shapes, buffers allocated to the exact byte (ASan sees past-the-end access)]=] PROPERTIES COST 9)
