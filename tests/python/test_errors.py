"""hearsay.torch: bad input raises a Python exception that says what and where; no crash."""
import json
import os
import subprocess
import tempfile
import unittest

import torch

import hearsay
import hearsay.torch as ht

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "alone-synthetic.textproto")


def write(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".textproto", delete=False)
    f.write(text)
    f.close()
    return f.name


class Errors(unittest.TestCase):
    def test_missing_config_names_the_file(self):
        with self.assertRaisesRegex(hearsay.InputError, "no/such/config.textproto"):
            ht.Peer("no/such/config.textproto", argv=[], handle_signals=False)

    def test_bad_field_names_file_line_and_column(self):
        path = write('name: "x"\ntrain { batch_size: -4 }\n')
        with self.assertRaisesRegex(ValueError, os.path.basename(path) + r":2:\d+: .*batch_size"):
            ht.Peer(path, argv=[], handle_signals=False)

    def test_missing_secret_names_the_variable(self):
        path = write('name: "x"\ndata { format: SYNTHETIC }\ncluster {\n  id: "c"\n  secret_env: "HEARSAY_TEST_NO_SUCH_SECRET"\n'
                     '  peers { name: "a" address: "127.0.0.1:17455" }\n  peers { name: "b" address: "127.0.0.1:17456" }\n}\n')
        os.environ.pop("HEARSAY_TEST_NO_SUCH_SECRET", None)
        with self.assertRaisesRegex(hearsay.InputError, "HEARSAY_TEST_NO_SUCH_SECRET"):
            ht.Peer(path, name="a", argv=[], handle_signals=False)

    def test_an_algorithm_that_steps_without_the_optimizer_is_refused_before_joining(self):
        # dgc and demo apply their own update; a torch peer's step is its framework's.
        for algorithm, extra in (("dgc", ' codec { name: "topk" }'), ("demo", "")):
            path = write('name: "x"\ndata { format: SYNTHETIC synthetic_dim: 8 num_classes: 3 }\noptim { momentum: 0 }\n'
                         'cluster {\n  id: "c"\n  secret_env: "HEARSAY_TEST_LONE_SECRET"\n'
                         '  gossip { algorithm: "%s"%s }\n'
                         '  peers { name: "a" address: "127.0.0.1:17486" }\n  peers { name: "b" address: "127.0.0.1:17487" }\n}\n'
                         % (algorithm, extra))
            os.environ["HEARSAY_TEST_LONE_SECRET"] = "a secret of the lone peer test"
            with self.assertRaisesRegex(hearsay.InputError, r"peer a: algorithm '%s' takes its step itself, without the "
                                        r"optimizer.*run it with native peers" % algorithm):
                ht.Peer(path, name="a", argv=[], quiet=True, handle_signals=False)

    def test_unknown_peer_name_is_refused(self):
        path = write('name: "x"\ncluster {\n  id: "c"\n  secret_env: "HEARSAY_SECRET"\n'
                     '  peers { name: "a" address: "127.0.0.1:17455" }\n  peers { name: "b" address: "127.0.0.1:17456" }\n}\n')
        with self.assertRaisesRegex(hearsay.InputError, "--peer 'zz': no such peer"):
            ht.Peer(path, name="zz", argv=[], handle_signals=False)

    def test_a_lone_asynchronous_peer_is_refused_naming_its_neighbours_unless_allowed(self):
        path = write('name: "x"\ndata { format: SYNTHETIC synthetic_dim: 8 num_classes: 3 }\ntrain { max_steps: 3 }\n'
                     'cluster {\n  id: "c"\n  secret_env: "HEARSAY_TEST_LONE_SECRET"\n  connect_timeout_s: 0.3\n'
                     '  gossip { algorithm: "adpsgd" }\n'
                     '  peers { name: "a" address: "127.0.0.1:17486" }\n  peers { name: "b" address: "127.0.0.1:17487" }\n}\n')
        os.environ["HEARSAY_TEST_LONE_SECRET"] = "a secret of the lone peer test"
        with self.assertRaisesRegex(hearsay.InputError, r"peer b: 0 of 1 neighbours connected .*not connected: a at "
                                    r"127\.0\.0\.1:17486; cluster\.min_neighbours is 1"):
            ht.Peer(path, name="b", argv=[], quiet=True, handle_signals=False)
        # Allowed: it starts alone.
        peer = ht.Peer(path, name="b", argv=[], quiet=True, handle_signals=False, sets=["cluster { min_neighbours: 0 }"])
        peer.finish()

    def lone(self, algorithm, timeout_s=1.0):
        path = write('name: "x"\ndata { format: SYNTHETIC synthetic_dim: 8 num_classes: 3 }\ntrain { max_steps: 3 }\n'
                     'cluster {\n  id: "c"\n  secret_env: "HEARSAY_TEST_LONE_SECRET"\n'
                     f'  connect_timeout_s: {timeout_s}\n  gossip {{ algorithm: "{algorithm}" }}\n'
                     '  peers { name: "a" address: "127.0.0.1:17484" }\n  peers { name: "b" address: "127.0.0.1:17485" }\n}\n')
        os.environ["HEARSAY_TEST_LONE_SECRET"] = "a secret of the lone peer test"
        return path

    def test_a_lone_peer_stops_within_the_quorum_timeout(self):
        # Its neighbour never comes: the error comes once connect_timeout_s (1 s) has passed,
        # not later, for an asynchronous algorithm (min_neighbours) and a synchronous one (all).
        import time
        for algorithm, why in (("adpsgd", r"cluster\.min_neighbours is 1"), ("allreduce", "allreduce needs all")):
            path = self.lone(algorithm)
            t0 = time.monotonic()
            with self.assertRaisesRegex(hearsay.InputError, r"peer b: 0 of 1 neighbours connected within "
                                        r"cluster\.connect_timeout_s \(1 s\); not connected: a at 127\.0\.0\.1:17484; " + why):
                ht.Peer(path, name="b", argv=[], quiet=True, handle_signals=False)
            took = time.monotonic() - t0
            self.assertGreaterEqual(took, 1.0, algorithm)
            self.assertLess(took, 3.0, algorithm)
        # A quorum of 0 given to Peer (or init) lets it train alone.
        peer = ht.Peer(self.lone("adpsgd", 0.2), name="b", argv=[], quiet=True, handle_signals=False, min_neighbours=0)
        self.assertEqual(peer.total_steps, 3)
        peer.close()

    def test_a_lone_torch_script_exits_2_with_the_quorum_error(self):
        root = os.path.dirname(os.path.dirname(HERE))
        bin_dir = os.environ.get("HEARSAY_BIN_DIR", os.path.join(root, "build", "bin"))
        cmd = [os.path.join(bin_dir, "hearsay-python"), os.path.join(root, "examples", "torch", "fmnist.py"), "--config",
               self.lone("adpsgd"), "--peer", "b", "--set", 'model { kind: MLP hidden: [8] }']
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("fmnist.py: error: peer b: 0 of 1 neighbours connected", r.stderr)
        self.assertNotIn("starting anyway", r.stderr)
        r = subprocess.run(cmd + ["--set", "cluster { min_neighbours: 0 }", "--quiet"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("after 3 steps", r.stdout)
        # The engine's own line names the script the user ran, not a program they did not.
        self.assertIn("fmnist.py: b: 0 of 1 neighbours connected; starting anyway", r.stderr)
        self.assertNotIn("hearsay-peer:", r.stderr)

    def test_a_config_device_of_another_kind_than_the_model_s_is_refused_naming_both(self):
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=['device: "cuda:0"'])
        model = torch.nn.Linear(8, 4)  # on the CPU
        with self.assertRaisesRegex(hearsay.InputError, r"the config's device is 'cuda:0' but the model's parameters are "
                                                        r"on cpu; move the model there"):
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        peer.close()
        # Left out, the model's device is used; named the same, it is accepted.
        for sets in ([], ['device: "cpu"']):
            peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=sets)
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
            peer.close()

    def test_hearsay_run_runs_a_one_peer_program_config_in_a_run_directory(self):
        root = os.path.dirname(os.path.dirname(HERE))
        bin_dir = os.environ.get("HEARSAY_BIN_DIR", os.path.join(root, "build", "bin"))
        out = tempfile.mkdtemp()
        program = os.path.join(root, "examples", "torch", "fmnist.py")
        r = subprocess.run([os.path.join(bin_dir, "hearsay-run"), CONFIG, "--out-dir", out, "--set", f'program: "{program}"',
                            "--set", "train { max_steps: 3 epochs: 0 }", "--set", "log { every_steps: 1 }"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("one peer (", r.stdout)
        [run] = os.listdir(out)
        log = os.path.join(out, run, "torch-alone.jsonl")
        with open(log) as f:
            steps = [e for e in map(json.loads, f) if e["event"] == "step"]
        self.assertEqual(steps[-1]["step"], 3)
        # A native config of one peer still goes to hearsay-peer, and says so.
        r = subprocess.run([os.path.join(bin_dir, "hearsay-run"), CONFIG, "--out-dir", out], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("names no program", r.stderr)
        self.assertIn(f"hearsay-peer --config {CONFIG}", r.stderr)

    def test_hearsay_run_refuses_a_missing_program_before_any_run(self):
        root = os.path.dirname(os.path.dirname(HERE))
        bin_dir = os.environ.get("HEARSAY_BIN_DIR", os.path.join(root, "build", "bin"))
        out = tempfile.mkdtemp()
        r = subprocess.run([os.path.join(bin_dir, "hearsay-run"), os.path.join(root, "configs", "torch-fmnist.textproto"),
                            "--out-dir", out, "--set", 'program: "no/such/script.py"'], capture_output=True, text=True,
                           timeout=60, cwd=root)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("program 'no/such/script.py': no such file", r.stderr)
        self.assertEqual(os.listdir(out), [])
        os.rmdir(out)

    def test_an_exception_in_the_optimizer_comes_back_as_itself(self):
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False)
        model = torch.nn.Linear(8, 4)

        class Broken(torch.optim.SGD):
            def step(self, closure=None):
                raise ArithmeticError("the optimizer broke")

        opt = ht.DecentralizedOptimizer(model, Broken(model.parameters(), lr=0.1), peer)
        x, y = peer.next_batch()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with self.assertRaisesRegex(ArithmeticError, "the optimizer broke"):
            opt.step()
        # The algorithm stopped part-way: the peer takes no more steps, and says why.
        with self.assertRaisesRegex(hearsay.InputError, "failed part-way"):
            opt.step()

    def test_a_model_in_half_precision_is_refused(self):
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False)
        model = torch.nn.Linear(8, 4).half()
        with self.assertRaisesRegex(hearsay.InputError, "float32"):
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)

    def test_a_bad_state_dict_is_refused(self):
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False)
        model = torch.nn.Linear(8, 4)
        ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        with self.assertRaisesRegex(hearsay.InputError, "does not parse|parameters"):
            peer.load_state_dict({"hearsay_peer": b"\xff\xff\xff garbage"})


if __name__ == "__main__":
    unittest.main()
