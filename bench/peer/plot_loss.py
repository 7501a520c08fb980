#!/usr/bin/python3
"""bench/peer/plot_loss.py - the loss curves of examples/char_gpt and of its
PyTorch peer (bench/peer/char_gpt.py) side by side, as a PNG.

Reads the "eval step=N train=X val=Y ..." lines of each log (the output of
either program; other lines are ignored) and draws the train and validation
loss of every log against the step.

Usage: /usr/bin/python3 bench/peer/plot_loss.py -o loss.png \\
           ntensor=ours.log pytorch=peer.log
(a LABEL=PATH argument names the curve; a bare PATH uses the file's name).
Needs matplotlib (Debian: python3-matplotlib; sh scripts/deps.sh --bench).
"""
import argparse
import os
import re
import sys

EVAL = re.compile(r"^eval step=(\d+) train=(\S+) val=(\S+)")


def read_log(path):
    steps, train, val = [], [], []
    with open(path) as f:
        for line in f:
            m = EVAL.match(line.strip())
            if m:
                steps.append(int(m.group(1)))
                train.append(float(m.group(2)))
                val.append(float(m.group(3)))
    return steps, train, val


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default="loss.png", help="the PNG to write (loss.png)")
    ap.add_argument("--title", default="char GPT on fortunes: ntensor vs PyTorch")
    ap.add_argument("logs", nargs="+", help="LABEL=PATH or PATH")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_loss.py: matplotlib is not installed (Debian: python3-matplotlib; "
              "sh scripts/deps.sh --bench)", file=sys.stderr)
        return 2
    fig, ax = plt.subplots(figsize=(8, 5))
    for spec in a.logs:
        label, _, path = spec.rpartition("=")
        label = label or os.path.basename(path)
        steps, train, val = read_log(path)
        if not steps:
            print(f"plot_loss.py: no 'eval step=' lines in {path}", file=sys.stderr)
            return 1
        line, = ax.plot(steps, val, marker="o", label=f"{label} validation")
        ax.plot(steps, train, linestyle="--", color=line.get_color(),
                label=f"{label} train (mean since last eval)")
        print(f"{label}: final val {val[-1]:.4f} at step {steps[-1]}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title(a.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
