#!/bin/sh
# The test command: installs missing Debian packages, builds, and runs the
# whole suite three times -- a normal build, one under AddressSanitizer +
# UndefinedBehaviorSanitizer, and one under ThreadSanitizer (0 reports
# allowed: halt_on_error) -- then prints "N passed, N failed".
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh build
sh scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
sh scripts/build.sh build-tsan -Db_sanitize=thread -Db_lundef=false
status=0
meson test -C build --print-errorlogs --num-processes 1 || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
NT_TEST_QUICK=1 \
    meson test -C build-asan --print-errorlogs --num-processes 1 --timeout-multiplier 3 ||
    status=1
# nmath is single-threaded arithmetic, and test_oom replaces malloc and forks
# (tests/meson.build): both run in the two builds above only.
# G_SLICE=always-malloc: GSlice hands blocks between threads through locks
# TSan cannot see (tests/tsan.supp says what else is done and why it is
# empty).
G_SLICE=always-malloc \
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(pwd)/tests/tsan.supp" \
NT_TEST_QUICK=1 \
    meson test -C build-tsan --print-errorlogs --num-processes 1 --timeout-multiplier 3 \
        --no-suite nothreads --no-suite no_tsan ||
    status=1
sh scripts/fuzz_build.sh build-fuzz || status=1 # the documented clang/libFuzzer build
python3 scripts/count_tests.py build/meson-logs/testlog.json build-asan/meson-logs/testlog.json \
    build-tsan/meson-logs/testlog.json
exit $status
