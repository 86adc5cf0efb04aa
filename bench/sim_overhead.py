#!/usr/bin/python3
"""The simulator's own cost beside the peers' compute (issue 22, "Simulation speed"): one
simulated run under `perf record`, each sample's own function (no call graph) sorted into

  model     the peers' training and evaluation arithmetic: the model's layers, the loss,
            the optimizer, OpenBLAS
  codec     encoding and decoding of what the peers send (fp16, int8, PowerSGD, top-k, ...)
  simgrid   SimGrid itself: its kernel, its network model's solver, its actors' context
            switches
  startup   loading the data set (gzip, the IDX reader), the dynamic linker and the CUDA
            libraries' start-up (linked, never called by a CPU run): once a run
  other     everything else: the engine's bookkeeping, the update guard's checks, frames
            and their CRC, logs, the allocator, memcpy, the kernel's page faults

A sample in the C library or the kernel (memset, memmove, malloc, a page fault) is charged
to the function that called it, found by unwinding the sample's stack (perf's DWARF call
graphs): OpenBLAS zeroing its output with memset is the model's arithmetic, a vector the
engine allocates is the engine's. `self_share_pct` gives the same split by each sample's
own function, as perf reports it without call graphs.

The simulator's overhead is `simgrid` + `other` (everything but the peers' gradient and
codec compute, the issue's definition), against `model` + `codec`; `startup` is given apart,
a cost of a run's first seconds, not of its length. The backend's arithmetic (CpuBackend)
counts as `model` whether a step or the mixer called it; the engine's own loops, the update
guard and the CRC land in `other`, so the overhead is, if anything, overstated. One JSON
line: the shares, their ratio, and the run's virtual time against its wall time.

    bench/sim_overhead.py                                   # scale-64, adpsgd, 20 virtual s
    bench/sim_overhead.py --config configs/scale-64.textproto --set 'cluster { gossip { algorithm: "allreduce" topology: "ring" codec { name: "powersgd" } } }'

Needs perf (linux-perf) and a kernel that lets this user sample (perf_event_paranoid <= 2
for one's own processes).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# A symbol's category, first match wins; the shared object decides first where it says.
DSO_CLASSES = [(re.compile(r"libsimgrid|libboost_context"), "simgrid"), (re.compile(r"libopenblas|libblas|libgomp"), "model"),
               (re.compile(r"^libz\.|^ld-linux|^libcublas|^libcudart"), "startup")]
SYMBOL_CLASSES = [
    # Reading the data set and cutting it into shards: once a peer, at its start.
    (re.compile(r"hearsay::load_idx|hearsay::read_|hearsay::\(anonymous namespace\)::read_payload|hearsay::shard_indices|TrainTest"),
     "startup"),
    (re.compile(r"simgrid::|^sg_|^xbt_|^smx_|boost::context|jump_fcontext|make_fcontext|ontop_fcontext"), "simgrid"),
    (re.compile(r"codec|Codec|PowerSgd|powersgd|fp16|half|bf16|quantize|Quantize|topk|TopK|int8|int4|Sparse|sparse|Precision"), "codec"),
    (re.compile(r"CpuBackend::|hearsay::(cpu|model|optim)::|Dense|Relu|relu|softmax|Softmax|cross_entropy|CrossEntropy|forward|backward|"
                r"Sgd|sgd|AdamW|adamw|sgemm|gemm|gemv|matmul|Model::|Mlp|MLP|Layer|layer|add_bias|bias_grad"), "model"),
]


def classify(dso, symbol):
    for pattern, name in DSO_CLASSES:
        if pattern.search(dso):
            return name
    for pattern, name in SYMBOL_CLASSES:
        if pattern.search(symbol):
            return name
    return "other"


# Where a sample's own function is only the C library or the kernel working for a caller.
HELPER_DSO = re.compile(r"^(libc\.so|libc-|libstdc\+\+|libm\.so|ld-linux|\[kernel|\[vdso|\[unknown)")


def parse_script(text):
    """perf script output with call chains: per sample, its frames (dso, symbol) from the
    leaf up. Returns [(leaf (dso, sym), charged (dso, sym))]: the frame charged is the first
    one, from the leaf, that is not a C library or kernel helper (the leaf when none is)."""
    samples = []
    frames = []

    def flush():
        if frames:
            charged = next((f for f in frames if not HELPER_DSO.search(f[0])), frames[0])
            samples.append((frames[0], charged))

    for line in text.splitlines():
        if not line.strip():
            flush()
            frames = []
            continue
        m = re.match(r"\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
        if m:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(1).strip())
            frames.append((os.path.basename(m.group(2)), sym))
    flush()
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "scale-64.textproto"))
    ap.add_argument("--set", action="append", default=[], help="a text-format fragment merged over the config")
    ap.add_argument("--virtual-s", type=float, default=20.0, help="virtual seconds to simulate")
    ap.add_argument("--sim-bin", default=os.path.join(ROOT, "build", "bin", "hearsay-sim"))
    ap.add_argument("--frequency", type=int, default=199, help="perf samples per second (each with its stack)")
    ap.add_argument("--top", type=int, default=0, help="also print the top N symbols with their class (stderr)")
    args = ap.parse_args()
    if not shutil.which("perf"):
        sys.exit("sim_overhead: perf is not installed (Debian: linux-perf)")
    work = tempfile.mkdtemp(prefix="hearsay-sim-overhead-")
    try:
        data = os.path.join(work, "perf.data")
        # The whole run, stopped by time only: a target reached early would profile less.
        sets = list(args.set) + [f"experiment {{ stop_at_target: false simulation {{ max_virtual_s: {args.virtual_s} }} }}"]
        cmd = ["perf", "record", "-q", "-F", str(args.frequency), "--call-graph", "dwarf,8192", "-o", data, "--",
               args.sim_bin, "--config", args.config,
               "--log-dir", os.path.join(work, "logs"), "--progress-every", "0"]
        for s in sets:
            cmd += ["--set", s]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"sim_overhead: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
        with open(os.path.join(work, "logs", "sim_stats.json"), encoding="utf-8") as f:
            stats = json.load(f)
        rep = subprocess.run(["perf", "script", "--no-inline", "-i", data, "-F", "ip,sym,dso"], capture_output=True, text=True)
        if rep.returncode != 0:
            sys.exit(f"sim_overhead: perf script failed:\n{rep.stderr[-2000:]}")
        samples = parse_script(rep.stdout)
        if not samples:
            sys.exit("sim_overhead: perf recorded no samples with call chains")
        shares = {"model": 0.0, "codec": 0.0, "simgrid": 0.0, "other": 0.0, "startup": 0.0}
        self_shares = dict(shares)
        by_charged = {}
        for leaf, charged in samples:
            shares[classify(*charged)] += 1
            self_shares[classify(*leaf)] += 1
            by_charged[charged] = by_charged.get(charged, 0) + 1
        if args.top:
            for (dso, sym), count in sorted(by_charged.items(), key=lambda kv: -kv[1])[:args.top]:
                sys.stderr.write(f"{100 * count / len(samples):6.2f}% {classify(dso, sym):8s} {dso:28s} {sym[:100]}\n")
        total = sum(shares.values()) or 1.0
        running = (total - shares["startup"]) or 1.0
        compute = shares["model"] + shares["codec"]
        overhead = shares["simgrid"] + shares["other"]
        print(json.dumps({
            "bench": "sim_overhead",
            "config": os.path.relpath(args.config, ROOT),
            "set": args.set,
            "peers": stats.get("peers"),
            "virtual_s": stats.get("virtual_s"),
            "wall_s": stats.get("wall_s"),
            "virtual_per_wall": stats.get("virtual_per_wall"),
            "events_per_s": stats.get("events_per_s"),
            "samples": len(samples),
            "share_pct": {k: round(100 * v / total, 1) for k, v in shares.items()},
            "self_share_pct": {k: round(100 * v / total, 1) for k, v in self_shares.items()},
            "compute_pct_of_running": round(100 * compute / running, 1),
            "overhead_pct_of_running": round(100 * overhead / running, 1),
            "overhead_over_compute": round(overhead / compute, 3) if compute > 0 else None,
        }))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
