#!/usr/bin/python3
"""The chaos run: every peer of a cluster config as its own process, one random peer
killed with SIGKILL and restarted every --every seconds, for --minutes. Not in CI.

What it checks, and writes to RUN_DIR/chaos.json (and prints):
- every restart resumed from its checkpoint (a "resume" event with a step > 0 in the
  restarted incarnation's log);
- every peer's resident memory stayed flat after warm-up (sampled every 5 s to
  rss.jsonl; the growth from the first to the last third of the run after --warmup);
- the cluster reached train.target_test_acc: the first time the mean over the peers of
  their latest test accuracy reached it (hearsay_figures; docs/LOGS.md, "Time to target").

    HEARSAY_SECRET=... /usr/bin/python3 experiments/hearsay_chaos.py configs/chaos.textproto --minutes 20
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


class Peer:
    def __init__(self, name, args, run_dir, env):
        self.name, self.args, self.run_dir, self.env = name, args, run_dir, env
        self.proc = None
        self.incarnation = 0
        self.log = os.path.join(run_dir, f"{name}.jsonl")

    def start(self):
        self.incarnation += 1
        err = open(os.path.join(self.run_dir, f"{self.name}.stderr"), "a", encoding="utf-8")
        err.write(f"--- incarnation {self.incarnation} at {time.time():.1f}\n")
        err.flush()
        cmd = [self.args.peer_bin, "--config", self.args.config, "--peer", self.name, "--quiet", "--log", self.log,
               "--set", f'checkpoint {{ dir: "{os.path.join(self.run_dir, "ckpt")}" }}']
        self.proc = subprocess.Popen(cmd, stdout=err, stderr=err, env=self.env)
        err.close()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def log_size(path):
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def resumed_step(path, offset):
    """The step of the first "resume" event written after byte `offset` of the log."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            for line in f:
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(e, dict) and e.get("event") == "resume":
                    return e.get("step")
    except FileNotFoundError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--every", type=float, default=60, help="seconds between kills")
    ap.add_argument("--warmup", type=float, default=120, help="seconds before memory counts as steady")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs"))
    ap.add_argument("--peer-bin", default=os.path.join(ROOT, "build", "bin", "hearsay-peer"))
    args = ap.parse_args()
    if not os.environ.get("HEARSAY_SECRET"):
        os.environ["HEARSAY_SECRET"] = "chaos-" + os.urandom(12).hex()
    names = subprocess.run([args.peer_bin, "--config", args.config, "--list-peers"], check=True, capture_output=True,
                           text=True).stdout.split()
    run_dir = os.path.join(args.out, time.strftime("chaos-%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(run_dir, "ckpt"))
    env = dict(os.environ)
    peers = [Peer(n, args, run_dir, env) for n in names]
    rng = random.Random(args.seed)
    t0 = time.time()
    for p in peers:
        p.start()
    restarts, rss = [], {p.name: [] for p in peers}
    next_kill, next_sample = t0 + args.every, t0
    end = t0 + args.minutes * 60
    with open(os.path.join(run_dir, "rss.jsonl"), "w", encoding="utf-8") as rss_log:
        while time.time() < end:
            now = time.time()
            if now >= next_sample:
                next_sample += 5
                for p in peers:
                    mb = rss_mb(p.proc.pid)
                    if mb is not None and p.proc.poll() is None:
                        rss[p.name].append((now - t0, mb))
                        rss_log.write(json.dumps({"t": round(now - t0, 1), "peer": p.name, "rss_mb": round(mb, 1)}) + "\n")
                rss_log.flush()
            if now >= next_kill:
                next_kill += args.every
                victim = rng.choice(peers)
                offset = log_size(victim.log)
                victim.kill()
                victim.start()
                restarts.append({"t": round(now - t0, 1), "peer": victim.name, "log_offset": offset})
                print(f"[chaos {now - t0:6.0f}s] killed and restarted {victim.name}", flush=True)
            for p in peers:
                if p.proc.poll() is not None:  # a peer that died on its own is a failure to report
                    print(f"[chaos] {p.name} exited with {p.proc.returncode}; restarting it", flush=True)
                    restarts.append({"t": round(time.time() - t0, 1), "peer": p.name, "log_offset": log_size(p.log),
                                     "unplanned_exit": p.proc.returncode})
                    p.start()
            time.sleep(0.5)
    for p in peers:
        p.proc.send_signal(signal.SIGTERM)
    for p in peers:
        try:
            p.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.proc.kill()

    for r in restarts:
        r["resumed_step"] = resumed_step(os.path.join(run_dir, f"{r['peer']}.jsonl"), r.pop("log_offset"))
    memory = {}
    for name, samples in rss.items():
        steady = [mb for t, mb in samples if t >= args.warmup]
        third = max(1, len(steady) // 3)
        memory[name] = {
            "first_third_mb": round(statistics.fmean(steady[:third]), 1) if steady else None,
            "last_third_mb": round(statistics.fmean(steady[-third:]), 1) if steady else None,
            "max_mb": round(max(steady), 1) if steady else None,
        }
    target = None
    with open(args.config, encoding="utf-8") as f:
        for line in f:
            if "target_test_acc" in line:
                target = float(line.split("target_test_acc:")[1].split()[0])
    # Log times are per incarnation; each "start" event's unix_time places them in the run,
    # and a killed incarnation is out of the mean until its restart (hearsay_figures).
    logs = hearsay_figures.Logs({p.name: hearsay_logs.read_log(p.log, warn=False)[1] for p in peers})
    reached = hearsay_figures.time_to_target(logs.mean_curve("test_acc"), target or 0)
    result = {
        "config": args.config,
        "minutes": args.minutes,
        "kill_every_s": args.every,
        "restarts": restarts,
        "restarts_resumed": sum(1 for r in restarts if (r["resumed_step"] or 0) > 0),
        "unplanned_exits": sum(1 for r in restarts if "unplanned_exit" in r),
        "memory_after_warmup": memory,
        "target_test_acc": target,
        "mean_acc_reached_target_at_s": reached,
        "final_mean_test_acc": logs.final("test_acc")[0],
    }
    with open(os.path.join(run_dir, "chaos.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "restarts"}, indent=2))
    print(f"hearsay-chaos: {len(restarts)} restarts, {result['restarts_resumed']} resumed from a checkpoint; "
          f"details in {os.path.join(run_dir, 'chaos.json')}")


if __name__ == "__main__":
    main()
