#!/usr/bin/python3
"""bench/peer/char_gpt.py - the PyTorch peer of examples/char_gpt.c.

The same model (examples/gpt_model.h), data, vocabulary and split, batch
order (the counter-based splitmix64 generator, in 64-bit wrapping integer
arithmetic), initialisation distributions, optimizer (AdamW, betas 0.9 and
0.95, eps 1e-8, weight decay 0.1 on the matrices and embeddings, none on the
layer norms' weights and the biases: two parameter groups), schedule (linear
warm-up, cosine decay to a tenth of the peak), gradient clipping at norm 1
and fixed validation batches.  The initial values are drawn by PyTorch's
generator, so they follow the same distributions but are not the same
numbers.  Attention is written out (PyTorch 1.13 has no
F.scaled_dot_product_attention): scores, masked_fill(-inf) above the
diagonal, softmax, times v -- what the C example computes.

Prints, like the C example,
  eval step=N train=X val=Y ms_per_step=Z
every --eval-every steps and at the end, then
  final val=Y ms_per_step=Z steps=N threads=K
(bench/gpt_step reads these; bench/peer/plot_loss.py plots the eval lines).

The environment is the peer's best (bench/peer/peer_env.py: OpenBLAS picks
its own kernels, glibc keeps freed blocks, OpenMP threads sleep when idle);
the first line says what it runs on.  bench/gpt_step runs it at --threads 1
and --threads 2 and compares with the faster.

Usage: /usr/bin/python3 bench/peer/char_gpt.py [--steps N] [...] (--help)
Needs torch (Debian: python3-torch; scripts/deps.sh --bench installs it).
"""
import argparse
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_env  # noqa: E402

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
VAL_SEED = 0x5EED
DATA_DIR = "/usr/share/games/fortunes"


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def rand_at(seed, i):
    """The i-th output of splitmix64 started at seed (gpt_rand_at)."""
    return mix64((seed + (i + 1) * GOLDEN) & MASK64)


def load_text(d):
    """The fortune files of d: not symlinks, not .dat, in byte order of their
    names, concatenated as they are (gpt_data_load)."""
    names = sorted(os.listdir(d), key=lambda s: s.encode())
    parts = []
    for n in names:
        p = os.path.join(d, n)
        if n.startswith(".") or (len(n) > 4 and n.endswith(".dat")):
            continue
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, "rb") as f:
            parts.append(f.read())
    return b"".join(parts), len(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--rope", action="store_true",
                    help="rotary position embedding of q and k (GPT-NeoX layout, base 10000) "
                         "instead of the learned positions, as examples/char_gpt --rope")
    ap.add_argument("--data", default=DATA_DIR)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads; 0 (default) keeps torch's own default "
                         "(OMP_NUM_THREADS, else what OpenMP gives it)")
    a = ap.parse_args()
    peer_env.ensure()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("char_gpt.py: torch is not installed (Debian: python3-torch; "
              "sh scripts/deps.sh --bench)", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    print("environment: " + peer_env.describe(torch), flush=True)
    torch.manual_seed(a.seed)

    text, nfiles = load_text(a.data)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = len(text)
    n_train = n - n // 10
    V, D, H, T, B, L = len(chars), a.width, a.heads, a.context, a.batch, a.layers
    print(f"char_gpt.py: {n} characters from {nfiles} files, vocabulary {V}, "
          f"{n_train} train / {n - n_train} validation; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)

    def batch(val, seed, step):
        lo, hi = (n_train, n) if val else (0, n_train)
        span = hi - lo - T
        offs = [lo + rand_at(seed, (step * B + b) & MASK64) % span for b in range(B)]
        x = torch.stack([ids[o:o + T] for o in offs])
        y = torch.stack([ids[o + 1:o + 1 + T] for o in offs])
        return x, y

    std, std_res = 0.02, 0.02 / math.sqrt(2 * L)

    def normal(*shape, s=std):
        return torch.nn.Parameter(torch.randn(*shape) * s)

    def zeros(*shape):
        return torch.nn.Parameter(torch.zeros(*shape))

    def ones(*shape):
        return torch.nn.Parameter(torch.ones(*shape))

    # In examples/gpt_model.h's order: wte, wpe, per block (ln1 w b, qkv w b,
    # proj w b, ln2 w b, fc w b, fc2 w b), ln_f w b, [head].
    params = [normal(V, D), normal(T, D)]
    for _ in range(L):
        params += [ones(D), zeros(D), normal(3 * D, D), zeros(3 * D),
                   normal(D, D, s=std_res), zeros(D), ones(D), zeros(D),
                   normal(4 * D, D), zeros(4 * D), normal(D, 4 * D, s=std_res), zeros(D)]
    params += [ones(D), zeros(D)]
    if a.untied:
        params.append(normal(V, D))
    print(f"model: {L} layers, {H} heads, width {D}, context {T}, "
          f"{'untied' if a.untied else 'tied'} head: "
          f"{sum(p.numel() for p in params)} parameters", flush=True)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    hd = D // H
    inv = torch.tensor([10000.0 ** (-(2.0 * i) / hd) for i in range(hd // 2)],
                       dtype=torch.float64).float()  # docs/ops.md: in double, rounded once

    def rope(z, t):  # GPT-NeoX: x * cos + cat(-x2, x1) * sin
        f = torch.outer(torch.arange(t, dtype=torch.float32), inv)
        c, s = torch.cat((f.cos(), f.cos()), -1), torch.cat((f.sin(), f.sin()), -1)
        return z * c + torch.cat((-z[..., hd // 2:], z[..., :hd // 2]), -1) * s

    def forward(x, y):
        b, t = x.shape
        h = params[0][x] if a.rope else params[0][x] + params[1][:t]
        for l in range(L):
            (l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, w1, b1, w2, b2) = \
                params[2 + 12 * l:2 + 12 * (l + 1)]
            z = F.layer_norm(h, (D,), l1w, l1b, 1e-5)
            qkv = F.linear(z, wqkv, bqkv)
            q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(b, t, H, D // H).transpose(1, 2)
                       for i in range(3))
            if a.rope:
                q, k = rope(q, t), rope(k, t)
            att = (q @ k.transpose(2, 3)) * (1 / math.sqrt(D // H))
            att = F.softmax(att.masked_fill(causal[:t, :t], float("-inf")), dim=3)
            z = (att @ v).transpose(1, 2).reshape(b, t, D)
            h = h + F.linear(z, wo, bo)
            z = F.layer_norm(h, (D,), l2w, l2b, 1e-5)
            h = h + F.linear(F.gelu(F.linear(z, w1, b1)), w2, b2)
        f = 2 + 12 * L
        h = F.layer_norm(h, (D,), params[f], params[f + 1], 1e-5)
        logits = F.linear(h, params[-1] if a.untied else params[0])
        return F.cross_entropy(logits.reshape(b * t, V), y.reshape(b * t))

    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    def get_lr(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        min_lr = a.lr * 0.1
        if a.steps <= a.warmup + 1:
            return min_lr
        prog = min(1.0, (step - a.warmup) / (a.steps - a.warmup - 1))
        return min_lr + 0.5 * (a.lr - min_lr) * (1 + math.cos(math.pi * prog))

    def evaluate():
        with torch.no_grad():
            return sum(forward(*batch(True, VAL_SEED, k)).item()
                       for k in range(a.eval_batches)) / a.eval_batches

    train_sum, n_eval, t_eval, t_train, val = 0.0, 0, time.perf_counter(), 0.0, float("nan")
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = get_lr(step)
        x, y = batch(False, a.seed, step)
        loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        train_sum += loss.item()
        n_eval += 1
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            dt = time.perf_counter() - t_eval
            t_train += dt
            val = evaluate()
            print(f"eval step={step + 1} train={train_sum / n_eval:.4f} val={val:.4f} "
                  f"ms_per_step={1e3 * dt / n_eval:.1f}", flush=True)
            train_sum, n_eval = 0.0, 0
            t_eval = time.perf_counter()
    print(f"final val={val:.4f} ms_per_step={1e3 * t_train / max(a.steps, 1):.1f} "
          f"steps={a.steps} threads={torch.get_num_threads()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
