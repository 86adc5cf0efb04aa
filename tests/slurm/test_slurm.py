#!/usr/bin/python3
"""make test-slurm: the shipped peers/slurm/hearsay.sbatch under a real Slurm (issue 24;
docs/OPERATIONS.md, "Slurm").

Starts Debian's munged, slurmctld and slurmd on this machine, as root, from files of its own
in a temporary directory (a munge key, slurm.conf: one node, its CPUs oversubscribed, its
daemons on loopback ports that were free), then submits

    sbatch peers/slurm/hearsay.sbatch CONFIG

as shipped, with only the config as its argument: a job array of 4 peers (Fashion-MNIST,
the quickstart's MLP, adpsgd, checkpoints every 50 steps). Once peer 2 has written a
checkpoint, its array task is cancelled (scancel JOB_2) and requeued (scontrol requeue);
the test passes when every array task has completed with exit code 0, the requeued peer's
log shows it resumed from its checkpoint, and the peers' mean test accuracy reached the
target. Everything it started is stopped and its directory removed, whatever happens.

Exit 0: passed; 1: failed; 77: skipped (not root, or Slurm or munge not installed).
"""
import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: signal_cleanup
import hearsay_logs  # noqa: E402
import signal_cleanup  # noqa: E402
from hearsay_metrics import free_ports  # noqa: E402

SKIP = 77
DAEMONS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo"]


def say(text):
    print(f"test-slurm: {text}", flush=True)


class Slurm:
    """munged, slurmctld and slurmd of one run, from files under `root`; close() stops them."""

    def __init__(self, root, cpus):
        self.root = root
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.pids = []
        key, self.socket = os.path.join(root, "munge.key"), os.path.join(root, "munge.sock")
        self.run("mungekey", "--create", "--keyfile", key)
        os.chmod(key, 0o600)
        self.run("munged", f"--key-file={key}", f"--socket={self.socket}", f"--pid-file={root}/munged.pid",
                 f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed", "--force")
        self.pids.append(f"{root}/munged.pid")
        ctl_port, node_port = free_ports(2)
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
        for d in ("state", "spool"):
            os.makedirs(os.path.join(root, d))
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=hearsaytest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmdPort={node_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
# No cgroups in a container: processes tracked by their parent, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node's CPUs as this file says (more than the machine has: every peer a task of its own).
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=600
MpiDefault=none
SwitchType=switch/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 State=UNKNOWN
PartitionName=hearsay Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.run("slurmctld", "-c", "-f", self.conf)
        self.pids.append(f"{root}/slurmctld.pid")
        self.run("slurmd", "-f", self.conf)
        self.pids.append(f"{root}/slurmd.pid")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError("the node did not come up idle within 30 s:\n" + self.tail("slurmctld.log") + self.tail("slurmd.log"))

    def run(self, *cmd, **kw):
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, **kw)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
        return r.stdout.strip()

    def tail(self, name, n=3000):
        try:
            with open(os.path.join(self.root, name), errors="replace") as f:
                return f"--- {name}:\n" + f.read()[-n:]
        except OSError:
            return ""

    def state(self, task):
        """The array task's state and exit code (scontrol: this Slurm keeps no accounting)."""
        r = subprocess.run(["scontrol", "-o", "show", "job", task], env=self.env, capture_output=True, text=True)
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?"), int(fields.get("Restarts", "0") or 0)

    def close(self):
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True)
        # slurmd last but one (its steps end with it), munged last (the others need it to the end).
        for pidfile in reversed(self.pids):
            try:
                with open(pidfile) as f:
                    pid = int(f.read().strip())
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass


def config_text(ports, ckpt_dir, args):
    peers = "\n".join(f'  peers {{ name: "{n}" site: "{n[:2]}" address: "127.0.0.1:{p}" }}'
                      for n, p in zip(["eu-0", "eu-1", "us-0", "us-1"], ports))
    return f"""name: "slurm"
seed: 1
device: "cpu"
model {{ kind: MLP hidden: [256, 256] }}
data {{ format: IDX }}
optim {{ optimizer: "sgd" lr: 0.05 momentum: 0.9 nesterov: true }}
train {{ batch_size: 64 max_steps: {args.steps} eval_every_s: 1 target_test_acc: {args.target} emulated_step_s: {args.step_ms / 1000} }}
log {{ every_steps: 50 }}
checkpoint {{ dir: "{ckpt_dir}" every_steps: 50 }}
cluster {{
  id: "slurm"
  secret_env: "HEARSAY_SECRET"
  transport: "tcp"
  connect_timeout_s: 60
{peers}
  gossip {{ algorithm: "adpsgd" topology: "random" }}
}}
"""


def wait_for(what, predicate, seconds, slurm):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not within {seconds} s\n" + slurm.tail("slurmctld.log") + slurm.tail("slurmd.log"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1200, help="each peer's steps")
    ap.add_argument("--step-ms", type=float, default=15, help="each step's emulated compute, ms")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--bin", default=os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--keep", help="keep the run's directory (logs, slurm.conf, daemon logs) here")
    ap.add_argument("--json", action="store_true", help="print the run's figures as one JSON line")
    args = ap.parse_args()
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if os.geteuid() != 0 or missing:
        say("SKIPPED: " + ("needs root" if os.geteuid() != 0 else "not installed: " + " ".join(missing)))
        return SKIP
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin"
    root = args.keep or tempfile.mkdtemp(prefix="hearsay-slurm-")
    os.makedirs(root, exist_ok=True)
    slurm = None
    try:
        slurm = Slurm(root, cpus=8)
        logs, ckpt = os.path.join(root, "logs"), os.path.join(root, "ckpt")
        cfg = os.path.join(root, "slurm.textproto")
        with open(cfg, "w") as f:
            f.write(config_text(free_ports(4), ckpt, args))
        env = dict(slurm.env, HEARSAY_SECRET=secrets.token_hex(16), HEARSAY_LOG_DIR=logs,
                   HEARSAY_BIN_DIR=os.path.abspath(args.bin),
                   OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"), OPENBLAS_NUM_THREADS="1")
        start = time.monotonic()
        job = subprocess.run(["sbatch", "--parsable", os.path.join(ROOT, "peers", "slurm", "hearsay.sbatch"), cfg],
                             env=env, cwd=root, capture_output=True, text=True)
        if job.returncode != 0:
            raise RuntimeError("sbatch: " + job.stderr.strip())
        job = job.stdout.strip().split(";")[0]
        tasks = [f"{job}_{i}" for i in range(4)]
        say(f"submitted job array {job} (4 peers)")
        wait_for("every array task running", lambda: all(slurm.state(t)[0] == "RUNNING" for t in tasks), 60, slurm)
        victim = tasks[2]
        wait_for("peer us-0's first checkpoint", lambda: os.path.exists(os.path.join(ckpt, "us-0.ckpt")), 60, slurm)
        slurm.run("scancel", victim)
        wait_for(f"{victim} cancelled", lambda: slurm.state(victim)[0] == "CANCELLED", 30, slurm)
        cancelled_at = time.monotonic() - start
        say(f"cancelled {victim} (peer us-0) at {cancelled_at:.1f} s, after its checkpoint; requeueing it")
        # slurmd revokes a killed job's credential, and a credential made within the same
        # second as the revocation counts as revoked too: a relaunch that soon is refused
        # ("Job credential revoked"), which is what Slurm's requeue delay guards against.
        time.sleep(2)
        slurm.run("scontrol", "requeue", victim)
        # A requeued job waits out Slurm's requeue delay (its eligible time) unless told to start now.
        slurm.run("scontrol", "update", f"JobId={victim}", "StartTime=now")
        wait_for(f"{victim} running again", lambda: slurm.state(victim)[0] == "RUNNING", 60, slurm)
        say(f"{victim} running again at {time.monotonic() - start:.1f} s")
        done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
        wait_for("every array task finished", lambda: all(slurm.state(t)[0] in done for t in tasks), 300, slurm)
        wall_s = time.monotonic() - start
        states = {t: slurm.state(t) for t in tasks}
        failures = [f"{t}: {s} exit {code}" for t, (s, code, _) in states.items() if s != "COMPLETED" or code != "0:0"]
        if states[victim][2] < 1:
            failures.append(f"{victim}: Slurm counts no restart")
        _, events = hearsay_logs.read_log(os.path.join(logs, "peer-2.jsonl"), warn=False)
        starts = [e for e in events if e.get("event") == "start"]
        resumes = [e for e in events if e.get("event") == "resume"]
        if len(starts) != 2 or len(resumes) != 1 or resumes[0].get("step", 0) <= 0:
            failures.append(f"peer us-0's log: {len(starts)} starts and resumes {resumes}; wanted 2 starts and one resume "
                            "from a checkpoint past step 0")
        summary = hearsay_logs.run_summary(logs, args.target)
        if summary.get("time_to_target_s") is None:
            failures.append(f"the peers' mean test accuracy never reached {args.target} (final {summary.get('final_test_acc')})")
        result = {"bench": "slurm", "peers": 4, "wall_s": round(wall_s, 1), "cancelled_at_s": round(cancelled_at, 1),
                  "resumed_from_step": resumes[0].get("step") if resumes else None,
                  "time_to_target_s": summary.get("time_to_target_s"), "final_test_acc": summary.get("final_test_acc"),
                  "states": {t: f"{s} {code}, {restarts} restarts" for t, (s, code, restarts) in states.items()}}
        if args.json:
            print(json.dumps(result))
        for f in failures:
            say("FAILED: " + f)
        if failures:
            for i in range(4):
                out = os.path.join(root, f"hearsay-{job}_{i}.out")
                if os.path.exists(out):
                    with open(out, errors="replace") as fh:
                        print(f"--- {out}:\n{fh.read()[-2000:]}", file=sys.stderr)
            return 1
        say(f"4 peers under slurmctld/slurmd, peer us-0 cancelled and requeued: it resumed from step "
            f"{result['resumed_from_step']}; mean accuracy reached {100 * args.target:.0f}% at "
            f"{result['time_to_target_s']} s, final {result['final_test_acc']}; every task COMPLETED 0:0; {wall_s:.0f} s")
        return 0
    except RuntimeError as e:
        say(f"FAILED: {e}")
        return 1
    finally:
        if slurm is not None:
            slurm.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    signal_cleanup.run(main)
