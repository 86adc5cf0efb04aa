"""BatchNorm's running statistics across two torch peers (allreduce, examples/torch/
ddp_style.py): averaged, they are equal on both peers after training and are the mean of
what each peer's own statistics would have been; broadcast, they are peer 0's; local, each
peer keeps its own and they differ. Training mode's BatchNorm reads batch statistics, not
the running ones, so the three runs train the same parameters on the same data, and the
running statistics, a linear running mean, compare exactly across them."""
import os
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin"))

CONFIG = '''name: "buffers"
seed: 1
threads: 1
data { format: SYNTHETIC synthetic_dim: 8 num_classes: 4 }
optim { optimizer: "sgd" lr: 0.05 momentum: 0.9 }
train { batch_size: 32 max_steps: 25 eval_every_steps: 1000 }
cluster {
  id: "buffers"
  secret_env: "HEARSAY_SECRET"
  gossip { algorithm: "allreduce" }
  peers { name: "a" address: "127.0.0.1:17475" }
  peers { name: "b" address: "127.0.0.1:17476" }
}
'''


class Buffers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.config = os.path.join(cls.dir, "c.textproto")
        with open(cls.config, "w") as f:
            f.write(CONFIG)
        cls.runs = {mode: cls.train(mode) for mode in ("local", "average", "broadcast")}

    @classmethod
    def train(cls, mode):
        save = os.path.join(cls.dir, mode + "-{peer}.pt")
        env = dict(os.environ, HEARSAY_SECRET="a secret for the buffers test, long enough")
        procs = [subprocess.Popen([os.path.join(BIN, "hearsay-python"), os.path.join(ROOT, "examples", "torch", "ddp_style.py"),
                                   "--config", cls.config, "--peer", p, "--quiet", "--workers", "0", "--buffers", mode,
                                   "--save", save], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for p in ("a", "b")]
        for p in procs:
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                raise AssertionError(f"{mode}: a peer exited {p.returncode}: {err}")
        return [torch.load(save.replace("{peer}", p))["state"] for p in ("a", "b")]

    def buffers(self, state):
        return {k: v for k, v in state.items() if "running" in k}

    def test_averaged_buffers_are_equal_on_both_peers_and_the_mean_of_their_own(self):
        a, b = map(self.buffers, self.runs["average"])
        own_a, own_b = map(self.buffers, self.runs["local"])
        self.assertEqual(sorted(a), ["1.running_mean", "1.running_var", "4.running_mean", "4.running_var"])
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)
            self.assertFalse(torch.equal(own_a[k], own_b[k]), k)  # they would differ
            self.assertTrue(torch.allclose(a[k], (own_a[k] + own_b[k]) / 2, rtol=1e-5, atol=1e-6),
                            f"{k}: {float((a[k] - (own_a[k] + own_b[k]) / 2).abs().max())}")

    def test_broadcast_buffers_are_peer_0s(self):
        a, b = map(self.buffers, self.runs["broadcast"])
        own_a = self.buffers(self.runs["local"][0])
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)
            self.assertTrue(torch.equal(a[k], own_a[k]), k)

    def test_the_parameters_are_the_same_in_every_mode(self):
        # allreduce keeps the two peers' parameters equal, and the buffers do not feed back.
        ref = self.runs["local"][0]
        for mode, (a, b) in self.runs.items():
            for k in ref:
                if "running" in k or "num_batches" in k:
                    continue
                self.assertTrue(torch.equal(a[k], ref[k]) and torch.equal(b[k], ref[k]), f"{mode}: {k}")


if __name__ == "__main__":
    unittest.main()
