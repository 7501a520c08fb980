#!/bin/sh
# tests/mpi_test.sh MPIRUN PROGRAM - the collectives between processes
# (docs/collectives.md, "Processes"), as TAP:
#   1. mpirun -np 2: every collective x dtype x op, values against the
#      reference, and the same output hash as one process with the same
#      number of global ranks;
#   2. the fault test: one of two ranks is killed; the survivor reports an
#      error naming the collective and its call site within
#      NT_COLLECTIVE_TIMEOUT, and exits.
# Without MPI built (MPIRUN is "none") it skips (a TAP plan "1..0 # SKIP",
# which meson reports as skipped; exit 77 would be an error under the TAP
# protocol): MPI is an optional feature; scripts/test.sh's build has it
# (scripts/deps.sh).
set -u
mpirun=$1
prog=$2
if [ "$mpirun" = none ]; then
    echo "1..0 # SKIP ntensor was built without MPI (meson option mpi) or mpirun is missing"
    exit 0
fi
# Open MPI in a container as root, on loopback: allow root; shared memory
# between the two processes (vader) without the single-copy mechanism
# (CMA needs ptrace rights a container may not grant); no network BTL.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's plugins (dlopen'ed, closed at MPI_Finalize) leave allocations
# LeakSanitizer can only name as "<unknown module>", so no suppression can
# match them: leak checking is off for the MPI processes (the in-process
# tests of tests/test_collectives.c check the collectives' own paths).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; sed 's/^/# /' "$out"; fail=1; }

devs=${NT_MPI_TEST_DEVS:-1}
echo "1..5"
# 1 process, 2*devs global ranks when devices allow it; otherwise the
# reference is the 2-process run's own check against computed values.
if NT_SIM_CORES=$((2 * devs)) "$prog" check $((2 * devs)) >"$out" 2>&1; then
    ref=$(grep '^rank ' "$out" | sort)
    ok "one process, $((2 * devs)) ranks: values match the reference"
else
    ref=""
    if grep -q "expected 1 .. " "$out"; then
        ok "one process, $((2 * devs)) ranks # SKIP this build has one device per process"
    else
        notok "one process, $((2 * devs)) ranks"
    fi
fi
if NT_SIM_CORES=$devs timeout 600 "$mpirun" -np 2 --oversubscribe "$prog" check "$devs" >"$out" 2>&1; then
    ok "mpirun -np 2, $devs device(s) each: values match the reference"
else
    notok "mpirun -np 2, $devs device(s) each"
fi
hashes=$(grep '^rank ' "$out" | sort)
if [ -z "$ref" ]; then
    ok "bit-identical to the 1-process run # SKIP no 1-process run"
elif [ "$hashes" = "$ref" ]; then
    ok "every rank's outputs bit-identical to the 1-process run ($(echo $ref | tr '\n' ' '))"
else
    notok "outputs differ from the 1-process run: $(echo $hashes) vs $(echo $ref)"
fi
if timeout 120 "$mpirun" -np 2 --oversubscribe "$prog" mismatch >"$out" 2>&1 &&
    [ "$(grep -c 'mismatch test: ok' "$out")" = 2 ]; then
    ok "shapes that differ between processes: $(sed -n 's/^process 0.s error: //p' "$out" | head -1)"
else
    notok "shapes that differ between processes"
fi
# The fault test.  --enable-recovery: without it mpirun kills the survivor
# as soon as a rank dies (it aborts the job on a process killed by a
# signal), so nobody would see the error.
NT_COLLECTIVE_TIMEOUT=${NT_MPI_TEST_TIMEOUT:-5} timeout 120 "$mpirun" -np 2 --oversubscribe \
    --enable-recovery "$prog" kill >"$out" 2>&1
if grep -q "fault test: ok" "$out"; then
    ok "a killed rank: $(sed -n 's/^survivor.s error: //p' "$out" | head -1)"
else
    notok "a killed rank: no clear error from the survivor"
fi
exit $fail
