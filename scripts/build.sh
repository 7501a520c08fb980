#!/bin/sh
# Configures (once) and builds a build directory, its output in DIR.build.log.
# Usage: scripts/build.sh DIR [meson options...]
# Environment: BUILD_TARGETS  only these ninja targets (default: everything);
#              BUILD_PROGRESS=1  a line every 15 s saying how far the build is
#              (scripts/main.sh: a newcomer sees it working).
set -eu
dir=$1
shift
if [ ! -f "$dir/build.ninja" ]; then
    [ "${BUILD_PROGRESS:-0}" = 1 ] && echo "build: configuring $dir"
    meson setup "$dir" --buildtype=debugoptimized "$@" >"$dir.setup.log" 2>&1 ||
        { cat "$dir.setup.log"; exit 1; }
fi
# shellcheck disable=SC2086 # BUILD_TARGETS is a list of words
ninja -C "$dir" -j"$(nproc)" ${BUILD_TARGETS:-} >"$dir.build.log" 2>&1 &
pid=$!
n=0
while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    n=$((n + 1))
    if [ "${BUILD_PROGRESS:-0}" = 1 ] && [ $((n % 15)) -eq 0 ]; then
        at=$(grep -o '^\[[0-9]*/[0-9]*\]' "$dir.build.log" | tail -n 1 || true)
        echo "build: $dir ${at:-starting}, $n s"
    fi
done
wait "$pid" || { tail -50 "$dir.build.log"; exit 1; }
[ "${BUILD_PROGRESS:-0}" = 1 ] && echo "build: $dir done in about $n s" || true
