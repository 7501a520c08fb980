#!/usr/bin/env python3
"""Checks the library's layering (docs/architecture.md, "Layers").

Each module ("unit") of the library may include only the units its row of
LAYERS lists, all of lower rank, so the include graph has no cycle and no
include goes up.  The script fails, naming file:line and the include, when

  - a quoted include names a unit its file's unit may not include, or does
    not resolve from the repository root or include/ (includes are by folder
    path: "core/internal.h");
  - a library file declares a weak symbol or a constructor/destructor: a
    call between modules goes through a table that nt_init fills
    (init/init.c), which the includes show and the compiler checks;
  - an internal function (nt__*) is declared in a unit below the one that
    defines it (a call up the layers that no include shows), or a .c file
    writes its own prototype of another unit's function (the compiler would
    not see a signature change).

Usage: check_layering.py [--tap] [--matrix] [ROOT]
  --tap     print TAP (the meson test 'layering')
  --matrix  print, for each unit, the units it includes, and exit 0
"""
import os
import re
import sys

# (unit, rank, the units it may include).  A unit is a folder of the
# repository, or one header that forms a layer of its own (fusion/ir.h).
# The longest matching prefix decides a file's unit.
LAYERS = [
    ("include", -1, []),                         # the public headers
    ("core", 0, ["include"]),                    # handles, arena, op table, one arithmetic, interfaces
    ("sim", 1, ["include", "core"]),             # the NeuronCore model
    ("streams", 1, ["include", "core"]),         # queues, workers, events
    ("fusion/ir.h", 1, ["include", "core"]),     # the fused-program IR the backends run
    ("debug", 2, ["include", "core", "sim", "streams"]),  # NaN hunt, host trace, stats
    # Backends implement core/backend.h; only the registration names them.
    ("cpu", 3, ["include", "core", "streams", "fusion/ir.h"]),
    ("neuron", 3, ["include", "core", "fusion/ir.h", "sim"]),  # the NeuronCore backend
    ("fusion", 4, ["include", "core", "sim", "streams", "fusion/ir.h", "debug"]),
    ("dispatcher", 5, ["include", "core", "sim", "streams", "fusion/ir.h", "debug", "fusion"]),
    ("autograd", 6, ["include", "core", "streams", "debug", "fusion", "dispatcher"]),
    ("amp", 7, ["include", "core", "streams", "debug", "dispatcher", "autograd"]),
    ("io", 8, ["include", "core", "streams", "debug", "dispatcher", "autograd", "amp"]),
    # Collectives over cores and processes (MPI): ops queued like the
    # dispatcher's, above autograd so data parallel can use both.
    ("dist", 9, ["include", "core", "sim", "streams", "fusion/ir.h", "debug", "fusion",
                 "dispatcher", "autograd", "amp", "io"]),
    # The one place that knows every module: registers them at nt_init.
    ("init", 10, ["include", "core", "sim", "streams", "fusion/ir.h", "debug", "cpu",
                  "neuron", "fusion", "dispatcher", "autograd", "amp", "io", "dist"]),
]
RANK = {u: r for u, r, _ in LAYERS}
ALLOWED = {u: set(a) for u, _, a in LAYERS}
# Not library code: they may include anything.
OUTSIDE = ("tests", "bench", "examples", "tools", "build", "scripts", "docs")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# __attribute__((weak)), ((constructor(101))), ((used, constructor)), #pragma weak
BANNED = re.compile(r'__attribute__\s*\(\((?:[^()]|\([^()]*\))*\b(weak|constructor|destructor)\b'
                    r'|^\s*#\s*pragma\s+weak\b')


def unit_of(rel):
    """The unit of a repository-relative path, or None outside the library."""
    best = None
    for u, _, _ in LAYERS:
        if rel == u or rel.startswith(u + "/"):
            if best is None or len(u) > len(best):
                best = u
    return best


def check_table():
    """Every allowed include goes to a unit of lower rank: no cycle."""
    errs = []
    for u, r, allowed in LAYERS:
        for a in allowed:
            if a not in RANK:
                errs.append(f"LAYERS: {u} lists unknown unit {a}")
            elif RANK[a] >= r:
                errs.append(f"LAYERS: {u} (rank {r}) may not include {a} (rank {RANK[a]})")
    return errs


def library_files(root):
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        if rel_dir != "." and (top.startswith(".") or top in OUTSIDE):
            dirs[:] = []
            continue
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                rel = os.path.normpath(os.path.join(rel_dir, f)).replace(os.sep, "/")
                if unit_of(rel):
                    yield rel


def resolve(root, inc):
    """The repository path an include names: from the root, or include/."""
    for base in ("", "include/"):
        if os.path.isfile(os.path.join(root, base + inc)):
            return os.path.normpath(base + inc).replace(os.sep, "/")
    return None


def scan(root):
    layer_errs, banned_errs, matrix = [], [], {}
    for rel in library_files(root):
        u = unit_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
        in_comment = False
        for no, line in enumerate(lines, 1):
            code = line
            # Drop comments, so a comment that names an attribute is fine.
            if in_comment:
                end = code.find("*/")
                if end < 0:
                    continue
                code, in_comment = code[end + 2:], False
            code = re.sub(r"/\*.*?\*/", "", code)
            if "/*" in code:
                code, in_comment = code[:code.index("/*")], True
            code = code.split("//")[0]
            if BANNED.search(code):
                banned_errs.append(f"{rel}:{no}: {line.strip()}: no weak symbols or "
                                   "constructors in the library (register at nt_init: "
                                   "init/init.c)")
            m = INCLUDE.match(code)
            if not m:
                continue
            inc = m.group(1)
            target = resolve(root, inc)
            if target is None:
                layer_errs.append(f'{rel}:{no}: #include "{inc}": not found from the '
                                  "repository root or include/ (include by folder path)")
                continue
            tu = unit_of(target)
            if tu is None or tu == u:
                continue
            matrix.setdefault(u, set()).add(tu)
            if tu not in ALLOWED[u]:
                layer_errs.append(
                    f'{rel}:{no}: #include "{inc}": {u} (rank {RANK[u]}) may not include '
                    f"{tu} (rank {RANK[tu]}); it may include: "
                    f"{', '.join(sorted(ALLOWED[u])) or 'nothing'}")
    return layer_errs, banned_errs, matrix


# a non-static function definition / a prototype, starting in column 0
DEFN = re.compile(r"^(?!static\b)[A-Za-z_][\w \t*]*?\b(nt__\w+)\s*\(([^;{}]*)\)\s*\{", re.M)
DECL = re.compile(r"^(?!static\b|typedef\b|return\b)[A-Za-z_][\w \t*]*?\b(nt__\w+)\s*\(([^;{}]*)\)"
                  r"\s*(?:G_GNUC_\w+(?:\([^()]*\))?\s*)*;", re.M)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text,
                  flags=re.S)


def scan_decls(root):
    """Where each internal function is defined, and every prototype of it."""
    defined, decls = {}, []
    for rel in library_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            text = strip_comments(fh.read())
        line_of = lambda pos: text.count("\n", 0, pos) + 1
        if rel.endswith(".c"):
            for m in DEFN.finditer(text):
                defined.setdefault(m.group(1), rel)
        for m in DECL.finditer(text):
            decls.append((m.group(1), rel, line_of(m.start(1))))
    errs = []
    for name, rel, no in decls:
        home = defined.get(name)
        if home is None:
            continue  # a public function's _at form, or defined by a macro
        du, hu = unit_of(rel), unit_of(home)
        if du == hu:
            continue
        if rel.endswith(".c"):
            errs.append(f"{rel}:{no}: {name} is {home}'s: declare it in {hu}'s header, "
                        "not in the caller")
        elif RANK[du] < RANK[hu]:
            errs.append(f"{rel}:{no}: {name} is declared in {du} (rank {RANK[du]}) but defined "
                        f"in {home} ({hu}, rank {RANK[hu]}): a call up the layers")
    return errs


def main(argv):
    tap = "--tap" in argv
    want_matrix = "--matrix" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    table_errs = check_table()
    layer_errs, banned_errs, matrix = scan(root)
    decl_errs = scan_decls(root)
    if want_matrix:
        for u, _, _ in LAYERS:
            if u in matrix:
                print(f"{u:12s} -> {', '.join(sorted(matrix[u]))}")
        return 0
    checks = [
        ("the layer table has no cycle", table_errs),
        ("every include goes down the layering", layer_errs),
        ("no weak symbol or constructor in the library", banned_errs),
        ("every internal function is declared by its own unit or above", decl_errs),
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
        print("layering: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
