"""Four torch peers on loopback (hearsay-run with the config's `program`) learn
Fashion-MNIST with adpsgd and with allreduce, and train as the native peers do.

One hearsay-run of tests/python/torch-fmnist.textproto: {adpsgd, allreduce} x {torch
program, native}, 2 epochs each."""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def mean_final_acc(summary):
    return summary["final_test_acc"]  # the peers' mean


class TorchCluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp(prefix="hearsay-torch-cluster-")
        r = subprocess.run([os.path.join(BIN, "hearsay-run"), os.path.join(HERE, "torch-fmnist.textproto"), "--plain",
                            "--out-dir", cls.out], cwd=ROOT, capture_output=True, text=True, timeout=900)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            raise AssertionError(f"hearsay-run failed with status {r.returncode}")
        cls.runs = {}
        for path in glob.glob(os.path.join(cls.out, "*", "*", "summary.json")):
            with open(path) as f:
                s = json.load(f)
            kind = "torch" if s["values"]["program"] else "native"
            cls.runs[(s["values"]["cluster.gossip.algorithm"], kind)] = s

    def test_every_run_finished_with_every_peer(self):
        self.assertEqual(len(self.runs), 4)
        for key, s in self.runs.items():
            self.assertEqual(s["stopped_by"], "finished", key)
            self.assertEqual(s["failed_peers"], [], key)
            self.assertEqual(len(s["peers"]), 4, key)

    def test_torch_peers_reach_85_percent_with_adpsgd_and_allreduce(self):
        for algorithm in ("adpsgd", "allreduce"):
            acc = mean_final_acc(self.runs[(algorithm, "torch")])
            print(f"torch {algorithm}: mean final test accuracy {acc:.4f}")
            self.assertGreaterEqual(acc, 0.85, algorithm)

    def test_torch_and_native_peers_agree_within_half_a_point(self):
        for algorithm in ("adpsgd", "allreduce"):
            torch_acc = mean_final_acc(self.runs[(algorithm, "torch")])
            native_acc = mean_final_acc(self.runs[(algorithm, "native")])
            print(f"{algorithm}: torch {torch_acc:.4f}, native {native_acc:.4f}")
            self.assertLessEqual(abs(torch_acc - native_acc), 0.005, algorithm)

    def test_torch_peers_gossip_as_much_as_native_ones(self):
        # The same algorithm on the same model sends the same kind and size of messages.
        for algorithm in ("allreduce",):
            t = self.runs[(algorithm, "torch")]["bytes_sent_total"]
            n = self.runs[(algorithm, "native")]["bytes_sent_total"]
            self.assertAlmostEqual(t / n, 1.0, delta=0.01)


if __name__ == "__main__":
    unittest.main()
