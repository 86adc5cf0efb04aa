"""hearsay.torch: a peer killed mid-training and started again resumes everything its
script registered (the scheduler's rate and momentum, a dict of its own) and its place in
its own data (the sampler's epoch, the batch within it), in either order of
peer.batches() and the optimizer; a rerun of a finished run says so and exits 2."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "alone-synthetic.textproto")
SCRIPT = os.path.join(HERE, "resume_script.py")


def run(ckpt, trace, order, *extra, total=40, workers=0):
    sets = ['train { epochs: 100 max_steps: %d }' % total, 'checkpoint { dir: "%s" every_steps: 5 }' % ckpt]
    cmd = [sys.executable, SCRIPT, "--config", CONFIG, "--order", order, "--trace", trace, "--total", str(total),
           "--workers", str(workers), *extra]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class Resume(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hearsay-resume-")
        reference = os.path.join(self.dir, "reference.jsonl")
        done = run(os.path.join(self.dir, "ref-ckpt"), reference, "optimizer-first")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.reference = lines(reference)

    def killed_and_restarted(self, order, kill_after=23, workers=0):
        ckpt, trace = os.path.join(self.dir, order + "-ckpt"), os.path.join(self.dir, order + ".jsonl")
        killed = run(ckpt, trace, order, "--kill-after", str(kill_after), workers=workers)
        self.assertEqual(killed.returncode, -9, killed.stderr)
        before = len(lines(trace))
        again = run(ckpt, trace, order, workers=workers)
        self.assertEqual(again.returncode, 0, again.stderr)
        return lines(trace)[before:], ckpt, trace

    def check_resumed(self, order, workers=0):
        resumed, ckpt, trace = self.killed_and_restarted(order, workers=workers)
        # The last checkpoint before the kill was at step 20: the restart goes on from 21
        # with what the reference run had there, step for step.
        self.assertEqual(resumed[0]["step"], 21)
        by_step = {r["step"]: r for r in self.reference if "step" in r}
        for row in resumed[:-1]:
            ref = by_step[row["step"]]
            for key in ("lr", "momentum", "epoch", "ids", "seen", "ids_sum"):
                self.assertEqual(row[key], ref[key], f"{order}: step {row['step']}: {key}")
        # 40 steps of 8 batches an epoch: epochs 2 to 4 after the resume.
        self.assertEqual(resumed[0]["epoch"], 2)
        self.assertEqual(resumed[-1], self.reference[-1], f"{order}: the final parameters differ from the reference run's")
        return ckpt, trace

    def test_killed_peer_resumes_scheduler_sampler_and_dict_with_the_optimizer_first(self):
        self.check_resumed("optimizer-first")

    def test_killed_peer_resumes_scheduler_sampler_and_dict_with_the_data_first(self):
        self.check_resumed("data-first")

    def test_resume_mid_epoch_with_loader_workers_skips_the_fed_batches(self):
        self.check_resumed("optimizer-first", workers=2)

    def test_rerun_of_a_finished_run_says_it_is_finished_and_exits_2(self):
        ckpt, trace = self.check_resumed("optimizer-first")
        again = run(ckpt, trace, "optimizer-first")
        self.assertEqual(again.returncode, 2, again.stderr)
        self.assertRegex(again.stderr, r"resume_script.py: error: peer torch-alone: its checkpoint in .* is at step 40, "
                                       r"and the run has 40 steps: it is finished.*checkpoint \{ resume: false \}.*"
                                       r"raise train.max_steps")
        self.assertEqual(again.stderr.count("\n"), 1, again.stderr)
        # Extending it goes on from step 40 (without the OneCycleLR, whose 40 steps are
        # over: the checkpoint's state for it is said to be left unrestored).
        longer = run(ckpt, trace, "optimizer-first", "--scheduler", "none", total=48)
        self.assertEqual(longer.returncode, 0, longer.stderr)
        self.assertIn("the checkpoint carries state for 'scheduler' that no register_state() took", longer.stderr)
        self.assertEqual(lines(trace)[-9]["step"], 41)
        self.assertEqual(lines(trace)[-1]["end"], 48)

    def test_a_loader_of_another_length_than_the_checkpoints_is_refused_in_either_order(self):
        for order in ("optimizer-first", "data-first"):
            ckpt, trace = os.path.join(self.dir, order + "-len-ckpt"), os.path.join(self.dir, order + "-len.jsonl")
            self.assertEqual(run(ckpt, trace, order, "--kill-after", "12").returncode, -9)
            other = run(ckpt, trace, order, "--batch", "16")
            self.assertEqual(other.returncode, 2, other.stderr)
            self.assertRegex(other.stderr, r"peer torch-alone: the script's data has 4 batches an epoch, but the checkpoint "
                                           r"it resumes from \(step 10\) counted 8")


if __name__ == "__main__":
    unittest.main()
