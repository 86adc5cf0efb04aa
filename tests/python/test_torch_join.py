"""hearsay.torch: the join. Peers started one after another each start training within
2 s of their quorum, and never before a neighbour has answered: a link that is up (the
neighbour's process admitted it) is not yet a neighbour that trains."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "two_targets.py")
SECRET = "a secret of the join test, long enough"

CONFIG = """name: "join"
seed: 1
model { kind: LOGREG }
data { format: SYNTHETIC synthetic_train: 256 synthetic_test: 64 synthetic_dim: 8 num_classes: 4 }
optim { optimizer: "sgd" lr: 0.05 }
train { batch_size: 32 max_steps: %d epochs: 1000 }
log { every_steps: 1 }
cluster {
  id: "join"
  secret_env: "HEARSAY_TEST_SECRET"
  peers { name: "a" address: "127.0.0.1:17671" }
  peers { name: "b" address: "127.0.0.1:17672" }
  peers { name: "c" address: "127.0.0.1:17673" }
  gossip { algorithm: "adpsgd" }
  %s
}
"""


def events(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class Join(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hearsay-join-")

    def start(self, name, steps=200, extra="", args=()):
        config = os.path.join(self.dir, "c.textproto")
        with open(config, "w") as f:
            f.write(CONFIG % (steps, extra))
        env = dict(os.environ, HEARSAY_TEST_SECRET=SECRET)
        return subprocess.Popen([sys.executable, SCRIPT, "--config", config, "--peer", name, "--out",
                                 os.path.join(self.dir, name + ".json"), "--log", os.path.join(self.dir, name + ".jsonl"),
                                 *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def test_three_peers_started_5_s_apart_each_train_within_2_s_of_their_quorum_and_never_alone(self):
        procs = {}
        for name in "abc":
            procs[name] = self.start(name, args=("--sleep-s", "0.05"))
            time.sleep(5)
        for name, p in procs.items():
            _, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, f"{name}: {err}")
        for name in "abc":
            log = events(os.path.join(self.dir, name + ".jsonl"))
            up = [e["t"] for e in log if e["event"] == "link" and e["state"] == "up"]
            first_step = next(e["t"] for e in log if e["event"] == "step")
            quorum = next(e for e in log if e["event"] == "quorum")
            print(f"{name}: first link up at {up[0]:.2f} s, quorum answered after {quorum['wait_s']:.2f} s, "
                  f"first step at {first_step:.2f} s")
            self.assertGreaterEqual(quorum["answered"], 1)
            self.assertGreater(first_step, up[0], f"{name} trained before any neighbour was up")
            self.assertLess(first_step - up[0], 2.0, f"{name} started {first_step - up[0]:.2f} s after its quorum")

    def test_a_neighbour_connected_but_not_yet_training_does_not_count(self):
        # b joins the cluster, then stalls before it makes its optimizer (its script still
        # building its model): its link is up but it does not answer, and a needs it.
        b = self.start("b", extra="connect_timeout_s: 6 min_neighbours: 1", args=("--stall-s", "30"))
        time.sleep(1)
        a = self.start("a", extra="connect_timeout_s: 6 min_neighbours: 1")
        _, err = a.communicate(timeout=60)
        b.kill()
        b.communicate()
        self.assertEqual(a.returncode, 2, err)
        self.assertRegex(err, r"two_targets.py: error: peer a: 0 of the 1 neighbours it needs \(cluster.min_neighbours\) "
                              r"answered within cluster.connect_timeout_s \(6 s\); connected but not answering: b")
        self.assertEqual(err.count("error:"), 1, err)
        log = events(os.path.join(self.dir, "a.jsonl"))
        self.assertFalse([e for e in log if e["event"] == "step"], "a trained alone")


if __name__ == "__main__":
    unittest.main()
