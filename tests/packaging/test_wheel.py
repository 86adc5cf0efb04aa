"""hearsay as a PyTorch user installs it: the wheel (written from this build by the carried
build backend, python/build_backend/hearsay_wheel.py), installed with pip --no-index into
a fresh venv made with --system-site-packages (Debian's torch), then used from a folder
outside the checkout with no PYTHONPATH: `import hearsay.torch`, and `hearsay-run` (the
venv's console script) trains two torch peers (examples/torch/fmnist.py) to their end. A
package whose version differs from its extension's is refused at import, naming both.

Run by ctest with /usr/bin/python3; HEARSAY_BUILD_DIR names the build. Loopback ports
17491-17492."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("HEARSAY_BUILD_DIR", os.path.join(ROOT, "build"))
BACKEND = os.path.join(ROOT, "python", "build_backend", "hearsay_wheel.py")
EXAMPLE = os.path.join(ROOT, "examples", "torch", "fmnist.py")

CONFIG = f"""name: "wheel-pair"
seed: 5
program: "{EXAMPLE}"
model {{ kind: MLP hidden: [32] }}
data {{ format: SYNTHETIC synthetic_train: 1024 synthetic_test: 256 synthetic_dim: 16 num_classes: 4 synthetic_separation: 0.8 }}
optim {{ optimizer: "sgd" lr: 0.1 momentum: 0.5 }}
train {{ batch_size: 32 epochs: 2 eval_every_steps: 10 }}
log {{ every_steps: 10 }}
cluster {{
  id: "wheel-pair"
  secret_env: "HEARSAY_SECRET"
  peers {{ name: "w0" site: "a" address: "127.0.0.1:17491" }}
  peers {{ name: "w1" site: "a" address: "127.0.0.1:17492" }}
  gossip {{ algorithm: "adpsgd" topology: "ring" }}
}}
"""


def version():
    with open(os.path.join(ROOT, "VERSION"), encoding="utf-8") as f:
        return f.read().strip()


def clean_env():
    """The environment of a user's shell: nothing that points into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "HEARSAY_BIN_DIR")}
    env["OPENBLAS_CORETYPE"] = "Haswell"
    return env


class WheelInstall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hearsay-wheel-")
        r = subprocess.run([sys.executable, BACKEND, "--no-build", "--build-dir", BUILD,
                            "--wheel-dir", os.path.join(cls.tmp, "dist")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        cls.wheel = r.stdout.strip().splitlines()[-1]
        cls.venv = os.path.join(cls.tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", cls.venv], check=True)
        r = subprocess.run([os.path.join(cls.venv, "bin", "pip"), "install", "--no-index", "--quiet", cls.wheel],
                           capture_output=True, text=True, env=clean_env(), cwd=cls.tmp)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.work = os.path.join(cls.tmp, "work")  # outside the checkout
        os.makedirs(cls.work)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def venv_run(self, argv, env=None):
        return subprocess.run(argv, capture_output=True, text=True, env=env or clean_env(), cwd=self.work, timeout=240)

    def test_the_wheel_is_named_by_version_and_python(self):
        name = os.path.basename(self.wheel)
        self.assertTrue(name.startswith(f"hearsay-{version()}-cp3"), name)
        self.assertTrue(name.endswith("linux_x86_64.whl"), name)

    def test_hearsay_torch_imports_from_the_venv_outside_the_checkout(self):
        r = self.venv_run([os.path.join(self.venv, "bin", "python"), "-c",
                           "import hearsay, hearsay.torch, json; "
                           "print(json.dumps({'file': hearsay.__file__, 'version': hearsay.__version__, "
                           "'algorithms': list(hearsay.algorithms())}))"])
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(r.stdout)
        self.assertTrue(info["file"].startswith(self.venv), info["file"])
        self.assertFalse(info["file"].startswith(ROOT + os.sep + "build"), info["file"])
        self.assertIn("adpsgd", info["algorithms"])

    def test_two_torch_peers_train_to_their_end_through_the_installed_hearsay_run(self):
        config = os.path.join(self.work, "pair.textproto")
        with open(config, "w") as f:
            f.write(CONFIG)
        out = os.path.join(self.work, "runs")
        r = self.venv_run([os.path.join(self.venv, "bin", "hearsay-run"), config, "--out-dir", out])
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        logs = glob.glob(os.path.join(out, "**", "*.jsonl"), recursive=True)
        self.assertEqual(len(logs), 2, logs)
        for log in logs:
            with open(log, encoding="utf-8") as f:
                events = [json.loads(line) for line in f]
            end = [e for e in events if e.get("event") == "end"]
            self.assertEqual(len(end), 1, log)
            self.assertGreater(end[0]["steps"], 0)
            self.assertGreater(end[0]["bytes_sent"], 0, "the two peers gossiped")
            self.assertGreater(end[0]["final_test_acc"], 0.5, log)
        # The report, from the wheel's own copy of the tools and the page's template (a
        # failed report leaves the exit status alone, so it is looked for here).
        self.assertIn("hearsay-run: report in", r.stdout, r.stderr[-2000:])
        self.assertEqual(len(glob.glob(os.path.join(out, "*", "index.html"))), 1)

    def test_the_installed_hearsay_torchrun_starts_the_peers_under_the_venvs_python(self):
        # /usr/bin/torchrun runs the system python, which does not see the venv's hearsay;
        # the venv's hearsay-torchrun runs torchrun, and so its workers, under the venv's.
        config = os.path.join(self.work, "torchrun.textproto")
        with open(config, "w") as f:
            f.write(CONFIG)
        r = self.venv_run([os.path.join(self.venv, "bin", "hearsay-torchrun"), "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", "17493", EXAMPLE, "--config", config, "--quiet"],
                          env={**clean_env(), "HEARSAY_SECRET": "a secret of the wheel test, long enough"})
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        # (The two ranks' lines may interleave on the shared stdout.)
        finals = re.findall(r"final test accuracy ([0-9.]+)% \(loss ([0-9.]+)\)", r.stdout)
        self.assertEqual(len(finals), 2, r.stdout)
        # finish() averaged the two peers' models: both evaluate the same weights.
        self.assertEqual(finals[0], finals[1], r.stdout)

    def test_the_installed_hearsay_peer_is_the_native_program(self):
        r = self.venv_run([os.path.join(self.venv, "bin", "hearsay-peer"), "--version"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(version(), r.stdout)

    def test_a_package_and_extension_of_different_versions_are_refused_at_import(self):
        site = glob.glob(os.path.join(self.venv, "lib", "python3*", "site-packages", "hearsay"))[0]
        copy = os.path.join(self.tmp, "mismatch")
        # Without the compiled caches: a rewritten _version.py of the same size within the
        # same second would otherwise be read from its stale .pyc.
        shutil.copytree(site, os.path.join(copy, "hearsay"), ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(copy, "hearsay", "_version.py"), "w") as f:
            f.write('__version__ = "9.9.9"\n')
        r = self.venv_run([os.path.join(self.venv, "bin", "python"), "-c", "import hearsay"],
                          env={**clean_env(), "PYTHONPATH": copy})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("version 9.9.9", r.stderr)
        self.assertIn("_engine", r.stderr)
        self.assertNotIn("Segmentation", r.stderr)


if __name__ == "__main__":
    unittest.main()
