#!/bin/sh
# Builds the libFuzzer targets with clang exactly as docs/fuzzing.md ("With
# libFuzzer") says, then runs each briefly from its seed corpus: the check
# that the documented build still compiles, links and starts (a gcc-only
# builtin once broke it under Debian 12's clang 14).  Not a fuzzing run.
# Usage: scripts/fuzz_build.sh [DIR]   (default build-fuzz; run as root)
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build-fuzz}
sh scripts/deps.sh clang libclang-rt-14-dev
if [ ! -f "$dir/build.ninja" ]; then
    CC=clang meson setup "$dir" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
        >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; exit 1; }
fi
ninja -C "$dir" tests/fuzz/fuzz_checkpoint tests/fuzz/fuzz_api >"$dir.build.log" 2>&1 ||
    { tail -50 "$dir.build.log"; exit 1; }
# New inputs go to a scratch directory, never into the seed corpus.
for t in checkpoint:2000 api:200; do
    name=${t%%:*}
    runs=${t#*:}
    new="$dir/fuzz-new/$name"
    mkdir -p "$new"
    "$dir/tests/fuzz/fuzz_$name" "$new" "tests/fuzz/corpus/$name" -runs="$runs" -seed=1 \
        >"$dir.$name.log" 2>&1 || { tail -30 "$dir.$name.log"; exit 1; }
    echo "fuzz_build: fuzz_$name built with clang, ran its corpus and $runs inputs"
done
