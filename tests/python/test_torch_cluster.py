"""Four torch peers on loopback (hearsay-run with the config's `program`) reach 85%
Fashion-MNIST test accuracy with adpsgd and with allreduce, and train as native peers do.

One hearsay-run of tests/python/torch-fmnist.textproto (its runs are listed there)."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin"))


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
        for path in glob.glob(os.path.join(cls.out, "*", "p*", "summary.json")):
            with open(path) as f:
                cls.runs[int(os.path.basename(os.path.dirname(path))[1:4])] = json.load(f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def test_every_run_ended_with_every_peer(self):
        self.assertEqual(sorted(self.runs), [0, 1, 2])
        for i, s in self.runs.items():
            self.assertEqual(s["stopped_by"], "finished", i)
            self.assertEqual(s["failed_peers"], [], i)
            self.assertEqual(len(s["peers"]), 4, i)

    def test_torch_peers_reach_85_percent_with_adpsgd_and_allreduce(self):
        for i, algorithm in ((0, "adpsgd"), (1, "allreduce")):
            s = self.runs[i]
            print(f"torch {algorithm}: mean test accuracy reached 85% at {s['time_to_target_s']} s; final {s['final_test_acc']:.4f}")
            self.assertEqual(s["values"]["run"], "examples/torch/fmnist.py")
            self.assertIsNotNone(s["time_to_target_s"], algorithm)
            self.assertGreaterEqual(s["final_test_acc"], 0.85, algorithm)

    def test_torch_and_native_peers_agree_within_half_a_point(self):
        torch_run, native_run = self.runs[1], self.runs[2]
        self.assertEqual((torch_run["values"]["run"], native_run["values"]["run"]), ("examples/torch/fmnist.py", ""))
        t, n = torch_run["final_test_acc"], native_run["final_test_acc"]
        print(f"allreduce, 2 epochs: torch {t:.4f}, native {n:.4f}")
        self.assertEqual(torch_run["steps_total"], native_run["steps_total"])
        self.assertLessEqual(abs(t - n), 0.005)

    def test_torch_peers_send_what_native_ones_send(self):
        # The same algorithm on the same model sends the same messages, header bytes aside.
        t, n = self.runs[1]["bytes_sent_total"], self.runs[2]["bytes_sent_total"]
        self.assertAlmostEqual(t / n, 1.0, delta=0.01)


if __name__ == "__main__":
    unittest.main()
