#!/usr/bin/env python3
"""A small GPT in torch on the config's text (the King James Bible), trained as a hearsay
peer (docs/PYTORCH.md): torch's own transformer layers (pre-LayerNorm, causal, GELU), a
byte vocabulary, the config's shape (model.gpt: layers, heads, width, context), AdamW
with the config's schedule and clipping, validation loss in bits per byte.

    build/bin/hearsay-python examples/torch/gpt.py --config configs/gpt-single.textproto
    build/bin/hearsay-run configs/gpt-geo.textproto --set 'program: "examples/torch/gpt.py"'
"""
import math
import sys

import torch
import torch.nn.functional as F

import hearsay.torch as ht


class Gpt(torch.nn.Module):
    def __init__(self, layers, heads, width, context, vocab=256):
        super().__init__()
        self.token = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(context, width)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        h = self.token(tokens) + self.position(torch.arange(t, device=tokens.device))
        h = self.norm(self.blocks(h, mask=self.mask[:t, :t]))
        return h @ self.token.weight.t()  # the head tied to the embedding


def main():
    peer = ht.Peer()
    cfg = peer.model_config
    if cfg["kind"] != "GPT":
        raise SystemExit(f"gpt.py: the config's model.kind is {cfg['kind']}; this example trains model.kind GPT")
    torch.manual_seed(peer.seed)
    torch.set_num_threads(peer.threads)
    g = cfg["gpt"]
    model = Gpt(g["layers"], g["heads"], g["width"], g["context"])
    o = peer.optim_config
    # Decay matrices only, as nanoGPT does.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    inner = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                              lr=o["lr"], betas=o["betas"], eps=o["eps"])
    opt = ht.DecentralizedOptimizer(model, inner, peer, lr_from_config=True)
    while peer.running:
        x, y = peer.next_batch()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step(loss)  # the engine clips to optim.grad_clip_norm, as for a native peer
        if peer.eval_due:
            acc, loss = peer.evaluate(model)
            print(f"step {peer.steps}: validation {loss / math.log(2):.3f} bits per byte", file=sys.stderr)
    peer.finish()


if __name__ == "__main__":
    try:
        main()
    except ht.InputError as e:
        print(f"gpt.py: error: {e}", file=sys.stderr)
        sys.exit(2)
