#!/usr/bin/python3
"""The reference values of tests/model/gpt_test.cpp: the same GPT as src/model/gpt.cpp,
written independently in PyTorch (Debian's python3-torch 1.13), on weights and a batch
that both sides compute from a formula; prints its loss and, per parameter tensor, the
gradient's L2 norm and four entries, in float64 text.

    /usr/bin/python3 tests/model/gpt_reference.py > tests/model/data/gpt_reference.txt
"""
import math

import torch
import torch.nn.functional as F

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 256, 16, 2, 2, 32, 3


def param_shapes():
    c = WIDTH
    shapes = [("wte", (VOCAB, c)), ("wpe", (CONTEXT, c))]
    for l in range(LAYERS):
        h = f"h.{l}."
        shapes += [(h + "ln_1.weight", (c,)), (h + "ln_1.bias", (c,)),
                   (h + "attn.c_attn.weight", (3 * c, c)), (h + "attn.c_attn.bias", (3 * c,)),
                   (h + "attn.c_proj.weight", (c, c)), (h + "attn.c_proj.bias", (c,)),
                   (h + "ln_2.weight", (c,)), (h + "ln_2.bias", (c,)),
                   (h + "mlp.c_fc.weight", (4 * c, c)), (h + "mlp.c_fc.bias", (4 * c,)),
                   (h + "mlp.c_proj.weight", (c, 4 * c)), (h + "mlp.c_proj.bias", (c,))]
    return shapes + [("ln_f.weight", (c,)), ("ln_f.bias", (c,))]


def weight(i):
    """Flat parameter i, as gpt_test.cpp computes it (in double, then rounded to float)."""
    return 0.1 * math.sin(0.37 * i + 1.0)


def main():
    torch.manual_seed(0)
    shapes = param_shapes()
    n = sum(math.prod(s) for _, s in shapes)
    flat = torch.tensor([weight(i) for i in range(n)], dtype=torch.float64).float()
    params, at = {}, 0
    for name, shape in shapes:
        size = math.prod(shape)
        t = flat[at:at + size].clone().reshape(shape)
        if name.endswith(".weight") and "ln_" in name:
            t = t + 1.0  # LayerNorm gains near 1, as trained models have
        params[name] = t.requires_grad_(True)
        at += size
    tokens = torch.tensor([(i * 37 + 11) % VOCAB for i in range(BATCH * (CONTEXT + 1))]).reshape(BATCH, CONTEXT + 1)
    x, y = tokens[:, :-1], tokens[:, 1:]

    c, hd = WIDTH, WIDTH // HEADS
    h = params["wte"][x] + params["wpe"][torch.arange(CONTEXT)]
    mask = torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool))
    for l in range(LAYERS):
        p = lambda s: params[f"h.{l}." + s]
        a = F.layer_norm(h, (c,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        q, k, v = F.linear(a, p("attn.c_attn.weight"), p("attn.c_attn.bias")).split(c, dim=-1)
        q, k, v = (t.reshape(BATCH, CONTEXT, HEADS, hd).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        o = (s @ v).transpose(1, 2).reshape(BATCH, CONTEXT, c)
        h = h + F.linear(o, p("attn.c_proj.weight"), p("attn.c_proj.bias"))
        m = F.layer_norm(h, (c,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        m = F.gelu(F.linear(m, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")), approximate="tanh")
        h = h + F.linear(m, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"))
    h = F.layer_norm(h, (c,), params["ln_f.weight"], params["ln_f.bias"], eps=1e-5)
    logits = h @ params["wte"].t()
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()

    print(f"loss {loss.item():.9e}")
    for name, shape in shapes:
        g = params[name].grad.flatten().double()
        size = g.numel()
        picks = [0, size // 3, (2 * size) // 3, size - 1]
        print(name, f"{g.norm().item():.9e}", " ".join(f"{i}:{g[i].item():.9e}" for i in picks))


if __name__ == "__main__":
    main()
