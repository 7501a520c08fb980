#!/usr/bin/env python3
"""Counts test cases across meson test logs and prints 'N passed, N failed'.

Each cmocka test prints TAP ('ok N - name' / 'not ok N - name'); every case
counts.  A test program that failed without reporting a failing case
(crash, timeout, sanitizer abort) counts as one failure, and one that passed
without TAP output counts as one pass."""
import json
import re
import sys

passed = failed = 0
for path in sys.argv[1:]:
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
        ok = len(re.findall(r"^ok \d+", out, re.M))
        bad = len(re.findall(r"^not ok \d+", out, re.M))
        result = rec.get("result", "")
        if result in ("OK", "EXPECTEDFAIL", "SKIP"):
            passed += ok if ok or bad else 1
            failed += bad
        else:
            passed += ok
            failed += bad if bad else 1
print(f"{passed} passed, {failed} failed")
