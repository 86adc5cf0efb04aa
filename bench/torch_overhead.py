#!/usr/bin/python3
"""What hearsay.torch adds to a torch training step: two torch peers of a cluster on this
machine (tcp on loopback, asynchronous gossip), each timing every step's parts in the same
run: the torch work (batch, forward, backward, torch's optimizer step) and the rest of
DecentralizedOptimizer.step() (the engine: sends, mixing, bookkeeping, the wrapper). One
JSON line per peer: the medians, and the engine's share of the step.

    build/bin/hearsay-python bench/torch_overhead.py --model gpt-10m --steps 20
    build/bin/hearsay-python bench/torch_overhead.py --model mlp-10m --steps 100

gpt-10m: the GPT of hearsay-bench step (6 layers, width 384, 6 heads, context 256; 10.8M
parameters) as examples/torch/gpt.py builds it, batch 8; mlp-10m: 784-2048-2048-2048-10
(10.2M), batch 64. One torch thread per peer.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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
    timed = {"optimizer": 0.0}
    torch_step = inner.step

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        r = torch_step(*a, **k)
        timed["optimizer"] += time.perf_counter() - t0
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
        t1 = time.perf_counter()
        timed["optimizer"] = 0.0
        opt.step(loss)
        t2 = time.perf_counter()
        rows.append({"torch_s": (t1 - t0) + timed["optimizer"], "engine_s": (t2 - t1) - timed["optimizer"], "step_s": t2 - t0})
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
                      "engine_share_median": round(share, 4), "engine_share_of_total": round(mean_share, 4),
                      "plain_torch_step_s_median": round(statistics.median(plain), 5),
                      "step_vs_plain_torch": round(med["step_s"] / statistics.median(plain), 4),
                      "bytes_sent": peer.bytes_sent}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt-10m")
    ap.add_argument("--algorithm", default="adpsgd")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--plain-steps", type=int, default=10, help="plain torch steps first, the baseline")
    ap.add_argument("--port", type=int, default=17461)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.NamedTemporaryFile("w", suffix=".textproto", delete=False) as f:
        f.write(config(args.model, args.algorithm, args.steps + 3, args.port))
    env = dict(os.environ, HEARSAY_SECRET=os.environ.get("HEARSAY_SECRET", "torch-overhead-bench-secret"))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--config", f.name, "--peer", p, "--model", args.model,
                              "--plain-steps", str(args.plain_steps)],
                              env=env) for p in ("a", "b")]
    codes = [p.wait() for p in procs]
    os.unlink(f.name)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
