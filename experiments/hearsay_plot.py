#!/usr/bin/python3
"""hearsay-plot: convergence plots from hearsay's JSON Lines logs (docs/LOGS.md).

    /usr/bin/python3 experiments/hearsay_plot.py RUN_DIR_OR_LOG... [--out DIR]

Each argument is a peer log (*.jsonl) or a directory holding them. Writes, to --out
(default: the first directory given, or the log's directory):
  accuracy.png/.svg   test accuracy against wall-clock time and steps, one line per peer
  loss.png/.svg       training loss against steps
It reads only the logs, so it works on runs copied from other machines.
"""
import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_log(path):
    """Returns (peer name, list of events); a line that is not JSON is reported and skipped."""
    events = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as e:
                print(f"hearsay-plot: {path}:{number}: skipped a line that is not JSON ({e.msg})", file=sys.stderr)
    peer = next((e.get("peer") for e in events if "peer" in e), os.path.basename(path))
    return peer, events


def collect(paths):
    logs = []
    for p in paths:
        files = sorted(glob.glob(os.path.join(p, "**", "*.jsonl"), recursive=True)) if os.path.isdir(p) else [p]
        if not files:
            raise SystemExit(f"hearsay-plot: error: {p}: no *.jsonl logs found")
        for f in files:
            if not os.path.exists(f):
                raise SystemExit(f"hearsay-plot: error: {f}: no such file")
            logs.append((f,) + read_log(f))
    return logs


def series(events, kind, x, y):
    pts = [(e[x], e[y]) for e in events if e.get("event") == kind and e.get(x) is not None and e.get(y) is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def save(fig, out, stem):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{stem}.{ext}"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args()
    logs = collect(args.paths)
    out = args.out or (args.paths[0] if os.path.isdir(args.paths[0]) else os.path.dirname(args.paths[0]) or ".")
    os.makedirs(out, exist_ok=True)

    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4))
    for _, peer, events in logs:
        t, acc = series(events, "eval", "t", "test_acc")
        s, acc2 = series(events, "eval", "step", "test_acc")
        by_time.plot(t, [100 * a for a in acc], marker=".", label=peer)
        by_step.plot(s, [100 * a for a in acc2], marker=".", label=peer)
    by_time.set(xlabel="wall-clock time (s)", ylabel="test accuracy (%)", title="Test accuracy over time")
    by_step.set(xlabel="step", ylabel="test accuracy (%)", title="Test accuracy over steps")
    for ax in (by_time, by_step):
        ax.grid(alpha=0.3)
        ax.legend()
    save(fig, out, "accuracy")

    fig, ax = plt.subplots(figsize=(6, 4))
    for _, peer, events in logs:
        s, loss = series(events, "step", "step", "loss")
        ax.plot(s, loss, label=peer)
    ax.set(xlabel="step", ylabel="training loss", title="Training loss", yscale="log")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out, "loss")
    print(f"hearsay-plot: wrote {out}/accuracy.png, {out}/loss.png (and .svg)")


if __name__ == "__main__":
    main()
