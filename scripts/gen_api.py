#!/usr/bin/env python3
"""Generates the call-site layer of the public header from one list.

Reads include/ntensor/site.list (one C prototype per call-site function, and
"%optable GROUP" lines standing for the ops of a group of core/optable.h) and
writes, next to it:

  include/ntensor/ops.h   the public prototypes of the op table's unary,
                          binary and comparison ops (nt_neg, nt_add, nt_eq ...)
  include/ntensor/site.h  for every function of the list: its X_at(site, ...)
                          declaration, an entry of NT_SITE_FUNCS(X), and the
                          macro X(...) -> X_at(NT_HERE, ...)

Both files are checked in, because programs compile with -Iinclude alone.

  python3 scripts/gen_api.py           rewrite them
  python3 scripts/gen_api.py --check   exit 1 (TAP "not ok") if either
                                       differs from what the list gives now

--check also holds docs/amp.md's autocast table to the table's amp column:
each op of a "low" or "f32" row has that policy, and each op with one of
those policies is named in a row of it (the rule text cannot fall behind
the code again).

The macros have to be real #defines, which the C preprocessor cannot
generate from a list; everything else in C stays an X-macro."""
import argparse
import os
import re
import sys

LIST = "include/ntensor/site.list"
OPTABLE = "core/optable.h"
OPS_H = "include/ntensor/ops.h"
SITE_H = "include/ntensor/site.h"
AMP_MD = "docs/amp.md"
REGEN = "python3 scripts/gen_api.py"

# The op-table groups that are public elementwise ops, with the kind every
# entry must have and the parameters of its prototype.  The parameter names
# are the ones the ops' error messages use ("argument 't'", "'a'", "'b'").
GROUPS = {
    "NT_OPS_UNARY": ("NT_KIND_UNARY", 1, "nt_tensor *t"),
    "NT_OPS_BINARY": ("NT_KIND_BINARY", 2, "nt_tensor *a, nt_tensor *b"),
    "NT_OPS_CMP": ("NT_KIND_CMP", 2, "nt_tensor *a, nt_tensor *b"),
}
GROUP_TITLES = {
    "NT_OPS_UNARY": "Unary ops, y = f(t)",
    "NT_OPS_BINARY": "Binary ops, broadcasting",
    "NT_OPS_CMP": "Comparisons: u8 tensors of 0/1",
}


class Error(Exception):
    pass


def strip_c_comments(text):
    return re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def macro_body(text, name, path):
    """The replacement list of `#define name(X)`, continuation lines joined."""
    m = re.search(r"^[ \t]*#[ \t]*define[ \t]+" + name + r"\(\s*X\s*\)", text, re.M)
    if not m:
        raise Error(f"{path}: no '#define {name}(X)'")
    body = []
    for line in text[m.end():].split("\n"):
        cont = line.rstrip().endswith("\\")
        body.append(line.rstrip().rstrip("\\"))
        if not cont:
            break
    return " ".join(body)


def split_args(s, start):
    """Arguments of the call whose '(' is at s[start]; returns (args, end)."""
    depth, args, cur, i = 0, [], [], start
    while i < len(s):
        c = s[i]
        if c in "\"'":  # a string or character literal: copied whole
            j = i + 1
            while j < len(s) and s[j] != c:
                j += 2 if s[j] == "\\" else 1
            cur.append(s[i:j + 1])
            i = j + 1
            continue
        if c == "(":
            depth += 1
            if depth > 1:
                cur.append(c)
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args, i + 1
            cur.append(c)
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    raise Error("unbalanced parentheses")


def optable_group(text, group):
    """[(ID, name)] of the X(ID, name, nin, kind, ...) entries of a group.
    Only the first four columns are read: more may follow."""
    kind, nin, _ = GROUPS[group]
    body = macro_body(text, group, OPTABLE)
    ops, pos = [], 0
    for m in re.finditer(r"\bX\s*\(", body):
        if m.start() < pos:
            continue  # an X( inside an earlier entry's extra columns
        args, pos = split_args(body, m.end() - 1)
        where = f"{OPTABLE}: {group} entry X({', '.join(args[:4])}, ...)"
        if len(args) < 4:
            raise Error(f"{where}: expected at least X(ID, name, nin, kind)")
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", args[0]) or \
                not re.fullmatch(r"[a-z][a-z0-9_]*", args[1]):
            raise Error(f"{where}: expected an upper-case ID and a lower-case name")
        if args[2] != str(nin) or args[3] != kind:
            raise Error(f"{where}: a {group} op has nin {nin} and kind {kind}")
        ops.append((args[0], args[1]))
    if not ops:
        raise Error(f"{OPTABLE}: {group} has no entries")
    return ops


def optable_rows(text):
    """{name: [columns]} of every entry of every NT_OPS_* group."""
    rows = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(NT_OPS_\w+)\(\s*X\s*\)", text, re.M):
        body, pos = macro_body(text, m.group(1), OPTABLE), 0
        for x in re.finditer(r"\bX\s*\(", body):
            if x.start() < pos:
                continue
            args, pos = split_args(body, x.end() - 1)
            if len(args) < 7:
                raise Error(f"{OPTABLE}: {m.group(1)} entry X({', '.join(args[:2])}, ...) has "
                            "no amp column")
            rows[args[1]] = args
    if not rows:
        raise Error(f"{OPTABLE}: no NT_OPS_* groups")
    return rows


def amp_doc_problems(root):
    """Where docs/amp.md's autocast table and the amp column disagree."""
    with open(os.path.join(root, OPTABLE), encoding="utf-8") as f:
        policy = {name: cols[6] for name, cols in optable_rows(strip_c_comments(f.read())).items()}
    with open(os.path.join(root, AMP_MD), encoding="utf-8") as f:
        lines = f.read().split("\n")
    want = {"low": "LOW", "f32": "F32"}
    named, problems = {"LOW": set(), "F32": set()}, []
    for no, line in enumerate(lines, 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= set("- "):
            continue
        row_policy = want.get(cells[1], "KEEP")
        for api in re.findall(r"`nt_(\w+)`", cells[0]):
            if api not in policy:
                continue  # a composite (nt_linear): its ops have rows of their own
            if policy[api] != row_policy:
                problems.append(f"{AMP_MD}:{no}: nt_{api} is in a '{cells[1]}' row but its amp "
                                f"column in {OPTABLE} is {policy[api]}")
            if row_policy in named:
                named[row_policy].add(api)
    for name, pol in sorted(policy.items()):
        if pol in named and name not in named[pol]:
            problems.append(f"{AMP_MD}: nt_{name} has amp {pol} in {OPTABLE} but no "
                            f"'{'low' if pol == 'LOW' else 'f32'}' row names it")
    return problems


def parse_proto(proto, where):
    """'ret name(params)' -> (ret, name, [params]); params [] for (void)."""
    m = re.fullmatch(r"(.+?[\s*])(nt_[a-z0-9_]+)\s*\((.*)\)", proto)
    if not m:
        raise Error(f"{where}: expected 'return-type nt_name(parameters)', got '{proto}'")
    ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
    if "(" in params:
        raise Error(f"{where}: {name}: use a typedef for a function-pointer parameter")
    plist = [] if params == "void" else [p.strip() for p in params.split(",")]
    for p in plist:
        # a type and a name: the macros do not need names, but the _at
        # declarations read better with them, and (void) is not ()
        words = re.findall(r"[A-Za-z_]\w*", p)
        if len(words) < 2 or not p.endswith(words[-1]) or words[-1] in ("const", "void"):
            raise Error(f"{where}: {name}: parameter '{p}' needs a type and a name "
                        "(write (void) for none)")
    return ret, name, plist


def read_list(root):
    """The functions of the list in order: (ret, name, [params], group)."""
    with open(os.path.join(root, LIST), encoding="utf-8") as f:
        lines = f.read().split("\n")
    with open(os.path.join(root, OPTABLE), encoding="utf-8") as f:
        optable = strip_c_comments(f.read())
    funcs, pending, seen = [], "", {}
    for no, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{LIST}:{no}"
        if line.startswith("%optable"):
            parts = line.split()
            if len(parts) != 2 or parts[1] not in GROUPS:
                raise Error(f"{where}: expected '%optable <one of {', '.join(GROUPS)}>'")
            _, _, params = GROUPS[parts[1]]
            for _, name in optable_group(optable, parts[1]):
                funcs.append(("nt_tensor *", "nt_" + name,
                              [p.strip() for p in params.split(",")], parts[1], where))
            continue
        pending = (pending + " " + line).strip()
        if pending.count("(") > pending.count(")"):
            continue  # the prototype goes on on the next line
        ret, name, params = parse_proto(re.sub(r"\s+", " ", pending).rstrip(";"), where)
        funcs.append((ret, name, params, None, where))
        pending = ""
    if pending:
        raise Error(f"{LIST}: unfinished prototype at the end: '{pending}'")
    for ret, name, params, group, where in funcs:
        if name in seen:
            raise Error(f"{where}: {name} is listed twice (also {seen[name]})")
        seen[name] = where
    return [f[:4] for f in funcs]


def star(ret, name):
    return f"{ret}{name}" if ret.endswith("*") else f"{ret} {name}"


def wrap(head, params, tail=";", width=96):
    """'head(p1, p2, ...)tail' broken after commas to stay within width."""
    out, line = [], head + "("
    indent = " " * len(line)
    for i, p in enumerate(params):
        piece = p + (", " if i < len(params) - 1 else ")" + tail)
        if len(line) + len(piece.rstrip()) > width and line.strip() not in ("", head + "("):
            out.append(line.rstrip())
            line = indent
        line += piece
    out.append(line)
    return "\n".join(out)


def banner(path, what):
    return (f"/* {path} - generated by scripts/gen_api.py from\n"
            f" * {LIST} and {OPTABLE}; do not edit: change those and run\n"
            f" * `{REGEN}` (the meson test 'api_generated' fails while\n"
            f" * this file is stale).\n"
            f" *\n{what} */\n")


def gen_ops(funcs):
    out = [banner(OPS_H, (
        " * The public prototypes of the op table's elementwise ops (its groups\n"
        " * NT_OPS_UNARY, NT_OPS_BINARY and NT_OPS_CMP): a new op in one of those\n"
        " * groups needs no hand-written declaration.  docs/ops.md gives each op's\n"
        " * exact arithmetic and dtype rules; ntensor.h includes this file in its\n"
        " * section \"Elementwise ops\", and the _at forms and macros are in\n"
        " * include/ntensor/site.h.\n")),
        "#ifndef NTENSOR_OPS_H\n#define NTENSOR_OPS_H\n",
        "#ifndef NTENSOR_H\n#error \"include <ntensor.h>, not ntensor/ops.h\"\n#endif"]
    group = None
    for ret, name, params, g in funcs:
        if not g:
            continue
        if g != group:
            group = g
            out.append(f"\n/* {GROUP_TITLES[g]} ({g}). */")
        out.append(wrap("NT_API " + star(ret, name), params))
    out.append("\n#endif /* NTENSOR_OPS_H */\n")
    return "\n".join(out)


def gen_site(funcs):
    out = [banner(SITE_H, (
        " * The call-site layer.  Each function X of the list also exists as X_at,\n"
        " * taking the caller's site first; in C and C++ the macro X(...) below\n"
        " * calls X_at(NT_HERE, ...), so errors, the fusion log and traces name the\n"
        " * caller's file:line.  NT_NO_SITE_MACROS leaves the plain\n"
        " * functions, which name their caller by return address; NT_HERE and the\n"
        " * _at forms stay usable.  ntensor.h includes this file at its end, after\n"
        " * every prototype the macros would otherwise rewrite.\n")),
        "#ifndef NTENSOR_SITE_H\n#define NTENSOR_SITE_H\n",
        "#ifndef NTENSOR_H\n#error \"include <ntensor.h>, not ntensor/site.h\"\n#endif\n",
        "/* X_at(site, ...): as X, with `site` naming the caller (NT_HERE). */"]
    for ret, name, params, _ in funcs:
        out.append(wrap("NT_API " + star(ret, name + "_at"), ["const nt_site *site"] + params))
    out.append("")
    out.append("/* NT_SITE_FUNCS(X) calls X(ret, name, (params), (site, params), nparams)\n"
               " * for every function above, e.g. to wrap them all; tests/test_api.c\n"
               " * checks through it that prototypes, _at forms and macros agree. */")
    out.append("#define NT_SITE_FUNCS(X) \\")
    for i, (ret, name, params, _) in enumerate(funcs):
        plain = "(" + (", ".join(params) if params else "void") + ")"
        at = "(" + ", ".join(["const nt_site *site"] + params) + ")"
        end = " \\" if i < len(funcs) - 1 else ""
        out.append(f"    X({ret}, {name}, {plain}, {at}, {len(params)}){end}")
    out.append("")
    out.append("#if !defined(NT_NO_SITE_MACROS) && !defined(NT_BUILDING_LIBRARY)")
    for ret, name, params, _ in funcs:
        if params:
            out.append(f"#define {name}(...) {name}_at(NT_HERE, __VA_ARGS__)")
        else:
            out.append(f"#define {name}() {name}_at(NT_HERE)")
    out.append("#endif")
    out.append("\n#endif /* NTENSOR_SITE_H */\n")
    return "\n".join(out)


# Entries as the op table may grow them: more columns after the four read,
# continued over lines, holding parentheses, commas, literals and comments.
PARSE_SAMPLE = r"""
#define NT_OPS_UNARY(X)                                                     \
    X(NEG, neg, 1, NT_KIND_UNARY, NT_OPF_DIFF | NT_OPF_INT,                 \
      NT_ACT(NEG, (a, b)), "x(", ')', /* ( */ X_BWD(neg))                  \
    X(FOO, foo, 1, NT_KIND_UNARY)
"""


def parse_sample_ok():
    ops = optable_group(strip_c_comments(PARSE_SAMPLE), "NT_OPS_UNARY")
    return ops == [("NEG", "neg"), ("FOO", "foo")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare instead of writing; print TAP; exit 1 if stale")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                    help="the source tree (default: this script's parent)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    try:
        funcs = read_list(root)
    except (Error, OSError) as e:
        if args.check:
            print("1..1\nnot ok 1 - read the list")
        print(f"gen_api: {e}", file=sys.stderr)
        return 1
    outputs = [(OPS_H, gen_ops(funcs)), (SITE_H, gen_site(funcs))]
    if args.check:
        print(f"1..{len(outputs) + 2}")
        status = 0
        for i, (path, text) in enumerate(outputs, 1):
            try:
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    same = f.read() == text
            except OSError:
                same = False
            print(f"{'ok' if same else 'not ok'} {i} - {path} matches {LIST} and {OPTABLE}")
            if not same:
                print(f"# {path} is stale: run `{REGEN}` and commit the result")
                print(f"gen_api: {path} is stale: run `{REGEN}` and commit the result",
                      file=sys.stderr)
                status = 1
        sample = parse_sample_ok()
        print(f"{'ok' if sample else 'not ok'} {len(outputs) + 1} - op-table entries with "
              "more columns than ID, name, nin, kind are read")
        try:
            amp = amp_doc_problems(root)
        except (Error, OSError) as e:
            amp = [str(e)]
        print(f"{'not ok' if amp else 'ok'} {len(outputs) + 2} - {AMP_MD}'s autocast table "
              f"matches the amp column of {OPTABLE}")
        for p in amp:
            print(f"# {p}")
            print(f"gen_api: {p}", file=sys.stderr)
        return status if sample and not amp else 1
    for path, text in outputs:
        full = os.path.join(root, path)
        old = None
        if os.path.exists(full):
            with open(full, encoding="utf-8") as f:
                old = f.read()
        if old != text:
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"gen_api: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
