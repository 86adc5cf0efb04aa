#!/usr/bin/python3
"""A simulated experiment beside the real one (docs/SIMULATION.md, "Validation"): for each
sweep point, the mean and spread over its seeds of the time to target and the bytes to
target in both, their ratio, and whether the simulated mean is within 15% of the real
mean or inside the real seeds' range; then whether the points rank the same by time.

  experiments/hearsay_compare.py runs/quickstart-REAL runs/quickstart-SIMULATED [--markdown]
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hearsay_logs  # noqa: E402


def groups(root):
    """{point label: [run summaries]} of a hearsay-run output directory, in sweep order."""
    with open(os.path.join(root, "summary.json"), encoding="utf-8") as f:
        top = json.load(f)
    points = top.get("points") or [top]
    out, key = {}, None
    for point in points:
        run_dir = point.get("run_dir") or os.path.join(root, point["dir"])
        if not os.path.isdir(run_dir):
            run_dir = root  # a single run is its own directory
        if key is None or point.get("repeat", 0) == 0:
            key = re.sub(r"-r\d+$", "", os.path.basename(run_dir))
        out.setdefault(key, []).append(hearsay_logs.run_summary(run_dir, point.get("target_test_acc") or 0))
    return out


def stats(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0, "lo": min(v), "hi": max(v),
            "n": len(v), "of": len(values)}


def text(s, scale=1.0, fmt="{:.1f}"):
    if s is None:
        return "never"
    t = fmt.format(s["mean"] * scale) + (" ± " + fmt.format(s["sd"] * scale) if s["n"] > 1 else "")
    return t + (f" ({s['of'] - s['n']} of {s['of']} never)" if s["n"] < s["of"] else "")


def agrees(real, sim):
    if real is None or sim is None:
        return real is None and sim is None
    return abs(sim["mean"] - real["mean"]) <= 0.15 * real["mean"] or real["lo"] <= sim["mean"] <= real["hi"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("real")
    ap.add_argument("simulated")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    real, sim = groups(args.real), groups(args.simulated)
    rows = [("point", "time to target, real s", "simulated s", "sim / real", "MB to target, real", "simulated MB",
             "sim / real", "within 15% or the spread")]
    order_real, order_sim = [], []
    for key in real:
        if key not in sim:
            continue
        tr = stats([r["time_to_target_s"] for r in real[key]])
        ts = stats([r["time_to_target_s"] for r in sim[key]])
        br = stats([r["bytes_to_target_total"] for r in real[key]])
        bs = stats([r["bytes_to_target_total"] for r in sim[key]])
        ratio = lambda a, b: f"{b['mean'] / a['mean']:.2f}" if a and b and a["mean"] > 0 else "-"
        ok = "time " + ("yes" if agrees(tr, ts) else "NO") + ", bytes " + ("yes" if agrees(br, bs) else "NO")
        rows.append((key, text(tr), text(ts), ratio(tr, ts), text(br, 1e-6), text(bs, 1e-6), ratio(br, bs), ok))
        order_real.append((tr["mean"] if tr else float("inf"), key))
        order_sim.append((ts["mean"] if ts else float("inf"), key))
    if args.markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for r in rows[1:]:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    same = [k for _, k in sorted(order_real)] == [k for _, k in sorted(order_sim)]
    print(f"\nranking by time to target: {'the same' if same else 'DIFFERENT'}"
          f" (real: {', '.join(k for _, k in sorted(order_real))}; simulated: {', '.join(k for _, k in sorted(order_sim))})")


if __name__ == "__main__":
    main()
