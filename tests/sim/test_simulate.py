"""hearsay-run --simulate as a user runs it (run by ctest with /usr/bin/python3): the same
config and seed give byte-identical logs and summaries; faults show in the logs and the
summary; what the simulator cannot model is refused at load, with its place in the file,
and never run on the real clock."""
import glob
import json
import os
import subprocess
import tempfile
import time
import unittest

BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
RUN = os.path.join(BIN, "hearsay-run")

# Eight peers in two sites over a 20 Mbit/s, 30 ms WAN; synthetic data, so a run takes seconds.
BASE = """name: "simtiny"
seed: 5
model { kind: LOGREG }
data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 1024 synthetic_dim: 32 num_classes: 4 synthetic_separation: 0.5 }
optim { lr: 0.1 momentum: 0.5 }
train { batch_size: 16 epochs: 4 eval_every_s: 0.5 target_test_acc: 0.99 emulated_step_s: 0.01 }
log { every_steps: 20 }
cluster {
  secret_env: "HEARSAY_TEST_SIM_SECRET"
%(peers)s
  gossip { algorithm: "adpsgd" topology: "random" }
  site_links { site_a: "x" site_b: "x" link { latency_ms: 0.5 bandwidth_mbps: 1000 } }
  site_links { site_a: "y" site_b: "y" link { latency_ms: 0.5 bandwidth_mbps: 1000 } }
  site_links { site_a: "x" site_b: "y" link { latency_ms: 30 bandwidth_mbps: 20 } }
}
experiment {
  simulate: true
%(experiment)s
}
"""
PEERS = "\n".join(f'  peers {{ name: "{s}{i}" site: "{s}" address: "10.0.0.{k}:1" {"slowdown: 3" if i == 3 else ""} }}'
                  for k, (s, i) in enumerate([(s, i) for s in "xy" for i in range(4)]))
SWEEP = """  sweep {
    field: "cluster.gossip.algorithm"
    values: ["adpsgd", "allreduce"]
    also_set: ["", "cluster { gossip { topology: \\"ring\\" codec { name: \\"powersgd\\" } } }"]
  }"""


def write(directory, text, name="c.textproto"):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def run(config, out_dir, *extra):
    return subprocess.run([RUN, config, "--out-dir", out_dir, "--plain", *extra], capture_output=True, text=True, timeout=600)


def only_dir(root):
    dirs = [d for d in glob.glob(os.path.join(root, "*")) if os.path.isdir(d)]
    assert len(dirs) == 1, dirs
    return dirs[0]


# What a simulated run writes that depends on the wall clock or the machine: its speed and
# memory (sim_stats.json), its progress lines, and the resolved config (absolute paths).
WALL_FILES = {"sim_stats.json", "sim.err", "sim.out", "config.textproto"}


def tree(root):
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if os.path.isfile(path) and os.path.basename(path) not in WALL_FILES:
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


class Simulate(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="hearsay-sim-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_the_same_config_and_seed_give_byte_identical_logs_and_summaries(self):
        config = write(self.dir, BASE % {"peers": PEERS, "experiment": SWEEP})
        first, second = os.path.join(self.dir, "one"), os.path.join(self.dir, "two")
        r1 = run(config, first)
        self.assertEqual(r1.returncode, 0, r1.stderr)
        r2 = run(config, second)
        self.assertEqual(r2.returncode, 0, r2.stderr)
        a, b = tree(only_dir(first)), tree(only_dir(second))
        self.assertEqual(sorted(a), sorted(b))
        logs = [k for k in a if k.endswith(".jsonl")]
        self.assertGreaterEqual(len(logs), 2 * 9)  # 8 peers and the simulator's log, per run
        for name in a:
            self.assertEqual(a[name], b[name], f"{name} differs between two runs of one config and seed")
        summary = json.loads(a["summary.json"])
        self.assertEqual(len(summary["points"]), 2)
        for point in summary["points"]:
            self.assertTrue(point["simulated"])
            self.assertGreater(point["steps_total"], 0)
            self.assertGreater(point["bytes_sent_total"], 0)
            self.assertIn("x", point["wan_bytes_per_site"])
        # The peers' logs are on virtual time and say so.
        peer_logs = [k for k in logs if os.path.basename(k) != "cluster.jsonl"]
        for name in peer_logs:
            start = json.loads(a[name].decode().splitlines()[0])
            self.assertEqual(start["event"], "start")
            self.assertIs(start["simulated"], True, name)

    def test_a_crash_and_a_site_outage_show_in_the_logs_and_the_summary(self):
        faults = """  simulation {
    faults { kind: PEER_CRASH peer: "y1" at_s: 1.0 for_s: 1.0 }
    faults { kind: SITE_DOWN site: "x" at_s: 1.5 for_s: 1.0 }
  }"""
        config = write(self.dir, BASE % {"peers": PEERS, "experiment": faults})
        r = run(config, os.path.join(self.dir, "runs"), "--set", "checkpoint { every_steps: 20 }")
        self.assertEqual(r.returncode, 0, r.stderr)
        d = only_dir(os.path.join(self.dir, "runs"))
        summary = json.load(open(os.path.join(d, "summary.json")))
        kinds = sorted((f["kind"], f["state"]) for f in summary["faults"])
        self.assertEqual(kinds, [("crash", "begin"), ("crash", "end"), ("site_down", "begin"), ("site_down", "end")])
        events = [json.loads(line) for line in open(os.path.join(d, "y1.jsonl"))]
        names = [e["event"] for e in events]
        self.assertEqual(names.count("start"), 2, "the crashed peer starts again")
        self.assertIn("resume", names, "from its checkpoint")
        crash = next(e for e in events if e["event"] == "fault")
        self.assertAlmostEqual(crash["t"], 1.0, delta=0.1)
        resumed = next(e for e in events if e["event"] == "resume")
        self.assertGreaterEqual(resumed["t"], 2.0)
        # It lost what it learnt after its last checkpoint: it resumes at a step before its crash.
        before = max(e["step"] for e in events if e["event"] == "step" and e["t"] <= crash["t"])
        self.assertLessEqual(resumed["step"], before)
        self.assertTrue(all(p["finished"] for p in summary["peers"].values()))

    def test_an_all_reduce_across_sites_of_one_peer_each_starts_with_every_peer_up_and_costs_two_hops(self):
        # Eight sites of one peer: the all-reduce runs between all eight from the first step. A peer whose actor ran first once sent its first frames to
        # peers not up yet, which dropped them, and the first round waited forever.
        peers = "\n".join(f'  peers {{ name: "s{k}" site: "s{k}" address: "10.0.{k}.1:1" }}' for k in range(8))
        text = (BASE % {"peers": peers, "experiment": ""}).replace(
            '  gossip { algorithm: "adpsgd" topology: "random" }',
            '  gossip { algorithm: "allreduce" topology: "ring" codec { name: "powersgd" } }\n'
            '  default_link { latency_ms: 30 bandwidth_mbps: 20 }')
        text = "\n".join(line for line in text.split("\n") if "site_links" not in line)
        config = write(self.dir, text.replace("epochs: 4", "epochs: 1"))
        r = run(config, os.path.join(self.dir, "runs"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        d = only_dir(os.path.join(self.dir, "runs"))
        summary = json.load(open(os.path.join(d, "summary.json")))
        steps = {name: p["steps"] for name, p in summary["peers"].items()}
        self.assertEqual(len(steps), 8)
        self.assertEqual(len(set(steps.values())), 1, f"every peer takes every synchronous step: {steps}")
        self.assertGreater(min(steps.values()), 0)
        # Across sites the reduce-scatter is direct: an all-reduce costs two hops, PowerSGD's
        # step two all-reduces. A hop here is 60 ms (the default link is each site's own link
        # too: 15 ms up, 30 ms across, 15 ms down), so a step takes 4 x 60 + 10 = 250 ms; a
        # ring's 7 hops in turn and its all-gather would take 2 x 8 x 60 + 10 = 970 ms.
        per_step = summary["virtual_s"] / min(steps.values())
        self.assertLess(per_step, 0.4, f"{per_step:.3f} virtual s a step")

    def test_a_run_stopped_at_its_target_logs_its_links_final_counters(self):
        # Stopped at the target long before the first log.every_steps: the last gossip event
        # is the one the summary's bytes per link and per site read, so it must be the end's.
        text = (BASE % {"peers": PEERS, "experiment": "  stop_at_target: true"}).replace(
            "target_test_acc: 0.99", "target_test_acc: 0.5").replace("every_steps: 20", "every_steps: 100000")
        config = write(self.dir, text)
        r = run(config, os.path.join(self.dir, "runs"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        d = only_dir(os.path.join(self.dir, "runs"))
        summary = json.load(open(os.path.join(d, "summary.json")))
        self.assertEqual(summary["stopped_by"], "target")
        for name in summary["peers"]:
            events = [json.loads(line) for line in open(os.path.join(d, name + ".jsonl"))]
            end = events[-1]
            self.assertEqual(end["event"], "end")
            self.assertLess(end["steps"], 100000)
            gossip = [e for e in events if e["event"] == "gossip"]
            self.assertTrue(gossip, f"{name}: no gossip event")
            self.assertEqual(gossip[-1]["step"], end["steps"], name)
        self.assertEqual(sorted(summary["wan_bytes_per_site"]), ["x", "y"])
        self.assertTrue(all(v > 0 for v in summary["wan_bytes_per_site"].values()))

    def test_an_evaluation_takes_its_emulated_time_on_the_virtual_clock(self):
        # Without train.emulated_eval_s the simulator scores on a stopped clock; with it,
        # every evaluation takes that much virtual time, which the peer does not train in.
        ends = {}
        for emulated in (0.0, 0.2):
            text = (BASE % {"peers": PEERS, "experiment": "  stop_at_target: false"}).replace(
                "epochs: 4", "epochs: 100 max_steps: 400").replace("emulated_step_s: 0.01", f"emulated_step_s: 0.01 emulated_eval_s: {emulated}")
            out = os.path.join(self.dir, f"runs-{emulated}")
            r = run(write(self.dir, text), out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(only_dir(out), "x0.jsonl"), encoding="utf-8") as f:
                events = [json.loads(line) for line in f]
            evals = [e for e in events if e["event"] == "eval"]
            self.assertGreaterEqual(len(evals), 8)
            for e in evals:
                self.assertAlmostEqual(e["eval_s"], emulated, places=9)
            end = events[-1]
            self.assertEqual(end["steps"], 400)
            ends[emulated] = (end["t"], end["train_s"], len(evals))
            if emulated:
                self.assertEqual(end["emulated_eval_s"], emulated)
                self.assertEqual(end["eval_overruns"], 0)
        (t0, train0, _), (t1, train1, evals1) = ends[0.0], ends[0.2]
        # The same 400 steps take as long to train; the run is longer by its evaluations.
        self.assertAlmostEqual(train1, train0, delta=0.05 * train0)
        self.assertGreater(t1 - t0, 0.9 * 0.2 * evals1)

    def test_the_scale_configs_are_what_their_tool_writes_and_load_as_simulated_runs(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        r = subprocess.run(["/usr/bin/python3", os.path.join(root, "tools", "make_scale_configs.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        configs = sorted(glob.glob(os.path.join(root, "configs", "scale-*.textproto")))
        self.assertEqual(len(configs), 5, configs)
        configs.append(os.path.join(root, "configs", "sites-16x8.textproto"))
        for path in configs:
            r = subprocess.run([os.path.join(BIN, "hearsay-peer"), "--config", path, "--plan"], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, f"{path}: {r.stderr}")
            plan = json.loads(r.stdout)
            self.assertTrue(plan["simulate"], path)
            self.assertEqual(len({p["site"] for p in plan["peers"]}), 16, path)

    def test_what_the_simulator_cannot_model_is_refused_with_its_place(self):
        cases = [
            ('transport: "fabric:verbs"\n', "cluster.transport"),
            (None, "program"),
        ]
        for cluster_extra, field in cases:
            text = BASE % {"peers": PEERS, "experiment": ""}
            if cluster_extra:
                text = text.replace('  secret_env: "HEARSAY_TEST_SIM_SECRET"\n', '  secret_env: "HEARSAY_TEST_SIM_SECRET"\n  ' + cluster_extra)
            else:
                text = text.replace('seed: 5\n', 'seed: 5\nprogram: "examples/torch/fmnist.py"\n')
            config = write(self.dir, text, f"bad-{field}.textproto")
            r = run(config, os.path.join(self.dir, "runs-" + field))
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            line = 3 if field == "program" else 10
            self.assertRegex(r.stderr, rf"bad-{field}\.textproto:{line}:\d+: {field}", r.stderr)
            self.assertFalse(glob.glob(os.path.join(self.dir, "runs-" + field, "*", "*.jsonl")), "nothing ran")
        # A time quantum of 0 (SimGrid would never take two events together, nor one at all).
        config = write(self.dir, BASE % {"peers": PEERS, "experiment": "  simulation { time_precision_s: 0 }"}, "bad-quantum.textproto")
        r = run(config, os.path.join(self.dir, "runs-quantum"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"bad-quantum\.textproto:\d+:\d+: experiment\.simulation\.time_precision_s: must be in \(0, 0\.1\]")
        # Completion at departure with LV08, whose latency is part of its TCP model.
        config = write(self.dir, BASE % {"peers": PEERS, "experiment": '  simulation { network_model: "LV08" sender_completion: "departure" }'},
                       "bad-completion.textproto")
        r = run(config, os.path.join(self.dir, "runs-completion"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"bad-completion\.textproto:\d+:\d+: experiment\.simulation\.sender_completion: departure needs network_model CM02")
        # And what only the simulator models is refused in a real run.
        text = (BASE % {"peers": PEERS, "experiment": '  simulation { faults { kind: SITE_DOWN site: "x" } }'}).replace(
            "  simulate: true\n", "")
        config = write(self.dir, text, "real-with-faults.textproto")
        r = run(config, os.path.join(self.dir, "runs-real"))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("experiment.simulation.faults[0]: faults: only the simulator models it", r.stderr)

    def test_an_absurd_latency_and_more_peers_than_memory_holds_are_refused_at_load_with_their_place(self):
        def refused(name, text):
            config = write(self.dir, text, name)
            out = os.path.join(self.dir, "runs-" + name)
            start = time.monotonic()
            # Before the bounds, the first never ended and the second ran 89 s into std::bad_alloc.
            r = subprocess.run([RUN, config, "--out-dir", out, "--plain"], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr[-4000:])
            self.assertLess(time.monotonic() - start, 60)
            self.assertLess(max(len(line) for line in r.stderr.splitlines()), 2000, "no line as long as the config")
            self.assertFalse(glob.glob(os.path.join(out, "*", "*.jsonl")), "nothing ran")
            return r.stderr

        wan = 'site_links { site_a: "x" site_b: "y" link { latency_ms: 30 bandwidth_mbps: 20 } }'
        text = (BASE % {"peers": PEERS, "experiment": ""}).replace(wan, wan.replace("latency_ms: 30", "latency_ms: 1e308"))
        self.assertRegex(refused("bad-latency.textproto", text),
                         r"bad-latency\.textproto:21:47: cluster\.site_links\[2\]\.link\.latency_ms: must be a finite number >= 0 "
                         r"and at most 3600000 ms \(an hour\), got 1e\+308")
        # 100,000 peers of a 17M-parameter model: about 27 TiB by the estimate, beyond any machine.
        peers = "\n".join(f'  peers {{ name: "p{k}" site: "{"xy"[k % 2]}" address: "10.{k >> 16}.{(k >> 8) & 255}.{k & 255}:1" }}'
                          for k in range(100000))
        text = (BASE % {"peers": peers, "experiment": ""}).replace("kind: LOGREG", "kind: MLP hidden: [4096, 4096]")
        self.assertRegex(refused("many.textproto", text),
                         r"many\.textproto:10:3: cluster\.peers: 100000 simulated peers need at least [0-9.]+ [KMGTPE]iB "
                         r"\(16932868 parameters x 4 model-sized buffers")


if __name__ == "__main__":
    unittest.main()
