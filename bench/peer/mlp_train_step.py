#!/usr/bin/python3
"""bench/peer/mlp_train_step.py - the PyTorch peer of bench/train_step.

The model and step of bench/train_step's MLP, in PyTorch eager on the CPU:
Linear 784 -> 1024, ReLU, Linear 1024 -> 1024, ReLU, Linear 1024 -> 10
(nn.Linear's own initialisation, seed 0), cross-entropy over a fixed batch of
128 normal rows with random labels, AdamW (lr 1e-3, betas 0.9 and 0.999, eps
1e-8, weight decay 0.01).  One step: drop the gradients (set to None), the
forward and the loss (under bf16 autocast for precision bf16), backward,
the optimizer's step and loss.item(), the one sync a training loop needs
per step -- what bench/train_step times for ours.

Each precision runs at each thread count of --threads (torch.set_num_threads;
a fresh model each time), so the caller can compare with the faster: on 2
cores one thread was sometimes the faster.  The environment is the peer's
best (bench/peer/peer_env.py: OpenBLAS picks its own kernels, glibc keeps
freed blocks, OpenMP threads sleep when idle).

Prints a first line "environment: ..." and then one JSON line per run:
  {"case": "mlp_train_step", "precision": "fp32", "threads": 1,
   "median_ms": ..., "min_ms": ..., "steps": N, "warmup": W}

Usage: /usr/bin/python3 bench/peer/mlp_train_step.py [--steps N] [--warmup N]
           [--precision fp32,bf16] [--threads 1,2]
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

BATCH, IN, HID, OUT = 128, 784, 1024, 10


def measure(torch, precision, threads, steps, warmup):
    """Median and fastest ms of `steps` steps after `warmup` untimed ones."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(),
                        nn.Linear(HID, OUT))
    adamw = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                              weight_decay=0.01)
    x = torch.randn(BATCH, IN)
    labels = torch.randint(0, OUT, (BATCH,))
    low = precision == "bf16"

    def one_step():
        adamw.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            loss = torch.nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        adamw.step()
        return loss.item()

    for _ in range(warmup):
        one_step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        one_step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--precision", default="fp32,bf16", help="fp32, bf16 or both, comma-separated")
    ap.add_argument("--threads", default="1,2", help="thread counts to run, comma-separated")
    a = ap.parse_args()
    precisions = a.precision.split(",")
    try:
        threads = [int(t) for t in a.threads.split(",")]
    except ValueError:
        threads = []
    if (a.steps < 1 or a.warmup < 0 or not threads or min(threads) < 1
            or any(p not in ("fp32", "bf16") for p in precisions)):
        print("mlp_train_step.py: --steps >= 1, --warmup >= 0, --precision of fp32 and bf16, "
              "--threads of counts >= 1", file=sys.stderr)
        return 2
    peer_env.ensure()
    try:
        import torch
    except ImportError:
        print("mlp_train_step.py: torch is not installed (Debian: python3-torch; "
              "sh scripts/deps.sh --bench)", file=sys.stderr)
        return 2
    print("environment: " + peer_env.describe(torch), flush=True)
    for p in precisions:
        for n in threads:
            med, best = measure(torch, p, n, a.steps, a.warmup)
            print(json.dumps({"case": "mlp_train_step", "precision": p, "threads": n,
                              "median_ms": round(med, 3), "min_ms": round(best, 3),
                              "steps": a.steps, "warmup": a.warmup}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
