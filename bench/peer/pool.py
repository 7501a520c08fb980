"""bench/peer/pool.py - PyTorch 1.13's side of bench/pool: F.max_pool2d and
F.avg_pool2d (2x2, stride 2) on x [128, 16, 28, 28] f32, the forward alone
and forward + backward of sum(y * cot), the best wall time of 15 steps after
2 warm-ups (the machine is shared), at 1 and 2 threads.

Run with /usr/bin/python3 (torch 1.13.1): /usr/bin/python3 bench/peer/pool.py [N C H W]"""
import os
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
    shape = [int(a) for a in sys.argv[1:5]] if len(sys.argv) == 5 else [128, 16, 28, 28]
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    cot = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    cases = (("max_pool2d", lambda: F.max_pool2d(x, 2)),
             ("avg_pool2d", lambda: F.avg_pool2d(x, 2)))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, f in cases:
            for bwd in (False, True):
                ts = []
                for i in range(17):
                    t0 = time.perf_counter()
                    if bwd:
                        (f() * cot).sum().backward()
                        x.grad = None
                    else:
                        f()
                    ts.append(time.perf_counter() - t0)
                what = "forward+backward" if bwd else "forward"
                print(f"{name} {what} {shape} f32 2x2: PyTorch {torch.__version__} cpu "
                      f"{min(ts[2:]) * 1e3:.3f} ms (best of 15, {threads} threads)", flush=True)

main()
