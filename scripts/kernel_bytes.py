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


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip())
        return 2
    by_site = "--by-site" in argv[2:]
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
    agg = collections.defaultdict(lambda: [0, 0, 0, 0.0])
    for i, k in enumerate(sim):
        h = host[i] if host else None
        what = kind_of(h["name"]) if h else ""
        if by_site and h:
            what += "  @" + h["args"].get("site", "").split(" in ")[0].lstrip("./")
        a = agg[(k["name"], what)]
        a[0] += 1
        a[1] += k["args"]["hbm_read"]
        a[2] += k["args"]["hbm_write"]
        a[3] += k["dur"]
    tot = [sum(v[i] for v in agg.values()) for i in range(4)]
    mib = 1 << 20
    print("| kernel | call | kernels | read MiB | written MiB | share | spans us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, what), v in sorted(agg.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print("| %s | %s | %d | %.1f | %.1f | %.1f%% | %.0f |"
              % (name, what, v[0], v[1] / mib, v[2] / mib,
                 100.0 * (v[1] + v[2]) / max(1, tot[1] + tot[2]), v[3]))
    print("| all | | %d | %.1f | %.1f | 100%% | %.0f |"
          % (tot[0], tot[1] / mib, tot[2] / mib, tot[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
