#!/usr/bin/env python3
"""PyTorch 1.13 references for the reductions over dim lists and the running
ops (tests/test_reductions.c): sum_dims, mean_dims, amax, amin, var, std,
logsumexp, prod, cumsum, cumprod on odd shapes with NaN, +-Inf, zeros and
ties in rows, their values and the gradients for a fixed upstream gradient.

    /usr/bin/python3 scripts/torch_refs/reduce.py > tests/torch_refs/reduce.h

Writes f32 values as their bit patterns (uint32_t hex)."""
import struct
import sys

import torch

torch.manual_seed(34)
POOL = []


def put(t):
    off = len(POOL)
    for v in t.detach().reshape(-1).tolist():
        POOL.append(struct.unpack("<I", struct.pack("<f", v))[0])
    return off


CASES = []


def case(op, x, dims, keepdim=False, corr=1.0, grad=True):
    """dims: a list (dim-list ops), an int (prod/cum ops) or None (NT_DIM_ALL)."""
    x = x.clone().float().requires_grad_(grad)
    if op == "sum_dims":
        y = torch.sum(x, dims, keepdim=keepdim)
    elif op == "mean_dims":
        y = torch.mean(x, dims, keepdim=keepdim)
    elif op == "amax":
        y = torch.amax(x, dims, keepdim=keepdim)
    elif op == "amin":
        y = torch.amin(x, dims, keepdim=keepdim)
    elif op == "var":
        y = torch.var(x, dims, correction=int(corr), keepdim=keepdim) if hasattr(torch, "var") else None
    elif op == "std":
        y = torch.std(x, dims, correction=int(corr), keepdim=keepdim)
    elif op == "logsumexp":
        y = torch.logsumexp(x, dims, keepdim=keepdim)
    elif op == "prod":
        y = torch.prod(x) if dims is None else torch.prod(x, dims, keepdim=keepdim)
        if dims is None and keepdim:
            y = y.reshape([1] * x.dim())
    elif op == "cumsum":
        y = torch.cumsum(x, dims)
    elif op == "cumprod":
        y = torch.cumprod(x, dims)
    else:
        raise ValueError(op)
    g = torch.randn(y.shape)
    gx = None
    if grad:
        (gx,) = torch.autograd.grad(y, x, g)
    if isinstance(dims, list):
        dl = dims
    elif dims is None:
        dl = None
    else:
        dl = [dims]
    CASES.append(dict(op=op, shape=list(x.shape), dims=dl, keepdim=keepdim, corr=corr,
                      x=put(x), n=x.numel(), oshape=list(y.shape), y=put(y), ny=y.numel(),
                      g=put(g), gx=put(gx) if gx is not None else -1))


def ties(shape, lo=-3, hi=3):
    return torch.randint(lo, hi + 1, shape).float()


def main():
    x357 = torch.randn(3, 5, 7)
    x_special = torch.randn(3, 5, 7)
    x_special[0, 1, :] = float("nan")
    x_special[1, 2, 3] = float("inf")
    x_special[2, 0, :] = float("-inf")
    x_special[2, 4, 1] = float("-inf")
    x_special[1, 3, 5] = -0.0
    # sums and means over dim lists
    case("sum_dims", x357, [0, 2])
    case("sum_dims", x357, [-1, 0], keepdim=True)
    case("sum_dims", x357, [])
    case("sum_dims", torch.randn(3, 1, 4), [1])
    case("sum_dims", torch.randn(2, 3, 4, 5), [1, 3])
    case("sum_dims", x_special, [1, 2], grad=False)
    case("mean_dims", x357, [1, 2])
    case("mean_dims", x357, [2, 0], keepdim=True)
    case("mean_dims", torch.randn(2, 3, 4, 5), [0, 3])
    # amax / amin: ties, NaN, +-Inf, -0
    t = ties((3, 5, 7))
    case("amax", t, [0, 2])
    case("amax", t, [1], keepdim=True)
    case("amax", t, [])
    case("amax", x_special, [2])
    case("amax", x_special, [0, 1], keepdim=True)
    case("amin", t, [0, 2])
    case("amin", t, [-1, -2])
    case("amin", x_special, [2], keepdim=True)
    z = torch.tensor([[0.0, -0.0, 1.0], [-0.0, -0.0, -1.0]])
    case("amax", z, [0])
    case("amin", z, [0])
    # var / std
    case("var", x357, [1])
    case("var", x357, [0, 2], corr=0.0)
    # (not dim=[]: PyTorch 1.13 then gives the value over every dim but an
    # infinite gradient, as if each element were its own row)
    case("var", x357, [0, 1, 2], keepdim=True)
    case("var", torch.randn(4, 1, 3), [1])  # n = 1, correction 1: NaN
    case("var", x_special, [2], grad=False)
    case("var", torch.randn(3, 5, 7) * 1e3 + 1e4, [2])
    case("std", x357, [2])
    case("std", x357, [0, 1], corr=0.0, keepdim=True)
    case("std", x_special, [2], grad=False)
    # logsumexp
    case("logsumexp", x357 * 10, [2])
    case("logsumexp", x357, [0, 2], keepdim=True)
    case("logsumexp", x_special, [2])
    case("logsumexp", x_special, [1, 2])
    lx = torch.tensor([[float("-inf")] * 4, [float("inf"), 1.0, 2.0, 3.0],
                       [100.0, 100.0, -100.0, 90.0], [float("inf"), float("inf"), 0.0, 0.0]])
    case("logsumexp", lx, [1])
    # prod: zeros in rows
    p = torch.rand(3, 5, 7) + 0.5
    p[0, 2, 1] = 0.0
    p[1, :, 3] = 0.0
    p[2, 1, 2] = 0.0
    p[2, 3, 2] = -0.0
    case("prod", p, 1)
    case("prod", p, -1, keepdim=True)
    case("prod", p[:, :2, :3], None)
    case("prod", x_special, 2, grad=False)
    # cumsum / cumprod
    case("cumsum", x357, 1)
    case("cumsum", x357, -1)
    case("cumsum", x_special, 2, grad=False)
    case("cumprod", p, 2)
    case("cumprod", p, 1)
    case("cumprod", torch.tensor([[2.0, 0.0, 3.0, 0.0, 5.0], [1.5, -2.0, 0.0, 4.0, 0.5]]), 1)

    w = sys.stdout.write
    w("/* tests/torch_refs/reduce.h - generated by scripts/torch_refs/reduce.py with\n"
      " * PyTorch %s; do not edit.  Regenerate:\n"
      " *   /usr/bin/python3 scripts/torch_refs/reduce.py > tests/torch_refs/reduce.h\n"
      " * f32 values as bit patterns in rr_pool; each case names its input x, its\n"
      " * result y, the upstream gradient g (y's shape) and PyTorch's gradient gx\n"
      " * of x (-1: none).  dims: ndims -1 means NT_DIM_ALL (prod). */\n" % torch.__version__)
    w("#include <stdint.h>\n\n")
    w("typedef struct rr_case {\n    const char *op;\n    int ndim;\n    int64_t shape[6];\n"
      "    int ndims;\n    int dims[6];\n    int keepdim;\n    double corr;\n    int64_t x, n;\n"
      "    int ondim;\n    int64_t oshape[6];\n    int64_t y, ny, g, gx;\n} rr_case;\n\n")
    w("static const uint32_t rr_pool[] = {\n")
    for i in range(0, len(POOL), 8):
        w("    " + ", ".join("0x%08xu" % v for v in POOL[i:i + 8]) + ",\n")
    w("};\n\nstatic const rr_case rr_cases[] = {\n")
    for c in CASES:
        def arr(v):
            v = list(v) or [0]
            return "{" + ", ".join(str(int(a)) for a in v) + "}"
        nd = -1 if c["dims"] is None else len(c["dims"])
        w('    {"%s", %d, %s, %d, %s, %d, %.1f, %d, %d, %d, %s, %d, %d, %d, %d},\n' % (
            c["op"], len(c["shape"]), arr(c["shape"]), nd, arr(c["dims"] or []),
            int(c["keepdim"]), c["corr"], c["x"], c["n"], len(c["oshape"]), arr(c["oshape"]),
            c["y"], c["ny"], c["g"], c["gx"]))
    w("};\n")


if __name__ == "__main__":
    main()
