#!/usr/bin/python3
"""PyTorch 1.13 references for the indexing and shape ops (scatter family, views, one_hot).

Run with the system python that has torch 1.13.1:
    /usr/bin/python3 scripts/torch_refs/shapeidx.py > tests/torch_refs/shapeidx.h
tests/test_shapeops.c reads the header: every case has its inputs (f32 as
bit patterns), integer arguments, PyTorch's output and, for a floating
output, the gradients of sum(out * w) for the w given.  Shapes are odd (a
size-1 dim, 3x5x7); values include +-0, +-Inf, NaN, subnormals and huge
numbers; indices repeat (scatter_add, index_add, index_put accumulate) and
dims are negative where PyTorch allows it."""
import struct
import sys

import torch

torch.manual_seed(34)
EDGE = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-40, 3e38, -3e38, 1.0]

# op codes, as tests/test_shapeops.c's enum
OPS = ["SCATTER", "SCATTER_ADD", "INDEX_ADD", "INDEX_PUT", "INDEX_PUT_MASK", "DIAGONAL",
       "ONE_HOT", "SQUEEZE", "UNSQUEEZE", "FLATTEN", "UNFLATTEN", "NARROW", "STACK", "CHUNK"]
cases = []


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in t.detach().reshape(-1).tolist()]


def vals(shape, edge=True, seed_scale=3.0):
    x = (torch.rand(shape) * 2 - 1) * seed_scale
    x = x.reshape(-1)
    if edge:
        for k in range(0, x.numel(), 3):
            x[k] = EDGE[(k // 3) % len(EDGE)]
    return x.reshape(shape)


def grads(out, inputs, w):
    live = [x for x in inputs if x is not None and x.requires_grad]
    gs = torch.autograd.grad((out * w).sum(), live, allow_unused=True)
    res, k = [], 0
    for x in inputs:
        if x is not None and x.requires_grad:
            res.append(gs[k])
            k += 1
        else:
            res.append(None)
    return res


def add(name, op, p, t=None, ix=None, src=None, out=None, g_t=None, g_s=None, w=None,
        ix_u8=False, ints_out=False):
    cases.append(dict(name=name, op=op, p=p, t=t, ix=ix, src=src, out=out, gt=g_t, gs=g_s, w=w,
                      ix_u8=ix_u8, ints_out=ints_out))


def smooth(shape):
    """finite, tame values for the gradient cases"""
    return vals(shape, edge=False)


def scatter_case(name, op, tshape, ishape, sshape, dim, V, edge=True, alpha=1.0):
    t = (vals(tshape) if edge else smooth(tshape)).requires_grad_(True)
    s = (vals(sshape) if edge else smooth(sshape)).requires_grad_(True)
    ix = torch.randint(0, V, ishape)
    if op == "SCATTER":
        out = torch.scatter(t, dim, ix, s)
    elif op == "SCATTER_ADD":
        out = torch.scatter_add(t, dim, ix, s)
    else:
        out = torch.index_add(t, dim, ix, s, alpha=alpha)
    w = smooth(out.shape)
    gt, gs = grads(out, [t, s], w) if not edge else (None, None)
    add(name, op, [dim, 0, 0, 0], t, ix, s, out, gt, gs, w if not edge else None)
    cases[-1]["alpha"] = alpha


def main():
    # scatter: last write wins on repeated indices (PyTorch CPU: in order)
    scatter_case("scatter_3x5x7_dim1", "SCATTER", (3, 5, 7), (3, 4, 7), (3, 6, 7), 1, 5)
    scatter_case("scatter_grad_dim-1", "SCATTER", (3, 5, 7), (3, 5, 4), (3, 5, 4), -1, 7, False)
    scatter_case("scatter_1x9_dim0", "SCATTER", (1, 9), (1, 9), (2, 9), 0, 1)
    # scatter_add: repeated indices add in src's row-major order
    scatter_case("scatter_add_edge_dim0", "SCATTER_ADD", (4, 5, 7), (9, 5, 7), (9, 5, 7), 0, 4)
    scatter_case("scatter_add_grad_dim-2", "SCATTER_ADD", (3, 5, 7), (3, 11, 6), (3, 11, 6), -2, 5,
                 False)
    scatter_case("scatter_add_1d", "SCATTER_ADD", (5,), (40,), (41,), 0, 5)
    # index_add
    scatter_case("index_add_edge_dim1", "INDEX_ADD", (3, 5, 7), (9,), (3, 9, 7), 1, 5)
    scatter_case("index_add_grad_dim-1", "INDEX_ADD", (3, 1, 7), (12,), (3, 1, 12), -1, 7, False)
    scatter_case("index_add_alpha-2", "INDEX_ADD", (6, 5), (8,), (8, 5), 0, 6, False, alpha=-2.0)
    # index_put with an index on dim 0 (negative entries wrap), and a mask
    for name, acc, vshape in [("index_put_rows", False, (1, 3, 7)), ("index_put_acc", True, (7,)),
                              ("index_put_acc_full", True, (5, 3, 7))]:
        t = smooth((4, 3, 7)).requires_grad_(True)
        v = smooth(vshape).requires_grad_(True)
        ix = torch.tensor([1, -1, 3, 1, 0])
        out = t.index_put((ix,), v, accumulate=acc)
        w = smooth(out.shape)
        gt, gv = grads(out, [t, v], w)
        add(name, "INDEX_PUT", [0, int(acc), 0, 0], t, ix, v, out, gt, gv, w)
    for name, acc, mshape in [("index_put_mask", False, (4, 3)), ("index_put_mask_acc", True, (4, 3, 7))]:
        t = vals((4, 3, 7)).requires_grad_(True)
        v = torch.tensor(2.5).requires_grad_(True)
        m = torch.rand(mshape) < 0.5
        out = t.index_put((m,), v, accumulate=acc)
        w = smooth(out.shape)
        add(name, "INDEX_PUT_MASK", [0, int(acc), 0, 0], t, m.to(torch.int64), v, out, None, None,
            None, ix_u8=True)
    # diagonal: offsets either side, negative dims, batched
    for name, shape, off, d1, d2 in [("diag_3x5x7_off1", (3, 5, 7), 1, 1, 2),
                                     ("diag_3x5x7_neg", (3, 5, 7), -2, -1, 0),
                                     ("diag_5x1", (5, 1), 0, 0, 1),
                                     ("diag_empty", (2, 3), 5, 0, 1)]:
        t = smooth(shape).requires_grad_(True)
        out = torch.diagonal(t, off, d1, d2)
        w = smooth(out.shape)
        (gt,) = grads(out, [t], w)
        add(name, "DIAGONAL", [off, d1, d2, 0], t, None, None, out, gt, None, w)
    # one_hot
    lab = torch.tensor([[0, 3, 2], [3, 3, 1]])
    add("one_hot_2x3_c5", "ONE_HOT", [5, 0, 0, 0], None, lab, None,
        torch.nn.functional.one_hot(lab, 5), ints_out=True)
    add("one_hot_infer", "ONE_HOT", [-1, 0, 0, 0], None, lab, None,
        torch.nn.functional.one_hot(lab, -1), ints_out=True)
    # the views: values and shapes (their gradients are the reshape/slice/cat ones)
    t = vals((3, 1, 5, 1))
    add("squeeze_1", "SQUEEZE", [1, 0, 0, 0], t, None, None, t.squeeze(1))
    add("squeeze_-1", "SQUEEZE", [-1, 0, 0, 0], t, None, None, t.squeeze(-1))
    add("squeeze_0_kept", "SQUEEZE", [0, 0, 0, 0], t, None, None, t.squeeze(0))
    add("squeeze_all", "SQUEEZE", [-1000, 0, 0, 0], t, None, None, t.squeeze())
    add("unsqueeze_-1", "UNSQUEEZE", [-1, 0, 0, 0], t, None, None, t.unsqueeze(-1))
    add("unsqueeze_2", "UNSQUEEZE", [2, 0, 0, 0], t, None, None, t.unsqueeze(2))
    t = vals((3, 5, 7)).transpose(0, 2)
    add("flatten_1_-1", "FLATTEN", [1, -1, 0, 0], t.contiguous(), None, None, t.contiguous().flatten(1, -1))
    add("flatten_all", "FLATTEN", [0, -1, 0, 0], t.contiguous(), None, None, t.contiguous().flatten())
    u = vals((3, 35))
    add("unflatten_5_-1", "UNFLATTEN", [1, 5, -1, 0], u, None, None, u.unflatten(1, (5, -1)))
    add("narrow_-4_3", "NARROW", [1, -4, 3, 0], u, None, None, u.narrow(1, -4, 3))
    add("stack_-1", "STACK", [-1, 0, 0, 0], u, None, None, torch.stack([u, u * 2, -u], -1))
    add("stack_0", "STACK", [0, 0, 0, 0], u, None, None, torch.stack([u, u * 2, -u], 0))
    v = vals((3, 5))
    for ch in (2, 3, 4, 6):
        parts = torch.chunk(v, ch, 1)
        add("chunk_%d" % ch, "CHUNK", [ch, 1, len(parts), parts[-1].shape[1]], v, None, None,
            torch.cat(parts, 1))
    emit()


def arr(name, ctype, xs):
    body = ", ".join(("0x%08xu" % x) if ctype == "uint32_t" else str(x) for x in xs)
    return "static const %s %s[%d] = {%s};\n" % (ctype, name, max(len(xs), 1), body or "0")


def shp(t):
    s = list(t.shape) if t is not None else []
    return "%d, {%s}" % (len(s), ", ".join(str(v) for v in s) or "0")


def emit():
    out = sys.stdout
    out.write("/* tests/torch_refs/shapeidx.h - generated by scripts/torch_refs/shapeidx.py with "
              "PyTorch %s;\n * regenerate: /usr/bin/python3 scripts/torch_refs/shapeidx.py > "
              "tests/torch_refs/shapeidx.h */\n" % torch.__version__)
    out.write("enum { %s };\n" % ", ".join("SI_" + o for o in OPS))
    rows = []
    for k, c in enumerate(cases):
        def put(key, t, ints=False):
            if t is None:
                return "NULL"
            nm = "si%d_%s" % (k, key)
            if ints:
                out.write(arr(nm, "int32_t", [int(v) for v in t.reshape(-1).tolist()]))
            else:
                out.write(arr(nm, "uint32_t", bits(t)))
            return nm
        tn = put("t", c["t"])
        ixn = put("ix", c["ix"], True)
        sn = put("src", c["src"])
        on = put("out", c["out"], c["ints_out"])
        wn = put("w", c["w"])
        gtn = put("gt", c["gt"])
        gsn = put("gs", c["gs"])
        o = c["out"]
        rows.append('    {"%s", SI_%s, {%s}, %r, %d, {%s}, %s, {%s}, %s, %d, {%s}, %s, {%s}, %s, %s, %s, %s},\n' % (
            c["name"], c["op"], ", ".join(str(v) for v in c["p"]), float(c.get("alpha", 1.0)), int(c["ix_u8"]),
            shp(c["t"]), tn, shp(c["ix"]), ixn, int(c["ints_out"]), shp(c["src"]), sn, shp(o), on,
            wn, gtn, gsn))
    out.write("static const si_case si_cases[] = {\n")
    for r in rows:
        out.write(r)
    out.write("};\n")


if __name__ == "__main__":
    main()
