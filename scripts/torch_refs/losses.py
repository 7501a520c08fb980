#!/usr/bin/env python3
"""PyTorch 1.13 references for the losses of issue 34 (tests/test_losses.c):
binary_cross_entropy (p exactly 0 and 1, weights), binary_cross_entropy_with_logits
(logits +-100 and beyond, pos_weight), nll_loss ([N, C] and [N, C, d1, d2],
ignore_index rows, class weights), l1_loss, smooth_l1_loss, huber_loss,
kl_div (log_target, batchmean), cross_entropy over [N, C, d1, ...] (nt_cross_entropy_ex)
and with every argument (nt_cross_entropy_loss: weights, reductions), with
every reduction, on odd shapes; their values and the gradients of
sum(loss * cot) (cot: a fixed cotangent for reduction 'none', 1 otherwise)
with respect to the first input (and the second where PyTorch has one).

    /usr/bin/python3 scripts/torch_refs/losses.py > tests/torch_refs/losses.h

Writes f32 values as their bit patterns (uint32_t hex), labels as int32."""
import struct

import torch
import torch.nn.functional as F

torch.manual_seed(34)
POOL = []
LABELS = []
RED = {"none": 0, "mean": 1, "sum": 2, "batchmean": 3}
KIND = ["bce", "bce_logits", "nll", "l1", "smooth_l1", "huber", "kl_div", "cross_entropy",
        "cross_entropy_loss"]


def put(t):
    if t is None:
        return -1
    off = len(POOL)
    for v in t.detach().reshape(-1).tolist():
        POOL.append(struct.unpack("<I", struct.pack("<f", v))[0])
    return off


def put_labels(t):
    off = len(LABELS)
    LABELS.extend(int(v) for v in t.reshape(-1).tolist())
    return off


CASES = []


def shape_of(t):
    s = list(t.shape)
    return len(s), s + [0] * (5 - len(s))


def case(kind, red, x, y, w=None, pw=None, arg=0.0, flag=0, ign=-100, gy=True):
    x = x.clone().float().requires_grad_(True)
    lab = y.dtype in (torch.int64, torch.int32)
    if not lab:
        y = y.clone().float().requires_grad_(gy)
    if kind == "bce":
        out = F.binary_cross_entropy(x, y, weight=w, reduction=red)
    elif kind == "bce_logits":
        out = F.binary_cross_entropy_with_logits(x, y, weight=w, reduction=red, pos_weight=pw)
    elif kind == "nll":
        out = F.nll_loss(x, y.long(), weight=w, ignore_index=ign, reduction=red)
    elif kind == "l1":
        out = F.l1_loss(x, y, reduction=red)
    elif kind == "smooth_l1":
        out = F.smooth_l1_loss(x, y, reduction=red, beta=arg)
    elif kind == "huber":
        out = F.huber_loss(x, y, reduction=red, delta=arg)
    elif kind == "kl_div":
        out = F.kl_div(x, y, reduction=red, log_target=bool(flag))
    elif kind in ("cross_entropy", "cross_entropy_loss"):
        out = F.cross_entropy(x, y.long(), weight=w, ignore_index=ign, reduction=red,
                              label_smoothing=arg)
    cot = torch.randn(out.shape) if red == "none" else torch.ones(())
    ins = [x] + ([y] if not lab and gy else [])
    grads = torch.autograd.grad((out * cot).sum(), ins)
    xnd, xsh = shape_of(x)
    ynd, ysh = shape_of(y)
    ond, osh = shape_of(out)
    CASES.append(dict(
        kind=KIND.index(kind), red=RED[red], arg=arg, flag=flag, ign=ign,
        xnd=xnd, xsh=xsh, ynd=ynd, ysh=ysh, ond=ond, osh=osh,
        x=put(x), y=put_labels(y) if lab else put(y), lab=int(lab),
        w=put(w), wnd=shape_of(w)[0] if w is not None else 0,
        wsh=shape_of(w)[1] if w is not None else [0] * 5,
        pw=put(pw), pwnd=shape_of(pw)[0] if pw is not None else 0,
        pwsh=shape_of(pw)[1] if pw is not None else [0] * 5,
        out=put(out), cot=put(cot), gx=put(grads[0]),
        gy=put(grads[1]) if len(grads) > 1 else -1))


REDS = ["none", "mean", "sum"]

# binary_cross_entropy: p in (0, 1) with soft targets, weights broadcast
p = torch.rand(3, 5, 7) * 0.98 + 0.01
t = torch.rand(3, 5, 7)
for r in REDS:
    case("bce", r, p, t, gy=False)
    case("bce", r, p, t, w=torch.rand(7) + 0.5, gy=False)
# p exactly 0 and 1 (logs clamped at -100), tiny and near-1 p, hard targets
pe = torch.tensor([0.0, 1.0, 0.0, 1.0, 1e-30, 1 - 2 ** -24, 0.5, 1e-45, 0.25])
te = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0])
for r in REDS:
    case("bce", r, pe, te, gy=False)

# binary_cross_entropy_with_logits: odd shape, extreme logits
x = torch.randn(3, 5, 7) * 4
x.view(-1)[:6] = torch.tensor([100.0, -100.0, 1e4, -1e4, 0.0, -0.0])
t = torch.rand(3, 5, 7)
t.view(-1)[:4] = torch.tensor([1.0, 0.0, 0.0, 1.0])
for r in REDS:
    case("bce_logits", r, x, t)
    case("bce_logits", r, x, t, pw=torch.rand(7) * 3)
    case("bce_logits", r, x, t, w=torch.rand(5, 1) + 0.5, pw=torch.rand(7) * 3)

# nll_loss: [N, C] with ignored rows and class weights; [N, C, d1, d2]
lp = F.log_softmax(torch.randn(9, 7) * 3, 1)
lab = torch.randint(0, 7, (9,))
lab[2] = -100
lab[5] = -100
for r in REDS:
    case("nll", r, lp, lab)
    case("nll", r, lp, lab, w=torch.rand(7) + 0.1)
lab4 = torch.randint(0, 5, (2, 3, 4))
lab4[0, 1, 2] = 3  # a label equal to the custom ignore_index below
lp4 = F.log_softmax(torch.randn(2, 5, 3, 4) * 2, 1)
for r in REDS:
    case("nll", r, lp4, lab4, ign=3)
    case("nll", r, lp4, lab4, w=torch.rand(5) + 0.1)
case("nll", "none", lp[0], lab[0])  # [C] with a 0-d label

# l1, smooth_l1, huber: odd shapes, exact ties, big differences
a = torch.randn(3, 5, 7) * 2
b = torch.randn(3, 5, 7) * 2
b.view(-1)[:3] = a.view(-1)[:3]  # z = 0
a.view(-1)[3] = 1e30
for r in REDS:
    case("l1", r, a, b)
    for beta in (1.0, 0.5, 0.0):
        case("smooth_l1", r, a, b, arg=beta)
    for delta in (1.0, 2.5):
        case("huber", r, a, b, arg=delta)
case("l1", "none", torch.randn(3, 1, 5), torch.randn(4, 1))  # broadcast

# kl_div: log-probabilities against probabilities (with zeros) or log-probs
inp = F.log_softmax(torch.randn(5, 7), 1)
tp = F.softmax(torch.randn(5, 7) * 2, 1)
tp[1, 3] = 0.0
tp[4, 0] = 0.0
tl = F.log_softmax(torch.randn(5, 7), 1)
for r in REDS + ["batchmean"]:
    case("kl_div", r, inp, tp)
    case("kl_div", r, inp, tl, flag=1)

# cross_entropy over [N, C, d1, d2] (mean only: ntensor's cross-entropies
# reduce by mean), with ignored positions and label smoothing
lg = torch.randn(2, 5, 3, 4) * 3
lg.view(-1)[:2] = torch.tensor([100.0, -100.0])
lab = torch.randint(0, 5, (2, 3, 4))
lab[1, 2, 3] = -100
lab[0, 0, 1] = -100
case("cross_entropy", "mean", lg, lab)
case("cross_entropy", "mean", lg, lab, arg=0.1)
case("cross_entropy", "mean", torch.randn(3, 4, 5), torch.randint(0, 4, (3, 5)))

# nt_cross_entropy_loss: every reduction, class weights, smoothing, [C] logits
for r in REDS:
    case("cross_entropy_loss", r, lg, lab)
    case("cross_entropy_loss", r, lg, lab, w=torch.rand(5) + 0.1, arg=0.2)
    case("cross_entropy_loss", r, torch.randn(9, 7) * 3, torch.randint(0, 7, (9,)), ign=4,
         w=torch.rand(7) + 0.1)
case("cross_entropy_loss", "none", torch.randn(6), torch.tensor(2), arg=0.3)


def arr(name, vals, ty, per=8, fmt="0x%08x"):
    print("static const %s %s[%d] = {" % (ty, name, max(len(vals), 1)))
    for i in range(0, len(vals), per):
        print("    " + ", ".join(fmt % v for v in vals[i:i + per]) + ",")
    if not vals:
        print("    0,")
    print("};")


print("/* tests/torch_refs/losses.h - generated by scripts/torch_refs/losses.py")
print(" * (PyTorch %s); do not edit.  Regenerate with" % torch.__version__)
print(" *     /usr/bin/python3 scripts/torch_refs/losses.py > tests/torch_refs/losses.h")
print(" * Offsets index lr_pool (f32 bits) or lr_labels; -1: absent. */")
print("#include <stdint.h>")
arr("lr_pool", POOL, "uint32_t")
arr("lr_labels", LABELS, "int32_t", 16, "%d")
print("enum { LR_BCE, LR_BCE_LOGITS, LR_NLL, LR_L1, LR_SMOOTH_L1, LR_HUBER, LR_KL_DIV, "
      "LR_CROSS_ENTROPY, LR_CROSS_ENTROPY_LOSS };")
print("typedef struct lr_case {")
print("    int kind, red, flag, lab;")
print("    double arg;")
print("    long long ign;")
print("    int xnd, ynd, ond, wnd, pwnd;")
print("    int64_t xsh[5], ysh[5], osh[5], wsh[5], pwsh[5];")
print("    long x, y, w, pw, out, cot, gx, gy;")
print("} lr_case;")
print("static const lr_case lr_cases[] = {")
for c in CASES:
    sh = lambda s: "{" + ", ".join(str(v) for v in s) + "}"
    print("    {%d, %d, %d, %d, %r, %d, %d, %d, %d, %d, %d, %s, %s, %s, %s, %s, "
          "%d, %d, %d, %d, %d, %d, %d, %d}," % (
              c["kind"], c["red"], c["flag"], c["lab"], float(c["arg"]), c["ign"], c["xnd"],
              c["ynd"], c["ond"], c["wnd"], c["pwnd"], sh(c["xsh"]), sh(c["ysh"]), sh(c["osh"]),
              sh(c["wsh"]), sh(c["pwsh"]), c["x"], c["y"], c["w"], c["pw"], c["out"], c["cot"],
              c["gx"], c["gy"]))
print("};")
print("enum { LR_NCASES = %d };" % len(CASES))
