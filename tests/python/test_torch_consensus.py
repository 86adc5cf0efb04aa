"""hearsay.torch: peer.finish() ends a cluster on one model (cluster.final_consensus), and
the script's collectives (peer.all_reduce, peer.barrier) give every peer the same values.

Two asynchronous (adpsgd) peers fit different targets (two_targets.py), the second slowed
so that the first finishes long before it: without a final average they end apart."""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "two_targets.py")
SECRET = "a secret of the consensus test, long enough"

CONFIG = """name: "two-targets"
seed: 1
model { kind: LOGREG }
data { format: SYNTHETIC synthetic_train: 256 synthetic_test: 64 synthetic_dim: 8 num_classes: 4 }
optim { optimizer: "sgd" lr: 0.05 }
train { batch_size: 32 max_steps: 60 epochs: 1000 }
cluster {
  id: "two-targets"
  secret_env: "HEARSAY_TEST_SECRET"
  peers { name: "a" address: "127.0.0.1:%d" }
  peers { name: "b" address: "127.0.0.1:%d" }
  gossip { algorithm: "adpsgd" }
  connect_timeout_s: 20
  %s
}
"""


class Consensus(unittest.TestCase):
    port = 17640

    def start(self, extra="", collectives=False, b_sleep_s=0.02, a_extra=()):
        Consensus.port += 2
        d = tempfile.mkdtemp(prefix="hearsay-consensus-")
        with open(os.path.join(d, "c.textproto"), "w") as f:
            f.write(CONFIG % (Consensus.port, Consensus.port + 1, extra))
        procs = {}
        for name, args in (("a", ("--sleep-s", "0") + tuple(a_extra)), ("b", ("--sleep-s", str(b_sleep_s)))):
            procs[name] = self.restart(d, name, args + (("--collectives",) if collectives else ()))
        return d, procs

    def restart(self, d, name, args):
        cmd = [sys.executable, SCRIPT, "--config", os.path.join(d, "c.textproto"), "--peer", name,
               "--out", os.path.join(d, name + ".json"), "--log", os.path.join(d, name + ".jsonl"), *args]
        return subprocess.Popen(cmd, env=dict(os.environ, HEARSAY_TEST_SECRET=SECRET), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def finish(self, d, procs):
        out = {}
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=120)
            out[name] = {"rc": p.returncode, "stderr": stderr}
            path = os.path.join(d, name + ".json")
            if os.path.exists(path):
                with open(path) as f:
                    out[name].update(json.load(f))
            with open(os.path.join(d, name + ".jsonl")) as f:
                ends = [e for e in map(json.loads, f) if e["event"] == "end"]
            out[name]["end"] = ends[-1] if ends else None
        return out

    def run_pair(self, extra="", **kw):
        d, procs = self.start(extra, **kw)
        out = self.finish(d, procs)
        for name in "ab":
            self.assertEqual(out[name]["rc"], 0, out[name]["stderr"])
        return out

    def test_two_peers_fitting_different_targets_end_with_the_same_weights_in_10_runs_of_10(self):
        distances, before = [], []
        for _ in range(10):
            out = self.run_pair()
            a, b = out["a"], out["b"]
            self.assertEqual(a["params"], b["params"], "not the same bits")
            distances.append(math.dist(a["params"], b["params"]))
            self.assertEqual((a["end"]["final_consensus"], b["end"]["final_consensus"]), ("average", "average"))
            before.append(a["end"]["consensus_distance"])
        print(f"after finish(): max distance {max(distances)} over 10 runs; before it, each peer "
              f"{min(before):.3f} to {max(before):.3f} from the mean")
        self.assertLess(max(distances), 1e-5)
        # They were apart before it: the average is what brought them together.
        self.assertGreater(min(before), 0.1)

    def test_measure_keeps_each_peers_weights_and_reports_the_distance_in_the_end_event(self):
        out = self.run_pair("final_consensus: MEASURE")
        a, b = out["a"], out["b"]
        apart = math.dist(a["params"], b["params"])
        self.assertGreater(apart, 0.1)
        # Two peers: each is half their distance from the mean.
        for peer in (a, b):
            self.assertEqual(peer["end"]["final_consensus"], "measure")
            self.assertAlmostEqual(peer["end"]["consensus_distance"], apart / 2, delta=1e-4 * apart)

    def test_off_ends_each_peer_at_once_with_its_own_weights(self):
        out = self.run_pair("final_consensus: OFF")
        self.assertGreater(math.dist(out["a"]["params"], out["b"]["params"]), 0.1)
        self.assertEqual(out["a"]["end"]["final_consensus"], "off")
        self.assertIsNone(out["a"]["end"].get("consensus_distance"))

    def test_collectives_give_every_peer_the_same_sum_mean_max_and_min(self):
        out = self.run_pair(collectives=True)
        for name in "ab":
            got = out[name]
            self.assertEqual(got["sum"], [3.0, -30.0])
            self.assertEqual(got["mean"], [1.5, -15.0])
            self.assertEqual(got["max"], [2.0, -10.0])
            self.assertEqual(got["min"], [1.0, -20.0])
            self.assertEqual(got["number"], 2.0)
            self.assertEqual(got["counts"], [6, 8])
            self.assertEqual(len(got["refused"]), 2, got["refused"])
            self.assertRegex(got["refused"][0], r"peer .: all_reduce\(\) of 33 values; at most 32 \(the model's size")
            self.assertRegex(got["refused"][1], r"peer .: all_reduce\(\): value 1 is nan; every peer refuses a value that "
                                                r"is not finite")
            self.assertEqual(got["after_refusals"], 2.0)

    def test_a_peer_stopped_by_sigint_tells_the_other_which_ends_at_once_with_its_own(self):
        d, procs = self.start(b_sleep_s=0.2)
        time.sleep(4)  # b joined and trains (60 steps of 0.2 s)
        t0 = time.time()
        procs["b"].send_signal(signal.SIGINT)
        out = self.finish(d, procs)
        self.assertLess(time.time() - t0, 30)  # not finish_timeout_s (600 s)
        self.assertIn(out["b"]["rc"], (-signal.SIGINT, 130), out["b"]["stderr"])  # Python's exit for an interrupt
        self.assertEqual(out["a"]["rc"], 0, out["a"]["stderr"])
        self.assertEqual(out["a"]["end"]["final_consensus"], "failed")
        self.assertIn("peer a: no final average (cluster.final_consensus): peer b left without it (stopped, or it never had "
                      "a link with every peer)",
                      out["a"]["stderr"])
        self.assertIn("peer b: no final average (cluster.final_consensus): it was stopped", out["b"]["stderr"])

    def test_a_peer_stopped_while_it_waits_in_finish_tells_the_other(self):
        # a finishes at once and waits for b; SIGINT ends a's wait, and b, when it
        # finishes, hears that a gave up instead of waiting for a's part of the average.
        d, procs = self.start(b_sleep_s=0.15)
        time.sleep(5)
        procs["a"].send_signal(signal.SIGINT)
        out = self.finish(d, procs)
        self.assertIn(out["a"]["rc"], (-signal.SIGINT, 130), out["a"]["stderr"])
        self.assertIn("peer a: no final average (cluster.final_consensus): a signal stopped it while it waited",
                      out["a"]["stderr"])
        self.assertEqual(out["b"]["rc"], 0, out["b"]["stderr"])
        self.assertIn("peer b: no final average (cluster.final_consensus): peer a gave up the consensus and left",
                      out["b"]["stderr"])
        self.assertLess(out["b"]["end"]["consensus_s"], 5)

    def test_a_peer_killed_and_restarted_while_the_other_waits_in_finish_ends_on_the_same_model(self):
        # a crashes at step 20 (checkpoints every 10); b finishes and waits in finish() for
        # a, answering its restart's hello (its quorum), and the two end on one model.
        ckpt = tempfile.mkdtemp(prefix="hearsay-consensus-ckpt-")
        extra = 'finish_timeout_s: 120 } checkpoint { dir: "%s" every_steps: 10' % ckpt
        d, procs = self.start(extra, b_sleep_s=0.0, a_extra=("--kill-after", "20", "--sleep-s", "0.05"))
        procs["a"].wait(timeout=60)
        self.assertEqual(procs["a"].returncode, -signal.SIGKILL)
        time.sleep(2)  # b has finished and waits
        procs["a"] = self.restart(d, "a", ("--sleep-s", "0.02"))
        out = self.finish(d, procs)
        for name in "ab":
            self.assertEqual(out[name]["rc"], 0, out[name]["stderr"])
            self.assertEqual(out[name]["end"]["final_consensus"], "average", out[name]["stderr"])
        self.assertEqual(out["a"]["end"]["steps"], 60)
        self.assertEqual(out["a"]["params"], out["b"]["params"])

    def test_a_peer_that_never_finishes_is_waited_for_finish_timeout_s_only(self):
        d, procs = self.start("finish_timeout_s: 2", b_sleep_s=0.3)
        out = self.finish(d, procs)
        self.assertEqual(out["a"]["rc"], 0, out["a"]["stderr"])
        self.assertEqual(out["a"]["end"]["final_consensus"], "failed")
        self.assertIn("peer b did not finish its training within cluster.finish_timeout_s (2 s)", out["a"]["stderr"])
        self.assertLess(out["a"]["end"]["consensus_s"], 4)


if __name__ == "__main__":
    unittest.main()
