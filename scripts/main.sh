#!/bin/sh
# The main job: installs missing Debian packages (with the Fashion-MNIST data
# set), builds, and trains an MLP on Fashion-MNIST (extra arguments go to
# examples/fashion_mnist; try --help).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh dataset-fashion-mnist
sh scripts/build.sh build
exec ./build/examples/fashion_mnist "$@"
