"""Peers that fit different targets (test_torch_consensus.py): peer k fits y = x W_k,
W_k drawn from seed k, so the peers pull apart and only gossip brings them together.
Before training, every peer runs the script collectives on values of its own and writes
what they gave; after finish(), its parameters. --sleep-s slows a peer's steps, so that
one finishes first and the other takes its last steps alone."""
import argparse
import json
import os
import signal
import time

import torch

import hearsay.torch as ht

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--sleep-s", type=float, default=0.0)
ap.add_argument("--collectives", action="store_true")
ap.add_argument("--kill-after", type=int, default=0, help="SIGKILL itself after this step (a crash)")
ap.add_argument("--stall-s", type=float, default=0.0, help="sleep this long after joining, before making the optimizer")
args, _ = ap.parse_known_args()

torch.manual_seed(0)
torch.set_num_threads(1)
peer = ht.init(quiet=True)
time.sleep(args.stall_s)  # a script still loading its data or building its model
model = torch.nn.Linear(8, 4, bias=False)
opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.05))
target = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + peer.rank))
data = torch.Generator().manual_seed(200 + peer.rank)

out = {"peer": peer.name, "rank": peer.rank}
if args.collectives:
    mine = torch.tensor([peer.rank + 1.0, -10.0 * (peer.rank + 1)])
    for op in ("sum", "mean", "max", "min"):
        out[op] = peer.all_reduce(mine.clone(), op).tolist()
    out["number"] = peer.all_reduce(peer.rank + 0.5, "sum")
    peer.barrier()
    out["counts"] = peer.all_reduce(torch.tensor([3, 4], dtype=torch.int64)).tolist()
    refused = []
    for bad in (torch.zeros(33), torch.tensor([1.0, float("nan")])):  # larger than the model; not finite
        try:
            peer.all_reduce(bad)
        except ht.InputError as e:
            refused.append(str(e))
    out["refused"] = refused
    out["after_refusals"] = peer.all_reduce(1.0)  # nothing was sent: the next collective still matches

while peer.running:
    x = torch.randn(32, 8, generator=data)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x @ target)
    loss.backward()
    opt.step(loss)
    if args.kill_after and peer.steps == args.kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
    if args.sleep_s:
        time.sleep(args.sleep_s)
peer.finish()
out["params"] = opt.flat_params.tolist()
with open(args.out, "w") as f:
    json.dump(out, f)
