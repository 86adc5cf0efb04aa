"""hearsay.torch.init() names its peer from the launcher's environment, as
torch.distributed.init_process_group does: torchrun's RANK and WORLD_SIZE (first: torchrun
under Slurm sets both), a Slurm job array's task, a Slurm step's SLURM_PROCID and
SLURM_NTASKS; a count that is not the config's is refused naming the variable. And a real
torchrun starts examples/torch/ddp_style.py as two peers (DataLoader with 2 workers,
gradient accumulation, BatchNorm buffers broadcast, allreduce)."""
import os
import subprocess
import sys
import tempfile
import unittest

import torch

import hearsay
from hearsay._torch_peer import _launcher

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEERS = ["a", "b"]
SECRET = "a secret for the launch tests, long enough"


def config(port0, algorithm="adpsgd", extra="", connect_timeout_s=0.3):
    path = os.path.join(tempfile.mkdtemp(), "c.textproto")
    with open(path, "w") as f:
        f.write(f'name: "launch"\nseed: 1\nthreads: 1\ndata {{ format: SYNTHETIC synthetic_dim: 8 num_classes: 4 }}\n{extra}'
                f'cluster {{\n  id: "launch"\n  secret_env: "HEARSAY_SECRET"\n  connect_timeout_s: {connect_timeout_s}\n'
                f'  gossip {{ algorithm: "{algorithm}" }}\n'
                f'  peers {{ name: "a" address: "127.0.0.1:{port0}" }}\n  peers {{ name: "b" address: "127.0.0.1:{port0 + 1}" }}\n}}\n')
    return path


class Environment(unittest.TestCase):
    def test_torchrun_variables_name_the_peer(self):
        self.assertEqual(_launcher({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, PEERS, "c"), ("b", "torchrun", 1))

    def test_slurm_variables_name_the_peer(self):
        self.assertEqual(_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, PEERS, "c"),
                         ("a", "slurm", 0))
        # A job array (peers/slurm/hearsay.sbatch): each task is SLURM_PROCID 0 of its own job.
        env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
        self.assertEqual(_launcher(env, PEERS, "c"), ("b", "slurm array", 0))

    def test_torchrun_under_slurm_is_named_by_torchrun(self):
        # srun torchrun: Slurm counts nodes (one task here), torchrun counts processes.
        env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "RANK": "1", "WORLD_SIZE": "2",
               "LOCAL_RANK": "1"}
        self.assertEqual(_launcher(env, PEERS, "c"), ("b", "torchrun", 1))

    def test_a_count_or_rank_that_does_not_fit_the_config_is_refused_by_name(self):
        with self.assertRaisesRegex(hearsay.InputError, r"WORLD_SIZE=3 \(torchrun\) but c lists 2 peers in cluster.peers"):
            _launcher({"RANK": "1", "WORLD_SIZE": "3"}, PEERS, "c")
        with self.assertRaisesRegex(hearsay.InputError, r"SLURM_NTASKS=4 \(slurm\) but c lists 2 peers"):
            _launcher({"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, PEERS, "c")
        with self.assertRaisesRegex(hearsay.InputError, r"SLURM_PROCID=2: not an index into the 2 peers of c"):
            _launcher({"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, PEERS, "c")
        with self.assertRaisesRegex(hearsay.InputError, r"RANK=x: not an index"):
            _launcher({"RANK": "x", "WORLD_SIZE": "2"}, PEERS, "c")
        self.assertEqual(_launcher({}, PEERS, "c"), (None, None, 0))

    def run_init(self, env, code):
        env = dict(os.environ, HEARSAY_SECRET=SECRET, **env)
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_ARRAY_TASK_ID"):
            if var not in env or env[var] is None:
                env.pop(var, None)
        return subprocess.run([sys.executable, "-c", "import hearsay.torch as ht\n" + code], env=env, capture_output=True,
                              text=True, timeout=60)

    def test_init_reads_the_config_and_rank_from_the_environment(self):
        path = config(17473)
        code = ("peer = ht.init(min_neighbours=0)\n"
                "print(peer.name, peer.rank, peer.local_rank, peer.launcher, peer.world_size, ht.is_initialized())\n"
                "try:\n    ht.init(min_neighbours=0)\nexcept ht.InputError as e:\n    print('second:', e)\n"
                "peer.close()\nprint(ht.is_initialized())\n")
        r = self.run_init({"HEARSAY_CONFIG": path, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1"}, code)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "b 1 1 slurm 2 True")
        self.assertIn("second: init(): this process is peer 'b' already", lines[1])
        self.assertEqual(lines[2], "False")
        r = self.run_init({"HEARSAY_CONFIG": path, "RANK": "0", "WORLD_SIZE": "3"}, "ht.init()\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("WORLD_SIZE=3 (torchrun) but " + path + " lists 2 peers", r.stderr)
        r = self.run_init({}, "ht.init()\n")
        self.assertIn("no config: pass config=, --config FILE, or set HEARSAY_CONFIG", r.stderr)


class Torchrun(unittest.TestCase):
    def test_torchrun_starts_a_peer_per_rank(self):
        d = tempfile.mkdtemp()
        # Two ranks that each import torch first: on a loaded machine they come up seconds
        # apart, and allreduce needs both (0.3 s once failed beside other tests).
        path = config(17471, "allreduce", 'optim { optimizer: "sgd" lr: 0.05 momentum: 0.9 }\n'
                                          'train { batch_size: 32 max_steps: 30 eval_every_steps: 1000 }\n',
                      connect_timeout_s=60)
        save = os.path.join(d, "{peer}.pt")
        env = dict(os.environ, HEARSAY_SECRET=SECRET, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(hearsay.__file__))))
        # -r/-t: Debian's torch 1.13 under Python 3.11 cannot parse torchrun's default "0"
        # (an IntFlag's zero member is not iterated); "0:1" names rank 0's stdout only.
        cmd = [sys.executable, "-m", "torch.distributed.run", "-r", "0:1", "-t", "0:1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", "17481", os.path.join(ROOT, "examples", "torch", "ddp_style.py"),
               "--config", path, "--workers", "2", "--accumulate", "2", "--save", save, "--quiet"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=d)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a, b = (torch.load(save.replace("{peer}", p)) for p in PEERS)
        self.assertEqual((a["peer"], b["peer"]), ("a", "b"))
        self.assertEqual((a["steps"], b["steps"]), (30, 30))
        # 30 steps of 2 batches of 32 over each peer's half of the 60,000 images (937 batches).
        self.assertAlmostEqual(a["epochs"], 60 / 937, places=6)
        for name in a["state"]:  # allreduce keeps the models equal, and peer 0's buffers go to b
            self.assertTrue(torch.equal(a["state"][name], b["state"][name]), name)
        self.assertNotIn("bye", r.stderr)
        self.assertNotIn("closed connection", r.stderr)


if __name__ == "__main__":
    unittest.main()
