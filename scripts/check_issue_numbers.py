#!/usr/bin/python3
"""Checks that no user-facing text names a tracker issue by number (TAP).

A user of ntensor knows no issue numbers, so a text that quotes "issue N's
ratios" or a target "(issue N)" says nothing to them: it should say what the
figure or the target is.  Looked at: README.md and every docs/*.md whole, and the string
literals of the C and Python sources (what a program prints or raises) under
the library's folders, bench/, examples/ and tools/.

Usage: check_issue_numbers.py [--tap] ROOT
"""
import os
import re
import sys

NUMBERED = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
C_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
PY_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
SKIP_DIRS = {".git", "tests", "scratch"}


def texts(root):
    """(path, line number, text to check) for every place looked at."""
    for name in ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs"))
                                       if f.endswith(".md")):
        with open(os.path.join(root, name), encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                yield name, i, line
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        dirnames[:] = [d for d in dirnames
                       if d not in SKIP_DIRS and not d.startswith("build")
                       and not (rel == "." and d == "docs")]
        if top in SKIP_DIRS or top.startswith("build"):
            continue
        for fn in sorted(filenames):
            strings = (C_STRING if fn.endswith((".c", ".h"))
                       else PY_STRING if fn.endswith(".py") else None)
            if strings is None:
                continue
            path = os.path.normpath(os.path.join(rel, fn))
            with open(os.path.join(dirpath, fn), encoding="utf-8", errors="replace") as f:
                for i, line in enumerate(f, 1):
                    for m in strings.finditer(line):
                        yield path, i, m.group(0)


def main():
    args = [a for a in sys.argv[1:] if a != "--tap"]
    if len(args) != 1:
        print("usage: check_issue_numbers.py [--tap] ROOT", file=sys.stderr)
        return 2
    found = [(p, i, NUMBERED.search(t).group(0)) for p, i, t in texts(args[0])
             if NUMBERED.search(t)]
    print("1..1")
    if found:
        print("not ok 1 - user-facing text names no issue by number")
        for p, i, what in found:
            print("# %s:%d: '%s': say what the figure or target is instead" % (p, i, what))
        return 1
    print("ok 1 - user-facing text names no issue by number")
    return 0


if __name__ == "__main__":
    sys.exit(main())
