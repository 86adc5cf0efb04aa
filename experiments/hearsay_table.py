#!/usr/bin/python3
"""A sweep's runs as one table: each sweep point's mean and sample standard deviation over
its repeats (the seeds) of the time to target (when the peers' mean test accuracy first
reached it), the bytes every peer had sent by then, the slowest peer's median time per
step, and the final mean accuracy. Recomputed from the peers' logs (hearsay_logs), so the
definitions are hearsay_figures' (docs/LOGS.md, "Time to target") whatever hearsay-run wrote
at the time.

  experiments/hearsay_table.py runs/heterogeneous-gpus-20261201-151500 [--markdown]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="a hearsay-run output directory with one subdirectory per run")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    groups = {key: [hearsay_logs.run_summary(d, p.get("target_test_acc") or 0) for d, p in runs]
              for key, runs in hearsay_logs.sweep_runs(args.root).items()}
    rows = [("run", "seeds", "time to target s", "MB to target", "step ms (slowest peer)", "final acc %")]
    for key, runs in groups.items():
        rows.append((key, str(len(runs)), hearsay_figures.mean_sd([r["time_to_target_s"] for r in runs]),
                     hearsay_figures.mean_sd([r["bytes_to_target_total"] for r in runs], 1e-6),
                     hearsay_figures.mean_sd([r["step_s_max_median"] for r in runs], 1e3, "{:.2f}"),
                     hearsay_figures.mean_sd([r["final_test_acc"] for r in runs], 100, "{:.2f}")))
    hearsay_logs.print_table(rows, args.markdown)

if __name__ == "__main__":
    main()
