#!/bin/sh
# Configures (once) and builds a build directory.
# Usage: scripts/build.sh DIR [meson options...]
set -eu
dir=$1
shift
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" --buildtype=debugoptimized "$@" >"$dir.setup.log" 2>&1 ||
        { cat "$dir.setup.log"; exit 1; }
fi
ninja -C "$dir" -j"$(nproc)" >"$dir.build.log" 2>&1 || { tail -50 "$dir.build.log"; exit 1; }
