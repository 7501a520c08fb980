#!/usr/bin/python3
"""bench/peer/check_peers.py - the peers' environment is what they promise (TAP).

The meson test peer_env runs it:
  check_peers.py SIM_MATMUL
1. peer_env.ensure(), started with OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE
   and another glibc tunable set, runs the script again once, without the
   two OpenBLAS variables, with the malloc tunables after the user's one and
   OMP_WAIT_POLICY=passive; started with all of that already, it runs on
   without starting again.
2. bench/sim_matmul --openblas, started with OPENBLAS_CORETYPE=Haswell, says
   it runs again and then names the core OpenBLAS picks with nothing set.
Neither needs torch; no time is measured.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, HERE)
import peer_env  # noqa: E402

PINNED = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576",
          "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def child():
    """Prints a line each time this process image starts, then ensure()s
    and prints the environment it runs with as JSON."""
    print("start", flush=True)
    peer_env.ensure()
    keys = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GLIBC_TUNABLES", "OMP_WAIT_POLICY")
    print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
    return 0


def run(cmd, extra, drop=()):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    return p.returncode, p.stdout


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--child":
        return child()
    if len(sys.argv) != 2:
        print("usage: check_peers.py SIM_MATMUL", file=sys.stderr)
        return 2
    sim_matmul = sys.argv[1]
    results = []

    def ok(cond, what, detail=""):
        results.append((bool(cond), what, detail))

    me = [sys.executable, os.path.abspath(__file__), "--child"]
    clean = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GLIBC_TUNABLES", "OMP_WAIT_POLICY",
             peer_env.AGAIN)
    rc, out = run(me, PINNED, drop=clean)
    lines = out.splitlines()
    env = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    ok(rc == 0 and lines.count("start") == 2,
       "a pinned environment: the peer starts again once", out)
    ok(env and env.get("OPENBLAS_CORETYPE") is None and env.get("OPENBLAS_L2_SIZE") is None,
       "the OpenBLAS variables are gone", out)
    ok(env.get("GLIBC_TUNABLES") == PINNED["GLIBC_TUNABLES"] + ":" + peer_env.TUNABLES,
       "glibc's malloc tunables follow the user's own", out)
    ok(env.get("OMP_WAIT_POLICY") == "passive", "OpenMP threads sleep when idle", out)

    rc, out = run(me, {"GLIBC_TUNABLES": peer_env.TUNABLES, "OMP_WAIT_POLICY": "active"},
                  drop=clean)
    lines = out.splitlines()
    env = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    ok(rc == 0 and lines.count("start") == 1,
       "the peer's environment already: no second start", out)
    ok(env.get("OMP_WAIT_POLICY") == "active", "a user's own OMP_WAIT_POLICY is kept", out)

    rc0, free = run([sim_matmul, "--openblas"], {}, drop=clean)
    rc1, pinned = run([sim_matmul, "--openblas"], {"OPENBLAS_CORETYPE": "Haswell"}, drop=clean)
    core = [l for l in free.splitlines() if l.startswith("OpenBLAS:")]
    core_p = [l for l in pinned.splitlines() if l.startswith("OpenBLAS:")]
    ok(rc0 == 0 and rc1 == 0 and "running again without it" in pinned,
       "sim_matmul, pinned: says it runs again", pinned)
    ok(core and core == core_p, "sim_matmul, pinned: OpenBLAS runs the core it picks unpinned",
       free + pinned)

    print("1..%d" % len(results))
    for i, (good, what, detail) in enumerate(results, 1):
        print("%s %d - %s" % ("ok" if good else "not ok", i, what))
        if not good:
            for line in detail.splitlines():
                print("# " + line)
    return 0 if all(r[0] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
