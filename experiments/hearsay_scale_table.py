#!/usr/bin/python3
"""The simulator's scale table (docs/SIMULATION.md, "Scale"): for simulated experiments of
one config at several sizes, each contender's mean (and spread over seeds) of the time to
target, bytes sent per peer, WAN bytes per site, final accuracy of the evaluated peers
and of the mean model, and the simulation's wall time, peak memory and events per second.

  experiments/hearsay_scale_table.py runs/scale-16-* runs/scale-64-* ... [--markdown]
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402


def runs(root):
    """Each run's summary.json, with its sim_stats.json as "stats"."""
    for group in hearsay_logs.sweep_runs(root).values():
        for d, _ in group:
            with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
                s = json.load(f)
            try:
                with open(os.path.join(d, "sim_stats.json"), encoding="utf-8") as f:
                    s["stats"] = json.load(f)
            except FileNotFoundError:
                s["stats"] = {}
            yield s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = [("peers", "contender", "seeds", "time to target (virtual s)", "MB sent per peer", "WAN MB per site",
             "final acc % (evaluated)", "mean model acc %", "wall s", "peak GiB", "events/s", "virtual s per wall s")]
    for root in args.roots:
        groups = {}
        for s in runs(root):
            label = "-".join(str(v) for v in s.get("values", {}).values()) or s["name"]
            label = re.sub(r"\s+", " ", label)
            groups.setdefault((len(s["peers"]), label), []).append(s)
        for (n, label), group in groups.items():
            wan = [statistics.fmean(s["wan_bytes_per_site"].values()) if s.get("wan_bytes_per_site") else None for s in group]
            rows.append((str(n), label, str(len(group)),
                         hearsay_figures.mean_sd([s["time_to_target_s"] for s in group]),
                         hearsay_figures.mean_sd([s["bytes_sent_total"] / n for s in group], 1e-6),
                         hearsay_figures.mean_sd(wan, 1e-6),
                         hearsay_figures.mean_sd([s["final_test_acc"] for s in group], 100, "{:.2f}"),
                         hearsay_figures.mean_sd([s.get("mean_model_final_test_acc") for s in group], 100, "{:.2f}"),
                         hearsay_figures.mean_sd([s["stats"].get("wall_s") for s in group], 1, "{:.0f}"),
                         hearsay_figures.mean_sd([s["stats"].get("peak_rss_bytes") for s in group], 1 / 2**30, "{:.2f}"),
                         hearsay_figures.mean_sd([s["stats"].get("events_per_s") for s in group], 1, "{:.0f}"),
                         hearsay_figures.mean_sd([s["stats"].get("virtual_per_wall") for s in group], 1, "{:.2f}")))
    hearsay_logs.print_table(rows, args.markdown)

if __name__ == "__main__":
    main()
