#!/bin/sh
# The test command: installs missing Debian packages, builds, and runs the
# whole suite twice -- a normal build and one under AddressSanitizer +
# UndefinedBehaviorSanitizer -- then prints "N passed, N failed".
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh build
sh scripts/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false
status=0
meson test -C build --print-errorlogs --num-processes 1 || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
NT_TEST_QUICK=1 \
    meson test -C build-asan --print-errorlogs --num-processes 1 --timeout-multiplier 3 ||
    status=1
python3 scripts/count_tests.py build/meson-logs/testlog.json build-asan/meson-logs/testlog.json
exit $status
