#!/usr/bin/env python3
"""Counts test cases across meson test logs and prints 'N passed, N failed'.

Each cmocka test prints TAP ('ok N - name' / 'not ok N - name'); every case
counts.  A case reported 'ok N ... # SKIP' did not run: it counts as
skipped, not passed, and so does a test program meson reports as skipped
(a TAP plan '1..0 # SKIP', or exit status 77) without cases.  The skipped
are printed on a line of their own before the last one.  A test program
that failed without reporting a failing case (crash, timeout, sanitizer
abort) counts as one failure, and one that passed without TAP output counts
as one pass.

Usage: count_tests.py TESTLOG.json...   or   count_tests.py --self-test
(the self-test checks these rules on made-up logs and prints TAP)."""
import json
import os
import re
import sys
import tempfile

OK = re.compile(r"^ok \d+", re.M)
NOT_OK = re.compile(r"^not ok \d+", re.M)
# TAP's directive: '# SKIP' after the description, any case
SKIPPED = re.compile(r"^ok \d+[^\n#]*#\s*skip", re.M | re.I)


def count(paths):
    """(passed, failed, skipped) over the meson testlog.json files."""
    passed = failed = skipped = 0
    for path in paths:
        try:
            lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
        except OSError as e:
            print(f"count_tests: cannot read {path}: {e}")
            failed += 1
            continue
        for line in lines:
            if not line.strip():
                continue
            rec = json.loads(line)
            out = rec.get("stdout") or ""
            skip = len(SKIPPED.findall(out))
            ok = len(OK.findall(out)) - skip
            bad = len(NOT_OK.findall(out))
            result = rec.get("result", "")
            skipped += skip
            if result == "SKIP" and not ok and not bad:
                skipped += 0 if skip else 1
            elif result in ("OK", "EXPECTEDFAIL", "SKIP"):
                passed += ok if ok or bad or skip else 1
                failed += bad
            else:
                passed += ok
                failed += bad if bad else 1
    return passed, failed, skipped


def report(paths):
    passed, failed, skipped = count(paths)
    print(f"{skipped} skipped (not run, not counted as passed)")
    print(f"{passed} passed, {failed} failed")


def self_test():
    """The rules above on made-up logs: TAP out, exit status 1 on a miss."""
    cases = [
        ("every ok case a pass", [("OK", "1..2\nok 1 - a\nok 2 - b\n")], (2, 0, 0)),
        ("a failing case a failure", [("FAIL", "1..2\nok 1 - a\nnot ok 2 - b\n")], (1, 1, 0)),
        ("a skipped case apart, not a pass",
         [("OK", "1..3\nok 1 - a\nok 2 # SKIP no gdb\nok 3 - c # skip no MPI\n")], (1, 0, 2)),
        ("a skipped program apart", [("SKIP", "1..0 # SKIP no MPI\n"), ("SKIP", "")], (0, 0, 2)),
        ("a crash without a case one failure", [("ERROR", "1..3\n"), ("TIMEOUT", "")], (0, 2, 0)),
        ("a program without TAP that passed one pass", [("OK", "")], (1, 0, 0)),
    ]
    print(f"1..{len(cases)}")
    bad = 0
    for i, (name, recs, want) in enumerate(cases, 1):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            for result, out in recs:
                f.write(json.dumps({"name": name, "result": result, "stdout": out}) + "\n")
        try:
            got = count([f.name])
        finally:
            os.unlink(f.name)
        if got == want:
            print(f"ok {i} - {name}")
        else:
            bad += 1
            print(f"not ok {i} - {name}: (passed, failed, skipped) = {got}, expected {want}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    report(sys.argv[1:])
