"""hearsay-run and hearsay-plot as a user runs them (run by ctest with /usr/bin/python3).

Small clusters of two peers on loopback ports 17495-17496, a few seconds each."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import re
import shutil
import unittest
import urllib.request

BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
RUN = os.path.join(BIN, "hearsay-run")
PLOT = os.path.join(BIN, "hearsay-plot")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
import hearsay_metrics  # noqa: E402

RECORDED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "data", "recorded-run")

BASE = """name: "tiny"
seed: 3
model { kind: LOGREG }
data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 1024 synthetic_dim: 16 num_classes: 4 synthetic_separation: 0.6 }
optim { lr: 0.1 momentum: 0.5 }
train { batch_size: 16 epochs: 3 eval_every_steps: 20 target_test_acc: 0.8 }
log { every_steps: 20 }
cluster {
  secret_env: "HEARSAY_TEST_RUN_SECRET"
  peers { name: "a" site: "x" address: "127.0.0.1:17495" }
  peers { name: "b" site: "y" address: "127.0.0.1:17496" }
  gossip { algorithm: "adpsgd" topology: "complete" }
  site_links { site_a: "x" site_b: "y" link { latency_ms: 2 bandwidth_mbps: 100 } }
}
"""


class HearsayRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="hearsay-run-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def config(self, text, name="c.textproto"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_tool(self, *args, timeout=120):
        return subprocess.run([RUN, *args], capture_output=True, text=True, timeout=timeout)

    def only_run_dir(self):
        dirs = glob.glob(os.path.join(self.dir, "runs", "*"))
        self.assertEqual(len(dirs), 1, dirs)
        return dirs[0]

    def test_bad_configs_exit_2_with_file_line_column_before_anything_starts(self):
        cases = {
            "an unknown field": (BASE + "colour: 3\n", "c.textproto:15:7"),
            "a wrong type": (BASE.replace("batch_size: 16", 'batch_size: "many"'), "c.textproto:6:21"),
            "a link naming no site": (BASE.replace('site_b: "y"', 'site_b: "mars"'), "site 'mars' has no peer"),
            "two peers with one name": (BASE.replace('name: "b"', 'name: "a"'), "name 'a' appears twice"),
            "a duplicate port": (BASE.replace("17496", "17495"), "is used by two peers"),
            "a sweep of a field that is not there": (BASE + 'experiment { sweep { field: "optim.speed" values: "1" } }\n',
                                                     "has no field 'speed'"),
        }
        for what, (text, expect) in cases.items():
            with self.subTest(what):
                r = self.run_tool(self.config(text), "--out-dir", os.path.join(self.dir, "runs"))
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expect, r.stderr)
                self.assertRegex(r.stderr, r"c\.textproto:\d+:\d+")
                self.assertFalse(os.path.exists(os.path.join(self.dir, "runs")), "nothing may start on a bad config")

    def test_two_peers_run_end_to_end_and_write_their_run_directory(self):
        cfg = self.config(BASE + 'experiment { stop_at_target: false out_dir: "%s" }\n' % os.path.join(self.dir, "runs"))
        r = self.run_tool(cfg, "--plain")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        run = self.only_run_dir()
        self.assertRegex(os.path.basename(run), r"^tiny-\d{8}-\d{6}$")
        for f in ("config.textproto", "a.jsonl", "b.jsonl", "a.err", "b.err", "summary.json"):
            self.assertTrue(os.path.exists(os.path.join(run, f)), f)
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        for key in ("time_to_target_s", "final_test_acc", "bytes_sent_total", "steps_total", "staleness", "points"):
            self.assertIn(key, s)
        self.assertGreater(s["final_test_acc"], 0.7)
        self.assertGreater(s["bytes_sent_total"], 0)
        self.assertEqual(s["steps_total"], 2 * 192)  # 3 epochs of 1024 samples, batch 16, each
        self.assertEqual(s["stopped_by"], "finished")
        # Per site: what crossed to other sites (a and b are in two), and the step rate.
        self.assertEqual(sorted(s["wan_bytes_per_site"]), ["x", "y"])
        self.assertGreater(min(s["wan_bytes_per_site"].values()), 0)
        self.assertEqual(sorted(s["steps_per_s_per_site"]), ["x", "y"])
        self.assertGreater(min(s["steps_per_s_per_site"].values()), 0)
        # The report, drawn from the logs at the end of the run.
        self.assertTrue(os.path.exists(os.path.join(run, "index.html")))
        self.assertIn(f"report in {os.path.join(run, 'index.html')}", r.stdout)
        # A second run never overwrites the first.
        r = self.run_tool(cfg, "--plain", "--set", "train { epochs: 1 }")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(glob.glob(os.path.join(self.dir, "runs", "*"))), 2)

    def test_a_sweep_with_repeats_runs_every_point_and_lists_them(self):
        text = BASE + """experiment {
  repeats: 2
  sweep { field: "cluster.gossip.algorithm" values: ["adpsgd", "gossip_grad"] }
  stop_at_target: true
}
checkpoint { every_steps: 50 }
"""
        r = self.run_tool(self.config(text), "--plain", "--out-dir", os.path.join(self.dir, "runs"),
                          "--set", "train { epochs: 2 }")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.only_run_dir(), "summary.json")) as f:
            s = json.load(f)
        self.assertEqual([(p["values"]["algorithm"], p["repeat"]) for p in s["points"]],
                         [("adpsgd", 0), ("adpsgd", 1), ("gossip_grad", 0), ("gossip_grad", 1)])
        for p in s["points"]:
            self.assertIn("final_test_acc", p)
            self.assertTrue(os.path.exists(os.path.join(p["run_dir"], "summary.json")))
            # Each run checkpoints on its own: none resumes from an earlier run's state.
            for name in ("a", "b"):
                self.assertTrue(os.path.exists(os.path.join(p["run_dir"], "checkpoints", name + ".ckpt")))
                with open(os.path.join(p["run_dir"], name + ".jsonl")) as f:
                    self.assertNotIn('"event":"resume"', f.read())
        # One report for the whole sweep, its lines named by the swept field.
        with open(os.path.join(self.only_run_dir(), "index.html")) as f:
            page = f.read()
        self.assertIn("adpsgd (x2)", page)
        self.assertIn("gossip_grad (x2)", page)
        # The repeats differ by seed.
        with open(os.path.join(s["points"][1]["run_dir"], "config.textproto")) as f:
            self.assertIn("seed: 4", f.read())

    def test_sigterm_stops_every_peer_and_still_writes_the_summary(self):
        text = BASE.replace("epochs: 3", "epochs: 0 max_steps: 100000").replace("peers { name: \"b\"",
                                                                                 "peers { slowdown: 50 name: \"b\"")
        cfg = self.config(text + 'experiment { stop_at_target: false out_dir: "%s" }\n' % os.path.join(self.dir, "runs"))
        proc = subprocess.Popen([RUN, cfg, "--plain"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            logs = glob.glob(os.path.join(self.dir, "runs", "*", "b.jsonl"))
            if logs:
                with open(logs[0]) as f:
                    if '"event":"step"' in f.read():
                        break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 130, out + err)
        with open(os.path.join(self.only_run_dir(), "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["stopped_by"], "signal")
        self.assertTrue(s["interrupted"])
        self.assertEqual(sorted(s["exit_codes"]), ["a", "b"])  # every peer was waited for
        for name in ("a", "b"):
            with open(os.path.join(self.only_run_dir(), name + ".jsonl")) as f:
                self.assertIn('"event":"end"', f.read())  # flushed its log and ended cleanly

    def test_metrics_serves_every_peers_figures_labelled_with_the_peer_while_the_cluster_runs(self):
        text = BASE.replace("epochs: 3", "epochs: 0 max_steps: 100000")
        cfg = self.config(text + 'experiment { stop_at_target: false out_dir: "%s" }\n' % os.path.join(self.dir, "runs"))
        port = hearsay_metrics.free_ports(1)[0]
        proc = subprocess.Popen([RUN, cfg, "--plain", "--metrics", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        steps, body = {}, ""
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not (len(steps) == 2 and min(steps.values()) > 0):
                time.sleep(0.3)
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        body = r.read().decode()
                except OSError:
                    continue
                steps = {m.group(1): float(m.group(2))
                         for m in re.finditer(r'^hearsay_steps_total\{peer="(\w+)"\} (\S+)$', body, re.M)}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        self.assertEqual(sorted(steps), ["a", "b"], body + out + err)
        self.assertGreater(min(steps.values()), 0, body)
        self.assertIn('hearsay_peer_up{peer="a"} 1', body)
        self.assertEqual(body.count("# TYPE hearsay_steps_total counter"), 1)  # one family, both peers in it
        self.assertRegex(body, r'hearsay_link_sent_bytes_total\{peer="b",neighbour="a"\} \d+')
        # A simulated run has nothing live to serve: refused before it starts.
        r = self.run_tool(cfg, "--simulate", "--metrics", "127.0.0.1:0")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--metrics", r.stderr)

    def test_a_peer_that_dies_is_reported_with_its_stderr_and_the_other_goes_on(self):
        text = BASE.replace('peers { name: "b" site: "y"', 'peers { name: "b" site: "y" device: "nonsense"')
        # b may die before a has seen it connect: a goes on alone either way (a quorum of 1,
        # the default, would stop a after connect_timeout_s when b died first).
        text = text.replace("cluster {\n", "cluster {\n  min_neighbours: 0\n", 1)
        r = self.run_tool(self.config(text), "--plain", "--out-dir", os.path.join(self.dir, "runs"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("peer b died (exit status 2)", r.stderr)
        self.assertIn("nonsense", r.stderr)  # the tail of its stderr says why
        with open(os.path.join(self.only_run_dir(), "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["failed_peers"], ["b"])
        self.assertEqual(s["exit_codes"]["a"], 0)
        self.assertGreater(s["peers"]["a"]["final_test_acc"], 0.7)

    def test_emulated_compute_scales_the_measured_step_and_evaluation_by_the_headroom(self):
        # emulate_compute measures a step and an evaluation alone, then gives every peer each
        # x ceil(peers / cores) x emulate_headroom; the peers pad their evaluations to it.
        config = self.config(BASE + "experiment { emulate_compute: true emulate_headroom: 2.5 stop_at_target: false }\n")
        r = self.run_tool(config, "--out-dir", os.path.join(self.dir, "runs"), "--plain")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.only_run_dir(), "summary.json")) as f:
            s = json.load(f)
        share = -(-2 // (os.cpu_count() or 1))
        self.assertAlmostEqual(s["emulated_step_s"], round(s["measured_step_s"] * share * 2.5, 6), places=6)
        self.assertAlmostEqual(s["emulated_eval_s"], round(s["measured_eval_s"] * share * 2.5, 6), places=6)
        with open(os.path.join(self.only_run_dir(), "a.jsonl")) as f:
            evals = [e for e in map(json.loads, f) if e["event"] == "eval"]
        self.assertTrue(evals)
        self.assertTrue(all(e["eval_s"] >= s["emulated_eval_s"] for e in evals), evals)
        bad = self.config(BASE + "experiment { emulate_compute: true emulate_headroom: 0.5 }\n", "bad.textproto")
        r = self.run_tool(bad, "--out-dir", os.path.join(self.dir, "runs-bad"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("experiment.emulate_headroom: must be in [1, 100]", r.stderr)

    def test_print_commands_gives_one_command_line_per_site(self):
        r = self.run_tool(self.config(BASE), "--print-commands")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stdout.splitlines() if not l.startswith("#")]
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0].endswith("--peer a") and lines[1].endswith("--peer b"), lines)
        self.assertIn("HEARSAY_TEST_RUN_SECRET", r.stdout)


class HearsayPlot(unittest.TestCase):
    def test_plots_and_report_from_a_recorded_run(self):
        with tempfile.TemporaryDirectory(prefix="hearsay-plot-test-") as out:
            r = subprocess.run([PLOT, RECORDED, "--out", out], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            for stem in ("accuracy", "test-loss", "train-loss", "staleness", "step_rate"):
                for ext in ("png", "svg"):
                    path = os.path.join(out, f"{stem}.{ext}")
                    self.assertGreater(os.path.getsize(path), 1000, path)
            with open(os.path.join(out, "index.html")) as f:
                page = f.read()
            self.assertIn('<img src="accuracy.png"', page)
            self.assertIn("82.32%", page)  # the recorded run's final accuracy, from its summary
            self.assertIn('<a href="%s/summary.json">recorded-run</a>' % os.path.relpath(RECORDED, out), page)
            self.assertTrue(os.path.exists(os.path.join(out, "plotly.js")))
            self.assertNotIn("overlaps", r.stderr)
            # Drawn again into the run's own directory, its table names the directory, not ".".
            shutil.copytree(RECORDED, os.path.join(out, "run"))
            r = subprocess.run([PLOT, os.path.join(out, "run")], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, "run", "index.html")) as f:
                self.assertIn('<a href="summary.json">run (this directory)</a>', f.read())

    def test_lines_with_mistyped_fields_are_skipped_with_a_warning_naming_file_and_line(self):
        with tempfile.TemporaryDirectory(prefix="hearsay-plot-test-") as run:
            for peer in ("a", "b"):
                with open(os.path.join(RECORDED, f"{peer}.jsonl")) as f:
                    lines = f.read().splitlines()
                if peer == "a":
                    lines[5:5] = [
                        '{"t":1.5,"peer":"a","event":"eval","step":40,"test_acc":"abc","test_loss":0.5}',
                        '{"t":1.6,"peer":"a","event":"step","step":"forty","loss":0.5}',
                        '{"t":"late","peer":"a","event":"gossip","step":41}',
                        '[1, 2, 3]',
                        '{"t":1.7,"peer":"a","event":"eval","step":4',
                    ]
                with open(os.path.join(run, f"{peer}.jsonl"), "w") as f:
                    f.write("\n".join(lines) + "\n")
            out = os.path.join(run, "report")
            r = subprocess.run([PLOT, run, "--out", out], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            log = os.path.join(run, "a.jsonl")
            for number, field in ((6, "test_acc"), (7, "step"), (8, "'t'"), (9, "list"), (10, "not JSON")):
                self.assertRegex(r.stderr, f"{log}:{number}: skipped .*{field}")
            self.assertNotIn("Traceback", r.stderr)
            self.assertTrue(os.path.exists(os.path.join(out, "index.html")))

    def test_the_summary_lists_quarantined_neighbours(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
        import hearsay_logs
        with tempfile.TemporaryDirectory(prefix="hearsay-summary-test-") as run:
            for peer in ("a", "b"):
                with open(os.path.join(RECORDED, f"{peer}.jsonl")) as f:
                    lines = f.read().splitlines()
                if peer == "a":
                    lines.insert(3, '{"t":0.9,"peer":"a","event":"quarantine","step":30,"neighbour":"b","state":"on",'
                                    '"reason":"non-finite: element 2 is NaN of segment 0","for_s":30}')
                with open(os.path.join(run, f"{peer}.jsonl"), "w") as f:
                    f.write("\n".join(lines) + "\n")
            summary = hearsay_logs.run_summary(run, 0.8)
            self.assertEqual(summary["quarantines"], [{"peer": "a", "neighbour": "b", "step": 30, "t": 0.9,
                                                       "reason": "non-finite: element 2 is NaN of segment 0"}])

    def test_time_to_target_is_when_the_peers_mean_accuracy_first_reaches_it(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
        import hearsay_figures

        def ev(t, acc):
            return {"t": t, "event": "eval", "test_acc": acc}
        # a crosses 0.85 first (a single peer's noisy crossing), but the mean of the two
        # reaches it only when b does; b started 0.5 s after a, which its unix_time says.
        logs = {
            "a": [{"t": 0.0, "event": "start", "unix_time": 1000.0}, ev(1.0, 0.90), ev(3.0, 0.84), ev(4.0, 0.88)],
            "b": [{"t": 0.0, "event": "start", "unix_time": 1000.5}, ev(1.0, 0.70), ev(2.0, 0.85), ev(3.2, 0.86)],
        }
        series = hearsay_figures.mean_accuracy_curve(logs)
        self.assertEqual(series[0], (1.5, 0.80))  # b's first eval, at 1.5 s of the run
        self.assertAlmostEqual(hearsay_figures.time_to_target(series, 0.85), 2.5)  # (0.90 + 0.85) / 2 at b's t = 2
        self.assertIsNone(hearsay_figures.time_to_target(series, 0.99))
        # Without unix_time the peers count as starting together.
        for events in logs.values():
            del events[0]["unix_time"]
        self.assertAlmostEqual(hearsay_figures.time_to_target(hearsay_figures.mean_accuracy_curve(logs), 0.85), 2.0)

    def test_a_peer_down_for_good_after_a_simulated_crash_leaves_the_mean_and_does_not_hold_the_target(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
        import hearsay_figures

        def ev(t, acc):
            return {"t": t, "event": "eval", "test_acc": acc}
        crash = {"t": 0.5, "event": "fault", "kind": "crash", "state": "begin", "target": "c", "until_s": 1000.0}
        # c crashed before it ever scored, and never came back: a and b alone make the mean.
        logs = {"a": [{"t": 0.0, "event": "start"}, ev(1.0, 0.80), ev(2.0, 0.86)],
                "b": [{"t": 0.0, "event": "start"}, ev(1.0, 0.82), ev(2.0, 0.88)],
                "c": [{"t": 0.0, "event": "start"}, crash]}
        series = hearsay_figures.mean_accuracy_curve(logs)
        self.assertAlmostEqual(series[-1][1], 0.87)
        self.assertAlmostEqual(hearsay_figures.time_to_target(series, 0.85), 2.0)
        # Without the crash event, c is waited for: no target.
        logs["c"] = [{"t": 0.0, "event": "start"}]
        self.assertIsNone(hearsay_figures.time_to_target(hearsay_figures.mean_accuracy_curve(logs), 0.85))
        # Back at 1.5 s (its next incarnation's start) and scoring 0.70: in the mean again.
        logs["c"] = [{"t": 0.0, "event": "start"}, crash, {"t": 1.5, "event": "start"}, ev(1.8, 0.70)]
        series = hearsay_figures.mean_accuracy_curve(logs)
        self.assertAlmostEqual(series[-1][1], (0.86 + 0.88 + 0.70) / 3)

    def test_bytes_to_target_are_every_peers_bytes_when_the_mean_reached_it(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
        import hearsay_figures
        import hearsay_logs

        def gossip(t, b):
            return {"t": t, "event": "gossip", "bytes_sent": b}
        a = [{"t": 0.0, "event": "start", "unix_time": 1000.0, "batch_size": 10}, gossip(1.0, 100), gossip(3.0, 300),
             {"t": 1.0, "event": "step", "samples_per_s": 100.0}, {"t": 2.0, "event": "step", "samples_per_s": 50.0},
             {"t": 3.0, "event": "step", "samples_per_s": 40.0}, {"t": 4.0, "event": "step", "samples_per_s": 25.0}]
        b = [{"t": 0.0, "event": "start", "unix_time": 1001.0, "batch_size": 10}, gossip(1.0, 1000), gossip(2.0, 3000)]
        logs = hearsay_figures.Logs({"a": a, "b": b})
        self.assertEqual(logs.start_offsets(), {"a": 0.0, "b": 1.0})
        # At run time 2.5: a is at 250 (between 100 at 1 s and 300 at 3 s); b, started 1 s
        # later, is at its own 1.5 s: 2000.
        self.assertAlmostEqual(logs.bytes_sent(2.5), 2250)
        self.assertEqual(logs.bytes_sent(11.0, peers=["b"]), 3000)  # past the last event: its total
        # The median window after the first: 10 / 50, 10 / 40, 10 / 25 -> 0.25 s per step.
        self.assertAlmostEqual(hearsay_logs.median_step_s(a), 0.25)

    def test_a_directory_without_logs_is_an_error_naming_it(self):
        with tempfile.TemporaryDirectory() as empty:
            r = subprocess.run([PLOT, empty], capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(empty, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
