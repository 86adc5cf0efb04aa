"""What the single-peer tests of hearsay.torch share: a peer alone on the small synthetic
problem (alone-synthetic.textproto) with a wrapped MLP, and one backward pass."""
import os

import torch

import hearsay.torch as ht

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alone-synthetic.textproto")


def make(model=None, optimizer=None, lr=0.1):
    """(peer, model, DecentralizedOptimizer) of a lone peer; the MLP 8-16-4 unless given."""
    peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False)
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = ht.DecentralizedOptimizer(model, (optimizer or torch.optim.SGD)(model.parameters(), lr=lr), peer)
    return peer, model, opt


def backward(peer, model):
    x, y = peer.next_batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss
