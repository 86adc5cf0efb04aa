#!/usr/bin/python3
"""The comparison of configs/gpt-geo.textproto, from the peers' logs of one or more of its
runs (one per seed): for each algorithm, the peers' mean validation loss after their last
inner step, the bytes that crossed between sites, and the time until the peers' mean
validation loss first came within `--tolerance` (0.05 nats) of allreduce's final loss in
the same seed; the time allreduce took to reach each one's final loss (the same loss on
one clock); then mean and spread (sample standard deviation) over the seeds. Each figure
as hearsay_figures defines it (docs/LOGS.md, "Time to target"): the mean over the peers of
each one's latest validation loss, on the run's clock (seconds since the first peer
started), a crashed peer out of it while down.

    /usr/bin/python3 experiments/gpt_geo_report.py runs/gpt-geo-A/ runs/gpt-geo-B/ ...

Prints a Markdown table, and one JSON object per algorithm with --json.
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402


def sites_of(config_text):
    return dict(re.findall(r'peers\s*\{\s*name:\s*"([^"]+)"\s*site:\s*"([^"]+)"', config_text))


class Point:
    """One run of one algorithm: its peers' logs (hearsay_figures.Logs), their mean
    validation loss over time, and the bytes that crossed between sites."""

    def __init__(self, point_dir):
        with open(os.path.join(point_dir, "config.textproto"), encoding="utf-8") as f:
            sites = sites_of(f.read())
        self.logs = hearsay_figures.Logs(dict(hearsay_logs.read_log(path) for path in hearsay_logs.peer_logs(point_dir)))
        self.curve = self.logs.mean_curve("test_loss")
        self.final_loss = self.logs.final("test_loss")[0]
        self.cross_site_bytes = sum(hearsay_logs.wan_bytes_per_site(point_dir, sites).values())

    def time_to(self, loss):
        """When the peers' mean validation loss first came to at most loss, or None."""
        return hearsay_figures.time_to_target(self.curve, loss, lower_is_better=True)


def algorithm_of(point_dir):
    m = re.search(r"algorithm=([a-z_]+)", os.path.basename(os.path.normpath(point_dir)))
    return m.group(1) if m else os.path.basename(point_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories of configs/gpt-geo.textproto (one per seed)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    per_algorithm = {}
    for run in args.runs:
        points = {algorithm_of(d): d for d in sorted(glob.glob(os.path.join(run, "p*-algorithm=*")))}
        if "allreduce" not in points:
            sys.exit(f"gpt_geo_report: {run}: no allreduce run to compare with")
        data = {name: Point(d) for name, d in points.items()}
        ref = data["allreduce"]
        for name, point in data.items():
            loss = point.final_loss
            sent = point.cross_site_bytes
            r = per_algorithm.setdefault(name, {"loss": [], "gap": [], "bytes": [], "fewer": [], "time": [], "wall": [],
                                                "ref_at_wall": [], "ref_time_to_this": []})
            r["loss"].append(loss)
            r["gap"].append(None if loss is None or ref.final_loss is None else loss - ref.final_loss)
            r["bytes"].append(sent)
            r["fewer"].append(ref.cross_site_bytes / sent if sent else None)
            r["time"].append(None if ref.final_loss is None else point.time_to(ref.final_loss + args.tolerance))
            wall = point.logs.last_end_s()
            r["wall"].append(wall)
            # allreduce's loss when this run's last peer finished: the comparison on one clock.
            r["ref_at_wall"].append(None if wall is None else hearsay_figures.value_at(ref.curve, wall))
            # How long allreduce took to reach this run's final loss: the same loss on one clock.
            r["ref_time_to_this"].append(None if loss is None else ref.time_to(loss))
    rows = [("algorithm", "final val loss (nats)", "minus allreduce's", "MB between sites", "allreduce's bytes / these",
             f"time to allreduce's loss + {args.tolerance} (s)", "time for all steps (s)",
             "allreduce's loss at that time", "allreduce's time to this final loss (s)")]
    for name, r in per_algorithm.items():
        rows.append((name, *(hearsay_figures.mean_sd(r[key], 1e-6 if key == "bytes" else 1.0, fmt) for key, fmt in (
            ("loss", "{:.3f}"), ("gap", "{:+.3f}"), ("bytes", "{:.1f}"), ("fewer", "{:.0f}x"), ("time", "{:.0f}"),
            ("wall", "{:.0f}"), ("ref_at_wall", "{:.3f}"), ("ref_time_to_this", "{:.0f}")))))
    hearsay_logs.print_table(rows, markdown=True)
    if args.json:
        for name, r in per_algorithm.items():
            print(json.dumps({"algorithm": name, **r, "seeds": len(r["loss"])}))


if __name__ == "__main__":
    main()
