#!/usr/bin/env python3
"""scripts/torch_refs/optim.py - PyTorch 1.13 references for tests/test_optim.c.

Writes tests/torch_refs/optim.h: a 3x5x7 f32 parameter, four steps of fixed
gradients (with +-0, a subnormal, tiny and large values), the parameter after
each step of torch.optim's Adam, AdamW, RMSprop, Adagrad and SGD (their
default single-tensor CPU forms) in several settings, and of the Lion paper's
update written with torch ops; and the lr sequences of StepLR, LinearLR and
OneCycleLR (cos, cycle_momentum=False) over two parameter groups.

Regenerate: /usr/bin/python3 scripts/torch_refs/optim.py > tests/torch_refs/optim.h
"""
import math
import struct

import torch

torch.manual_seed(34)
SHAPE = (3, 5, 7)
NEL = 3 * 5 * 7
STEPS = 4

p0 = (torch.randn(SHAPE) * 0.5).float()
grads = []
for t in range(STEPS):
    g = torch.randn(SHAPE).float() * 0.1
    flat = g.view(-1)
    flat[0] = 0.0
    flat[1] = -0.0
    flat[2] = 1e-40          # subnormal
    flat[3] = -3e-30         # tiny
    flat[4] = 2e3 * (t + 1)  # large
    flat[5] = -5e2
    flat[6 + t] = 0.0        # a zero that moves
    grads.append(g)


def bits(t):
    return [struct.unpack('<I', struct.pack('<f', float(v)))[0] for v in t.reshape(-1).tolist()]


def run(make):
    p = p0.clone().requires_grad_(True)
    opt = make([p])
    out = []
    for t in range(STEPS):
        p.grad = grads[t].clone()
        opt.step()
        out.append(p.detach().clone())
    return out


class Lion:
    """The Lion paper's update (Chen et al. 2023), with torch ops in f32."""

    def __init__(self, params, lr, betas, weight_decay):
        self.params, self.lr, self.betas, self.wd = params, lr, betas, weight_decay
        self.m = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        b1, b2 = self.betas
        for p, m in zip(self.params, self.m):
            g = p.grad
            p.mul_(1 - self.lr * self.wd)
            update = m.clone().mul_(b1).add(g, alpha=1 - b1).sign_()
            p.add_(update, alpha=-self.lr)
            m.mul_(b2).add_(g, alpha=1 - b2)


# name, C constructor call (params p, n 1), torch constructor
CONFIGS = [
    ("adam", "nt_optim_adam(&p, 1, 1e-2, 0.9, 0.999, 1e-8, 0, 0)",
     lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    ("adam_wd_amsgrad", "nt_optim_adam(&p, 1, 5e-3, 0.8, 0.99, 1e-6, 0.1, NT_OPTIM_AMSGRAD)",
     lambda ps: torch.optim.Adam(ps, lr=5e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                                 amsgrad=True)),
    ("adamw", "nt_optim_adamw(&p, 1, 1e-2, 0.9, 0.999, 1e-8, 0.01)",
     lambda ps: torch.optim.AdamW(ps, lr=1e-2)),
    ("adamw_amsgrad", "nt_optim_adamw_ex(&p, 1, 2e-2, 0.9, 0.95, 1e-8, 0.1, NT_OPTIM_AMSGRAD)",
     lambda ps: torch.optim.AdamW(ps, lr=2e-2, betas=(0.9, 0.95), weight_decay=0.1,
                                  amsgrad=True)),
    ("rmsprop", "nt_optim_rmsprop(&p, 1, 1e-2, 0.99, 1e-8, 0, 0, false)",
     lambda ps: torch.optim.RMSprop(ps, lr=1e-2)),
    ("rmsprop_all", "nt_optim_rmsprop(&p, 1, 3e-3, 0.9, 1e-6, 0.05, 0.9, true)",
     lambda ps: torch.optim.RMSprop(ps, lr=3e-3, alpha=0.9, eps=1e-6, weight_decay=0.05,
                                    momentum=0.9, centered=True)),
    ("adagrad", "nt_optim_adagrad(&p, 1, 1e-2, 0, 0, 0, 1e-10)",
     lambda ps: torch.optim.Adagrad(ps, lr=1e-2)),
    ("adagrad_all", "nt_optim_adagrad(&p, 1, 5e-2, 0.1, 0.1, 0.1, 1e-8)",
     lambda ps: torch.optim.Adagrad(ps, lr=5e-2, lr_decay=0.1, weight_decay=0.1,
                                    initial_accumulator_value=0.1, eps=1e-8)),
    ("lion", "nt_optim_lion(&p, 1, 1e-3, 0.9, 0.99, 0.1)",
     lambda ps: Lion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
    ("sgd_nesterov", "nt_optim_sgd(&p, 1, 1e-2, 0.9, 0.01, true)",
     lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01, nesterov=True)),
]


def sched_seq(make, n, lrs=(0.1, 0.02)):
    ps = [torch.zeros(1, requires_grad=True) for _ in lrs]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(ps, lrs)], lr=lrs[0])
    s = make(opt)
    out = [[g["lr"] for g in opt.param_groups]]
    for _ in range(n):
        opt.step()
        s.step()
        out.append([g["lr"] for g in opt.param_groups])
    return out


def cosine_ref(base, k, warm, total, min_lr):
    """The documented cosine-with-warm-up formula (no single PyTorch 1.13 class)."""
    if k < warm:
        return base * (k + 1) / warm
    if total <= warm + 1:
        return min_lr
    prog = min(1.0, (k - warm) / (total - warm - 1))
    return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * prog))


SCHEDS = [
    ("steplr", "nt_scheduler_steplr(o, 3, 0.5)", 12,
     lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
    ("linear", "nt_scheduler_linear(o, 0.25, 1.0, 5)", 8,
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, end_factor=1.0,
                                                 total_iters=5)),
    ("onecycle", "nt_scheduler_onecycle(o, 0.1, 20, 0.3, 25, 1e4)", 20,
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20, pct_start=0.3,
                                                   cycle_momentum=False)),
]


def main():
    print("/* tests/torch_refs/optim.h - generated by scripts/torch_refs/optim.py with torch %s;"
          % torch.__version__)
    print(" * regenerate: /usr/bin/python3 scripts/torch_refs/optim.py > tests/torch_refs/optim.h */")
    print("#include <stdint.h>\n")
    print("#define TR_OPT_NEL %d\n#define TR_OPT_STEPS %d" % (NEL, STEPS))
    print("static const int64_t tr_opt_shape[3] = {3, 5, 7};")

    def arr(name, vals):
        print("static const uint32_t %s[%d] = {" % (name, len(vals)))
        for i in range(0, len(vals), 8):
            print("    " + ", ".join("0x%08xu" % v for v in vals[i:i + 8]) + ",")
        print("};")

    arr("tr_opt_p0", bits(p0))
    arr("tr_opt_grads", sum((bits(g) for g in grads), []))
    for name, _, make in CONFIGS:
        arr("tr_opt_%s" % name, sum((bits(t) for t in run(make)), []))
    print("typedef struct { const char *name; const uint32_t *want; } tr_opt_case;")
    print("/* the C constructor of each case is in tests/test_optim.c, in this order */")
    print("static const tr_opt_case tr_opt_cases[] = {")
    for name, call, _ in CONFIGS:
        print('    {"%s", tr_opt_%s}, /* %s */' % (name, name, call))
    print("};")
    print("\n/* lr sequences, two groups (base lrs 0.1 and 0.02): [position][group] */")
    for name, call, n, make in SCHEDS:
        seq = sched_seq(make, n)
        print("static const double tr_sched_%s[%d][2] = { /* %s */" % (name, n + 1, call))
        for row in seq:
            print("    {%s}," % ", ".join(repr(float(v)) for v in row))
        print("};")
    # the cosine schedule (warm-up 3, total 10, min_lr 0.001) from its formula
    seq = [[cosine_ref(b, k, 3, 10, 0.001) for b in (0.1, 0.02)] for k in range(13)]
    print("static const double tr_sched_cosine[13][2] = { /* nt_scheduler_cosine(o, 3, 10, 0.001) */")
    for row in seq:
        print("    {%s}," % ", ".join(repr(v) for v in row))
    print("};")
    # OneCycleLR past its end
    o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    s = torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20, cycle_momentum=False)
    n = 0
    try:
        for n in range(1, 30):
            s.step()
    except ValueError:
        pass
    print("/* OneCycleLR(total_steps 20): the scheduler step that raises ValueError */")
    print("#define TR_ONECYCLE_FAILS_AT %d" % n)


main()
