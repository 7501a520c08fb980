#!/usr/bin/python3
"""bench/peer/tiny_op.py - PyTorch's host cost of one tiny op, the peer of
bench/dispatch.

torch.add of two f32 [16] tensors from a tight loop, as bench/dispatch times
nt_add: ns per call, the median of --repeats batches of --batch calls (the
outputs kept alive until the batch ends, as bench/dispatch keeps its
handles), at 1 and at 2 threads (a tiny op runs on the calling thread, so
the two should agree).  Batches of 256 are PyTorch's best: one takes about
the wall time of one of bench/dispatch's 4096 (0.3-0.5 ms), and with 4096
calls a batch the median per call was 3.6x higher on a loaded 2-core Zen 4
(4096 live outputs leave the caches, and a longer batch is cut by more of
the scheduler's time slices).  The environment is the peer's best
(bench/peer/peer_env.py).

Prints a first line "environment: ..." and then one JSON line per thread
count: {"case": "tiny_add", "threads": N, "median_ns": ..., "min_ns": ...}

Usage: /usr/bin/python3 bench/peer/tiny_op.py [--batch 256] [--repeats 401]
Needs torch (Debian: python3-torch; sh scripts/deps.sh --bench).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_env  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=401)
    a = ap.parse_args()
    if a.batch < 1 or a.repeats < 1:
        print("tiny_op.py: --batch and --repeats must be >= 1", file=sys.stderr)
        return 2
    peer_env.ensure()
    import torch
    print("environment: " + peer_env.describe(torch), flush=True)
    x = torch.arange(16, dtype=torch.float32)
    y = torch.arange(16, dtype=torch.float32)
    add = torch.add
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs = [None] * a.batch
        per_op = []
        for r in range(a.repeats + 1):
            t0 = time.perf_counter_ns()
            for i in range(a.batch):
                outs[i] = add(x, y)
            t1 = time.perf_counter_ns()
            if r:  # the first batch warms up
                per_op.append((t1 - t0) / a.batch)
        print(json.dumps({"case": "tiny_add", "threads": threads,
                          "median_ns": round(statistics.median(per_op), 1),
                          "min_ns": round(min(per_op), 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
