#!/usr/bin/python3
"""The GPT of hearsay (src/model/gpt.cpp) in PyTorch 1.13, for the comparisons of the
transformer: its training step's speed in `hearsay-bench step` (--serve), and a whole
training run with hearsay's settings (--train) whose validation loss docs/BENCHMARKS.md
sets beside hearsay's own.

Same architecture (pre-LayerNorm blocks, causal attention over full score matrices, GELU's
tanh form, head tied to the token embedding), GPT-2 initialisation, AdamW over every
parameter, linear warm-up then cosine decay as hearsay's LrSchedule, random training
windows and the same held-out validation windows (the last 2% of the text). One thread.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from torch_serve import serve


class Gpt(torch.nn.Module):
    def __init__(self, layers, heads, width, context, vocab=256):
        super().__init__()
        self.heads, self.width, self.context = heads, width, context
        c = width
        self.wte = torch.nn.Parameter(torch.randn(vocab, c) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(context, c) * 0.02)
        proj_std = 0.02 / math.sqrt(2 * layers)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln_1 = torch.nn.LayerNorm(c)
            b.c_attn = torch.nn.Linear(c, 3 * c)
            b.c_proj = torch.nn.Linear(c, c)
            b.ln_2 = torch.nn.LayerNorm(c)
            b.c_fc = torch.nn.Linear(c, 4 * c)
            b.c_proj2 = torch.nn.Linear(4 * c, c)
            for lin, std in ((b.c_attn, 0.02), (b.c_proj, proj_std), (b.c_fc, 0.02), (b.c_proj2, proj_std)):
                torch.nn.init.normal_(lin.weight, 0.0, std)
                torch.nn.init.zeros_(lin.bias)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(c)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x, y):
        n, t = x.shape
        c, h = self.width, self.heads
        d = c // h
        z = self.wte[x] + self.wpe[:t]
        for b in self.blocks:
            a = b.ln_1(z)
            q, k, v = b.c_attn(a).split(c, dim=-1)
            q, k, v = (u.reshape(n, t, h, d).transpose(1, 2) for u in (q, k, v))
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
            s = s.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            z = z + b.c_proj((s @ v).transpose(1, 2).reshape(n, t, c))
            z = z + b.c_proj2(F.gelu(b.c_fc(b.ln_2(z)), approximate="tanh"))
        logits = self.ln_f(z) @ self.wte.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def lr_at(step, base, warmup, total, min_lr):
    """hearsay's LrSchedule (src/optim/lr_schedule.cpp), kind COSINE."""
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + (base - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def load_text(path, validation_fraction):
    if not path or not os.path.exists(path):  # as hearsay-bench without the corpus
        data = bytes(torch.randint(0, 256, (1 << 20,), generator=torch.Generator().manual_seed(3)).tolist())
    else:
        data = open(path, "rb").read()
    held = int(len(data) * validation_fraction)
    return torch.frombuffer(bytearray(data[:len(data) - held]), dtype=torch.uint8).long(), \
        torch.frombuffer(bytearray(data[len(data) - held:]), dtype=torch.uint8).long()


def windows(stream, starts, t):
    idx = starts[:, None] + torch.arange(t + 1)[None, :]
    w = stream[idx]
    return w[:, :-1], w[:, 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--text", default="data/kjv.txt")
    ap.add_argument("--serve", action="store_true", help="answer step counts on stdin with seconds")
    ap.add_argument("--train", action="store_true", help="train with hearsay's gpt-single settings")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--min-lr", type=float, default=0.0003)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda:N (fp32 matmuls, no TF32, as hearsay's)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = Gpt(args.layers, args.heads, args.width, args.context).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=args.weight_decay)
    train, val = load_text(args.text, 0.02)
    t = args.context
    gen = torch.Generator().manual_seed(args.seed)

    def batch():
        return windows(train, torch.randint(0, len(train) - t, (args.batch,), generator=gen), t)

    if args.serve:
        batches = [tuple(t.to(args.device) for t in batch()) for _ in range(8)]
        state = {"i": 0}

        def step():
            x, y = batches[state["i"]]
            state["i"] = (state["i"] + 1) % len(batches)
            opt.zero_grad(set_to_none=True)
            model(x, y).backward()
            opt.step()

        serve(step, device=args.device, params=sum(p.numel() for p in model.parameters()))
        return

    if args.train:
        count = (len(val) - 1 - t) // t + 1
        starts = torch.arange(min(count, args.eval_windows)) * t
        vx, vy = windows(val, starts, t)
        t0 = time.perf_counter()
        for step in range(args.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr)
            x, y = batch()
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
            if (step + 1) % 250 == 0 or step + 1 == args.steps:
                with torch.no_grad():
                    val_loss = sum(model(vx[i:i + 32], vy[i:i + 32]).item() * len(vx[i:i + 32])
                                   for i in range(0, len(vx), 32)) / len(vx)
                print(json.dumps({"step": step + 1, "train_loss": loss.item(), "val_loss": val_loss,
                                  "val_bpb": val_loss / math.log(2), "wall_s": time.perf_counter() - t0}),
                      flush=True)


if __name__ == "__main__":
    main()
