#!/usr/bin/python3
"""hearsay-plot: convergence plots and an HTML report from hearsay's logs (docs/LOGS.md).

    hearsay-plot RUN_DIR_OR_LOG... [--out DIR] [--target ACC]

Each argument is a run directory of hearsay-run (a sweep's or repeats' sub-runs are
found inside it), a directory of peer logs, or one log (*.jsonl). Runs with the same swept
values are repeats of one line: drawn as their mean with a band from the lowest to the
highest. Writes to --out (default: the first directory given):

  accuracy.png/.svg    test accuracy (mean over peers) against wall-clock time, steps
                       (mean over peers) and bytes sent (all peers)
  loss.png/.svg        test loss against time, and training loss against steps
  staleness.png/.svg   histogram of staleness (each peer's median per log window)
  step_rate.png/.svg   each peer's step rate over time, one panel per line
  index.html           the plots beside the summary table

It reads only the logs (and summary.json where present), so it works on runs copied from
other machines.
"""
import argparse
import html
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_logs  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class Run:
    """One cluster run: its peers' events, and the swept values that name its line."""

    def __init__(self, directory, logs):
        self.dir = directory
        self.peers = {}
        for path in logs:
            name, events = hearsay_logs.read_log(path)
            self.peers[name] = events
        self.summary = None
        summary = os.path.join(directory, "summary.json")
        if os.path.exists(summary):
            with open(summary, encoding="utf-8") as f:
                self.summary = json.load(f)
        values = (self.summary or {}).get("values") or {}
        self.label = ", ".join(f"{k}={v}" for k, v in values.items()) or os.path.basename(os.path.normpath(directory))
        self.repeat = (self.summary or {}).get("repeat", 0)

    def curve(self, x_kind):
        """(x, mean test accuracy, mean test loss) after each evaluation of any peer; x is
        time, the peers' mean step, or the bytes all peers had sent by then."""
        timeline = []
        for peer, events in self.peers.items():
            for e in events:
                if e.get("event") in ("eval", "gossip", "step", "end") and "t" in e:
                    timeline.append((e["t"], peer, e))
        timeline.sort(key=lambda x: x[0])
        acc, loss, step, sent = {}, {}, {}, {}
        out = []
        for t, peer, e in timeline:
            kind = e["event"]
            if "step" in e:
                step[peer] = e["step"]
            if kind == "gossip" or (kind == "end" and "bytes_sent" in e):
                sent[peer] = e.get("bytes_sent", sent.get(peer, 0))
            if kind != "eval" or e.get("test_acc") is None:
                continue
            acc[peer], loss[peer] = e["test_acc"], e.get("test_loss")
            x = {"time": t, "steps": sum(step.values()) / max(1, len(step)), "bytes": sum(sent.values())}[x_kind]
            losses = [v for v in loss.values() if v is not None]
            out.append((x, sum(acc.values()) / len(acc), sum(losses) / len(losses) if losses else None))
        return out


def find_runs(paths):
    runs = []
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"hearsay-plot: error: {p}: no such file or directory")
        if os.path.isfile(p):
            runs.append(Run(os.path.dirname(p) or ".", [p]))
            continue
        found = False
        for root, _dirs, _files in sorted(os.walk(p)):
            logs = hearsay_logs.peer_logs(root)
            if logs:
                runs.append(Run(root, logs))
                found = True
        if not found:
            raise SystemExit(f"hearsay-plot: error: {p}: no peer logs (*.jsonl) in it or below it")
    return runs


def group(runs):
    lines = {}
    for r in runs:
        lines.setdefault(r.label, []).append(r)
    return lines


def mean_band(curves, column):
    """Mean and (min, max) of several step curves on the union of their x values."""
    xs = sorted({x for c in curves for x, *_ in c})
    mean, lo, hi = [], [], []
    for x in xs:
        vals = []
        for c in curves:
            last = [row[column] for row in c if row[0] <= x and row[column] is not None]
            if last:
                vals.append(last[-1])
        if len(vals) < len(curves):  # not every repeat has a value yet
            mean.append(None), lo.append(None), hi.append(None)
            continue
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    keep = [i for i, m in enumerate(mean) if m is not None]
    return [xs[i] for i in keep], [mean[i] for i in keep], [lo[i] for i in keep], [hi[i] for i in keep]


def save(fig, out, stem):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{stem}.{ext}"), dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_against_time_steps_bytes(lines, out, column, scale, ylabel, title, stem, target=None):
    """One panel each for time, steps and bytes: the peers' mean of the evaluated metric
    (column 1: test accuracy, 2: test loss), with the spread over repeats as a band."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for (label, runs), color in zip(lines.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10):
        for ax, kind in zip(axes, ("time", "steps", "bytes")):
            x, m, lo, hi = mean_band([[c for c in r.curve(kind) if c[column] is not None] for r in runs], column)
            if not x:
                continue
            if kind == "bytes" and x and x[0] <= 0:
                x = [max(v, 1) for v in x]
            ax.plot(x, [scale * v for v in m], color=color, label=f"{label} (x{len(runs)})" if len(runs) > 1 else label)
            if len(runs) > 1:
                ax.fill_between(x, [scale * v for v in lo], [scale * v for v in hi], color=color, alpha=0.2, step=None)
    titles = ("wall-clock time (s)", "steps (mean over peers)", "bytes sent (all peers)")
    for ax, xl in zip(axes, titles):
        ax.set(xlabel=xl, ylabel=ylabel)
        if target:
            ax.axhline(scale * target, color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    axes[2].set_xscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    save(fig, out, stem)


def plot_accuracy(lines, out, target):
    plot_against_time_steps_bytes(lines, out, 1, 100, "test accuracy (%, mean over peers)", "Test accuracy", "accuracy",
                                  target)


def plot_test_loss(lines, out):
    """Test (validation) loss against time, steps and bytes: a language model's measure
    (nats per byte for text; bits per byte = nats / ln 2)."""
    plot_against_time_steps_bytes(lines, out, 2, 1, "test loss (nats, mean over peers)", "Test (validation) loss",
                                  "test-loss")


def plot_loss(lines, out):
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(12, 4.2))
    for label, runs in lines.items():
        x, m, _, _ = mean_band([r.curve("time") for r in runs], 2)
        by_time.plot(x, m, label=label)
        r = runs[0]
        steps = {}
        for events in r.peers.values():
            for e in events:
                if e.get("event") == "step" and e.get("loss") is not None:
                    steps.setdefault(e["step"], []).append(e["loss"])
        s = sorted(steps)
        by_step.plot(s, [sum(steps[k]) / len(steps[k]) for k in s], label=label)
    by_time.set(xlabel="wall-clock time (s)", ylabel="test loss (mean over peers)", title="Test loss")
    by_step.set(xlabel="step", ylabel="training loss (mean over peers)", title="Training loss", yscale="log")
    for ax in (by_time, by_step):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, out, "loss")


def plot_staleness(lines, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    data, labels = [], []
    for label, runs in lines.items():
        taus = [e["tau_p50"] for r in runs for events in r.peers.values() for e in events
                if e.get("event") == "gossip" and e.get("applied", 0) > 0 and e.get("tau_p50") is not None]
        if taus:
            data.append(taus)
            labels.append(label)
    if data:
        top = max(max(d) for d in data)
        bins = [b - 0.5 for b in range(0, int(top) + 2)] if top < 60 else 40
        ax.hist(data, bins=bins, label=labels, density=True)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no asynchronous updates were applied", ha="center", va="center", transform=ax.transAxes)
    ax.set(xlabel="staleness tau (logical steps; each peer's median per log window)", ylabel="share of windows",
           title="Staleness of applied updates")
    ax.grid(alpha=0.3)
    save(fig, out, "staleness")


def plot_step_rate(lines, out):
    n = len(lines)
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.6 * n), squeeze=False)
    for ax, (label, runs) in zip(axes[:, 0], lines.items()):
        for peer, events in sorted(runs[0].peers.items()):
            pts = [(e["t"], e["samples_per_s"]) for e in events if e.get("event") == "step" and e.get("samples_per_s")]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=peer)
        ax.set(ylabel="samples/s", title=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("wall-clock time (s)")
    fig.suptitle("Step rate per peer (first repeat of each line)")
    save(fig, out, "step_rate")


def fmt(v, spec=".2f", scale=1.0, unit=""):
    return "-" if v is None else f"{v * scale:{spec}}{unit}"


def write_index(runs, out, target):
    rows = []
    for r in runs:
        s = r.summary or hearsay_logs.run_summary(r.dir, target)
        st = s.get("staleness") or {}
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r.label, r.repeat, fmt(s.get("time_to_target_s"), ".1f", unit=" s"), fmt(s.get("final_test_acc"), ".2f", 100, "%"),
            fmt(s.get("bytes_sent_total"), ".1f", 1e-6, " MB"), s.get("steps_total", "-"), fmt(st.get("p50"), ".1f"),
            fmt(st.get("p90"), ".1f"), s.get("stopped_by", "-"), os.path.relpath(r.dir, out))) + "</tr>")
    target_text = f"{100 * target:.0f}%" if target else "target"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>hearsay report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}
img{{max-width:100%;margin:1em 0}}</style></head><body>
<h1>hearsay report</h1>
<table><tr><th>run</th><th>repeat</th><th>time to {target_text}</th><th>final test acc</th><th>bytes sent</th>
<th>steps</th><th>staleness p50</th><th>p90</th><th>stopped by</th><th>directory</th></tr>
{chr(10).join(rows)}
</table>
<img src="accuracy.png" alt="test accuracy against time, steps and bytes">
<img src="test-loss.png" alt="test (validation) loss against time, steps and bytes">
<img src="loss.png" alt="test and training loss">
<img src="staleness.png" alt="staleness histogram">
<img src="step_rate.png" alt="step rate per peer">
</body></html>
"""
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page)


def main():
    ap = argparse.ArgumentParser(prog="hearsay-plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--target", type=float, help="target accuracy line (default: from summary.json or the logs)")
    args = ap.parse_args()
    runs = find_runs(args.paths)
    out = args.out or (args.paths[0] if os.path.isdir(args.paths[0]) else os.path.dirname(args.paths[0]) or ".")
    os.makedirs(out, exist_ok=True)
    target = args.target
    if target is None:
        target = next((r.summary.get("target_test_acc") for r in runs if r.summary and r.summary.get("target_test_acc")), None)
    if target is None:
        target = next((e.get("target_test_acc") for r in runs for ev in r.peers.values() for e in ev
                       if e.get("event") == "start" and e.get("target_test_acc")), 0.0)
    lines = group(runs)
    plot_accuracy(lines, out, target)
    plot_loss(lines, out)
    plot_test_loss(lines, out)
    plot_staleness(lines, out)
    plot_step_rate(lines, out)
    write_index(runs, out, target)
    print(f"hearsay-plot: {len(runs)} run(s), {len(lines)} line(s): wrote accuracy, test-loss, loss, staleness, step_rate "
          f"(.png, .svg) and index.html to {out}")


if __name__ == "__main__":
    main()
