#!/usr/bin/python3
"""PyTorch's training step for the MLP 784-256-256-10, the comparison in `hearsay-bench step`.

Same model (He-uniform init does not matter for speed), same optimizer (SGD, momentum 0.9,
Nesterov), same data (Fashion-MNIST, random batches pre-gathered, cycled), one thread.
Prints one JSON object with samples_per_s (median over rounds) and the BLAS library loaded.
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch

from torch_serve import blas_library, serve

DATA = "/usr/share/datasets/fashion-mnist"


def load_images():
    path = os.path.join(DATA, "train-images-idx3-ubyte.gz")
    if not os.path.exists(path):
        return np.random.default_rng(1).random((8192, 784), dtype=np.float32), np.zeros(8192, np.int64)
    with gzip.open(path, "rb") as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(), np.uint8).reshape(n, rows * cols).astype(np.float32) / 255.0
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz"), "rb") as f:
        f.read(8)
        y = np.frombuffer(f.read(), np.uint8).astype(np.int64)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--round-s", type=float, default=0.5)
    ap.add_argument("--serve", action="store_true", help="answer step counts on stdin with seconds")
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (fp32 matmuls, no TF32, as hearsay's)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = load_images()
    rng = np.random.default_rng(42)
    batches = []
    for _ in range(32):
        idx = rng.integers(0, len(x), args.batch)
        batches.append((torch.from_numpy(x[idx].copy()).to(args.device), torch.from_numpy(y[idx].copy()).to(args.device)))
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"i": 0}

    def step():
        xb, yb = batches[state["i"]]
        state["i"] = (state["i"] + 1) % len(batches)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()

    if args.serve:
        serve(step, device=args.device)  # driven by hearsay-bench
        return

    iters = 1
    while True:  # warm up and size a round, as bench_util.h does
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        s = time.perf_counter() - t0
        if s >= args.round_s / 4:
            iters = max(1, int(iters * args.round_s / s))
            break
        iters *= 2
    rounds = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        rounds.append((time.perf_counter() - t0) / iters)
    print(json.dumps({"samples_per_s": args.batch / statistics.median(rounds),
                      "torch": torch.__version__, "blas": blas_library()}, separators=(",", ":")))

if __name__ == "__main__":
    main()
