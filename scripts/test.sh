#!/bin/sh
# The test command: installs missing Debian packages, builds, and runs the
# whole suite three times -- a normal build, one under AddressSanitizer +
# UndefinedBehaviorSanitizer, and one under ThreadSanitizer (0 reports
# allowed: halt_on_error) -- then prints the skipped cases and, last,
# "N passed, N failed".
#
# Tests run side by side, one per processor (tests/meson.build says which
# run alone, and why).  Each sanitizer tree is built while the tests of the
# tree before it run, at a lower priority (nice), so it takes the processor
# time those tests leave idle (the clang/libFuzzer build goes beside the
# ThreadSanitizer tests the same way); the sanitizer trees leave out bench/ and the
# examples no test runs (-Dextras=false).  NT_TEST_QUICK=1 in the sanitizer
# runs shrinks the biggest tests (test_oom there fails a sample of the
# allocations the normal run fails every one of).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
jobs=$(nproc)
status=0
sh scripts/build.sh build
nice -n 10 sh scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false \
    -Dextras=false &
asan_build=$!
meson test -C build --print-errorlogs --num-processes "$jobs" || status=1
wait $asan_build
nice -n 10 sh scripts/build.sh build-tsan -Db_sanitize=thread -Db_lundef=false -Dextras=false &
tsan_build=$!
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
NT_TEST_QUICK=1 \
    meson test -C build-asan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3 ||
    status=1
wait $tsan_build
# The documented clang/libFuzzer build (and a short run of each target) goes
# on beside the ThreadSanitizer tests, niced like the builds above: its
# output is printed when it ends.
nice -n 10 sh scripts/fuzz_build.sh build-fuzz >build-fuzz.log 2>&1 &
fuzz_build=$!
# nmath is single-threaded arithmetic, and test_oom replaces malloc and forks
# (tests/meson.build): both run in the two builds above only.
# G_SLICE=always-malloc: GSlice hands blocks between threads through locks
# TSan cannot see (tests/tsan.supp says what else is done and why it is
# empty).
G_SLICE=always-malloc \
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(pwd)/tests/tsan.supp" \
NT_TEST_QUICK=1 \
    meson test -C build-tsan --print-errorlogs --num-processes "$jobs" --timeout-multiplier 3 \
        --no-suite nothreads --no-suite no_tsan ||
    status=1
wait $fuzz_build || status=1
cat build-fuzz.log
python3 scripts/count_tests.py build/meson-logs/testlog.json build-asan/meson-logs/testlog.json \
    build-tsan/meson-logs/testlog.json
exit $status
