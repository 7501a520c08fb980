#!/bin/sh
# The main job: installs missing Debian packages, builds, and runs the
# training example (extra arguments go to it).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh build
exec ./build/examples/demo "$@"
