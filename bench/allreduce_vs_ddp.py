#!/usr/bin/python3
"""hearsay's allreduce against PyTorch DDP (gloo) on loopback, side by side in one run.

Both train the MLP 784-256-256-10 on Fashion-MNIST with SGD (lr 0.05, momentum 0.9,
Nesterov), batch 64 per process, one BLAS thread per process, N processes on this
machine, no link emulation and no encryption (gloo has none: hearsay's tcp runs with
cluster.tls false here), no learning-rate scaling. hearsay: N hearsay-peer processes with
allreduce (codec none); its time per step is read from the peers' step events
(docs/LOGS.md: samples_per_s over each window of log.every_steps steps). PyTorch: N
processes under DistributedDataParallel with the gloo backend, timed the same way, in
windows of the same size. Rounds alternate hearsay, PyTorch, ...; each contender's figure
is the median over its rounds of the median window, the slowest process's.
Prints JSON lines (suite allreduce_vs_ddp).

  make deps   # python3-torch
  /usr/bin/python3 bench/allreduce_vs_ddp.py --peers 2 --rounds 3
"""
import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WINDOW = 25  # steps per timing window (hearsay: log.every_steps)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def one_thread_env():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    return env


def hearsay_round(args, work):
    ports = free_ports(args.peers)
    peers = "\n".join(f'  peers {{ name: "p{i}" site: "s" address: "127.0.0.1:{ports[i]}" }}' for i in range(args.peers))
    cfg = f"""name: "ddp-compare"
seed: 1
device: "cpu"
model {{ kind: MLP hidden: [256, 256] }}
data {{ format: IDX }}
optim {{ lr: 0.05 momentum: 0.9 nesterov: true }}
train {{ batch_size: {args.batch} epochs: 1000 max_steps: {args.steps} eval_every_steps: 100000000 eval_batch_size: 1000 }}
log {{ every_steps: {WINDOW} }}
cluster {{
  id: "ddp-compare"
  secret_env: "HEARSAY_SECRET"
  transport: "tcp"
  tls: false
{peers}
  gossip {{ algorithm: "allreduce" topology: "ring" [hearsay.algorithms.allreduce] {{ sync_lr_scaling: "none" }} }}
}}
"""
    path = os.path.join(work, "hearsay.textproto")
    with open(path, "w") as f:
        f.write(cfg)
    env = one_thread_env()
    env["HEARSAY_SECRET"] = secrets.token_hex(16)
    procs, logs = [], []
    for i in range(args.peers):
        log = os.path.join(work, f"p{i}-{time.monotonic_ns()}.jsonl")
        logs.append(log)
        procs.append(subprocess.Popen([args.peer_bin, "--config", path, "--peer", f"p{i}", "--quiet", "--log", log],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env))
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit("allreduce_vs_ddp: hearsay-peer failed: " + err.decode(errors="replace")[-2000:])
    per_peer = []
    for log in logs:
        windows = []
        with open(log) as f:
            for line in f:
                e = json.loads(line)
                if e.get("event") == "step" and e.get("samples_per_s", 0) > 0:
                    windows.append(args.batch / e["samples_per_s"])
        per_peer.append(statistics.median(windows[1:]))  # the first window warms up
    return max(per_peer)


def torch_worker(rank, world, port, args, out):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, HERE)
    from torch_step import blas_library, load_images
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = load_images()
    rng = np.random.default_rng(rank)
    windows, t0 = [], time.perf_counter()
    for step in range(args.steps):
        idx = rng.integers(0, len(x), args.batch)  # sampled per step, as hearsay's sampler does
        xb, yb = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(xb), yb).backward()
        opt.step()
        if (step + 1) % WINDOW == 0:
            now = time.perf_counter()
            windows.append((now - t0) / WINDOW)
            t0 = now
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump({"step_s": statistics.median(windows[1:]), "torch": torch.__version__, "blas": blas_library()}, f)


def torch_round(args, work):
    port = free_ports(1)[0]
    procs, outs = [], []
    for rank in range(args.peers):
        out = os.path.join(work, f"torch{rank}-{time.monotonic_ns()}.json")
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(rank), "--port", str(port),
                                       "--peers", str(args.peers), "--steps", str(args.steps), "--batch", str(args.batch),
                                       "--out", out], env=one_thread_env(), stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit("allreduce_vs_ddp: the PyTorch worker failed: " + err.decode(errors="replace")[-2000:])
    results = [json.load(open(o)) for o in outs]
    return max(r["step_s"] for r in results), results[0]["torch"] + ", " + results[0]["blas"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--peer-bin", default=os.path.join(ROOT, "build", "bin", "hearsay-peer"))
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker >= 0:
        return torch_worker(args.worker, args.peers, args.port, args, args.out)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit("allreduce_vs_ddp: python3-torch is missing (make deps)")
    ours, theirs, version = [], [], ""
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            ours.append(hearsay_round(args, work))
            t, version = torch_round(args, work)
            theirs.append(t)
    common = {"peers": args.peers, "batch": args.batch, "steps": args.steps, "rounds": args.rounds}
    def emit(case, metric, value, unit, extra=None):
        o = {"suite": "allreduce_vs_ddp", "case": case, "metric": metric, "value": value, "unit": unit}
        o.update(common)
        o.update(extra or {})
        print(json.dumps(o), flush=True)
    emit(f"hearsay_allreduce/{args.peers}", "step_ms", statistics.median(ours) * 1e3, "ms",
         {"rounds_ms": [round(v * 1e3, 3) for v in ours]})
    emit(f"torch_ddp_gloo/{args.peers}", "step_ms", statistics.median(theirs) * 1e3, "ms",
         {"rounds_ms": [round(v * 1e3, 3) for v in theirs], "torch": version})
    emit(f"ratio/{args.peers}", "hearsay_over_ddp", statistics.median(ours) / statistics.median(theirs), "ratio")


if __name__ == "__main__":
    main()
