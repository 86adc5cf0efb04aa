"""The report's panels as data: which runs hearsay-plot found, how they group into lines
(repeats of the same swept values), and what every panel shows, computed once from the
logs for both the matplotlib figures (hearsay_draw) and the page (hearsay_plot). Each
figure is hearsay_figures' definition of it: the curves against time are the peers' mean
curves on the run's clock, the bytes axis what every peer had sent by then.
"""
import bisect
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402

# matplotlib's tab10, then darker and lighter variants: one colour per line, the same in
# every figure and on the page.
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354"]

# The x axes every evaluated metric is drawn against: (key, axis label, logarithmic).
X_AXES = (("time", "wall-clock time (s)", False), ("steps", "steps (mean of peers)", False),
          ("bytes", "bytes sent (all peers)", True))

# The most peers a step-rate panel draws one by one.
MAX_PEERS_DRAWN = 12


class Run:
    """One cluster run: its peers' events (on the run's clock: hearsay_figures.Logs), its
    summary, and the swept values that name its line."""

    def __init__(self, directory, logs):
        self.dir = directory
        self.peers = dict(hearsay_logs.read_log(path) for path in logs)
        self.logs = hearsay_figures.Logs(self.peers)
        self.summary = None
        summary = os.path.join(directory, "summary.json")
        if os.path.exists(summary):
            with open(summary, encoding="utf-8") as f:
                self.summary = json.load(f)
        self.values = {k: str(v) for k, v in ((self.summary or {}).get("values") or {}).items()}
        self.repeat = (self.summary or {}).get("repeat", 0)
        self.name = os.path.basename(os.path.abspath(directory))

    def curve(self, x_kind, field):
        """(x, the peers' mean of field: test_acc or test_loss) at each point of its mean
        curve. x is the time, the peers' mean step, or the bytes every peer had sent by then
        (from the first byte a peer reported sending)."""
        curve = self.logs.mean_curve(field)
        if x_kind == "time":
            return list(curve)
        if x_kind == "steps":
            return [(self.logs.mean_steps(t), v) for t, v in curve]
        first = self.logs.first_byte_s()
        return [(self.logs.bytes_sent(t), v) for t, v in curve if first is not None and t >= first]

    def train_loss(self):
        return hearsay_figures.train_loss_curve(self.peers)

    def step_rates(self):
        """{peer: [(t on the run's clock, samples/s)]}."""
        out = {}
        for peer, events in self.logs.events.items():
            pts = [(t, e["samples_per_s"]) for t, e in events
                   if e.get("event") == "step" and hearsay_figures.finite(e.get("samples_per_s")) and e["samples_per_s"] > 0]
            if pts:
                out[peer] = pts
        return dict(sorted(out.items()))

    def staleness(self):
        return hearsay_figures.staleness_windows(self.peers, "p50")


def find_runs(paths):
    runs = []
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"hearsay-plot: error: {p}: no such file or directory")
        if os.path.isfile(p):
            runs.append(Run(os.path.dirname(p) or ".", [p]))
            continue
        found = False
        for root, dirs, _files in os.walk(p):
            dirs.sort()
            logs = hearsay_logs.peer_logs(root)
            if logs:
                runs.append(Run(root, logs))
                found = True
        if not found:
            raise SystemExit(f"hearsay-plot: error: {p}: no peer logs (*.jsonl) in it or below it")
    return runs


class Line:
    """The runs drawn as one line: repeats of the same swept values."""

    def __init__(self, index, label, short, runs):
        self.index, self.label, self.runs = index, label, runs
        self.color = COLORS[index % len(COLORS)]
        # Beside the legend's title, which names the swept fields: the values alone.
        self.legend = f"{short} (x{len(runs)})" if len(runs) > 1 else short


def group(runs):
    """(lines, what varies). A line's label names only the swept fields whose values differ
    between the runs; runs that name none (separate runs plotted together) are told apart by
    their directories."""
    keys = []
    for r in runs:
        keys += [k for k in r.values if k not in keys]
    varying = [k for k in keys if len({r.values.get(k) for r in runs}) > 1]
    by_key = {}
    for r in runs:
        key = tuple(r.values.get(k, "-") for k in varying) if varying else (r.name if len(runs) > 1 else "",)
        by_key.setdefault(key, []).append(r)
    lines = []
    for key, members in by_key.items():
        if varying:
            label = ", ".join(f"{k}={v}" for k, v in zip(varying, key))
            short = ", ".join(key)
        else:
            label = short = key[0] or (members[0].summary or {}).get("name") or members[0].name
        lines.append(Line(len(lines), label, short, members))
    title = ", ".join(varying) if varying else ("run directory" if len(lines) > 1 else "run")
    return lines, title


def line_series(line, x, y, lo, hi):
    s = {"line": line.index, "x": x, "y": y}
    if len(line.runs) > 1:
        s.update(lo=lo, hi=hi)
    return s


def evaluated_panels(lines, field, scale, name, figure, ylabel, hline):
    panels = []
    for kind, xlabel, xlog in X_AXES:
        series = []
        for line in lines:
            x, m, lo, hi = hearsay_figures.mean_band([r.curve(kind, field) for r in line.runs])
            if x:
                series.append(line_series(line, x, [scale * v for v in m], [scale * v for v in lo],
                                          [scale * v for v in hi]))
        panels.append({"id": f"{figure}-{kind}", "figure": figure, "kind": "lines",
                       "title": f"{name} against {'time' if kind == 'time' else kind}", "xlabel": xlabel,
                       "ylabel": ylabel, "xlog": xlog, "ylog": False, "series": series, "hline": hline,
                       "empty": "no evaluation after the first byte sent" if kind == "bytes" else "no evaluations"})
    return panels


def staleness_panel(lines):
    data = [(line, line_taus) for line in lines for line_taus in [[t for r in line.runs for t in r.staleness()]]
            if line_taus]
    series, width = [], 1.0
    if data:
        top = max(max(taus) for _, taus in data)
        if top < 60:
            edges = [b - 0.5 for b in range(0, int(top) + 2)]
        else:
            edges = [top * i / 40 for i in range(41)]
        width = edges[1] - edges[0]
        for line, taus in data:
            counts = [0] * (len(edges) - 1)
            for t in taus:
                counts[min(len(counts) - 1, max(0, bisect.bisect_right(edges, t) - 1))] += 1
            series.append({"line": line.index, "x": [(a + b) / 2 for a, b in zip(edges, edges[1:])],
                           "y": [c / len(taus) for c in counts]})
    return {"id": "staleness", "figure": "staleness", "kind": "bars", "title": "Staleness of applied updates",
            "xlabel": "staleness (steps; median of a peer's log window)", "ylabel": "share of windows",
            "xlog": False, "ylog": False, "series": series, "width": width, "hline": None,
            "empty": "no asynchronous updates were applied"}


def panels_of(lines, target):
    panels = evaluated_panels(lines, "test_acc", 100, "Test accuracy", "accuracy", "test accuracy (%, mean of peers)",
                              100 * target if target else None)
    panels += evaluated_panels(lines, "test_loss", 1, "Test loss", "test-loss", "test loss (mean of peers)", None)
    series = []
    for line in lines:
        x, m, lo, hi = hearsay_figures.mean_band([r.train_loss() for r in line.runs])
        if x:
            series.append(line_series(line, x, m, lo, hi))
    panels.append({"id": "train-loss", "figure": "train-loss", "kind": "lines", "title": "Training loss against steps",
                   "xlabel": "step", "ylabel": "training loss (mean of peers)", "xlog": False,
                   "ylog": all(v > 0 for s in series for v in s["y"] + s.get("lo", [])), "series": series,
                   "hline": None, "empty": "no step events with a loss"})
    panels.append(staleness_panel(lines))
    for line in lines:
        first = line.runs[0]
        rates = first.step_rates()
        names = {peer: peer for peer in rates}
        which = f", repeat {first.repeat}" if len(line.runs) > 1 else ""
        if len(rates) > MAX_PEERS_DRAWN:
            # Hundreds of peers (the simulator's) are no legend: the slowest, the median and
            # the fastest peer by their median rate stand for them.
            order = sorted(rates, key=lambda peer: statistics.median(v for _, v in rates[peer]))
            picked = {order[0]: "slowest", order[len(order) // 2]: "median", order[-1]: "fastest"}
            which += f"; 3 of {len(rates)} peers"
            names = {peer: f"{peer} ({what})" for peer, what in picked.items()}
            rates = {peer: rates[peer] for peer in picked}
        series = [{"name": names[peer], "x": [p[0] for p in pts], "y": [p[1] for p in pts]} for peer, pts in rates.items()]
        panels.append({"id": f"step-rate-{line.index}", "figure": "step_rate", "kind": "peers", "line": line.index,
                       "title": f"Step rate per peer: {line.label}{which}", "xlabel": "wall-clock time (s)",
                       "ylabel": "samples/s", "xlog": False, "ylog": False, "series": series, "hline": None,
                       "empty": "no step events with a rate"})
    for p in panels:
        for axis in ("x", "y"):
            values = [v for s in p["series"] for v in s[axis] + (s.get("lo", []) if axis == "y" else [])]
            if p[axis + "log"] and values and min(values) > 0:
                p[axis + "ticks"] = log_ticks(min(values), max(values), si_bytes if p[axis + "label"].startswith("bytes")
                                              else (lambda v: f"{v:g}"))
    return panels


def log_ticks(lo, hi, text):
    """{"values", "text"}: a logarithmic axis's ticks from lo to hi, as matplotlib's are."""
    values = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
              for m in log_subs(lo, hi)]
    values = [float(f"{v:.6g}") for v in values if lo / 1.3 <= v <= hi * 1.3]
    return {"values": values, "text": [text(v) for v in values]}


def si_bytes(v, spec="g"):
    """1500000 -> '1.5 MB'."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(v) >= scale:
            return f"{v / scale:{spec}} {unit}"
    return f"{v:{spec}} B"


def log_subs(lo, hi):
    """Which multiples of each power of ten a logarithmic axis from lo to hi labels."""
    span = math.log10(hi / lo) if lo > 0 and hi > lo else 0
    return (1.0, 2.0, 3.0, 5.0, 7.0) if span < 1 else (1.0, 2.0, 5.0) if span < 2.5 else (1.0,)


def target_of(runs):
    target = next((r.summary.get("target_test_acc") for r in runs if r.summary and r.summary.get("target_test_acc")), None)
    if target is None:
        target = next((e.get("target_test_acc") for r in runs for ev in r.peers.values() for e in ev
                       if e.get("event") == "start" and e.get("target_test_acc")), 0.0)
    return target
