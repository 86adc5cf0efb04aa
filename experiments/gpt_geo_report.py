#!/usr/bin/python3
"""The comparison of configs/gpt-geo.textproto, from the peers' logs of one or more of its
runs (one per seed): for each algorithm, the peers' mean validation loss after their last
inner step, the bytes that crossed between sites, and the time until the peers' mean
validation loss first came within `--tolerance` (0.05 nats) of allreduce's final loss in
the same seed; the time allreduce took to reach each one's final loss (the same loss on
one clock); then mean and spread (sample standard deviation) over the seeds.

    /usr/bin/python3 experiments/gpt_geo_report.py runs/gpt-geo-A/ runs/gpt-geo-B/ ...

Prints a Markdown table, and one JSON object per algorithm with --json.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys


def sites_of(config_text):
    return dict(re.findall(r'peers\s*\{\s*name:\s*"([^"]+)"\s*site:\s*"([^"]+)"', config_text))


def read_point(point_dir):
    """{peer: [events]} and the peers' sites, for one run of one algorithm."""
    with open(os.path.join(point_dir, "config.textproto"), encoding="utf-8") as f:
        sites = sites_of(f.read())
    logs = {}
    for path in sorted(glob.glob(os.path.join(point_dir, "*.jsonl"))):
        events = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    events.append(json.loads(line))
        logs[os.path.basename(path)[:-len(".jsonl")]] = events
    return logs, sites


def final_loss(logs):
    """The peers' mean validation loss at their last evaluation."""
    last = []
    for events in logs.values():
        evals = [e for e in events if e["event"] == "eval"]
        if not evals:
            return None
        last.append(evals[-1]["test_loss"])
    return sum(last) / len(last)


def cross_site_bytes(logs, sites):
    """Bytes each peer sent to peers of another site, from its last gossip event, summed."""
    total = 0
    for peer, events in logs.items():
        gossip = [e for e in events if e["event"] == "gossip" and "links" in e]
        if not gossip:
            continue
        for neighbour, link in gossip[-1]["links"].items():
            if sites.get(neighbour) != sites.get(peer):
                total += link.get("bytes_sent", 0)
    return total


def time_to(logs, target):
    """The first moment at which the mean over the peers of each one's latest validation
    loss is at most target (seconds since the peers started), or None."""
    evals = sorted((e["t"], peer, e["test_loss"]) for peer, events in logs.items() for e in events if e["event"] == "eval")
    latest = {}
    for t, peer, loss in evals:
        latest[peer] = loss
        if len(latest) == len(logs) and sum(latest.values()) / len(latest) <= target:
            return t
    return None


def end_time(logs):
    """When the last peer finished (its `end` event), seconds since the peers started."""
    ends = [e["t"] for events in logs.values() for e in events if e["event"] == "end"]
    return max(ends) if ends else None


def loss_at(logs, t_end):
    """The peers' mean of each one's latest validation loss at time t_end, or None."""
    latest = {}
    for events in logs.values():
        for e in events:
            if e["event"] == "eval" and e["t"] <= t_end:
                latest[e["peer"]] = e["test_loss"]
    return sum(latest.values()) / len(latest) if len(latest) == len(logs) else None


def algorithm_of(point_dir):
    m = re.search(r"algorithm=([a-z_]+)", os.path.basename(os.path.normpath(point_dir)))
    return m.group(1) if m else os.path.basename(point_dir)


def mean_spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0), len(values)


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
        data = {name: read_point(d) for name, d in points.items()}
        ref = final_loss(data["allreduce"][0])
        ref_bytes = cross_site_bytes(*data["allreduce"])
        for name, (logs, sites) in data.items():
            loss = final_loss(logs)
            sent = cross_site_bytes(logs, sites)
            r = per_algorithm.setdefault(name, {"loss": [], "gap": [], "bytes": [], "fewer": [], "time": [], "wall": [],
                                                "ref_at_wall": [], "ref_time_to_this": []})
            r["loss"].append(loss)
            r["gap"].append(None if loss is None or ref is None else loss - ref)
            r["bytes"].append(sent)
            r["fewer"].append(ref_bytes / sent if sent else None)
            r["time"].append(None if ref is None else time_to(logs, ref + args.tolerance))
            wall = end_time(logs)
            r["wall"].append(wall)
            # allreduce's loss when this run's last peer finished: the comparison on one clock.
            r["ref_at_wall"].append(None if wall is None else loss_at(data["allreduce"][0], wall))
            # How long allreduce took to reach this run's final loss: the same loss on one clock.
            r["ref_time_to_this"].append(None if loss is None else time_to(data["allreduce"][0], loss))
    print(f"| algorithm | final val loss (nats) | minus allreduce's | MB between sites | allreduce's bytes / these "
          f"| time to allreduce's loss + {args.tolerance} (s) | time for all steps (s) | allreduce's loss at that time "
          f"| allreduce's time to this final loss (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in per_algorithm.items():
        cells = []
        for key, fmt in (("loss", "{:.3f}"), ("gap", "{:+.3f}"), ("bytes", "{:.1f}"), ("fewer", "{:.0f}x"), ("time", "{:.0f}"),
                         ("wall", "{:.0f}"), ("ref_at_wall", "{:.3f}"), ("ref_time_to_this", "{:.0f}")):
            vals = [None if v is None else (v / 1e6 if key == "bytes" else v) for v in r[key]]
            m, s, n = mean_spread(vals)
            missing = len(vals) - n
            cell = "-" if m is None else (fmt.format(m) + " ± " + fmt.format(s).lstrip("+"))
            if missing:
                cell += f" ({missing} of {len(vals)} never)"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
        if args.json:
            print(json.dumps({"algorithm": name, **r, "seeds": len(r["loss"])}))


if __name__ == "__main__":
    main()
