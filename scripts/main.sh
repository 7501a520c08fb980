#!/bin/sh
# The main job: installs missing Debian packages (with the Fashion-MNIST data
# set), builds what it needs (the library and examples/fashion_mnist, saying
# how far it is every 15 s), and trains an MLP on Fashion-MNIST (extra
# arguments go to examples/fashion_mnist; try --help).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh dataset-fashion-mnist
BUILD_PROGRESS=1 BUILD_TARGETS=examples/fashion_mnist sh scripts/build.sh build
exec ./build/examples/fashion_mnist "$@"
