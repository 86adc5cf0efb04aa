#!/usr/bin/python3
"""What hearsay.torch adds to a torch training step: two torch peers of a cluster on this
machine (tcp with TLS on loopback, asynchronous gossip), each timing every step's parts in
the same run: the torch work (batch, forward, backward, torch's optimizer step) and the
rest of DecentralizedOptimizer.step() (the engine: sends, mixing, bookkeeping, the
wrapper). One JSON line per peer and run: the medians, and the engine's share of the step;
then one summary line per model: the median over the runs of the two peers' mean.

    build/bin/hearsay-python bench/torch_overhead.py                       # both models, 3 runs each, side by side
    build/bin/hearsay-python bench/torch_overhead.py --models mlp-10m --runs 1 --steps 30

gpt-10m: the GPT of hearsay-bench step (6 layers, width 384, 6 heads, context 256; 10.84M
parameters) as examples/torch/gpt.py builds it, batch 8; mlp-10m: 784-2048-2048-2048-10
(10.02M), batch 64. One torch thread per peer. The runs alternate between the models
(mlp, gpt, mlp, gpt, ...), so both see the machine as it is.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODELS = {
    "gpt-10m": ('model { kind: GPT gpt { layers: 6 heads: 6 width: 384 context: 256 } }\n'
                'data { format: TEXT text_path: "%s" }\n' % os.path.join(ROOT, "data", "kjv.txt"), 8),
    "mlp-10m": ('model { kind: MLP hidden: [2048, 2048, 2048] }\ndata { format: IDX }\n', 64),
}


def config(model, algorithm, steps, port0):
    text, batch = MODELS[model]
    return (f'name: "torch-overhead"\nseed: 1\n{text}optim {{ optimizer: "adamw" lr: 0.0003 }}\n'
            f'train {{ batch_size: {batch} max_steps: {steps} epochs: 0 eval_every_steps: 1000000 }}\n'
            f'log {{ every_steps: 1000000 }}\n'
            f'cluster {{\n  id: "torch-overhead"\n  secret_env: "HEARSAY_SECRET"\n'
            f'  peers {{ name: "a" address: "127.0.0.1:{port0}" }}\n  peers {{ name: "b" address: "127.0.0.1:{port0 + 1}" }}\n'
            f'  gossip {{ algorithm: "{algorithm}" }}\n}}\n')


def worker(args):
    import torch
    import torch.nn.functional as F
    import hearsay.torch as ht
    sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
    peer = ht.Peer(args.config, name=args.peer, argv=[], quiet=True)
    torch.manual_seed(1)
    torch.set_num_threads(1)
    if args.model.startswith("gpt"):
        from gpt import Gpt
        g = peer.model_config["gpt"]
        model = Gpt(g["layers"], g["heads"], g["width"], g["context"])
    else:
        from fmnist import mlp
        model = mlp(peer.model_config)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-4)
    timed = {"optimizer": 0.0, "optimizer_cpu": 0.0}
    torch_step = inner.step

    def timed_step(*a, **k):
        t0, c0 = time.perf_counter(), time.thread_time()
        r = torch_step(*a, **k)
        timed["optimizer"] += time.perf_counter() - t0
        timed["optimizer_cpu"] += time.thread_time() - c0
        return r

    inner.step = timed_step
    # The same loop in plain torch first (both peers at once, so under the same
    # contention): what a step costs without hearsay.
    plain = []
    for _ in range(args.plain_steps + 3):
        t0 = time.perf_counter()
        x, y = peer.next_batch()
        inner.zero_grad()
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        inner.step()
        plain.append(time.perf_counter() - t0)
    plain = plain[3:]
    schedstat = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def runqueue_s():
        # The kernel's count of this thread's time runnable but waiting for a core: the
        # engine's wall time less its CPU time less this is time it was blocked (a lock, a
        # wait for the copy between steps).
        try:
            with open(schedstat) as f:
                return int(f.read().split()[1]) * 1e-9
        except (OSError, IndexError, ValueError):
            return 0.0

    opt = ht.DecentralizedOptimizer(model, inner, peer)
    n = sum(p.numel() for p in model.parameters())
    rows = []
    while peer.running:
        t0 = time.perf_counter()
        x, y = peer.next_batch()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        t1, c1, q1 = time.perf_counter(), time.thread_time(), runqueue_s()
        timed["optimizer"] = timed["optimizer_cpu"] = 0.0
        opt.step(loss)
        t2, c2, q2 = time.perf_counter(), time.thread_time(), runqueue_s()
        # The engine's wall time in step(), and its CPU time on this thread (the rest of the
        # wall time it waited for a core: the machine's threads, its own transport's too).
        rows.append({"torch_s": (t1 - t0) + timed["optimizer"], "engine_s": (t2 - t1) - timed["optimizer"], "step_s": t2 - t0,
                     "engine_cpu_s": (c2 - c1) - timed["optimizer_cpu"], "step_runqueue_s": q2 - q1})
    peer.finish()
    rows = rows[3:]  # warm-up
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    share = statistics.median(r["engine_s"] / r["step_s"] for r in rows)
    mean_share = sum(r["engine_s"] for r in rows) / sum(r["step_s"] for r in rows)
    print(json.dumps({"bench": "torch_overhead", "model": args.model, "params": n, "algorithm": peer.algorithm,
                      "peer": peer.name, "steps": len(rows), "step_s_median": round(med["step_s"], 5),
                      "torch_s_median": round(med["torch_s"], 5), "engine_s_median": round(med["engine_s"], 5),
                      "engine_s_p90": round(sorted(r["engine_s"] for r in rows)[int(0.9 * (len(rows) - 1))], 5),
                      "engine_s_max": round(max(r["engine_s"] for r in rows), 5),
                      "engine_cpu_s_median": round(med["engine_cpu_s"], 5),
                      # step()'s time waiting for a core (torch's optimizer step included), mean per step
                      "step_runqueue_s_mean": round(statistics.mean(r["step_runqueue_s"] for r in rows), 5),
                      "engine_s_mean": round(statistics.mean(r["engine_s"] for r in rows), 5),
                      "engine_cpu_s_mean": round(statistics.mean(r["engine_cpu_s"] for r in rows), 5),
                      "engine_share_median": round(share, 4), "engine_share_of_total": round(mean_share, 4),
                      "plain_torch_step_s_median": round(statistics.median(plain), 5),
                      "step_vs_plain_torch": round(med["step_s"] / statistics.median(plain), 4),
                      "bytes_sent": peer.bytes_sent}), flush=True)


# Steps timed and plain torch steps first (the baseline), per model: about the same wall
# time for each (a GPT step is 13x the MLP's).
DEFAULT_STEPS = {"gpt-10m": (12, 5), "mlp-10m": (60, 20)}
# The figures a summary gives: for each, the median over the runs of the two peers' mean.
SUMMARY = ["engine_share_of_total", "engine_share_median", "engine_s_median", "engine_s_p90", "engine_cpu_s_median",
           "engine_s_mean", "engine_cpu_s_mean", "step_runqueue_s_mean",
           "step_s_median",
           "torch_s_median", "plain_torch_step_s_median", "step_vs_plain_torch"]


def run_pair(model, algorithm, steps, plain_steps, port, run):
    """One run: two peers of `model`; their JSON lines (printed as they come)."""
    with tempfile.NamedTemporaryFile("w", suffix=".textproto", delete=False) as f:
        f.write(config(model, algorithm, steps + 3, port))
    env = dict(os.environ, HEARSAY_SECRET=os.environ.get("HEARSAY_SECRET", "torch-overhead-bench-secret"))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--config", f.name, "--peer", p, "--models", model,
                               "--plain-steps", str(plain_steps)], env=env, stdout=subprocess.PIPE, text=True)
             for p in ("a", "b")]
    rows = []
    for p in procs:
        out, _ = p.communicate()
        for line in out.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                print(line, flush=True)
                continue
            row["run"] = run
            print(json.dumps(row), flush=True)
            rows.append(row)
    os.unlink(f.name)
    if any(p.returncode != 0 for p in procs) or len(rows) != 2:
        raise SystemExit(f"torch_overhead: run {run} of {model} failed (exit {[p.returncode for p in procs]})")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp-10m,gpt-10m", help="comma-separated: " + ", ".join(sorted(MODELS)))
    ap.add_argument("--runs", type=int, default=3, help="runs of each model; the summary is their median")
    ap.add_argument("--algorithm", default="adpsgd")
    ap.add_argument("--steps", type=int, help="steps timed (default: 60 for the MLP, 12 for the GPT)")
    ap.add_argument("--plain-steps", type=int, help="plain torch steps first, the baseline (default 20, 5)")
    ap.add_argument("--port", type=int, default=17471, help="the peers listen on PORT and PORT + 1")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: {m!r} is not one of {', '.join(sorted(MODELS))}")
    if args.worker:
        args.model = models[0]
        return worker(args)
    per_model = {m: [] for m in models}
    for run in range(1, args.runs + 1):
        for m in models:
            steps, plain = DEFAULT_STEPS[m]
            per_model[m].append(run_pair(m, args.algorithm, args.steps or steps, args.plain_steps or plain, args.port, run))
    for m, runs in per_model.items():
        summary = {"bench": "torch_overhead_summary", "model": m, "params": runs[0][0]["params"], "algorithm": args.algorithm,
                   "runs": len(runs)}
        for key in SUMMARY:
            per_run = [statistics.mean(r[key] for r in pair) for pair in runs]
            summary[key] = round(statistics.median(per_run), 5)
            summary[key + "_per_run"] = [round(v, 5) for v in per_run]
        summary["aim_5pct_met"] = summary["engine_share_of_total"] <= 0.05
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
