#!/usr/bin/python3
"""Checkpoints of a large peer (issue 41, Done when 4): what a checkpoint every step costs
the steps, and that a damaged file is refused before anything is loaded.

One hearsay-peer alone, the native GPT at `--size` (1b: 20 x 2048, context 128, 1.008B
parameters), momentum SGD (its state, the velocity, is one model-sized buffer: a copy of
the state is 8 bytes a parameter, which this 24 GiB machine fits beside the peer's 12; a
CPU peer holds one only once a fence has waited for its disk, docs/CHECKPOINTS.md), batch 1, `--steps` steps, logged every step. Run twice: without checkpoints, and with
a checkpoint every `--every` steps. A step's time is the gap between its step event and
the one before; the first step (the first touch of every buffer) is left out.
Then the last checkpoint has one byte flipped in the middle of the parameters and the
peer is started on it: it must exit 2 naming the chunk, having loaded nothing. JSON lines:

  {"run": "plain" | "checkpoint", "params", "start_event_s" (the process's start to its start
   event: data, model, initialisation), "first_step_s" (the start event to the first step's
   end), "step_s": {step: seconds}, "kind": {step: "quiet" |
   "snapshot" (the step after a checkpoint: the write reads the live state beside it, and
   its fence comes before its optimizer step) | "during_write" (the write ran in it too)},
   "median_step_s": {kind: median}, "checkpoints": [...], "peak_rss_bytes", "wall_s"}
  {"ratio_to_plain": {kind: median over the plain run's median},
   "ratio_to_quiet": {kind: median over the checkpointed run's own quiet median} (the same
   process, so a machine that slows down between the two runs does not count)}
  {"refused": true, "exit": 2, "message", "refuse_s"}

    bench/checkpoint_scale.py                 # 1b, 10 steps, every 3: about 6 min here
    bench/checkpoint_scale.py --size 85m --steps 12 --every 4
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZES = {"85m": (12, 12, 768), "300m": (24, 16, 1024), "1b": (20, 16, 2048)}


def config(size, steps, checkpoint_dir, every=1):
    layers, heads, width = SIZES[size]
    ckpt = f'checkpoint {{ dir: "{checkpoint_dir}" every_steps: {every} }}' if checkpoint_dir else ""
    return f"""
name: "ckpt-scale" seed: 1
model {{ kind: GPT gpt {{ layers: {layers} heads: {heads} width: {width} context: 128 }} }}
data {{ format: TEXT text_path: "{ROOT}/data/kjv.txt" test_limit: 2 }}
optim {{ optimizer: "sgd" lr: 0.0001 momentum: 0.9 }}
train {{ batch_size: 1 epochs: 0 max_steps: {steps} eval_batch_size: 1 eval_every_steps: 1000000 }}
log {{ every_steps: 1 }}
{ckpt}
"""


def run_peer(peer, cfg_path, log_path, out_path):
    """Runs one peer; returns its exit code, its output, its wall time and its own peak
    resident memory (wait4's ru_maxrss: this child's, not the largest child's so far)."""
    t0 = time.time()
    with open(out_path, "w") as out:
        proc = subprocess.Popen([peer, "--config", cfg_path, "--log", log_path, "--quiet"], stdout=out, stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    with open(out_path) as f:
        output = f.read()
    return proc.returncode, output, time.time() - t0, usage.ru_maxrss * 1024


def events(log_path, kind):
    with open(log_path) as f:
        return [e for e in map(json.loads, f) if e.get("event") == kind]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1b", choices=sorted(SIZES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=3, help="checkpoint every this many steps")
    ap.add_argument("--peer", default=os.path.join(ROOT, "build", "bin", "hearsay-peer"))
    ap.add_argument("--dir", default=None, help="working directory (default: a new one under /var/tmp)")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="hearsay-ckpt-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    ckpt_dir = os.path.join(work, "ckpt")
    medians = {}
    try:
        for run in ("plain", "checkpoint"):
            cfg_path = os.path.join(work, run + ".textproto")
            with open(cfg_path, "w") as f:
                f.write(config(args.size, args.steps, ckpt_dir if run == "checkpoint" else "", args.every))
            log_path = os.path.join(work, run + ".jsonl")
            code, output, wall, rss = run_peer(args.peer, cfg_path, log_path, os.path.join(work, run + ".out"))
            if code != 0:
                print(json.dumps({"run": run, "exit": code, "output": output[-2000:]}), flush=True)
                return 1
            steps = {e["step"]: e["t"] for e in events(log_path, "step")}
            # Step s took t[s] - t[s-1]; the first step (first touch of every buffer) is left out.
            step_s = {s: steps[s] - steps[s - 1] for s in steps if s - 1 in steps}
            checkpoints = events(log_path, "checkpoint")
            # A checkpoint after step k is snapshotted at the start of step k + 1's time,
            # and written until its event: the steps that overlap the write are "during".
            kinds = {s: "quiet" for s in step_s}
            for c in checkpoints:
                k = c["step"]
                if k + 1 in kinds:
                    kinds[k + 1] = "snapshot"
                for s in step_s:
                    if s > k + 1 and steps[s - 1] < c["t"]:
                        kinds[s] = "during_write"
            by_kind = {}
            for s, d in step_s.items():
                by_kind.setdefault(kinds[s], []).append(d)
            medians[run] = {k: statistics.median(v) for k, v in by_kind.items()}
            start = events(log_path, "start")[0]
            first = min(steps) if steps else None
            print(json.dumps({"run": run, "params": start.get("params"), "start_event_s": start["t"],
                              "first_step_s": steps[first] - start["t"] if first is not None else None,
                              "step_s": step_s, "kind": kinds,
                              "median_step_s": medians[run],
                              "checkpoints": [{k: c[k] for k in ("step", "bytes", "snapshot_s", "waited_s", "write_s", "copied_bytes", "fence_waited_bytes", "fence_s") if k in c}
                                              for c in checkpoints],
                              "peak_rss_bytes": rss, "wall_s": wall}), flush=True)
        plain = medians["plain"]["quiet"]
        quiet = medians["checkpoint"].get("quiet", plain)
        print(json.dumps({"ratio_to_plain": {k: v / plain for k, v in medians["checkpoint"].items()},
                          "ratio_to_quiet": {k: v / quiet for k, v in medians["checkpoint"].items()}}), flush=True)

        # A byte flipped in the middle of the parameters: refused, nothing loaded.
        path = os.path.join(ckpt_dir, "ckpt-scale.ckpt")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 3)
            b = f.read(1)
            f.seek(size // 3)
            f.write(bytes([b[0] ^ 0x10]))
        cfg_path = os.path.join(work, "checkpoint.textproto")
        t0 = time.time()
        proc = subprocess.run([args.peer, "--config", cfg_path, "--log", os.path.join(work, "refused.jsonl"), "--quiet"],
                              capture_output=True, text=True)
        message = (proc.stdout + proc.stderr).strip().splitlines()
        print(json.dumps({"refused": proc.returncode == 2, "exit": proc.returncode, "file_bytes": size,
                          "message": message[-1] if message else "", "refuse_s": time.time() - t0}), flush=True)
        return 0 if proc.returncode == 2 else 1
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
