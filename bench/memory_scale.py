#!/usr/bin/python3
"""Memory per parameter at the field's model sizes (issue 41, "Memory, accounted and cut"):
what a peer of a cluster holds beyond what the same model, data and steps hold trained by
one peer alone, in bytes a parameter.

For each algorithm, real hearsay-peer processes on loopback (tcp, emulated links of
1 Gbit/s and 40 ms): the native GPT (byte-level, so its vocabulary is 256 and the count is
all transformer), AdamW, batch 2, `--steps` steps. Each process's peak resident memory is
its kernel-reported high-water mark (wait4's ru_maxrss). The baseline is one peer alone on
the same config without a cluster. One JSON line per run:

  {"algorithm", "params", "peers", "neighbours", "steps", "optimizer", "alone_rss_bytes",
   "peer_rss_bytes": [...], "extra_bytes_per_param": max over peers of (rss - alone) / params,
   "p0_owners_bytes_per_param": the largest memory event of peer p0, by owner, "wall_s"}

    bench/memory_scale.py                                       # 85M, every algorithm, 2 peers
    bench/memory_scale.py --size 300m --algorithms adpsgd,diloco
    bench/memory_scale.py --algorithms adpsgd --peers 5         # 4 neighbours each (complete)
    bench/memory_scale.py --algorithms gossip_grad --keep /tmp/mem  # and keep the logs

The algorithms' settings: adpsgd and gossip_grad with the fp16 codec for gradients and whole
models alike (the issue's trial meant fp16; until 2026-12-06 this bench left model_codec at
none, so their models travelled and were held as fp32),
dgc with top-k 1% (its own codec), demo its own, diloco and streaming_diloco with int8 and
an outer step every 4 steps (2 fragments), allreduce with int8, delta_gossip on the complete
graph its paper assumes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (layers, heads, width): the parameter count is about 12 layers width^2.
SIZES = {"85m": (12, 12, 768), "300m": (24, 16, 1024), "10m": (4, 8, 448)}

ALGORITHMS = {
    "adpsgd": 'algorithm: "adpsgd" topology: "complete" codec { name: "fp16" model_codec: "fp16" }',
    "gossip_grad": 'algorithm: "gossip_grad" topology: "complete" codec { name: "fp16" model_codec: "fp16" }',
    "delta_gossip": 'algorithm: "delta_gossip" topology: "complete" codec { name: "fp16" } '
                    '[hearsay.algorithms.delta_gossip] { local_steps: 4 }',
    "dgc": 'algorithm: "dgc" topology: "complete" codec { name: "topk" density: 0.01 }',  # with SGD: OPTIMIZERS
    "demo": 'algorithm: "demo" topology: "complete"',
    "diloco": 'algorithm: "diloco" topology: "complete" codec { name: "int8" } '
              '[hearsay.algorithms.diloco] { local_steps: 4 }',
    "streaming_diloco": 'algorithm: "streaming_diloco" topology: "complete" codec { name: "int8" } '
                        '[hearsay.algorithms.streaming_diloco] { local_steps: 4 fragments: 2 overlap_steps: 1 }',
    "allreduce": 'algorithm: "allreduce" topology: "ring" codec { name: "int8" }',
}

# The optimizer each algorithm runs with, and so its baseline alone: AdamW, but dgc's
# momentum correction is momentum SGD's (its paper's); DeMo takes its own step.
ADAMW = 'optimizer: "adamw" lr: 0.0003 weight_decay: 0.1'
OPTIMIZERS = {"dgc": 'optimizer: "sgd" lr: 0.01 momentum: 0.9',
              # DeMo keeps its own momentum and takes its own step: plain SGD, no momentum.
              "demo": 'optimizer: "sgd" lr: 0.01'}


def config(size, steps, gossip, peers, port0, optim=ADAMW):
    layers, heads, width = SIZES[size]
    text = f'''name: "mem"
seed: 1
device: "cpu"
model {{ kind: GPT gpt {{ layers: {layers} heads: {heads} width: {width} context: 128 }} }}
data {{ format: TEXT text_path: "{ROOT}/data/kjv.txt" test_limit: 8 }}
optim {{ {optim} }}
train {{ batch_size: 2 epochs: 0 max_steps: {steps} eval_batch_size: 2 eval_every_steps: 1000000 }}
log {{ every_steps: 4 }}
'''
    if gossip is None:
        return text
    names = [f"p{i}" for i in range(peers)]
    lines = [f'  peers {{ name: "{n}" site: "{n}" address: "127.0.0.1:{port0 + i}" }}' for i, n in enumerate(names)]
    links = [f'  site_links {{ site_a: "{a}" site_b: "{b}" link {{ latency_ms: 40 bandwidth_mbps: 1000 }} }}'
             for i, a in enumerate(names) for b in names[i + 1:]]
    return text + 'cluster {\n  id: "mem"\n  secret_env: "HEARSAY_SECRET"\n  connect_timeout_s: 120\n' + "\n".join(lines) + \
        "\n" + f"  gossip {{ {gossip} }}\n" + "\n".join(links) + "\n}\n"


def peer_bin():
    for c in (os.path.join(ROOT, "build", "bin", "hearsay-peer"), shutil.which("hearsay-peer") or ""):
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("memory_scale: no hearsay-peer (make build)")


def run(cmds, env):
    """Starts every command at once; returns each one's peak RSS in bytes and the wall time."""
    t0 = time.monotonic()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    rss = {}
    while len(rss) < len(procs):
        pid, status, usage = os.wait4(-1, 0)
        for i, p in enumerate(procs):
            if p.pid == pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                rss[i] = usage.ru_maxrss * 1024
    for p in procs:
        err = p.stderr.read().decode(errors="replace")
        if p.returncode != 0:
            sys.exit(f"memory_scale: {' '.join(p.args)} exited {p.returncode}:\n{err[-2000:]}")
    return [rss[i] for i in range(len(procs))], time.monotonic() - t0


def params_of(log):
    with open(log) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "start":
                return e["params"]
    sys.exit(f"memory_scale: no start event in {log}")


def owners_per_param(log, params):
    """The largest memory event of a peer's log, by owner, in bytes a parameter."""
    best = None
    with open(log) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "memory" and (best is None or e["total_bytes"] > best["total_bytes"]):
                best = e
    if best is None:
        return {}
    return {k: round(v / params, 2) for side in ("host", "device") for k, v in sorted(best[side].items()) if v > 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="85m", choices=sorted(SIZES))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--peers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--port", type=int, default=17400)
    ap.add_argument("--keep", help="copy each run's logs and configs to this folder (they are deleted otherwise)")
    args = ap.parse_args()
    env = dict(os.environ, HEARSAY_SECRET="memory-scale-bench-secret", OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"))
    binary = peer_bin()
    with tempfile.TemporaryDirectory(prefix="hearsay-memory-") as tmp:
        alone_rss = {}  # by optimizer

        def alone(optim):
            if optim not in alone_rss:
                name = f"alone{len(alone_rss)}"
                path = os.path.join(tmp, name + ".textproto")
                with open(path, "w") as f:
                    f.write(config(args.size, args.steps, None, 1, 0, optim))
                (rss,), _ = run([[binary, "--config", path, "--quiet", "--log", f"{tmp}/{name}.jsonl"]], env)
                alone_rss[optim] = (rss, params_of(f"{tmp}/{name}.jsonl"))
            return alone_rss[optim]
        for algorithm in args.algorithms.split(","):
            if algorithm not in ALGORITHMS:
                sys.exit(f"memory_scale: unknown algorithm '{algorithm}' (one of {', '.join(ALGORITHMS)})")
            logs = os.path.join(tmp, algorithm)
            os.makedirs(logs)
            path = os.path.join(tmp, algorithm + ".textproto")
            optim = OPTIMIZERS.get(algorithm, ADAMW)
            base, params = alone(optim)
            with open(path, "w") as f:
                f.write(config(args.size, args.steps, ALGORITHMS[algorithm], args.peers, args.port, optim))
            rss, wall = run([[binary, "--config", path, "--peer", f"p{i}", "--quiet", "--log", f"{logs}/p{i}.jsonl"]
                             for i in range(args.peers)], env)
            neighbours = args.peers - 1 if algorithm != "allreduce" else 2 if args.peers > 2 else 1
            print(json.dumps({"algorithm": algorithm, "size": args.size, "params": params, "peers": args.peers,
                              "neighbours": neighbours, "steps": args.steps, "optimizer": optim.split('"')[1], "alone_rss_bytes": base,
                              "peer_rss_bytes": rss, "extra_bytes_per_param": round(max(r - base for r in rss) / params, 2),
                              "p0_owners_bytes_per_param": owners_per_param(f"{logs}/p0.jsonl", params),
                              "wall_s": round(wall, 1)}), flush=True)
            if args.keep:
                shutil.copytree(logs, os.path.join(args.keep, algorithm), dirs_exist_ok=True)
                shutil.copy(path, os.path.join(args.keep, algorithm))


if __name__ == "__main__":
    main()
