#!/usr/bin/env python3
"""Where a captured step's HBM bytes go: one replay's kernels by kind.

Reads an NT_TRACE file (the default `kernel` level) holding one graph replay
and prints, per kind of kernel -- the simulated kernel's name and the call it
runs (its op, and whose backward or which call it is part of) -- how many
kernels, the HBM bytes they read and wrote, and their simulated spans summed
(kernels overlap, so spans add up to more than the step).  The replay's
kernels are paired in order with the host's spans of the step that recorded
them (the worker's span per kernel: the op and its site).

  NT_TRACE=/tmp/t.json NT_TRACE_STEPS=1 build/examples/char_gpt --capture \\
      --steps 20 --sample 0
  python3 scripts/kernel_bytes.py /tmp/t.json [--by-site | --by-kernel]

--by-site splits the kinds further by the call's site (file:line);
--by-kernel (and any replay with a foreach kernel, whose programs' host
spans do not pair one to one with kernels) groups by the kernel's name only.
--by-ops names a fused kernel by its ops ('fused row: mul clamp cast abs max')
and adds a column: the time each kind adds to the step, a kernel's end past
the end of every kernel that started before it (the columns sum to the
replay's length: what the step waits for; spans overlap).  Run with
NT_FOREACH=0 so that every program is a kernel of its own.
"""
import collections
import json
import sys


def kind_of(host_name):
    """'nt_sum (backward of nt_add)' -> 'nt_sum backward of nt_add';
    'fused matmul+epilogue kernel #12 (3 ops)' -> 'fused matmul+epilogue'."""
    if host_name.startswith("fused "):
        return host_name.split(" kernel")[0]
    if "(" in host_name:
        op, rest = host_name.split(" (", 1)
        return op + " " + rest.rstrip(")")
    return host_name


def ops_of(host):
    """'fused row: mul clamp cast abs max' from a fused kernel's host span."""
    ops = (host.get("args") or {}).get("ops")
    if not ops:
        return kind_of(host["name"])
    return kind_of(host["name"]) + ": " + " ".join(
        o.split(" (")[0].replace("nt_", "") for o in ops)


def added(sim):
    """Per kernel: how far its end lies past the end of every kernel that
    started before it (in the order of their starts; the first kernel's
    from the replay's start)."""
    out = [0.0] * len(sim)
    end = min(k["ts"] for k in sim)
    for i in sorted(range(len(sim)), key=lambda i: sim[i]["ts"]):
        fin = sim[i]["ts"] + sim[i]["dur"]
        out[i] = max(0.0, fin - end)
        end = max(end, fin)
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip())
        return 2
    by_site = "--by-site" in argv[2:]
    by_ops = "--by-ops" in argv[2:]
    with open(argv[1]) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    sim = [e for e in ev if e.get("ph") == "X" and (e.get("args") or {}).get("in_program")]
    sim_pid = sim[0]["pid"] if sim else None
    host = [e for e in ev if e.get("ph") == "X" and e.get("pid") != sim_pid
            and not e["name"].startswith("sync") and "in nt_graph_replay" not in e["name"]]
    # the host spans of the replay's own kernels are its last len(sim) ones
    # of the recording: pair from the end of the list the same length
    if not sim:
        print("no kernel of a replayed program in %s (trace a replay: NT_TRACE_STEPS)" % argv[1])
        return 1
    host = host[-len(sim):] if len(host) >= len(sim) else []
    # a foreach kernel runs several recorded programs, each its own host
    # span: the spans no longer pair one to one, so only the kernels' names
    # are shown then
    if "foreach" in {k["name"] for k in sim} or "--by-kernel" in argv[2:]:
        host = []
    agg = collections.defaultdict(lambda: [0, 0, 0, 0.0, 0.0])
    add = added(sim)
    for i, k in enumerate(sim):
        h = host[i] if host else None
        what = (ops_of(h) if by_ops else kind_of(h["name"])) if h else ""
        if by_site and h:
            what += "  @" + h["args"].get("site", "").split(" in ")[0].lstrip("./")
        a = agg[(k["name"], what)]
        a[0] += 1
        a[1] += k["args"]["hbm_read"]
        a[2] += k["args"]["hbm_write"]
        a[3] += k["dur"]
        a[4] += add[i]
    tot = [sum(v[i] for v in agg.values()) for i in range(5)]
    mib = 1 << 20
    extra = (" added us |", " --- |") if by_ops else ("", "")
    print("| kernel | call | kernels | read MiB | written MiB | share | spans us |" + extra[0])
    print("| --- | --- | --- | --- | --- | --- | --- |" + extra[1])
    order = (lambda kv: -kv[1][4]) if by_ops else (lambda kv: -(kv[1][1] + kv[1][2]))
    for (name, what), v in sorted(agg.items(), key=order):
        print("| %s | %s | %d | %.1f | %.1f | %.1f%% | %.0f |" % (
            name, what, v[0], v[1] / mib, v[2] / mib,
            100.0 * (v[1] + v[2]) / max(1, tot[1] + tot[2]), v[3])
            + (" %.0f |" % v[4] if by_ops else ""))
    print("| all | | %d | %.1f | %.1f | 100%% | %.0f |" % (
        tot[0], tot[1] / mib, tot[2] / mib, tot[3]) + (" %.0f |" % tot[4] if by_ops else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
