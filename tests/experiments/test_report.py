"""The report as people look at it (run by ctest with /usr/bin/python3): hearsay-run runs a
sweep (2 algorithms x 2 repeats, simulated: no ports, seconds) and writes index.html; a
real headless Chromium (Debian's chromium) opens it and must find every panel drawn, no
console message, no overlapping text, the page's width used, and runs that toggle; with
JavaScript off the static figures stand in. matplotlib's figures are checked for
overlapping text as well."""
import glob
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
RUN = os.path.join(BIN, "hearsay-run")
PLOT = os.path.join(BIN, "hearsay-plot")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
import hearsay_draw  # noqa: E402
import hearsay_logs  # noqa: E402
import hearsay_panels  # noqa: E402

CHROMIUM = shutil.which("chromium")
WIDTH = 1400  # the width the user study's complaint was made at

# Four peers in two sites over a 20 Mbit/s, 30 ms WAN, one of them 3x slower; synthetic data.
SWEEP = """name: "report-sweep"
seed: 5
model { kind: LOGREG }
data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 1024 synthetic_dim: 32 num_classes: 4 synthetic_separation: 0.5 }
optim { lr: 0.1 momentum: 0.5 }
train { batch_size: 16 epochs: 3 eval_every_s: 0.5 target_test_acc: 0.8 emulated_step_s: 0.01 }
log { every_steps: 20 }
cluster {
  peers { name: "x0" site: "x" address: "10.0.0.1:1" }
  peers { name: "x1" site: "x" address: "10.0.0.2:1" }
  peers { name: "y0" site: "y" address: "10.0.0.3:1" slowdown: 3 }
  peers { name: "y1" site: "y" address: "10.0.0.4:1" }
  gossip { algorithm: "adpsgd" topology: "random" }
  site_links { site_a: "x" site_b: "x" link { latency_ms: 0.5 bandwidth_mbps: 1000 } }
  site_links { site_a: "y" site_b: "y" link { latency_ms: 0.5 bandwidth_mbps: 1000 } }
  site_links { site_a: "x" site_b: "y" link { latency_ms: 30 bandwidth_mbps: 20 } }
}
experiment {
  simulate: true
  repeats: 2
  stop_at_target: false
  sweep {
    field: "cluster.gossip.algorithm"
    values: ["adpsgd", "allreduce"]
    also_set: ["", "cluster { gossip { topology: \\"ring\\" codec { name: \\"powersgd\\" } } }"]
  }
}
"""

# Every panel the sweep's report must draw, and how many traces each (a line with its band
# is 3: low, high, mean; the staleness histogram has adpsgd's bars only: allreduce applies
# nothing asynchronously; a step-rate panel one trace per peer).
PANELS = {**{f"panel-{metric}-{x}": 6 for metric in ("accuracy", "test-loss") for x in ("time", "steps", "bytes")},
          "panel-train-loss": 6, "panel-staleness": 1, "panel-step-rate-0": 4, "panel-step-rate-1": 4}

# Appended to a copy of the page: measures what a reader sees once plotly has drawn, and
# writes it into the page as JSON (read back from Chromium's --dump-dom).
PROBE = r"""<script>
window.addEventListener("load", function () { setTimeout(function () {
  function shown(el) {
    var r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0 || !el.textContent.trim()) { return false; }
    for (var e = el; e && e.nodeType === 1; e = e.parentNode) {
      var s = getComputedStyle(e);
      if (s.display === "none" || s.visibility === "hidden" || s.opacity === "0") { return false; }
    }
    return true;
  }
  var out = {width: document.documentElement.clientWidth, panels: [], overlaps: [], outside: [], axes: {},
             toggled: null, hover: null};
  document.querySelectorAll("#panels .panel").forEach(function (cell) {
    var box = cell.getBoundingClientRect();
    out.panels.push({id: cell.id, left: box.left, right: box.right, top: box.top});
    var texts = Array.prototype.filter.call(cell.querySelectorAll("h2, svg text"), shown).map(function (t) {
      return {text: t.textContent, r: t.getBoundingClientRect()};
    });
    texts.forEach(function (a, i) {
      if (a.r.left < box.left - 1 || a.r.right > box.right + 1 || a.r.top < box.top - 1 || a.r.bottom > box.bottom + 1) {
        out.outside.push([cell.id, a.text]);
      }
      texts.slice(i + 1).forEach(function (b) {
        var w = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
        var h = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
        if (w > 1 && h > 1) { out.overlaps.push([cell.id, a.text, b.text]); }
      });
    });
    var gd = cell.querySelector(".js-plotly-plot");
    out.axes[cell.id] = {x: gd._fullLayout.xaxis.range, xtype: gd._fullLayout.xaxis.type, dragmode: gd._fullLayout.dragmode};
  });
  // Hover: the first line's mean trace in the accuracy-against-time panel shows its values.
  var acc = document.querySelector("#panel-accuracy-time .js-plotly-plot");
  var mean = acc.data.findIndex(function (t) { return t.meta === 0 && t.hoverinfo !== "skip"; });
  Plotly.Fx.hover(acc, [{curveNumber: mean, pointNumber: 0}]);
  var hover = acc.querySelector(".hoverlayer .hovertext");
  out.hover = hover ? hover.textContent : null;
  // Toggling the first line's box hides its traces in every panel, and its step-rate panel.
  document.querySelector("#lines input[data-line='0']").click();
  out.toggled = Array.prototype.map.call(document.querySelectorAll("#panels .panel"), function (cell) {
    var gd = cell.querySelector(".js-plotly-plot");
    return {id: cell.id, hidden: cell.hidden,
            line0: gd.data.filter(function (t) { return t.meta === 0; }).map(function (t) { return t.visible; }),
            line1: gd.data.filter(function (t) { return t.meta === 1; }).map(function (t) { return t.visible; })};
  });
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300); });
</script>
</body>"""


def chromium(url, *flags, timeout=90):
    """(DOM or '', console messages, stderr) of headless Chromium at url, with its own profile.
    Its process group is killed if it outlives the timeout."""
    with tempfile.TemporaryDirectory(prefix="hearsay-report-chromium-") as profile:
        cmd = [CHROMIUM, "--no-sandbox", "--headless=new", f"--user-data-dir={profile}", "--enable-logging=stderr",
               "--v=0", "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--hide-scrollbars", f"--window-size={WIDTH},1600", "--dump-dom", *flags, url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything of this run's that is left
            except ProcessLookupError:
                pass
    console = [line for line in err.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return out, console, err


class Elements(html.parser.HTMLParser):
    """Every element of a DOM as (tag, attributes, ids of the elements around it)."""

    def __init__(self):
        super().__init__()
        self.stack, self.found = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.found.append((tag, attrs, [a.get("id") for _, a in self.stack if a.get("id")]))
        if tag not in ("meta", "link", "br", "hr", "img", "input", "area", "base", "col", "embed", "source", "track",
                       "wbr"):  # HTML's void elements; SVG's are closed in a dumped DOM
            self.stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self.found.append((tag, dict(attrs), [a.get("id") for _, a in self.stack if a.get("id")]))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break


def elements(dom):
    p = Elements()
    p.feed(dom)
    return p.found


class Report(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assert CHROMIUM, "no chromium on PATH: deps/debian-packages.txt lists it (make installs it)"
        cls.tmp = tempfile.TemporaryDirectory(prefix="hearsay-report-test-")
        config = os.path.join(cls.tmp.name, "sweep.textproto")
        with open(config, "w", encoding="utf-8") as f:
            f.write(SWEEP)
        r = subprocess.run([RUN, config, "--out-dir", os.path.join(cls.tmp.name, "runs"), "--plain"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.run_stderr = r.stderr
        cls.root = glob.glob(os.path.join(cls.tmp.name, "runs", "report-sweep-*"))[0]
        cls.index = os.path.join(cls.root, "index.html")
        assert f"report in {cls.index}" in r.stdout, r.stdout
        cls.dom, cls.console, cls.stderr = chromium("file://" + cls.index)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def page(self):
        with open(self.index, encoding="utf-8") as f:
            return f.read()

    def test_hearsay_run_wrote_the_report_of_the_sweep_with_plotly_beside_it(self):
        self.assertGreater(os.path.getsize(os.path.join(self.root, "plotly.js")), 1_000_000)
        for stem in ("accuracy", "test-loss", "train-loss", "staleness", "step_rate"):
            for ext in ("png", "svg"):
                self.assertGreater(os.path.getsize(os.path.join(self.root, f"{stem}.{ext}")), 1000, stem + ext)
        self.assertNotIn("overlaps", self.run_stderr)  # hearsay-plot's own check of every figure's text
        # Nothing is fetched from the network when the page is viewed.
        self.assertIsNone(re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", self.page()))

    def test_every_panel_renders_in_chromium_with_no_console_message(self):
        self.assertEqual(self.console, [], "the page wrote to the console:\n" + "\n".join(self.console))
        found = elements(self.dom)
        panels = [a["id"] for tag, a, _ in found if tag == "section" and "panel" in a.get("class", "").split()]
        self.assertEqual(sorted(panels), sorted(PANELS), "the panels drawn, each once")
        titles = re.findall(r"<h2>([^<]*)</h2>", self.dom)
        self.assertEqual(len(titles), len(set(titles)), titles)
        for panel, traces in PANELS.items():
            inside = [(tag, a) for tag, a, around in found if panel in around]
            self.assertTrue(any("js-plotly-plot" in a.get("class", "") for tag, a in inside), panel + ": no plot")
            drawn = [a for tag, a in inside if tag == "g" and a.get("class", "").split()[:1] == ["trace"]]
            self.assertEqual(len(drawn), traces, panel + ": traces drawn")
            if panel == "panel-staleness":
                bars = [m for tag, a in inside if tag == "path"
                        for m in [re.match(r"M[\d.]+,([\d.]+)V([\d.]+)H", a.get("d", ""))] if m and m[1] != m[2]]
                self.assertGreater(len(bars), 0, panel + ": no bars of any height")
            else:
                lines = [a for tag, a in inside if tag == "path" and a.get("class") == "js-line" and "L" in a.get("d", "")]
                self.assertGreaterEqual(len(lines), traces // 3 if traces == 6 else traces, panel + ": lines drawn")
        # The static figures give way to the interactive panels.
        static = next(a for tag, a, _ in found if a.get("id") == "static")
        self.assertIn("hidden", static)

    def test_no_overlapping_text_the_width_used_runs_toggle_and_values_on_hover(self):
        probe = os.path.join(self.root, "probe.html")
        with open(probe, "w", encoding="utf-8") as f:
            f.write(self.page().replace("</body>", PROBE))
        dom, console, _ = chromium("file://" + probe, "--virtual-time-budget=10000")
        self.assertEqual(console, [], "\n".join(console))
        m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
        self.assertIsNotNone(m, "the probe did not run")
        out = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        self.assertEqual(out["overlaps"], [], "text that overlaps other text in a panel")
        self.assertEqual(out["outside"], [], "text outside its panel")
        # At 1,400 px the panels fill the width: three to a row, the last near the right edge.
        first_row = [p for p in out["panels"] if abs(p["top"] - out["panels"][0]["top"]) < 2]
        self.assertGreaterEqual(len(first_row), 3, out["panels"])
        self.assertGreater(max(p["right"] for p in first_row), out["width"] - 60, out)
        # Byte axes begin at the first bytes sent, not at 1 byte (10^0).
        first_bytes = min(e["bytes_sent"] for path in glob.glob(os.path.join(self.root, "p*", "*.jsonl"))
                          for e in hearsay_logs.read_log(path)[1]
                          if e.get("event") == "gossip" and e.get("bytes_sent", 0) > 0)
        for panel in ("panel-accuracy-bytes", "panel-test-loss-bytes"):
            axis = out["axes"][panel]
            self.assertEqual(axis["xtype"], "log")
            self.assertGreater(10 ** axis["x"][0], first_bytes / 2, (panel, axis, first_bytes))
        self.assertTrue(all(a["dragmode"] == "zoom" for a in out["axes"].values()))
        self.assertRegex(out["hover"] or "", r"adpsgd \(x2\).*wall-clock time \(s\): [\d.]+.*test accuracy")
        # After the first line's box is clicked: its traces are hidden everywhere, the
        # other's stay, and its step-rate panel is hidden.
        for p in out["toggled"]:
            self.assertTrue(all(v is False for v in p["line0"]), p)
            self.assertTrue(all(v is not False for v in p["line1"]), p)
            self.assertEqual(p["hidden"], p["id"] == "panel-step-rate-0", p)

    def test_the_legend_names_what_varies_and_the_table_names_each_runs_directory(self):
        found = elements(self.page())
        legend = re.search(r'<div id="lines">(.*?)</div>', self.page(), re.S).group(1)
        self.assertIn("algorithm:", legend)
        self.assertEqual(re.findall(r"</span>([^<]+)</label>", legend), ["adpsgd (x2)", "allreduce (x2)"])
        links = [a["href"] for tag, a, _ in found if tag == "a" and a["href"].endswith("summary.json")]
        dirs = sorted(os.path.basename(d) for d in glob.glob(os.path.join(self.root, "p*")) if os.path.isdir(d))
        self.assertEqual(links, [os.path.join(d, "summary.json") for d in dirs])

    def test_without_javascript_the_static_figures_stand_in(self):
        # A copy of the page whose Content-Security-Policy refuses every script: as a browser
        # with JavaScript off shows it (Chromium's own switch for that stops --dump-dom too).
        nojs = os.path.join(self.root, "nojs.html")
        with open(nojs, "w", encoding="utf-8") as f:
            f.write(self.page().replace('<meta charset="utf-8">', '<meta charset="utf-8"><meta http-equiv='
                                        '"Content-Security-Policy" content="script-src \'none\'">', 1))
        dom, console, _ = chromium("file://" + nojs)
        self.assertTrue(console and all("Content Security Policy" in line for line in console), console)
        found = elements(dom)
        static = next(a for tag, a, _ in found if a.get("id") == "static")
        self.assertNotIn("hidden", static)
        images = [a["src"] for tag, a, around in found if tag == "img" and "static" in around]
        self.assertEqual(images, ["accuracy.png", "test-loss.png", "train-loss.png", "staleness.png", "step_rate.png"])
        for src in images:
            self.assertTrue(os.path.exists(os.path.join(self.root, src)), src)

    def test_no_text_overlaps_in_the_figures(self):
        runs = hearsay_panels.find_runs([self.root])
        lines, title = hearsay_panels.group(runs)
        self.assertEqual(title, "algorithm")
        panels = hearsay_panels.panels_of(lines, hearsay_panels.target_of(runs))
        for stem, fig in hearsay_draw.figures(panels, lines, title):
            self.assertEqual(hearsay_draw.overlapping_text(fig), [], stem)
            hearsay_draw.plt.close(fig)
        # The curve against time crosses the target where the summary says it was reached.
        by_time = next(p for p in panels if p["id"] == "accuracy-time")
        for line, series in zip(lines, by_time["series"]):
            for run in line.runs:
                crossing = next(t for t, acc in run.curve("time", "test_acc") if acc >= 0.8)
                self.assertAlmostEqual(crossing, run.summary["time_to_target_s"], places=6)


if __name__ == "__main__":
    unittest.main(verbosity=2)
