#!/bin/sh
# Installs the Debian 12 packages ntensor needs that are missing (run as root).
# Usage: scripts/deps.sh [--bench] [extra packages...]
#   --bench  also PyTorch and matplotlib, for the PyTorch peers of bench/
#            (bench/peer/*.py) and bench/peer/plot_loss.py; the tests
#            never need them.
# fortunes: the text examples/char_gpt trains on.
# libopenmpi-dev, openmpi-bin: collectives between processes (meson option
# mpi, on when found) and the tests that run mpirun -np 2.
set -eu
extra=""
for a in "$@"; do
    case "$a" in
    --bench) extra="$extra python3-torch python3-matplotlib" ;;
    *) extra="$extra $a" ;;
    esac
done
pkgs="gcc g++ meson ninja-build pkg-config python3 libglib2.0-dev liburcu-dev libatomic-ops-dev
      libcmocka-dev libopenblas-dev zlib1g-dev gdb libtsan2 fortunes
      libopenmpi-dev openmpi-bin $extra"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # -q: a line per package unpacked and set up (a fresh machine installs for
    # minutes: it shows it is working), no progress bars
    apt-get install -y -q --no-install-recommends $missing
fi
