"""torch's GradScaler on a CUDA device, where it is enabled (torch 1.13 has it for CUDA only):
a step whose scaled gradient overflowed contributes zeros, takes no local step, and lowers
the scale; the next, finite step trains. Needs a CUDA device and a build with CUDA: without
them it exits 77, which ctest reports as skipped, never as passed."""
import os
import sys
import unittest

import torch

import hearsay
import hearsay.torch as ht

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "alone-synthetic.textproto")


class GradScalerOverflow(unittest.TestCase):
    def test_an_overflowed_step_contributes_zeros_takes_no_step_and_lowers_the_scale(self):
        device = torch.device("cuda", 0)
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        scaler = torch.cuda.amp.GradScaler(init_scale=1024.0)
        self.assertTrue(scaler.is_enabled())

        def one_step(overflow):
            x, y = peer.next_batch(device=device)
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if overflow:
                with torch.no_grad():
                    next(model.parameters()).grad.view(-1)[0] = float("inf")  # as an fp16 overflow leaves it
            scaler.step(opt, loss)
            scaler.update()

        one_step(overflow=False)
        before, scale = opt.flat_params.clone(), scaler.get_scale()
        one_step(overflow=True)
        self.assertTrue(torch.equal(opt.flat_params, before), "an overflowed step moved the model")
        self.assertTrue(torch.equal(opt.flat_grads, torch.zeros_like(opt.flat_grads)), "non-finite gradients left the step")
        self.assertLess(scaler.get_scale(), scale)
        self.assertEqual(peer.steps, 2)  # the step still counts: the peer keeps the cluster's pace
        one_step(overflow=False)
        self.assertFalse(torch.equal(opt.flat_params, before), "a finite step after the overflow did not train")


if __name__ == "__main__":
    if not (torch.cuda.is_available() and hearsay.with_cuda):
        print("SKIPPED: needs a CUDA device and a build with CUDA (GradScaler is enabled on CUDA only in torch 1.13)")
        sys.exit(77)
    unittest.main()
