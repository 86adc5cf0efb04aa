#!/usr/bin/env python3
"""Fashion-MNIST as a DDP script trains it, with hearsay peers in place of DDP's ranks
(docs/PYTORCH.md, "Coming from DDP"): init() from the launcher's environment, the script's
own Dataset and DataLoader (worker processes, a DistributedSampler over the peers), a
network with BatchNorm whose running statistics the peers share, gradient accumulation
with no_sync(), mixed precision (autocast; a GradScaler for float16 on a GPU) and
TorchScript. The algorithm, codecs, links and stop criteria are the config's.

    # torchrun starts one process per peer of the config (RANK names the peer)
    # (build/bin/hearsay-torchrun, or an install's hearsay-torchrun: torchrun under the
    # python that has hearsay)
    HEARSAY_SECRET=$(openssl rand -hex 16) \\
        build/bin/hearsay-torchrun --nproc_per_node 2 examples/torch/ddp_style.py --config examples/torch/ddp-fmnist.textproto
    # Slurm: srun -n 2 build/bin/hearsay-python examples/torch/ddp_style.py --config ...  (SLURM_PROCID)
    # hearsay-run: --set 'program: "examples/torch/ddp_style.py"'  (--peer NAME)

Options: --workers N (DataLoader worker processes, default 2), --accumulate K (micro-batches
per step, the first K-1 under no_sync()), --amp off|bf16|fp16 (autocast; fp16 with a
GradScaler, CUDA only), --jit off|script|trace (wrap, then compile with TorchScript; torch 2's
torch.compile goes the same way), --buffers average|broadcast|local (default: as DDP under a
synchronous algorithm), --data DIR (the IDX files), --save PATH (the final state_dict; {peer}
in PATH becomes the peer's name).
"""
import argparse
import contextlib
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hearsay.torch as ht


def idx(path):
    """An IDX file (MNIST's layout) as a numpy array."""
    with gzip.open(path) as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(folder, split):
    x = idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz")).reshape(-1, 784).astype(np.float32) / 255.0
    y = idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz")).astype(np.int64)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def network(width=256):
    return torch.nn.Sequential(
        torch.nn.Linear(784, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10))


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in loader:
        logits = model(x).float()
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    model.train()
    return correct / count, loss / count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    ap.add_argument("--jit", choices=["off", "script", "trace"], default="off")
    ap.add_argument("--buffers", choices=["average", "broadcast", "local"], default=None)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--save")
    args, _ = ap.parse_known_args()  # --config, --peer, --set, --log are hearsay's

    peer = ht.init()  # HEARSAY_CONFIG or --config; RANK (torchrun), SLURM_PROCID or --peer
    torch.manual_seed(peer.seed)  # every peer starts from the same weights, as DDP's ranks do
    torch.set_num_threads(peer.threads)
    device = torch.device("cpu")
    if peer.device.startswith("cuda"):
        device = torch.device("cuda", peer.local_rank)  # LOCAL_RANK / SLURM_LOCALID: this node's GPU
    if args.amp == "fp16" and device.type != "cuda":
        raise SystemExit("ddp_style.py: --amp fp16 needs a GPU (torch's GradScaler is CUDA's); use --amp bf16 on a CPU")

    train = fashion_mnist(args.data, "train")
    test = fashion_mnist(args.data, "t10k")
    # Each peer its own part of the data, a new order each epoch (peer.batches tells the
    # sampler the epoch), as DistributedSampler does for DDP's ranks.
    sampler = DistributedSampler(train, num_replicas=peer.world_size, rank=peer.rank, shuffle=True, seed=peer.seed,
                                 drop_last=True)
    loader = DataLoader(train, batch_size=peer.batch_size, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0, drop_last=True)
    test_loader = DataLoader(test, batch_size=1000)

    model = network().to(device)
    o = peer.optim_config
    inner = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                            weight_decay=o["weight_decay"])
    opt = ht.DecentralizedOptimizer(model, inner, lr_from_config=True, buffers=args.buffers)
    # Compile after wrapping: the compiled module reads the parameters where hearsay put them.
    run = model
    if args.jit == "script":
        run = torch.jit.script(model)
    elif args.jit == "trace":
        run = torch.jit.trace(model, train[0:peer.batch_size][0].to(device))
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp == "fp16")
    # The peer's checkpoint (checkpoint { dir } in the config) carries the scaler's state
    # too: a restarted peer goes on with the scale it had, at the batch it had reached.
    peer.register_state(scaler=scaler)

    k = args.accumulate
    loss_sum = 0.0
    for i, (x, y) in enumerate(peer.batches(loader, per_step=k)):
        x, y = x.to(device), y.to(device)
        last = (i + 1) % k == 0
        # The first k-1 micro-batches only add to the gradient; the k-th one's step sends it.
        with (contextlib.nullcontext() if last else opt.no_sync()):
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = F.cross_entropy(run(x), y) / k
            scaler.scale(loss).backward()
        loss_sum += float(loss)
        if not last:
            continue
        scaler.step(opt, loss_sum)  # opt.step(loss_sum), the gradient unscaled first under fp16
        scaler.update()
        opt.zero_grad()
        loss_sum = 0.0
        if peer.eval_due:
            acc, test_loss = evaluate(run, test_loader)
            peer.log_eval(acc, test_loss)
    peer.finish()
    acc, test_loss = evaluate(run, test_loader)
    print(f"{peer.name}: test accuracy {100 * acc:.2f}% (loss {test_loss:.4f}) after {peer.steps} steps, "
          f"{peer.epochs_done:.2f} epochs of its {len(loader)} batches")
    if args.save:
        torch.save({"peer": peer.name, "steps": peer.steps, "epochs": peer.epochs_done,
                    "state": {n: t.detach().cpu() for n, t in model.state_dict().items()}}, args.save.replace("{peer}", peer.name))


if __name__ == "__main__":
    try:
        main()
    except ht.InputError as e:
        print(f"ddp_style.py: error: {e}", file=sys.stderr)
        sys.exit(2)
