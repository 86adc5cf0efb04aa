"""SIGTERM and SIGINT at every phase of a lone peer and of a cluster peer (loading its data,
joining, training, writing a checkpoint), RUNS times each (issue 39: 100), and RUNS / 4
times each to a synchronous peer in its join: every run ends
by itself within its bound, says it was stopped on stderr, exits 143 or 130 (not killed by
the signal: the status is its own), leaves its stop checkpoint where it took a step, and
no file of a library's (libinfinipath wrote *.btr files from its handler) in its working
directory.

The signal lands after a random delay over the run's whole life (the phases are timed
from each run's own log), so the RUNS runs of each kind cover them all; the tally per
phase is printed.

usage: test_stop_signals.py BIN_DIR [--runs N] [--jobs J]"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

RUN_BOUND_S = 30  # a run that has not ended this long after its signal hangs

CONFIG = '''name: "signals"
seed: 5
model {{ kind: MLP hidden: [64] }}
data {{ format: SYNTHETIC synthetic_train: 20000 synthetic_test: 500 synthetic_dim: 32 num_classes: 4 }}
optim {{ lr: 0.05 }}
train {{ batch_size: 16 epochs: 1 eval_every_steps: 400 emulated_step_s: 0.002 }}
log {{ every_steps: 20 }}
checkpoint {{ dir: "ckpt" every_steps: 25 }}
{cluster}
'''

# b never starts: "cluster" trains alone from the start while it dials b (asynchronous,
# min_neighbours 0 starts at once); "sync join" spends all its life in the join
# (all-reduce needs every peer: it would give up, exit 2, at 4 s).
CLUSTER = '''cluster {{
  id: "signals"
  secret_env: "HEARSAY_SECRET"
  connect_timeout_s: {timeout}
  min_neighbours: 0
  tls: false
  peers {{ name: "a" address: "127.0.0.1:{port}" }}
  peers {{ name: "b" address: "127.0.0.1:{other}" }}
  gossip {{ algorithm: "{algorithm}" }}
}}'''
CLUSTER_OF = {"cluster": {"timeout": 0.6, "algorithm": "adpsgd"}, "sync join": {"timeout": 4, "algorithm": "allreduce"}}


def events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by the end of the file
    except FileNotFoundError:
        pass
    return out


def phase_of(kind, evs):
    """Where the run was when its signal came, from its own log."""
    if not any(e.get("event") == "start" for e in evs):
        return "loading"
    end = next((e for e in reversed(evs) if e.get("event") == "end"), None)
    if end is None or end.get("steps", 0) == 0:
        return "before the first step" if kind == "lone" else "joining"
    # The stop checkpoint follows the periodic one at once: the signal came while it was written.
    ckpts = [e for e in evs if e.get("event") == "checkpoint"]
    if len(ckpts) >= 2 and ckpts[-2].get("step") == end["steps"]:
        return "checkpoint write"
    return "training"


def one_run(bin_dir, kind, sig, delay_s, port):
    d = tempfile.mkdtemp(prefix="hearsay-signals-")
    try:
        cluster = CLUSTER.format(port=port, other=port + 1, **CLUSTER_OF[kind]) if kind in CLUSTER_OF else ""
        with open(os.path.join(d, "c.textproto"), "w") as f:
            f.write(CONFIG.format(cluster=cluster))
        cmd = [os.path.join(bin_dir, "hearsay-peer"), "--config", "c.textproto", "--quiet", "--log", "peer.jsonl"]
        if kind != "lone":
            cmd += ["--peer", "a"]
        env = dict(os.environ, HEARSAY_SECRET="signals-test-secret-0123456789")
        started = time.monotonic()
        p = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay_s)
        if p.poll() is not None:
            out, err = p.communicate()
            return {"ok": False, "why": f"ended before its signal (exit {p.returncode}): {err[-400:]}"}
        p.send_signal(sig)
        signalled = time.monotonic() - started
        try:
            out, err = p.communicate(timeout=RUN_BOUND_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return {"ok": False, "why": f"hung: still running {RUN_BOUND_S} s after {sig.name}"}
        took = time.monotonic() - started - signalled
        evs = events(os.path.join(d, "peer.jsonl"))
        end = next((e for e in reversed(evs) if e.get("event") == "end"), None)
        want = 128 + sig
        why = []
        if p.returncode == -sig and not evs and not err:
            # Before main: the dynamic loader was still mapping libraries, and the signal's
            # default action ended the process, as nothing else can then.
            return {"ok": True, "phase": "before main", "took": took}
        if p.returncode != want:
            why.append(f"exit {p.returncode}, wanted {want}" + (" (killed by the signal)" if p.returncode < 0 else ""))
        if f"stopped by {sig.name}" not in err:
            why.append(f"no 'stopped by {sig.name}' on stderr")
        stepped = end is not None and end.get("steps", 0) > 0
        ckpt = os.path.join(d, "ckpt", "signals.ckpt" if kind == "lone" else "a.ckpt")
        if stepped and not os.path.exists(ckpt):
            why.append("took steps but left no stop checkpoint")
        if stepped and not any(e.get("event") == "checkpoint" and e.get("step") == end["steps"] for e in evs):
            why.append(f"no checkpoint at its last step {end['steps']}")
        total = next((e.get("total_steps") for e in evs if e.get("event") == "start"), 0)
        if end is not None and not end.get("stopped") and end.get("steps", 0) < total:
            why.append("its end event does not say it was stopped")
        strays = sorted(set(os.listdir(d)) - {"c.textproto", "peer.jsonl", "ckpt"})
        if strays:
            why.append(f"files no one asked for: {strays}")
        return {"ok": not why, "why": "; ".join(why) + (f"\nstderr: {err[-600:]}" if why else ""), "phase": phase_of(kind, evs),
                "took": took}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--runs", type=int, default=100, help="runs of each (kind, signal)")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.bin_dir = os.path.abspath(args.bin_dir)
    rng = random.Random(args.seed)
    plan = []
    port = 17600
    for kind in ("lone", "cluster", "sync join"):
        # The whole run, short of its end even where start-up is quick: 2 ms steps (emulated,
        # so no faster elsewhere), 1,250 alone (2.5 s), 625 in the cluster (1.25 s: it
        # starts at once); the synchronous peer's 4 s join.
        horizon = {"lone": 2.3, "cluster": 1.1, "sync join": 3.0}[kind]
        runs = args.runs if kind != "sync join" else max(1, args.runs // 4)
        for sig in (signal.SIGTERM, signal.SIGINT):
            for i in range(runs):
                # One in ten lands in the first quarter second: start-up and data loading
                # are a small part of the run's life, and each must be hit.
                delay = rng.uniform(0.0, 0.25) if i % 10 == 0 else rng.uniform(0.0, horizon)
                plan.append((kind, sig, delay, port))
                port += 2
    tally = collections.Counter()
    failures = []
    slowest = 0.0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for (kind, sig, delay, _), r in zip(plan, pool.map(lambda p: one_run(args.bin_dir, *p), plan)):
            if not r["ok"]:
                failures.append(f"{kind} peer, {sig.name} after {delay:.3f} s: {r['why']}")
                continue
            tally[(kind, sig.name, r["phase"])] += 1
            slowest = max(slowest, r["took"])
    for (kind, name, phase), n in sorted(tally.items()):
        print(f"{kind:8s} {name:8s} {phase:22s} {n:4d}")
    print(f"{len(plan) - len(failures)} of {len(plan)} runs stopped cleanly; the slowest ended {slowest:.2f} s after its signal")
    for f in failures:
        print("FAILED: " + f)
    phases = {phase for (_, _, phase) in tally}
    if "training" not in phases or not phases & {"loading", "before the first step", "joining"}:
        print(f"FAILED: the signals missed a phase: only {sorted(phases)}")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
