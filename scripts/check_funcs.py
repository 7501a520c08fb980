#!/usr/bin/env python3
"""Checks that no library function is longer than MAX_LINES lines.

A function of hundreds of lines is read, reviewed and changed as one piece;
split by step or by op (named static functions, `static inline` where a call
in a hot loop would cost), it says what each step does.  The library is the
units of scripts/check_layering.py (core, cpu, sim, streams, fusion,
dispatcher, autograd, amp, io, dist, debug, init); tests, bench, examples
and tools are not checked.

A function's length counts from the line that names it to the line of its
closing brace.  The scanner blanks comments, string and character literals
and preprocessor lines (a macro's body is not a function), then takes each
brace block at file scope whose opening brace follows a parameter list.

The script fails, naming file:line and the function, for each function over
the limit that the allow-list does not name, and for each allow-list entry
that no longer names a long function (so the list cannot go stale).

Usage: check_funcs.py [--tap] [--list N] [ROOT]
  --tap     print TAP (the meson test 'func_length')
  --list N  print every library function of N lines or more, longest first,
            and exit 0
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layering import library_files, unit_of  # noqa: E402  (one list of units)

MAX_LINES = 150

# Functions allowed over the limit, as (file, function): none.  An entry
# would be a debt with an owner, not an exemption, and one that no longer
# names a long function fails the check.
ALLOWED = set()

IDENT = re.compile(r"[A-Za-z_]\w*")
NOT_NAMES = {"if", "for", "while", "switch", "return", "sizeof", "_Alignof", "alignof",
             "__attribute__", "__typeof__", "typeof", "_Generic", "defined"}


def blank(text):
    """text with comments, literals and preprocessor lines turned to spaces
    (newlines kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":
            # a directive, with its continuation lines
            j = i
            while j < n and text[j] != "\n":
                if text.startswith("/*", j):  # a comment inside a directive
                    k = text.find("*/", j + 2)
                    j = n if k < 0 else k + 2
                    continue
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        line_start = c == "\n"
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function defined in text."""
    code = blank(text)
    line_of = lambda pos: code.count("\n", 0, pos) + 1
    found = []
    depth = 0
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "{":
            if depth == 0:
                name_pos = definition_name(code, i)
                if name_pos is not None:
                    end = matching(code, i, "{", "}")
                    if end is None:
                        break
                    name, pos = name_pos
                    found.append((name, line_of(pos), line_of(end)))
                    i = end + 1
                    continue
            depth += 1
        elif c == "}":
            depth = max(depth - 1, 0)
        i += 1
    return found


def matching(code, i, open_c, close_c):
    """The offset of the bracket that closes the one at i, or None."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_c:
            depth += 1
        elif code[j] == close_c:
            depth -= 1
            if depth == 0:
                return j
    return None


def definition_name(code, brace):
    """(name, offset) if the brace at file scope opens a function body: it
    follows `name(parameters)` (and perhaps attributes); None for a struct,
    an enum or an initializer."""
    j = brace - 1
    while True:
        while j >= 0 and code[j].isspace():
            j -= 1
        if j < 0 or code[j] != ")":
            return None
        k = j
        depth = 0
        while k >= 0:  # back to the matching '('
            if code[k] == ")":
                depth += 1
            elif code[k] == "(":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        if k < 0:
            return None
        e = k - 1
        while e >= 0 and code[e].isspace():
            e -= 1
        s = e
        while s >= 0 and (code[s].isalnum() or code[s] == "_"):
            s -= 1
        name = code[s + 1:e + 1]
        if not IDENT.fullmatch(name or "-"):
            return None
        if name in ("__attribute__", "G_GNUC_PRINTF", "G_GNUC_NULL_TERMINATED"):
            j = s  # an attribute after the parameters: look further back
            continue
        if name in NOT_NAMES:
            return None
        return name, s + 1


def scan(root, limit):
    """(file, line, name, lines) of each library function of `limit` lines or more."""
    out = []
    for rel in library_files(root):
        if unit_of(rel) == "include":
            continue  # the public headers: declarations, not library code
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for name, first, last in functions(text):
            length = last - first + 1
            if length >= limit:
                out.append((rel, first, name, length))
    return out


def main(argv):
    tap = "--tap" in argv
    list_n = None
    args = []
    it = iter(argv)
    for a in it:
        if a == "--list":
            list_n = int(next(it))
        elif not a.startswith("--"):
            args.append(a)
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    if list_n is not None:
        for rel, line, name, length in sorted(scan(root, list_n), key=lambda f: -f[3]):
            print(f"{length:5d}  {rel}:{line} {name}")
        return 0
    long_funcs = scan(root, MAX_LINES + 1)
    too_long = [f"{rel}:{line}: {name} is {length} lines; the limit is {MAX_LINES} "
                "(split it by step or by op: scripts/check_funcs.py)"
                for rel, line, name, length in long_funcs if (rel, name) not in ALLOWED]
    present = {(rel, name) for rel, _, name, _ in long_funcs}
    stale = [f"scripts/check_funcs.py: ALLOWED names {rel}'s {name}, which is not over "
             f"{MAX_LINES} lines (or is gone): remove the entry"
             for rel, name in sorted(ALLOWED - present)]
    checks = [
        (f"no library function over {MAX_LINES} lines", too_long),
        ("every allow-list entry names a long function", stale),
    ]
    failed = 0
    if tap:
        print(f"1..{len(checks)}")
    for i, (name, errs) in enumerate(checks, 1):
        for e in errs:
            print(("# " if tap else "") + e)
        if tap:
            print(f"{'not ok' if errs else 'ok'} {i} - {name}")
        failed += bool(errs)
    if not tap:
        print("func_length: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
