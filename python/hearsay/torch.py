"""hearsay.torch: a torch training loop as a hearsay peer (docs/PYTORCH.md).

    import hearsay.torch as ht
    peer = ht.init()                                        # config and rank as torchrun/Slurm/--peer say
    model = Net()
    opt = ht.DecentralizedOptimizer(model, torch.optim.AdamW(model.parameters()))
    for x, y in peer.batches(loader):                       # or peer.next_batch(): the config's shard
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss)                                      # gossips as the config says
        if peer.eval_due:
            peer.evaluate(model)
    peer.finish()

The model's parameters and gradients become views into two flat tensors that the engine
reads and writes in place (no copies): after each local optimizer step the engine sends
what the configured algorithm calls for and mixes what neighbours sent into the
parameters; synchronous algorithms average the gradient inside step().
"""
from ._engine import InputError
from ._torch_optimizer import DecentralizedOptimizer
from ._torch_peer import Peer, init, is_initialized

__all__ = ["init", "is_initialized", "Peer", "DecentralizedOptimizer", "InputError"]
