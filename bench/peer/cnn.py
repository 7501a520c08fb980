#!/usr/bin/python3
"""bench/peer/cnn.py - the PyTorch peer of examples/cnn.c.

The same ResNet-style network (examples/cnn_model.h), data, batch order,
initialisation, optimizer and schedule, in PyTorch 1.13 eager on the CPU:

  stem    conv3x3(1 -> C) BN ReLU                          28 x 28
  block   conv3x3(C -> C) BN ReLU conv3x3 BN, + x, ReLU    28 x 28
          max_pool 2                                       14 x 14
  down    conv3x3(C -> 2C) BN ReLU                         14 x 14
  block   (2C)                                             14 x 14
          max_pool 2                                        7 x  7
  block   (2C)                                              7 x  7
  head    adaptive_avg_pool 1, linear(2C -> 10)

(convolutions without bias, padding 1; BN momentum 0.1, eps 1e-5).  Pixels
are x / 255 standardised with the data set's mean 0.2860 and std 0.3530
(in f32, as the C example).  Each epoch's order is examples/cnn.c's:
Fisher-Yates with splitmix64 from seed * 1000003 + epoch (64-bit wrapping
arithmetic), batches of --batch in that order, the last one smaller.

Optimizer: SGD with Nesterov momentum 0.9 (or --optim adamw: AdamW betas
0.9, 0.999, eps 1e-8) in two parameter groups -- weight decay --wd on the
convolutions' and the linear layer's weights, none on the batch norms and
the linear bias -- and the warm-up-then-cosine schedule of
nt_scheduler_cosine (docs/optimizers.md): lr = base (k + 1) / warmup for
k < warmup, then min_lr + (base - min_lr) (1 + cos(pi p)) / 2, p = min(1,
(k - warmup) / (total - warmup - 1)), min_lr 0, set before step k.

--init PATH loads the initial parameters examples/cnn --dump-init PATH
wrote (raw little-endian f32, the parameters in examples/cnn_model.h's
order), so both start from the same numbers; without it PyTorch's
generator draws them from the same distributions (Kaiming normal, fan out,
ReLU gain for the convolutions; BN weight 1, bias 0; the linear layer
Kaiming uniform a = sqrt 5 and its bias uniform +-1/sqrt(fan in)).

Prints, like the C example, one line per epoch
  epoch E/N: loss X train acc Y% test acc Z% ms_per_step W (S s)
and at the end
  final test_acc=Z ms_per_step=W steps=N threads=K
(the step time is the training loop's wall time over its steps; the
evaluation is excluded).  --time-steps N instead times N steps after
--warmup untimed ones on the first batches and prints
  timed median_ms=M min_ms=L steps=N threads=K cpu_ms=C
(C: the process's CPU time over the timed steps, every thread, per step)
(bench/cnn_step reads these lines).

The environment is the peer's best (bench/peer/peer_env.py: OpenBLAS picks
its own kernels, glibc keeps freed blocks, OpenMP threads sleep when idle);
the first line says what it runs on.

Usage: /usr/bin/python3 bench/peer/cnn.py [--epochs N] [--batch N] ... (--help)
Needs torch (Debian: python3-torch; sh scripts/deps.sh --bench).
"""
import argparse
import gzip
import math
import os
import statistics
import struct
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_env  # noqa: E402

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def shuffle(n, seed):
    """examples/cnn.c's shuffle: Fisher-Yates, splitmix64 from seed."""
    idx = list(range(n))
    s = seed & MASK64
    for i in range(n - 1, 0, -1):
        s = (s + GOLDEN) & MASK64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        j = z % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return idx


def load_split(torch, d, prefix):
    """(images f32 [n, 1, 28, 28] standardised, labels int64 [n])."""
    with gzip.open(os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"), "rb") as f:
        raw = f.read()
    magic, n, h, w = struct.unpack(">IIII", raw[:16])
    if magic != 0x803 or h != 28 or w != 28 or len(raw) != 16 + n * 784:
        raise SystemExit(f"cnn.py: malformed {prefix} images")
    with gzip.open(os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz"), "rb") as f:
        lab = f.read()
    if struct.unpack(">II", lab[:8]) != (0x801, n) or len(lab) != 8 + n:
        raise SystemExit(f"cnn.py: malformed {prefix} labels")
    x = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).reshape(n, 1, 28, 28)
    # (v / 255 - mean) * (1 / std) in f32, as examples/cnn.c
    x = (x.float() / 255.0 - torch.tensor(MEAN, dtype=torch.float32)) * torch.tensor(
        1.0 / STD, dtype=torch.float32)
    y = torch.frombuffer(bytearray(lab[8:]), dtype=torch.uint8).long()
    return x.contiguous(), y


def build(torch, width):
    """The parameters in examples/cnn_model.h's order, and the forward."""
    F = torch.nn.functional
    C, C2 = width, 2 * width
    convs = [(C, 1), (C, C), (C, C), (C2, C), (C2, C2), (C2, C2), (C2, C2), (C2, C2)]
    params, bufs, decay = [], [], []
    for (o, i) in convs:
        w = torch.empty(o, i, 3, 3)
        torch.nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
        params += [w, torch.ones(o), torch.zeros(o)]
        decay += [True, False, False]
        bufs += [torch.zeros(o), torch.ones(o)]
    lw = torch.empty(10, C2)
    torch.nn.init.kaiming_uniform_(lw, a=math.sqrt(5))
    lb = torch.empty(10).uniform_(-1 / math.sqrt(C2), 1 / math.sqrt(C2))
    params += [lw, lb]
    decay += [True, False]
    params = [torch.nn.Parameter(p) for p in params]

    def cbr(h, k, training, relu=True):
        w, g, b = params[3 * k:3 * k + 3]
        h = F.conv2d(h, w, None, 1, 1)
        h = F.batch_norm(h, bufs[2 * k], bufs[2 * k + 1], g, b, training, 0.1, 1e-5)
        return F.relu(h) if relu else h

    def block(h, k, training):
        z = cbr(h, k, training)
        z = cbr(z, k + 1, training, relu=False)
        return F.relu(z + h)

    def forward(x, training):
        h = cbr(x, 0, training)
        h = block(h, 1, training)
        h = F.max_pool2d(h, 2)
        h = cbr(h, 3, training)
        h = block(h, 4, training)
        h = F.max_pool2d(h, 2)
        h = block(h, 6, training)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return F.linear(h, params[-2], params[-1])

    return params, bufs, decay, forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--optim", default="sgd", choices=("sgd", "adamw"))
    ap.add_argument("--lr", type=float, default=0.0, help="0: 0.1 for sgd, 2e-3 for adamw")
    ap.add_argument("--wd", type=float, default=-1.0, help="<0: 5e-4 for sgd, 0.05 for adamw")
    ap.add_argument("--warmup", type=int, default=-1, help="<0: a tenth of an epoch's steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", default="", help="initial parameters from examples/cnn --dump-init")
    ap.add_argument("--limit-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    ap.add_argument("--time-steps", type=int, default=0,
                    help="only time N steps (after --time-warmup) and print their median")
    ap.add_argument("--time-warmup", type=int, default=5)
    ap.add_argument("--data", default=DATA_DIR)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads; 0 (default) keeps torch's own default")
    a = ap.parse_args()
    if a.epochs < 1 or a.batch < 1 or a.width < 1 or a.time_steps < 0 or a.time_warmup < 0:
        print("cnn.py: --epochs, --batch, --width >= 1; --time-steps, --time-warmup >= 0",
              file=sys.stderr)
        return 2
    lr = a.lr if a.lr > 0 else (0.1 if a.optim == "sgd" else 2e-3)
    wd = a.wd if a.wd >= 0 else (5e-4 if a.optim == "sgd" else 0.05)
    peer_env.ensure()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("cnn.py: torch is not installed (Debian: python3-torch; "
              "sh scripts/deps.sh --bench)", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    print("environment: " + peer_env.describe(torch), flush=True)
    torch.manual_seed(a.seed)
    xtr, ytr = load_split(torch, a.data, "train")
    xte, yte = load_split(torch, a.data, "t10k")
    n = xtr.shape[0]
    params, bufs, decay, forward = build(torch, a.width)
    if a.init:
        with open(a.init, "rb") as f:
            raw = f.read()
        want = sum(p.numel() for p in params) * 4
        if len(raw) != want:
            print(f"cnn.py: --init {a.init}: {len(raw)} bytes, the model needs {want} "
                  "(another --width?)", file=sys.stderr)
            return 2
        flat = torch.frombuffer(bytearray(raw), dtype=torch.float32)
        off = 0
        with torch.no_grad():
            for p in params:
                p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
    steps_per_epoch = (n + a.batch - 1) // a.batch
    total = a.epochs * steps_per_epoch
    warmup = a.warmup if a.warmup >= 0 else steps_per_epoch // 10
    print(f"cnn.py: width {a.width}, {sum(p.numel() for p in params)} parameters, batch "
          f"{a.batch}, {a.optim} lr {lr:g} wd {wd:g} (warm-up {warmup}, cosine over {total} "
          f"steps), seed {a.seed}, init {'from ' + a.init if a.init else 'drawn by torch'}",
          flush=True)
    groups = [{"params": [p for p, d in zip(params, decay) if d], "weight_decay": wd},
              {"params": [p for p, d in zip(params, decay) if not d], "weight_decay": 0.0}]
    if a.optim == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    else:
        opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)

    def get_lr(k):
        if k < warmup:
            return lr * (k + 1) / warmup
        if total <= warmup + 1:
            return 0.0
        prog = min(1.0, (k - warmup) / (total - warmup - 1))
        return 0.5 * lr * (1 + math.cos(math.pi * prog))

    def step(k, idx):
        for g in opt.param_groups:
            g["lr"] = get_lr(k)
        x, y = xtr[idx], ytr[idx]
        logits = forward(x, True)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item(), (logits.argmax(1) == y).sum().item()

    if a.time_steps:
        order = torch.tensor(shuffle(n, a.seed * 1000003))
        times = []
        c0 = time.process_time()
        for k in range(a.time_warmup + a.time_steps):
            s0 = (k * a.batch) % (n - a.batch + 1)
            idx = order[s0:s0 + a.batch]
            if k == a.time_warmup:
                c0 = time.process_time()
            t0 = time.perf_counter()
            step(k, idx)
            if k >= a.time_warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        print(f"timed median_ms={statistics.median(times):.3f} min_ms={min(times):.3f} "
              f"steps={a.time_steps} threads={torch.get_num_threads()} "
              f"cpu_ms={(time.process_time() - c0) * 1e3 / a.time_steps:.3f}", flush=True)
        return 0

    def evaluate():
        correct = 0
        with torch.no_grad():
            for s in range(0, xte.shape[0], 1000):
                correct += (forward(xte[s:s + 1000], False).argmax(1) == yte[s:s + 1000]) \
                    .sum().item()
        return 100.0 * correct / xte.shape[0]

    k, t_train, acc = 0, 0.0, float("nan")
    for ep in range(a.epochs):
        order = torch.tensor(shuffle(n, a.seed * 1000003 + ep))
        loss_sum, correct, seen = 0.0, 0, 0
        t0 = time.perf_counter()
        steps = 0
        for s0 in range(0, n, a.batch):
            if a.limit_steps and k >= a.limit_steps:
                break
            idx = order[s0:s0 + a.batch]
            l, c = step(k, idx)
            loss_sum += l * idx.numel()
            correct += c
            seen += idx.numel()
            k += 1
            steps += 1
        dt = time.perf_counter() - t0
        t_train += dt
        if not steps:
            break
        acc = evaluate()
        print(f"epoch {ep + 1}/{a.epochs}: loss {loss_sum / seen:.4f} train acc "
              f"{100.0 * correct / seen:.2f}% test acc {acc:.2f}% ms_per_step "
              f"{1e3 * dt / steps:.1f} ({dt:.1f} s)", flush=True)
    print(f"final test_acc={acc:.2f} ms_per_step={1e3 * t_train / max(k, 1):.1f} steps={k} "
          f"threads={torch.get_num_threads()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
