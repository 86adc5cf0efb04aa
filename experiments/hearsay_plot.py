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
other machines. Every curve is hearsay_figures' definition of it (docs/LOGS.md, "Time to
target"): the peers' mean on the run's clock, where each peer's start event's unix_time
places its log among the others'. The panels' data come from hearsay_panels, the PNG and
SVG figures from hearsay_draw, the page from report_template.html.
"""
import argparse
import html
import json
import os
import string
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_logs  # noqa: E402
from hearsay_draw import figures, save  # noqa: E402
from hearsay_panels import find_runs, group, panels_of, si_bytes, target_of  # noqa: E402

# The page: its HTML, CSS and the script that draws the panels with plotly.js (the runs'
# check boxes show and hide a line in every panel at once; without plotly.js or JavaScript
# the static figures stay), beside this file.
TEMPLATE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "report_template.html")

# The most points a trace carries into the page (every point goes into the PNG and SVG).
MAX_PAGE_POINTS = 2000


def template():
    with open(TEMPLATE, encoding="utf-8") as f:
        return string.Template(f.read())


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
    title = html.escape(", ".join(names))
    page = template().substitute(title=title, about=about, legend="".join(legend), head="".join(head),
                                 rows="\n".join(rows), static="\n".join(static), data=data_text)
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page)


def decimate_panel(p):
    return dict(p, series=[decimate(s) for s in p["series"]])


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
