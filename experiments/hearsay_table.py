#!/usr/bin/python3
"""A sweep's runs as one table: each sweep point's mean and sample standard deviation over
its repeats (the seeds) of the time to target (when the peers' mean test accuracy first
reached it), the bytes every peer had sent by then, the slowest peer's median time per
step, and the final mean accuracy. Recomputed from the peers' logs (hearsay_logs), so the
definitions are the ones in docs/LOGS.md whatever hearsay-run wrote at the time.

  experiments/hearsay_table.py runs/heterogeneous-gpus-20261201-151500 [--markdown]
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hearsay_logs  # noqa: E402


def mean_sd(values, scale=1.0, fmt="{:.1f}"):
    v = [x * scale for x in values if x is not None]
    if not v:
        return "-"
    missing = len(values) - len(v)
    text = fmt.format(statistics.fmean(v))
    if len(v) > 1:
        text += " ± " + fmt.format(statistics.stdev(v))
    if missing:
        text += f" ({missing} of {len(values)} never)"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="a hearsay-run output directory with one subdirectory per run")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    with open(os.path.join(args.root, "summary.json"), encoding="utf-8") as f:
        top = json.load(f)
    # Runs come point by point, each point's repeats in a row (repeat 0 starts a point);
    # two points may share a label (one sweep value with different also_set fragments),
    # so a point is named by its first run's directory, index included.
    groups = {}
    key = None
    for point in top.get("points", []):
        run_dir = point.get("run_dir") or os.path.join(args.root, point["dir"])  # a simulated run names its directory
        if key is None or point.get("repeat", 0) == 0:
            key = re.sub(r"-r\d+$", "", os.path.basename(run_dir))
        s = hearsay_logs.run_summary(run_dir, point.get("target_test_acc") or 0)
        groups.setdefault(key, []).append(s)
    rows = [("run", "seeds", "time to target s", "MB to target", "step ms (slowest peer)", "final acc %")]
    for key, runs in groups.items():
        rows.append((key, str(len(runs)), mean_sd([r["time_to_target_s"] for r in runs]),
                     mean_sd([r["bytes_to_target_total"] for r in runs], 1e-6),
                     mean_sd([r["step_s_max_median"] for r in runs], 1e3, "{:.2f}"),
                     mean_sd([r["final_test_acc"] for r in runs], 100, "{:.2f}")))
    if args.markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for r in rows[1:]:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
