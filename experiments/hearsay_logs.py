"""Reading hearsay's JSON Lines logs (docs/LOGS.md) and summarizing a run from them.

Shared by hearsay-run (the summary it writes) and hearsay-plot (what it draws). Only the
logs are read, so both work on runs copied from other machines.
"""
import glob
import json
import os
import re
import statistics
import sys


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


def first_at_or_above(evals, target):
    for e in evals:
        if e.get("test_acc") is not None and e["test_acc"] >= target:
            return e
    return None


def mean_accuracy_series(peer_events):
    """The peers' mean test accuracy over time, the one curve time to target is read from
    (docs/LOGS.md, "Time to target"): after each eval event of any peer, once every peer
    has one, the mean of each peer's latest test accuracy. A peer that a simulated crash
    took down (its "fault" event, kind crash or churn, state begin) is left out of both
    until it starts again: one that never comes back must not hold the run from its target.
    Times are seconds since the earliest peer's start; each "start" event's unix_time places
    its incarnation's t among the other peers' (without it in every log, all peers count as
    starting together). peer_events: {name: [events]}."""
    # A simulated peer that never evaluates (simulation.eval_peers) is not waited for.
    peer_events = {name: events for name, events in peer_events.items()
                   if not any(e.get("event") == "start" and e.get("evaluates") is False for e in events)}
    aligned = all(any(e.get("event") == "start" and _is_number(e.get("unix_time")) for e in events)
                  for events in peer_events.values())
    points, origins = [], []
    down = {name: [] for name in peer_events}  # [begin, end) a crash held each peer down
    for name, events in peer_events.items():
        origin = 0.0  # this incarnation's t = 0, in unix time when aligned
        for e in events:
            if e.get("event") == "start":
                if aligned and _is_number(e.get("unix_time")):
                    origin = e["unix_time"] - e["t"]
                    origins.append(origin)
                if down[name] and down[name][-1][1] is None:
                    down[name][-1][1] = origin + e["t"]  # back
            elif e.get("event") == "eval" and _is_number(e.get("test_acc")):
                points.append((origin + e["t"], name, e["test_acc"]))
            elif (e.get("event") == "fault" and e.get("kind") in ("crash", "churn") and e.get("state") == "begin"
                  and e.get("target") == name and _is_number(e.get("t"))):
                down[name].append([origin + e["t"], None])
    base = min(origins) if aligned and origins else 0.0

    def up_at(name, t):
        return not any(b <= t and (end is None or t < end) for b, end in down[name])

    latest, series = {}, []
    for t, name, acc in sorted(points, key=lambda p: p[0]):
        latest[name] = acc
        live = [n for n in peer_events if up_at(n, t)]
        if live and all(n in latest for n in live):
            series.append((t - base, sum(latest[n] for n in live) / len(live)))
    return series


def time_to_target(series, target):
    """The first time the peers' mean test accuracy reached the target, or None."""
    if target <= 0:
        return None
    return next((t for t, acc in series if acc >= target), None)


def peer_summary(events, target):
    evals = [e for e in events if e.get("event") == "eval"]
    steps = [e for e in events if e.get("event") == "step"]
    gossip = [e for e in events if e.get("event") == "gossip"]
    end = next((e for e in reversed(events) if e.get("event") == "end"), None)
    hit = first_at_or_above(evals, target) if target > 0 else None
    bytes_sent = 0
    if end is not None and end.get("bytes_sent") is not None:
        bytes_sent = end["bytes_sent"]
    elif gossip:
        bytes_sent = gossip[-1].get("bytes_sent", 0)
    last_step = max([e.get("step", 0) for e in steps + evals + gossip] + [end.get("steps", 0) if end else 0])
    return {
        "final_test_acc": evals[-1]["test_acc"] if evals else None,
        "final_test_loss": evals[-1].get("test_loss") if evals else None,
        "time_to_target_s": hit["t"] if hit else None,
        "step_at_target": hit.get("step") if hit else None,
        "steps": last_step,
        "bytes_sent": bytes_sent,
        "finished": end is not None,
        "wall_s": events[-1]["t"] if events else 0,
    }


def _first_start(events):
    """A log's first start event that carries unix_time, or None."""
    return next((e for e in events if e.get("event") == "start" and _is_number(e.get("unix_time"))), None)


def start_offsets(peer_events):
    """Each peer's first start on the run's clock (seconds after the earliest peer's, from
    the start events' unix_time; all 0 when a log lacks it), as mean_accuracy_series
    places them."""
    first = {}
    for name, events in peer_events.items():
        s = _first_start(events)
        first[name] = s["unix_time"] - s["t"] if s else None
    if any(v is None for v in first.values()) or not first:
        return {name: 0.0 for name in peer_events}
    base = min(first.values())
    return {name: v - base for name, v in first.items()}


def all_started_s(peer_events):
    """When the last peer began training, on the run's clock (its first start event, written
    once its data is loaded and its model built; start_offsets places its log among the
    others'). A simulated run's peers all start at 0; a real one's after loading and
    admission: what separates the two clocks at the outset."""
    offsets = start_offsets(peer_events)
    starts = [offsets[name] + s["t"] for name, s in ((n, _first_start(ev)) for n, ev in peer_events.items()) if s]
    return max(starts) if starts else 0.0


def bytes_at(events, t):
    """A peer's bytes sent by time t of its own log: linear between the gossip events
    around t (each carries the running total); the last total once t is past them."""
    points = [(0.0, 0)] + [(e["t"], e["bytes_sent"]) for e in events
                           if e.get("event") == "gossip" and e.get("bytes_sent") is not None]
    end = next((e for e in reversed(events) if e.get("event") == "end" and e.get("bytes_sent") is not None), None)
    if end is not None:
        points.append((end["t"], end["bytes_sent"]))
    for (t0, b0), (t1, b1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return points[-1][1]


def median_step_s(events):
    """The median over a peer's step windows of its time per step (computation and waiting
    on neighbours, evaluations excluded), from samples_per_s and the start event's batch."""
    start = next((e for e in events if e.get("event") == "start"), None)
    if start is None or not start.get("batch_size"):
        return None
    w = [start["batch_size"] / e["samples_per_s"] for e in events if e.get("event") == "step" and (e.get("samples_per_s") or 0) > 0]
    return statistics.median(w[1:] if len(w) > 2 else w) if w else None


def run_summary(directory, target):
    """The fields of summary.json for one run: time_to_target_s is when the peers' mean test
    accuracy first reached the target (mean_accuracy_series), final_test_acc the peers' mean."""
    peers = {}
    all_events = {}
    taus = {"p50": [], "p90": [], "p99": []}
    tau_max = 0
    quarantines = []
    for path in peer_logs(directory):
        name, events = read_log(path)
        all_events[name] = events
        peers[name] = peer_summary(events, target)
        for e in events:
            if e.get("event") == "quarantine" and e.get("state") == "on":
                quarantines.append({"peer": name, "neighbour": e.get("neighbour"), "step": e.get("step"),
                                    "t": e.get("t"), "reason": e.get("reason")})
            if e.get("event") == "gossip" and e.get("applied", 0) > 0:
                for k in taus:
                    if e.get("tau_" + k) is not None:
                        taus[k].append(e["tau_" + k])
                tau_max = max(tau_max, e.get("tau_max") or 0)
    reached = sum(1 for p in peers.values() if p["time_to_target_s"] is not None)
    ttt = time_to_target(mean_accuracy_series(all_events), target)
    accs = [p["final_test_acc"] for p in peers.values() if p["final_test_acc"] is not None]
    step_s = [v for v in (median_step_s(ev) for ev in all_events.values()) if v is not None]
    offsets = start_offsets(all_events)
    started = all_started_s(all_events)
    return {
        "time_to_target_s": ttt,
        # The same, counted from when the last peer began training (all_started_s).
        "time_to_target_after_start_s": ttt - started if ttt is not None else None,
        "all_started_s": started,
        "target_test_acc": target,
        "peers_reached_target": reached,
        "final_test_acc": statistics.fmean(accs) if accs else None,
        "final_test_acc_min": min(accs) if accs else None,
        "final_test_acc_max": max(accs) if accs else None,
        "bytes_sent_total": sum(p["bytes_sent"] for p in peers.values()),
        # Bytes every peer had sent when the mean accuracy reached the target (None: never).
        "bytes_to_target_total": (round(sum(bytes_at(ev, ttt - offsets[name]) for name, ev in all_events.items()))
                                  if ttt is not None else None),
        # The slowest peer's median time per step (synchronous peers all wait for it).
        "step_s_max_median": max(step_s) if step_s else None,
        "steps_total": sum(p["steps"] for p in peers.values()),
        "staleness": {
            "p50": statistics.median(taus["p50"]) if taus["p50"] else None,
            "p90": statistics.median(taus["p90"]) if taus["p90"] else None,
            "p99": statistics.median(taus["p99"]) if taus["p99"] else None,
            "max": tau_max,
        },
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


def mean_sd(values, scale=1.0, fmt="{:.1f}"):
    """'mean ± sd' of the values that are not None (scaled), with how many never were; '-'
    when none is. The tables' one way of writing a point over its seeds."""
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
