"""bench/peer/norm.py - PyTorch 1.13's side of bench/norm: F.batch_norm
(training, running statistics, weight and bias) and F.group_norm (32
groups) forward + backward of sum(y * cot) on x [16, 64, 28, 28] f32, the
median wall time of 15 steps after 2 warm-ups, on this machine's threads.

Run with /usr/bin/python3 (torch 1.13.1): /usr/bin/python3 bench/peer/norm.py"""
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_env  # noqa: E402


def main():
    peer_env.ensure()
    import torch
    import torch.nn.functional as F
    print("environment: " + peer_env.describe(torch), flush=True)
    shape = [int(a) for a in sys.argv[1:5]] if len(sys.argv) == 5 else [16, 64, 28, 28]
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    cot = torch.randn(shape)
    w = torch.randn(shape[1], requires_grad=True)
    b = torch.randn(shape[1], requires_grad=True)
    rm, rv = torch.zeros(shape[1]), torch.ones(shape[1])
    cases = (("batch_norm (training)", lambda: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)),
             ("group_norm (32 groups)", lambda: F.group_norm(x, 32, w, b, 1e-5)))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, f in cases:
            ts = []
            for i in range(17):
                t0 = time.perf_counter()
                (f() * cot).sum().backward()
                x.grad = w.grad = b.grad = None
                ts.append(time.perf_counter() - t0)
            print(f"{name} {shape} f32, forward + backward: PyTorch {torch.__version__} cpu "
                  f"{statistics.median(ts[2:]) * 1e3:.3f} ms (median of 15, {threads} threads)")

main()
