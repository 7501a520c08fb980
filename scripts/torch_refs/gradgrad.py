#!/usr/bin/env python3
"""PyTorch 1.13 references for tests/test_gradgrad.c (double backward of the
ops whose backward runs a kernel of its own):

- ew: for each elementwise f, g = d/dx sum(f(x)) with create_graph=True and
  h = d/dx sum(g), on edge values (+-0, subnormals, large, +-Inf, NaN);
- bin: pow (a > 0), atan2 and fmod of two tensors, b broadcast along the
  rows of a [3, 5]: ga, gb with create_graph=True, then the gradients of
  sum(ga * u) + sum(gb * w) with respect to a and b (a Hessian-vector
  product);
- hvp: Hessian-vector products L = sum(f(x) * k), hu = grad(sum(grad(L, x,
  create_graph=True) * u), x) through gather, index_select, embedding,
  cumprod (rows with zeros) on odd shapes, and attention (q, k, v of
  [2, 5, 3], causal and with a u8 mask): its gradients with respect to q,
  k and v of sum over them of <g_i, u_i>.

    /usr/bin/python3 scripts/torch_refs/gradgrad.py > tests/torch_refs/gradgrad.h

Writes f32 values as their bit patterns (uint32_t hex) into gg_pool."""
import struct

import torch
import torch.nn.functional as F

torch.manual_seed(3434)
POOL = []


def put(t):
    off = len(POOL)
    for v in t.detach().float().reshape(-1).tolist():
        POOL.append(struct.unpack("<I", struct.pack("<f", v))[0])
    return off


EDGE = [0.0, -0.0, 1e-40, -1e-40, 1e-20, 0.5, -0.5, 1.25, -1.3, 3.0, -2.75, 7.5, -9.0,
        19.5, 20.5, -20.0, 60.0, float("inf"), float("-inf"), float("nan")]

EW = [
    ("sin", torch.sin),
    ("cos", torch.cos),
    ("erf", torch.erf),
    ("softplus", F.softplus),
    ("mish", F.mish),
    ("softsign", F.softsign),
    ("reciprocal", torch.reciprocal),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    ("log1p", torch.log1p),
    ("expm1", torch.expm1),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1)),
    ("hardtanh", lambda x: F.hardtanh(x, -1.0, 1.5)),
]

ew_rows = []
x0 = torch.tensor(EDGE, dtype=torch.float32)
for name, f in EW:
    x = x0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
    if h is None:
        h = torch.zeros_like(x)
    ew_rows.append((name, put(g), put(h)))
ex = put(x0)

# ---- pow, atan2, fmod of two tensors
A = torch.rand(3, 5) * 2.5 + 0.2
B = torch.tensor([1.7, -0.8, 0.7, 2.3, -1.4])
U = torch.randn(3, 5)
W = torch.randn(5)
bin_rows = []
for name, f in (("pow", torch.pow), ("atan2", torch.atan2), ("fmod", torch.fmod)):
    a = A.clone().requires_grad_(True)
    b = B.clone().requires_grad_(True)
    ga, gb = torch.autograd.grad(f(a, b).sum(), (a, b), create_graph=True)
    s = (ga * U).sum() + (gb * W).sum()
    if s.requires_grad:
        ha, hb = torch.autograd.grad(s, (a, b), allow_unused=True)
    else:
        ha = hb = None
    ha = torch.zeros_like(A) if ha is None else ha
    hb = torch.zeros_like(B) if hb is None else hb
    bin_rows.append((name, put(ga), put(gb), put(ha), put(hb)))
bin_in = dict(a=put(A), b=put(B), u=put(U), w=put(W))


# ---- Hessian-vector products through the index ops and cumprod
def hvp(f, x0, k):
    x = x0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((f(x) * k).sum(), x, create_graph=True)
    u = torch.randn(x0.shape)
    (hu,) = torch.autograd.grad((g * u).sum(), x)
    return u, g, hu


HV = []
X = torch.randn(3, 5, 7)
gi = torch.randint(0, 5, (3, 4, 7))
hv_x = put(X)
hv_gi = [int(v) for v in gi.reshape(-1).tolist()]
si = torch.tensor([4, 0, 4, 2, 1, 0], dtype=torch.long)
hv_si = [int(v) for v in si.tolist()]
emb_w = torch.randn(6, 5)
ei = torch.tensor([[5, 0, 2], [2, 2, 1]], dtype=torch.long)
hv_ei = [int(v) for v in ei.reshape(-1).tolist()]
C = torch.randn(3, 1, 7) * 1.2
C[0, 0, 3] = 0.0
C[2, 0, 0] = 0.0
C[2, 0, 5] = 0.0

cases = [
    ("gather", lambda x: torch.gather(x, 1, gi) ** 2, X, (3, 4, 7)),
    ("index_select", lambda x: torch.index_select(x, 1, si) ** 2, X, (3, 6, 7)),
    ("embedding", lambda w: F.embedding(ei, w) ** 2, emb_w, (2, 3, 5)),
    ("cumprod", lambda x: torch.cumprod(x, 2), C, (3, 1, 7)),
]
hv_rows = []
for name, f, x, kshape in cases:
    k = torch.randn(kshape)
    u, g, hu = hvp(f, x, k)
    hv_rows.append((name, put(x), put(k), put(u), put(g), put(hu)))

# ---- attention: q, k, v [2, 5, 3], causal / u8 mask
Q = torch.randn(2, 5, 3) * 0.8
K = torch.randn(2, 5, 3) * 0.8
V = torch.randn(2, 5, 3)
M = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 0, 0, 1], [0, 1, 1, 1, 1], [1, 0, 0, 1, 1],
                  [1, 1, 1, 0, 0]], dtype=torch.bool)
GO = torch.randn(2, 5, 3)
UQ, UK, UV = torch.randn(2, 5, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 3)
at_rows = []
for variant in ("causal", "mask"):
    q, k, v = (t.clone().requires_grad_(True) for t in (Q, K, V))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=M if variant == "mask" else None,
                                       is_causal=variant == "causal", scale=0.6) \
        if hasattr(F, "scaled_dot_product_attention") else None
    if y is None:  # PyTorch 1.13: the math definition
        s = q @ k.transpose(-1, -2) * 0.6
        if variant == "causal":
            s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
        else:
            s = s.masked_fill(~M, float("-inf"))
        y = torch.softmax(s, -1) @ v
    gs = torch.autograd.grad((y * GO).sum(), (q, k, v), create_graph=True)
    dot = (gs[0] * UQ).sum() + (gs[1] * UK).sum() + (gs[2] * UV).sum()
    hs = torch.autograd.grad(dot, (q, k, v))
    at_rows.append((variant, [put(g) for g in gs], [put(h) for h in hs]))
at_in = dict(q=put(Q), k=put(K), v=put(V), go=put(GO), uq=put(UQ), uk=put(UK), uv=put(UV))


def ints(name, vals):
    print("static const int32_t %s[] = {%s};" % (name, ", ".join(str(v) for v in vals)))


print("/* tests/torch_refs/gradgrad.h - generated by scripts/torch_refs/gradgrad.py with")
print(" * PyTorch %s; do not edit.  Regenerate:" % torch.__version__)
print(" *   /usr/bin/python3 scripts/torch_refs/gradgrad.py > tests/torch_refs/gradgrad.h")
print(" * f32 values as bit patterns in gg_pool; every other number is an offset")
print(" * into it (or an index).  See the script for what each case computes. */")
print("#include <stdint.h>")
print()
print("static const uint32_t gg_pool[] = {")
for i in range(0, len(POOL), 8):
    print("    " + " ".join("0x%08xu," % v for v in POOL[i:i + 8]))
print("};")
print()
print("enum { GG_NEDGE = %d };" % len(EDGE))
print("static const long gg_ew_x = %d;" % ex)
print("typedef struct { const char *name; long g, h; } gg_ew_row;")
print("static const gg_ew_row gg_ew[] = {")
for name, g, h in ew_rows:
    print('    {"%s", %d, %d},' % (name, g, h))
print("};")
print()
print("static const long gg_bin_a = %d, gg_bin_b = %d, gg_bin_u = %d, gg_bin_w = %d;" %
      (bin_in["a"], bin_in["b"], bin_in["u"], bin_in["w"]))
print("typedef struct { const char *name; long ga, gb, ha, hb; } gg_bin_row;")
print("static const gg_bin_row gg_bin[] = {")
for r in bin_rows:
    print('    {"%s", %d, %d, %d, %d},' % r)
print("};")
print()
ints("gg_gather_idx", hv_gi)
ints("gg_select_idx", hv_si)
ints("gg_embed_idx", hv_ei)
print("typedef struct { const char *name; long x, k, u, g, hu; } gg_hv_row;")
print("static const gg_hv_row gg_hv[] = {")
for r in hv_rows:
    print('    {"%s", %d, %d, %d, %d, %d},' % r)
print("};")
print()
print("static const long gg_at_q = %d, gg_at_k = %d, gg_at_v = %d, gg_at_go = %d;" %
      (at_in["q"], at_in["k"], at_in["v"], at_in["go"]))
print("static const long gg_at_u[3] = {%d, %d, %d};" % (at_in["uq"], at_in["uk"], at_in["uv"]))
print("static const uint8_t gg_at_mask[25] = {%s};" %
      ", ".join(str(int(v)) for v in M.reshape(-1).tolist()))
print("typedef struct { const char *variant; long g[3], h[3]; } gg_at_row;")
print("static const gg_at_row gg_at[] = {")
for variant, g, h in at_rows:
    print('    {"%s", {%d, %d, %d}, {%d, %d, %d}},' % (variant, *g, *h))
print("};")
