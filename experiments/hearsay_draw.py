"""The report's PNG and SVG figures, drawn with matplotlib from the panels
(hearsay_panels): one figure per kind of panel, one legend naming what varies, and a check
that no text of a figure overlaps another.
"""
import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from hearsay_panels import log_subs, si_bytes  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402


def wrap(text, width):
    return "\n".join(textwrap.wrap(text, width)) or text


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
