#!/usr/bin/python3
"""hearsay-plot: convergence plots and an HTML report from hearsay's logs (docs/LOGS.md).

    hearsay-plot RUN_DIR_OR_LOG... [--out DIR] [--target ACC]

hearsay-run writes this report at the end of every run; hearsay-plot draws it again, or
draws several runs on one page. Each argument is a run directory of hearsay-run (a
sweep's or repeats' sub-runs are found inside it), a directory of peer logs, or one log
(*.jsonl). Runs with the same swept values are repeats of one line: drawn as their mean
with a band from the lowest to the highest; the legend names only the fields that vary.
Writes to --out (default: the first directory given):

  index.html           the summary table and every panel, interactive (zoom, hover for
                       values, runs toggled on and off) with plotly.js, written beside it;
                       without JavaScript it shows the PNG figures below
  plotly.js            Debian's python3-plotly's plotly.js: nothing is fetched at view time
  accuracy.png/.svg    test accuracy (mean over peers) against wall-clock time, steps
                       (mean over peers) and bytes sent (all peers, from the first byte)
  test-loss.png/.svg   test loss against the same three
  train-loss.png/.svg  training loss (mean over peers) against steps
  staleness.png/.svg   histogram of staleness (each peer's median per log window)
  step_rate.png/.svg   each peer's step rate over time, one panel per line

It reads only the logs (and summary.json where present), so it works on runs copied from
other machines. Times are on the run's clock: each peer's start event's unix_time places
its log among the others' (docs/LOGS.md, "Time to target").
"""
import argparse
import bisect
import html
import json
import math
import os
import statistics
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_logs  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# matplotlib's tab10, then darker and lighter variants: one colour per line, the same in
# every figure and on the page.
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354"]

# The x axes every evaluated metric is drawn against: (key, axis label, logarithmic).
X_AXES = (("time", "wall-clock time (s)", False), ("steps", "steps (mean of peers)", False),
          ("bytes", "bytes sent (all peers)", True))

# The most peers a step-rate panel draws one by one.
MAX_PEERS_DRAWN = 12

# The most points a trace carries into the page (every point goes into the PNG and SVG).
MAX_PAGE_POINTS = 2000


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_clock(peer_events):
    """Every event of every peer as (t on the run's clock, peer, event), in time order.
    Each start event's unix_time places its incarnation's t among the other peers' (as
    hearsay_logs.mean_accuracy_series does); without one in every log, all peers count as
    starting together."""
    aligned = all(any(e.get("event") == "start" and _number(e.get("unix_time")) for e in events)
                  for events in peer_events.values())
    out, origins = [], []
    for name, events in peer_events.items():
        origin = 0.0
        for e in events:
            if e.get("event") == "start" and aligned and _number(e.get("unix_time")):
                origin = e["unix_time"] - e["t"]
                origins.append(origin)
            out.append((origin + e["t"], len(out), name, e))
    base = min(origins) if aligned and origins else 0.0
    out.sort(key=lambda x: (x[0], x[1]))
    return [(t - base, name, e) for t, _, name, e in out]


class Run:
    """One cluster run: its peers' events, its summary, and the swept values that name its line."""

    def __init__(self, directory, logs):
        self.dir = directory
        self.peers = {}
        for path in logs:
            name, events = hearsay_logs.read_log(path)
            self.peers[name] = events
        self.summary = None
        summary = os.path.join(directory, "summary.json")
        if os.path.exists(summary):
            with open(summary, encoding="utf-8") as f:
                self.summary = json.load(f)
        self.values = {k: str(v) for k, v in ((self.summary or {}).get("values") or {}).items()}
        self.repeat = (self.summary or {}).get("repeat", 0)
        self.name = os.path.basename(os.path.abspath(directory))
        self._rows = None

    def rows(self):
        """(t, mean step, bytes sent, mean test accuracy, mean test loss) after each evaluation
        of any peer once every evaluating peer has evaluated (the curve time to target is read
        from): the peers' mean of their latest figures, the bytes all peers had sent by then."""
        if self._rows is not None:
            return self._rows
        evaluating = {name for name, events in self.peers.items()
                      if not any(e.get("event") == "start" and e.get("evaluates") is False for e in events)}
        # Each peer's latest figure, and their sums kept as they change (a run may have
        # a thousand peers).
        latest = {k: {} for k in ("step", "sent", "acc", "loss")}
        total = {k: 0.0 for k in latest}

        def put(kind, peer, value):
            total[kind] += value - latest[kind].get(peer, 0.0)
            latest[kind][peer] = value

        self._rows = []
        for t, peer, e in run_clock(self.peers):
            kind = e.get("event")
            if _number(e.get("step")):
                put("step", peer, e["step"])
            elif kind == "end" and _number(e.get("steps")):
                put("step", peer, e["steps"])
            if kind in ("gossip", "end") and _number(e.get("bytes_sent")):
                put("sent", peer, e["bytes_sent"])
            if kind != "eval" or peer not in evaluating or not _number(e.get("test_acc")):
                continue
            put("acc", peer, e["test_acc"])
            if _number(e.get("test_loss")):
                put("loss", peer, e["test_loss"])
            if len(latest["acc"]) < len(evaluating):
                continue
            self._rows.append((t, total["step"] / max(1, len(latest["step"])), total["sent"],
                               total["acc"] / len(latest["acc"]),
                               total["loss"] / len(latest["loss"]) if latest["loss"] else None))
        return self._rows

    def curve(self, x_kind, column):
        """(x, value) of rows(): x is time, steps or bytes; column 3 is test accuracy, 4 test
        loss. Against bytes it starts at the first evaluation after a byte was sent."""
        xi = {"time": 0, "steps": 1, "bytes": 2}[x_kind]
        return [(r[xi], r[column]) for r in self.rows() if r[column] is not None and (x_kind != "bytes" or r[2] > 0)]

    def train_loss(self):
        """(step, training loss averaged over the peers that logged that step)."""
        by_step = {}
        for events in self.peers.values():
            for e in events:
                if e.get("event") == "step" and _number(e.get("loss")) and _number(e.get("step")):
                    by_step.setdefault(e["step"], []).append(e["loss"])
        return [(s, sum(v) / len(v)) for s, v in sorted(by_step.items())]

    def step_rates(self):
        """{peer: [(t on the run's clock, samples/s)]}."""
        out = {}
        for t, peer, e in run_clock(self.peers):
            if e.get("event") == "step" and _number(e.get("samples_per_s")) and e["samples_per_s"] > 0:
                out.setdefault(peer, []).append((t, e["samples_per_s"]))
        return dict(sorted(out.items()))

    def staleness(self):
        return [e["tau_p50"] for events in self.peers.values() for e in events
                if e.get("event") == "gossip" and (e.get("applied") or 0) > 0 and _number(e.get("tau_p50"))]


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


def mean_band(curves):
    """Mean and (min, max) of several step curves [(x, value)] on the union of their x
    values, from where every curve has a value."""
    curves = [sorted(c) for c in curves if c]
    if not curves:
        return [], [], [], []
    xs_of = [[x for x, _ in c] for c in curves]
    xs = sorted({x for c in xs_of for x in c})
    out_x, mean, lo, hi = [], [], [], []
    for x in xs:
        vals = []
        for c, cx in zip(curves, xs_of):
            i = bisect.bisect_right(cx, x)
            if i:
                vals.append(c[i - 1][1])
        if len(vals) < len(curves):  # not every repeat has a value yet
            continue
        out_x.append(x)
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return out_x, mean, lo, hi


# --- panels: what every figure and the page draw, computed once from the logs ---------------


def line_series(line, x, y, lo, hi):
    s = {"line": line.index, "x": x, "y": y}
    if len(line.runs) > 1:
        s.update(lo=lo, hi=hi)
    return s


def evaluated_panels(lines, column, scale, name, figure, ylabel, hline):
    panels = []
    for kind, xlabel, xlog in X_AXES:
        series = []
        for line in lines:
            x, m, lo, hi = mean_band([r.curve(kind, column) for r in line.runs])
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
    panels = evaluated_panels(lines, 3, 100, "Test accuracy", "accuracy", "test accuracy (%, mean of peers)",
                              100 * target if target else None)
    panels += evaluated_panels(lines, 4, 1, "Test loss", "test-loss", "test loss (mean of peers)", None)
    series = []
    for line in lines:
        x, m, lo, hi = mean_band([r.train_loss() for r in line.runs])
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


# --- matplotlib: the PNG and SVG figures -----------------------------------------------------


def wrap(text, width):
    return "\n".join(textwrap.wrap(text, width)) or text


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


def log_axis_ticks(axis, lo, hi):
    """Plain-number ticks on a logarithmic axis: with less than a decade or two, matplotlib
    labels minor ticks in scientific notation, wide enough to run into the axis label."""
    axis.set_major_locator(ticker.LogLocator(base=10, subs=log_subs(lo, hi)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def few_points(s):
    """A marker for a series too short to show as a line (one point draws none)."""
    return "o" if len(s["x"]) < 3 else None


def draw_panel(ax, panel, lines):
    if panel["kind"] == "bars":
        n = max(1, len(panel["series"]))
        w = panel["width"] * 0.8 / n
        for k, s in enumerate(panel["series"]):
            line = lines[s["line"]]
            ax.bar([x - panel["width"] * 0.4 + w * (k + 0.5) for x in s["x"]], s["y"], width=w, color=line.color,
                   label=line.legend)
    elif panel["kind"] == "peers":
        for s in panel["series"]:
            ax.plot(s["x"], s["y"], label=s["name"], marker=few_points(s))
        if panel["series"]:
            ax.legend(fontsize=7, ncol=max(1, min(4, len(panel["series"]) // 4)), title="peer", title_fontsize=7)
    else:
        for s in panel["series"]:
            line = lines[s["line"]]
            ax.plot(s["x"], s["y"], color=line.color, label=line.legend, marker=few_points(s))
            if "lo" in s:
                ax.fill_between(s["x"], s["lo"], s["hi"], color=line.color, alpha=0.2, linewidth=0)
    if not panel["series"]:
        ax.text(0.5, 0.5, panel["empty"], ha="center", va="center", transform=ax.transAxes)
    if panel["hline"] is not None and panel["series"]:
        ax.axhline(panel["hline"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(panel["xlabel"])
    ax.set_ylabel(panel["ylabel"])
    ax.set_title(wrap(panel["title"], 56), fontsize=10)
    ax.grid(alpha=0.3)
    for axis, log, values in ((ax.xaxis, panel["xlog"], [v for s in panel["series"] for v in s["x"]]),
                              (ax.yaxis, panel["ylog"], [v for s in panel["series"] for v in s["y"] + s.get("lo", [])])):
        if log and values and min(values) > 0:
            (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
            log_axis_ticks(axis, min(values), max(values))
    if panel["xlabel"].startswith("bytes"):
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: si_bytes(v)))


def figures(panels, lines, legend_title):
    """(stem, matplotlib figure) for each figure file, drawn from the panels."""
    by_figure = {}
    for p in panels:
        by_figure.setdefault(p["figure"], []).append(p)
    handles = [Line2D([], [], color=line.color, linewidth=2) for line in lines]
    labels = [wrap(line.legend, 40) for line in lines]
    for stem, group_panels in by_figure.items():
        n = len(group_panels)
        if stem == "step_rate":
            cols = min(n, 3)
            rows = -(-n // cols)
            fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 3.6 * rows), squeeze=False, constrained_layout=True)
            axes = list(axes.flat)
            for ax in axes[n:]:
                ax.set_visible(False)
        else:
            fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 2.6, 4.0), squeeze=False, constrained_layout=True)
            axes = list(axes.flat)
        for ax, panel in zip(axes, group_panels):
            draw_panel(ax, panel, lines)
        if stem != "step_rate":
            # One legend, right of the figure's last panel: it names what varies.
            axes[n - 1].legend(handles, labels, title=legend_title, fontsize=8, title_fontsize=8,
                               loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        yield stem, fig


def text_boxes(fig):
    """(text, window extent) of every visible piece of text of a drawn figure."""
    renderer = fig.canvas.get_renderer()
    texts = list(fig.texts)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]  # noqa: SLF001
        texts += ax.texts
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if lo - 1e-12 * abs(hi - lo) <= tick.get_loc() <= hi + 1e-12 * abs(hi - lo):
                    texts += [tick.label1, tick.label2]
            texts.append(axis.get_offset_text())
        legend = ax.get_legend()
        if legend is not None:
            texts += legend.get_texts() + [legend.get_title()]
    out = []
    for t in texts:
        if t.get_visible() and t.get_text().strip():
            out.append((t.get_text(), t.get_window_extent(renderer)))
    return out


def overlapping_text(fig):
    """Pairs of texts of a figure whose boxes overlap (more than a pixel each way)."""
    fig.canvas.draw()
    boxes = text_boxes(fig)
    out = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            if min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 1 and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 1:
                out.append((a, b))
    return out


def save(fig, out, stem):
    for pair in overlapping_text(fig):
        print(f"hearsay-plot: warning: {stem}.png: text {pair[0]!r} overlaps {pair[1]!r}", file=sys.stderr)
    # The same logs give the same bytes (the simulator's runs are compared whole): no
    # date in the SVG, and its element ids from a fixed salt instead of a random one.
    with plt.rc_context({"svg.hashsalt": "hearsay"}):
        fig.savefig(os.path.join(out, f"{stem}.png"), dpi=110)
        fig.savefig(os.path.join(out, f"{stem}.svg"), dpi=110, metadata={"Date": None})
    plt.close(fig)


# --- the page ----------------------------------------------------------------------------------


def fmt(v, spec=".2f", scale=1.0, unit=""):
    return "-" if v is None else f"{v * scale:{spec}}{unit}"


def fmt_bytes(v):
    return "-" if v is None else si_bytes(v, ".3g")


def decimate(s):
    """A series cut to at most MAX_PAGE_POINTS points (always with its last), numbers to 6 digits."""
    n = len(s["x"])
    keep = range(n) if n <= MAX_PAGE_POINTS else sorted(set(range(0, n, -(-n // MAX_PAGE_POINTS))) | {n - 1})
    out = dict(s)
    for k in ("x", "y", "lo", "hi"):
        if k in s:
            out[k] = [float(f"{s[k][i]:.6g}") for i in keep]
    return out


def plotly_js_to(out):
    """plotly.js beside the page, from Debian's python3-plotly (a hard link where it can be:
    the same 8.6 MB in every report). Returns False without python3-plotly."""
    try:
        import plotly.offline
    except ImportError:
        return False
    dest = os.path.join(out, "plotly.js")
    debian = "/usr/share/python3-plotly/plotly.js"  # where Debian's get_plotlyjs() reads it
    if os.path.exists(dest) and os.path.exists(debian) and os.path.samefile(dest, debian):
        return True
    tmp = dest + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    try:
        os.link(debian, tmp)
    except OSError:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(plotly.offline.get_plotlyjs())
    os.replace(tmp, dest)
    return True


PAGE_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1em 1.5em;color:#222}
h1{font-size:1.35em;margin:.2em 0 .3em}
p.about{margin:.2em 0 .8em;color:#555}
#lines{display:flex;flex-wrap:wrap;gap:.3em 1.2em;align-items:center;margin:.4em 0 .8em}
#lines .title{font-weight:600}
#lines label{display:inline-flex;align-items:center;gap:.35em;white-space:nowrap}
.swatch{display:inline-block;width:1.6em;height:.3em;border-radius:2px}
.js-only{display:none}
html.js .js-only{display:inline}
.tablewrap{overflow-x:auto;margin-bottom:1em}
table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f5f5f5}
td.text,th.text{text-align:left}
td.dir{white-space:normal;overflow-wrap:anywhere;min-width:14em}
tr.off td{color:#bbb}
#panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:.8em}
#panels .panel{min-width:0;border:1px solid #e5e5e5;border-radius:4px}
#panels .panel h2{font-size:.95em;font-weight:600;margin:.55em .8em 0}
#static{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
#static figure{margin:0}
#static figure.wide{grid-column:1/-1}
#static img{max-width:100%;height:auto}
"""

# Draws every panel of the report's data with plotly.js; the runs' check boxes show and hide
# a line in every panel at once. Without plotly.js (or JavaScript) the static figures stay.
PAGE_SCRIPT = r"""
(function () {
  "use strict";
  if (!window.Plotly) { return; }
  var report = JSON.parse(document.getElementById("report-data").textContent);
  document.documentElement.classList.add("js");
  document.getElementById("static").hidden = true;
  var grid = document.getElementById("panels");
  grid.hidden = false;

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }
  function mode(s) {  // a series too short to show as a line (one point draws none)
    return s.x.length < 3 ? "lines+markers" : "lines";
  }
  function traces(p) {
    if (p.kind === "peers") {
      return p.series.map(function (s) {
        return {type: "scatter", mode: mode(s), x: s.x, y: s.y, name: s.name,
                hovertemplate: s.name + "<br>%{x:.3~f} s: %{y:.4~g} samples/s<extra></extra>"};
      });
    }
    var out = [];
    p.series.forEach(function (s) {
      var line = report.lines[s.line];
      var hover = line.legend + "<br>" + p.xlabel + ": %{x:.4~g}<br>" + p.ylabel + ": %{y:.4~g}<extra></extra>";
      if (p.kind === "bars") {
        out.push({type: "bar", x: s.x, y: s.y, name: line.legend, meta: s.line, marker: {color: line.color},
                  hovertemplate: hover});
        return;
      }
      if (s.lo) {
        out.push({type: "scatter", mode: "lines", x: s.x, y: s.lo, meta: s.line, showlegend: false, hoverinfo: "skip",
                  line: {width: 0, color: line.color}});
        out.push({type: "scatter", mode: "lines", x: s.x, y: s.hi, meta: s.line, showlegend: false, hoverinfo: "skip",
                  fill: "tonexty", fillcolor: rgba(line.color, 0.2), line: {width: 0, color: line.color}});
      }
      out.push({type: "scatter", mode: mode(s), x: s.x, y: s.y, name: line.legend, meta: s.line,
                line: {color: line.color, width: 2}, hovertemplate: hover});
    });
    return out;
  }
  function axis(p, which) {
    var a = {title: {text: p[which + "label"]}, type: p[which + "log"] ? "log" : "linear", automargin: true,
             zeroline: false};
    var ticks = p[which + "ticks"];
    if (ticks) { a.tickvals = ticks.values; a.ticktext = ticks.text; }
    return a;
  }
  function layout(p) {
    var l = {
      height: 320,
      margin: {l: 64, r: 16, t: 28, b: 48},
      xaxis: axis(p, "x"),
      yaxis: axis(p, "y"),
      showlegend: p.kind === "peers" && p.series.length > 0,
      legend: {title: {text: "peer"}, font: {size: 11}},
      hovermode: "closest", barmode: "group", bargap: 0.15,
      shapes: [], annotations: []
    };
    if (p.hline !== null && p.series.length) {
      l.shapes.push({type: "line", xref: "paper", x0: 0, x1: 1, y0: p.hline, y1: p.hline,
                     line: {color: "grey", width: 1, dash: "dot"}});
    }
    if (!p.series.length) {
      l.annotations.push({text: p.empty, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false});
      l.xaxis.showticklabels = false;
      l.yaxis.showticklabels = false;
    }
    return l;
  }

  var plots = [];
  report.panels.forEach(function (p) {
    var cell = document.createElement("section");
    cell.className = "panel";
    cell.id = "panel-" + p.id;
    var title = document.createElement("h2");
    title.textContent = p.title;
    var plot = document.createElement("div");
    plot.className = "plot";
    cell.appendChild(title);
    cell.appendChild(plot);
    grid.appendChild(cell);
    Plotly.newPlot(plot, traces(p), layout(p), {responsive: true, displaylogo: false});
    plots.push({cell: cell, plot: plot, panel: p});
  });

  function showLine(index, on) {
    plots.forEach(function (q) {
      if (q.panel.line === index) {  // the line's own panel (its step rates)
        q.cell.hidden = !on;
        if (on) { Plotly.Plots.resize(q.plot); }
        return;
      }
      var which = [];
      q.plot.data.forEach(function (t, k) { if (t.meta === index) { which.push(k); } });
      if (which.length) { Plotly.restyle(q.plot, {visible: on}, which); }
    });
    document.querySelectorAll("tr[data-line='" + index + "']").forEach(function (tr) {
      tr.classList.toggle("off", !on);
    });
  }
  document.querySelectorAll("#lines input[type=checkbox]").forEach(function (box) {
    box.addEventListener("change", function () { showLine(Number(box.dataset.line), box.checked); });
  });
})();
"""


def write_index(runs, lines, legend_title, panels, out, target, figure_stems):
    line_of = {id(r): line for line in lines for r in line.runs}
    varying = legend_title.split(", ") if legend_title not in ("run", "run directory") else []
    target_text = f"{100 * target:.0f}%" if target else "target"
    head = [f'<th class="text">{html.escape(k)}</th>' for k in varying] or ['<th class="text">run</th>']
    head += [f"<th>{h}</th>" for h in ("repeat", f"time to {target_text}", f"bytes to {target_text}", "final test acc",
                                       "bytes sent", "steps", "staleness p50", "p90", "stopped by")]
    head.append('<th class="text">directory</th>')
    rows = []
    for r in sorted(runs, key=lambda r: (line_of[id(r)].index, r.repeat)):
        line = line_of[id(r)]
        s = r.summary or hearsay_logs.run_summary(r.dir, target)
        st = s.get("staleness") or {}
        first = [r.values.get(k, "-") for k in varying] if varying else [line.label]
        cells = [f'<td class="text"><span class="swatch" style="background:{line.color}"></span> {html.escape(str(c))}</td>'
                 if k == 0 else f'<td class="text">{html.escape(str(c))}</td>' for k, c in enumerate(first)]
        cells += [f"<td>{html.escape(str(c))}</td>" for c in (
            r.repeat, fmt(s.get("time_to_target_s"), ".1f", unit=" s"), fmt_bytes(s.get("bytes_to_target_total")),
            fmt(s.get("final_test_acc"), ".2f", 100, "%"), fmt_bytes(s.get("bytes_sent_total")),
            s.get("steps_total", "-"), fmt(st.get("p50"), ".1f"), fmt(st.get("p90"), ".1f"), s.get("stopped_by", "-"))]
        rel = os.path.relpath(r.dir, out)
        link = os.path.normpath(os.path.join(rel, "summary.json")) if r.summary else rel
        name = r.name if rel != "." else f"{r.name} (this directory)"
        cells.append(f'<td class="text dir"><a href="{html.escape(link)}">{html.escape(name)}</a></td>')
        rows.append(f'<tr data-line="{line.index}">' + "".join(cells) + "</tr>")
    legend = [f'<span class="title">{html.escape(legend_title)}:</span>']
    for line in lines:
        legend.append(f'<label><input type="checkbox" class="js-only" data-line="{line.index}" checked>'
                      f'<span class="swatch" style="background:{line.color}"></span>{html.escape(line.legend)}</label>')
    names = sorted({(r.summary or {}).get("name") or r.name for r in runs})
    repeats = max(len(line.runs) for line in lines)
    simulated = "simulated " if all((r.summary or {}).get("simulated") for r in runs) else ""
    about = (f"{len(runs)} {simulated}run(s) of {html.escape(', '.join(names))} as {len(lines)} line(s)"
             + ("; each line the mean of its repeats, the band from the lowest to the highest" if repeats > 1 else "")
             + (f"; the dotted line is the target, {target_text} test accuracy" if target else "")
             + '.<span class="js-only"> Drag to zoom, double-click to zoom out, hover for values; the boxes show and '
               "hide lines.</span>")
    static = []
    captions = {"accuracy": "test accuracy against time, steps and bytes", "test-loss": "test loss against time, steps and bytes",
                "train-loss": "training loss against steps", "staleness": "staleness of applied updates",
                "step_rate": "step rate per peer"}
    for stem in figure_stems:
        wide = ' class="wide"' if stem in ("accuracy", "test-loss", "step_rate") else ""
        static.append(f'<figure{wide}><a href="{stem}.svg"><img src="{stem}.png" alt="{captions.get(stem, stem)}"></a>'
                      f"</figure>")
    data = {"lines": [{"label": line.label, "legend": line.legend, "color": line.color} for line in lines],
            "panels": [decimate_panel(p) for p in panels]}
    data_text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hearsay report: {html.escape(', '.join(names))}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{PAGE_STYLE}</style></head><body>
<h1>hearsay report: {html.escape(', '.join(names))}</h1>
<p class="about">{about}</p>
<div id="lines">{"".join(legend)}</div>
<div class="tablewrap"><table>
<tr>{"".join(head)}</tr>
{chr(10).join(rows)}
</table></div>
<div id="panels" hidden></div>
<div id="static">
{chr(10).join(static)}
</div>
<script id="report-data" type="application/json">{data_text}</script>
<script src="plotly.js"></script>
<script>{PAGE_SCRIPT}</script>
</body></html>
"""
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page)


def decimate_panel(p):
    return dict(p, series=[decimate(s) for s in p["series"]])


def target_of(runs):
    target = next((r.summary.get("target_test_acc") for r in runs if r.summary and r.summary.get("target_test_acc")), None)
    if target is None:
        target = next((e.get("target_test_acc") for r in runs for ev in r.peers.values() for e in ev
                       if e.get("event") == "start" and e.get("target_test_acc")), 0.0)
    return target


def report(paths, out, target=None):
    """Draws the figures and writes index.html (and plotly.js) for the runs under paths into
    out. Returns (runs, lines)."""
    runs = find_runs(paths)
    os.makedirs(out, exist_ok=True)
    if target is None:
        target = target_of(runs)
    lines, legend_title = group(runs)
    panels = panels_of(lines, target)
    stems = []
    for stem, fig in figures(panels, lines, legend_title):
        save(fig, out, stem)
        stems.append(stem)
    if not plotly_js_to(out):
        print("hearsay-plot: warning: no python3-plotly: index.html shows the static figures only", file=sys.stderr)
    write_index(runs, lines, legend_title, panels, out, target, stems)
    return runs, lines


def main():
    ap = argparse.ArgumentParser(prog="hearsay-plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out")
    ap.add_argument("--target", type=float, help="target accuracy line (default: from summary.json or the logs)")
    args = ap.parse_args()
    out = args.out or (args.paths[0] if os.path.isdir(args.paths[0]) else os.path.dirname(args.paths[0]) or ".")
    runs, lines = report(args.paths, out, args.target)
    print(f"hearsay-plot: {len(runs)} run(s), {len(lines)} line(s): wrote accuracy, test-loss, train-loss, staleness, "
          f"step_rate (.png, .svg) and index.html to {out}")


if __name__ == "__main__":
    main()
