"""A torch script as users write one, for test_torch_resume.py: its own DataLoader over a
DistributedSampler, OneCycleLR, a dict of its own, a checkpoint every few steps. Each step
appends a line to --trace: the step, the rate it used, the sampler's epoch, the ids of the
batch's samples, the dict's count. --kill-after N kills the process (SIGKILL, no clean up)
after step N. --order says which of peer.batches() and the optimizer comes first."""
import argparse
import hashlib
import json
import os
import signal

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hearsay.torch as ht

ap = argparse.ArgumentParser()
ap.add_argument("--order", choices=["optimizer-first", "data-first"], required=True)
ap.add_argument("--trace", required=True)
ap.add_argument("--kill-after", type=int, default=0)
ap.add_argument("--total", type=int, default=40)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--scheduler", choices=["onecycle", "none"], default="onecycle")
args, _ = ap.parse_known_args()

torch.manual_seed(0)
torch.set_num_threads(1)
peer = ht.init(quiet=True)
ids = torch.arange(64)
x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
y = (x[:, 0] > 0).long()
sampler = DistributedSampler(TensorDataset(ids), num_replicas=1, rank=0, shuffle=True, seed=7)
loader = DataLoader(TensorDataset(ids, x, y), batch_size=args.batch, sampler=sampler, num_workers=args.workers)
progress = {"seen": 0, "ids_sum": 0}

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def optimizer():
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = ht.DecentralizedOptimizer(model, inner)
    if args.scheduler == "none":
        return opt, None
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=args.total)
    return opt, sched


if args.order == "optimizer-first":  # docs/PYTORCH.md's order
    opt, sched = optimizer()
    peer.register_state(progress=progress)
    if sched is not None:
        peer.register_state(scheduler=sched)
    batches = peer.batches(loader)
else:
    batches = peer.batches(loader)
    peer.register_state(progress=progress)
    opt, sched = optimizer()
    if sched is not None:
        peer.register_state(scheduler=sched)

with open(args.trace, "a") as trace:
    for i, xx, yy in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(xx), yy)
        loss.backward()
        lr = opt.param_groups[0]["lr"]
        momentum = opt.param_groups[0]["momentum"]
        opt.step(loss)
        if sched is not None:
            sched.step()
        progress["seen"] += 1
        progress["ids_sum"] += int(i.sum())
        trace.write(json.dumps({"step": peer.steps, "lr": lr, "momentum": momentum, "epoch": sampler.epoch,
                                "ids": i.tolist(), "seen": progress["seen"], "ids_sum": progress["ids_sum"]}) + "\n")
        trace.flush()
        if args.kill_after and peer.steps == args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    peer.finish()
    digest = hashlib.sha256(opt.flat_params.numpy().tobytes()).hexdigest()
    trace.write(json.dumps({"end": peer.steps, "params": digest}) + "\n")
