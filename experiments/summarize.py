#!/usr/bin/python3
"""Summarizes a run directory of peer logs (docs/LOGS.md) as one JSON object:
per peer: final test accuracy, time to target, steps, step rate, bytes sent; for the
cluster: the median peer's time to target (the time by which half the peers had reached
it), the first peer's, and total bytes sent. Writes RUN_DIR/summary.json and prints it.

    /usr/bin/python3 experiments/summarize.py RUN_DIR [--target ACC]

Times to target come from the eval events (the first at or above the target, taken from
each log's start event unless --target is given), so a peer that was stopped early
still counts up to where it got.
"""
import glob
import json
import os
import statistics
import sys


def main():
    args = sys.argv[1:]
    target_override = None
    if "--target" in args:
        i = args.index("--target")
        target_override = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 1:
        raise SystemExit(__doc__)
    run = args[0]
    peers = {}
    for path in sorted(glob.glob(os.path.join(run, "*.jsonl"))):
        name = os.path.basename(path)[:-6]
        end, last_gossip, start, reached, last_eval = None, None, None, None, None
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    print(f"summarize: {path}:{number}: not JSON, skipped", file=sys.stderr)
                    continue
                kind = e.get("event")
                if kind == "end":
                    end = e
                elif kind == "gossip":
                    last_gossip = e
                elif kind == "start":
                    start = e
                elif kind == "eval":
                    last_eval = e
                    target = target_override or (start or {}).get("target_test_acc") or 0
                    if reached is None and target > 0 and (e.get("test_acc") or 0) >= target:
                        reached = e["t"]
        if end is None:
            peers[name] = {"finished": False, "time_to_target_s": reached,
                           "last_test_acc": (last_eval or {}).get("test_acc")}
            continue
        peers[name] = {
            "finished": True,
            "final_test_acc": end.get("final_test_acc"),
            "time_to_target_s": reached,
            "steps": end.get("steps"),
            "wall_s": end.get("t"),
            "steps_per_s": (end.get("steps") or 0) / end["t"] if end.get("t") else None,
            "bytes_sent": (last_gossip or {}).get("bytes_sent"),
            "tau_p90": (last_gossip or {}).get("tau_p90"),
        }
    times = sorted(p["time_to_target_s"] for p in peers.values() if p.get("time_to_target_s") is not None)
    finished = [p for p in peers.values() if p.get("finished")]
    summary = {
        "run": run,
        "peers": peers,
        "time_to_target_median_s": times[(len(peers) - 1) // 2] if len(times) > (len(peers) - 1) // 2 else None,
        "time_to_target_first_s": times[0] if times else None,
        "final_test_acc_mean": statistics.mean(p["final_test_acc"] for p in finished) if finished else None,
        "bytes_sent_total": sum(p.get("bytes_sent") or 0 for p in finished),
    }
    with open(os.path.join(run, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
