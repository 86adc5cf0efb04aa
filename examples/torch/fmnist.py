#!/usr/bin/env python3
"""Fashion-MNIST in torch, trained as a hearsay peer (docs/PYTORCH.md).

The model is the config's: model.kind MLP (its hidden widths; started from the native
peer's initial weights, so that a torch cluster and a native one train the same network),
or CNN (conv-pool, conv-pool, fc, fc, torch's initialisation). The optimizer and its
schedule are the config's (optim), the batches this peer's shard in the native order.

    build/bin/hearsay-python examples/torch/fmnist.py --config configs/single-mlp.textproto
    build/bin/hearsay-run configs/torch-fmnist.textproto     # its `program` names this file
"""
import math
import sys

import torch
import torch.nn.functional as F

import hearsay.torch as ht


def mlp(cfg):
    widths = [math.prod(cfg["input_shape"])] + list(cfg["hidden"]) + [cfg["num_classes"]]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Cnn(torch.nn.Module):
    """conv-pool, conv-pool, fc, fc: the native CNN's shape ("same" padding, 2x2 pooling)."""

    def __init__(self, cfg):
        super().__init__()
        h, w, c = cfg["input_shape"]
        self.shape = (c, h, w)
        chans = list(cfg["conv_channels"]) or [16, 32]
        k = cfg["kernel"]
        self.conv1 = torch.nn.Conv2d(c, chans[0], k, padding=k // 2)
        self.conv2 = torch.nn.Conv2d(chans[0], chans[1], k, padding=k // 2)
        self.fc1 = torch.nn.Linear(chans[1] * (h // 4) * (w // 4), cfg["fc_width"])
        self.fc2 = torch.nn.Linear(cfg["fc_width"], cfg["num_classes"])

    def forward(self, x):
        # Rows are images flattened channels last (NHWC), as hearsay stores them.
        h, w, c = self.shape[1], self.shape[2], self.shape[0]
        x = x.reshape(-1, h, w, c).permute(0, 3, 1, 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def build_model(peer):
    cfg = peer.model_config
    if cfg["kind"] in ("MLP", "LOGREG"):
        model = mlp(cfg)
        # The native peer's initial weights (dense weights are [out, in] in both).
        with torch.no_grad():
            for p, (name, value) in zip(model.parameters(), peer.native_initial_params()):
                if tuple(p.shape) != value.shape:
                    raise SystemExit(f"fmnist.py: native parameter {name} has shape {value.shape}, torch's {tuple(p.shape)}")
                p.copy_(torch.from_numpy(value))
        return model
    if cfg["kind"] == "CNN":
        return Cnn(cfg)
    raise SystemExit(f"fmnist.py: model.kind {cfg['kind']} is not an image classifier; see examples/torch/gpt.py")


def build_optimizer(peer, model):
    o = peer.optim_config
    if o["optimizer"] == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                               weight_decay=o["weight_decay"])
    if o["optimizer"] == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=o["betas"], eps=o["eps"],
                                 weight_decay=o["weight_decay"])
    raise SystemExit(f"fmnist.py: optim.optimizer {o['optimizer']} has no torch counterpart here")


def main():
    peer = ht.Peer()
    torch.manual_seed(peer.seed)
    torch.set_num_threads(peer.threads)
    model = build_model(peer)
    opt = ht.DecentralizedOptimizer(model, build_optimizer(peer, model), peer, lr_from_config=True)
    while peer.running:
        x, y = peer.next_batch()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step(loss, correct=int((logits.argmax(1) == y).sum()))
        if peer.eval_due:
            peer.evaluate(model)
    peer.finish()
    acc, loss = peer.evaluate(model, log=False)
    print(f"final test accuracy {100 * acc:.2f}% (loss {loss:.4f}) after {peer.steps} steps, "
          f"{peer.epochs_done:.2f} epochs")


if __name__ == "__main__":
    try:
        main()
    except ht.InputError as e:
        print(f"fmnist.py: error: {e}", file=sys.stderr)
        sys.exit(2)
