"""Reading hearsay's JSON Lines logs (docs/LOGS.md) and summarizing a run from them.

Shared by hearsay-run (the summary it writes), hearsay-plot (what it draws) and the
tables. The figures themselves are defined in hearsay_figures. Only the logs are read, so
all of them work on runs copied from other machines.
"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_figures  # noqa: E402


# Fields that are numbers wherever they appear. Counts are never null; the others are null
# where the value was not finite. A line that gives one of them another type was not
# written by a peer (or was damaged), and is skipped rather than failing a reader later.
COUNT_FIELDS = frozenset((
    "t", "step", "steps", "clock", "bytes_sent", "bytes_received", "applied", "dropped", "coalesced", "rejected",
    "buffered_bytes", "params", "shard_size", "batch_size", "total_steps", "seed", "bytes_to_target", "their_step"))
NUMBER_FIELDS = frozenset((
    "epoch", "loss", "lr", "samples_per_s", "test_acc", "test_loss", "eval_s", "tau_p50", "tau_p90", "tau_p99",
    "tau_max", "weight_mean", "target_test_acc", "final_test_acc", "final_test_loss", "train_s", "time_to_target_s",
    "write_s", "their_wall_s", "distance"))
STRING_FIELDS = frozenset(("peer", "event"))


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def event_problem(e):
    """Why a decoded log line cannot be an event, or None when it can."""
    if not isinstance(e, dict):
        return f"not a JSON object but a {type(e).__name__}"
    if "t" not in e:
        return "no field 't'"
    for k, v in e.items():
        if k in COUNT_FIELDS and not _is_number(v):
            return f"field '{k}' is {json.dumps(v)[:40]}, not a number"
        if k in NUMBER_FIELDS and v is not None and not _is_number(v):
            return f"field '{k}' is {json.dumps(v)[:40]}, not a number or null"
        if k in STRING_FIELDS and not isinstance(v, str):
            return f"field '{k}' is {json.dumps(v)[:40]}, not a string"
    return None


def read_log(path, warn=True):
    """Returns (peer name, list of events). A line that is not JSON (a run killed mid-write)
    or not an event (a field of the wrong type) is reported and skipped."""
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                if warn:
                    print(f"hearsay: {path}:{number}: skipped a line that is not JSON ({err.msg})", file=sys.stderr)
                continue
            problem = event_problem(e)
            if problem is not None:
                if warn:
                    print(f"hearsay: {path}:{number}: skipped a line that is not an event ({problem})", file=sys.stderr)
                continue
            events.append(e)
    peer = next((e.get("peer") for e in events if "peer" in e), os.path.splitext(os.path.basename(path))[0])
    return peer, events


def peer_logs(directory):
    """The peer logs of one run directory: every *.jsonl but the in-process cluster's."""
    return [p for p in sorted(glob.glob(os.path.join(directory, "*.jsonl"))) if os.path.basename(p) != "cluster.jsonl"]


def peer_summary(logs, name, target):
    """One peer's entry in summary.json; its time to target is its own first evaluation at
    or above the target, on the run's clock (hearsay_figures.Logs)."""
    events = [e for _, e in logs.events[name]]
    evals = [e for e in events if e.get("event") == "eval"]
    steps = [e for e in events if e.get("event") in ("step", "gossip")]
    end = next((e for e in reversed(events) if e.get("event") == "end"), None)
    hit = logs.peer_reached(name, target)
    last_step = max([e.get("step", 0) for e in steps + evals] + [end.get("steps", 0) if end else 0])
    return {
        "final_test_acc": evals[-1]["test_acc"] if evals else None,
        "final_test_loss": evals[-1].get("test_loss") if evals else None,
        "time_to_target_s": hit[0] if hit else None,
        "step_at_target": hit[1].get("step") if hit else None,
        "steps": last_step,
        "bytes_sent": round(logs.bytes_sent(peers=[name])),
        "finished": end is not None,
        "wall_s": events[-1]["t"] if events else 0,
        "memory": peak_memory(events),
        "compute_utilisation": end.get("compute_utilisation") if end else None,
    }


def peak_memory(events):
    """The largest of a peer's memory events (docs/LOGS.md): its bytes by owner, host and
    device, its total and bytes a parameter; None for a log without one (an older peer)."""
    memory = [e for e in events if e.get("event") == "memory"]
    if not memory:
        return None
    m = max(memory, key=lambda e: e.get("total_bytes", 0))
    return {k: m[k] for k in ("step", "host", "device", "total_bytes", "bytes_per_param", "resident_bytes") if k in m}


def median_step_s(events):
    """The median over a peer's step windows of its time per step (computation and waiting
    on neighbours, evaluations excluded), from samples_per_s and the start event's batch."""
    start = next((e for e in events if e.get("event") == "start"), None)
    if start is None or not start.get("batch_size"):
        return None
    w = [start["batch_size"] / e["samples_per_s"] for e in events if e.get("event") == "step" and (e.get("samples_per_s") or 0) > 0]
    return statistics.median(w[1:] if len(w) > 2 else w) if w else None


def run_summary(directory, target):
    """The fields of summary.json for one run, each figure as hearsay_figures defines it:
    time_to_target_s when the peers' mean test accuracy first reached the target,
    final_test_acc that mean at the end of the logs (and the lowest and highest of the
    values it averages), bytes_to_target_total what every peer had sent by then."""
    all_events, quarantines = {}, []
    for path in peer_logs(directory):
        name, events = read_log(path)
        all_events[name] = events
        for e in events:
            if e.get("event") == "quarantine" and e.get("state") == "on":
                quarantines.append({"peer": name, "neighbour": e.get("neighbour"), "step": e.get("step"),
                                    "t": e.get("t"), "reason": e.get("reason")})
    logs = hearsay_figures.Logs(all_events)
    peers = {name: peer_summary(logs, name, target) for name in all_events}
    ttt = hearsay_figures.time_to_target(logs.mean_curve("test_acc"), target)
    final, finals = logs.final("test_acc")
    step_s = [v for v in (median_step_s(ev) for ev in all_events.values()) if v is not None]
    started = logs.all_started_s()
    return {
        "time_to_target_s": ttt,
        # The same, counted from when the last peer began training (Logs.all_started_s).
        "time_to_target_after_start_s": ttt - started if ttt is not None else None,
        "all_started_s": started,
        "target_test_acc": target,
        "peers_reached_target": sum(1 for p in peers.values() if p["time_to_target_s"] is not None),
        "final_test_acc": final,
        "final_test_acc_min": min(finals.values()) if finals else None,
        "final_test_acc_max": max(finals.values()) if finals else None,
        "bytes_sent_total": round(logs.bytes_sent()),
        # Bytes every peer had sent when the mean accuracy reached the target (None: never).
        "bytes_to_target_total": hearsay_figures.bytes_to_target(logs, ttt),
        # The slowest peer's median time per step (synchronous peers all wait for it).
        "step_s_max_median": max(step_s) if step_s else None,
        "steps_total": sum(p["steps"] for p in peers.values()),
        "staleness": hearsay_figures.staleness(all_events),
        # The mean over peers of their own compute's share of their training time.
        "compute_utilisation": hearsay_figures.compute_utilisation(all_events),
        # Neighbours a peer stopped mixing because their updates kept failing its checks.
        "quarantines": quarantines,
        "peers": peers,
    }


def simulator_log(directory):
    """What a simulated run's own log (cluster.jsonl) says: how it ended, its faults, the
    mean model's last accuracy. Empty for a run that was not simulated."""
    path = os.path.join(directory, "cluster.jsonl")
    if not os.path.exists(path):
        return {}
    _, events = read_log(path)
    out = {"faults": []}
    for e in events:
        kind = e.get("event")
        if kind == "sim_end":
            out["stopped_by"] = e.get("stopped_by")
            out["virtual_s"] = e.get("virtual_s")
            out["frames"] = e.get("frames")
        elif kind == "fault":
            out["faults"].append({k: e.get(k) for k in ("t", "kind", "state", "target", "until_s") if k in e})
        elif kind == "mean_eval":
            out["mean_model_final_test_acc"] = e.get("test_acc")
    return out


def wan_bytes_per_site(directory, site_of):
    """Bytes each site's peers sent to peers of other sites, from each peer's last gossip
    event's per-link counters. site_of: {peer: site}."""
    out = {}
    for path in peer_logs(directory):
        name, events = read_log(path, warn=False)
        last = next((e for e in reversed(events) if e.get("event") == "gossip" and isinstance(e.get("links"), dict)), None)
        site = site_of.get(name)
        if last is None or site is None:
            continue
        for neighbour, link in last["links"].items():
            if isinstance(link, dict) and site_of.get(neighbour) not in (None, site):
                out[site] = out.get(site, 0) + (link.get("bytes_sent") or 0)
    return dict(sorted(out.items()))


def steps_per_s_per_site(peers, site_of):
    """Each site's step rate: the mean over its peers of steps / wall seconds, from
    run_summary's peers. With site replicas every peer of a site steps together, so it is
    the site's rate; without, the mean GPU's. site_of: {peer: site}."""
    rates = {}
    for name, p in peers.items():
        site = site_of.get(name)
        if site is not None and p.get("steps") and p.get("wall_s"):
            rates.setdefault(site, []).append(p["steps"] / p["wall_s"])
    return {site: round(statistics.fmean(r), 2) for site, r in sorted(rates.items())}


def print_table(rows, markdown=False):
    """rows[0] is the header: as a Markdown table, or as aligned columns."""
    if markdown:
        print("| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for r in rows[1:]:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def sweep_runs(root):
    """The runs of a hearsay-run output directory, grouped by sweep point: {point name: [(run
    directory, its entry in the top summary's points)]}, in sweep order. Runs come point by
    point, each point's repeats in a row (repeat 0 starts a point); two points may share a
    label (one sweep value with different also_set fragments), so a point is named by its
    first run's directory, index included. A simulated run names its directory relative
    to the root (`dir`); a single run is the root itself."""
    with open(os.path.join(root, "summary.json"), encoding="utf-8") as f:
        top = json.load(f)
    groups, key = {}, None
    for point in top.get("points") or [top]:
        run_dir = point.get("run_dir") or os.path.join(root, point["dir"])
        if not os.path.isdir(run_dir):
            run_dir = root
        if key is None or point.get("repeat", 0) == 0:
            key = re.sub(r"-r\d+$", "", os.path.basename(run_dir))
        groups.setdefault(key, []).append((run_dir, point))
    return groups
