"""Misuse of a wrapped model gives a clear error, never a crash (issue 25, item 7): a
parameter that changes shape, device or type after wrapping, a replaced layer, a
non-contiguous or sparse gradient, and a second thread that steps or reads batches while
one thread's step runs. After each error the process goes on."""
import threading
import unittest

import torch

import hearsay
from alone_peer import backward, make



class Parameters(unittest.TestCase):
    def test_a_parameter_that_changes_shape_in_place_is_refused(self):
        peer, model, opt = make()
        w = model[0].weight
        w.data = w.data.view(8, 16)  # the same memory, another shape
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.weight' changed shape from \[16, 8\] to \[8, 16\]"):
            opt.step()
        w.data = w.data.view(16, 8)
        opt.zero_grad()
        opt.step(backward(peer, model))  # put back, it steps again
        self.assertEqual(peer.steps, 1)

    def test_a_parameter_reshaped_after_wrapping_is_refused_in_backward_before_torch_fails_on_it(self):
        # A bias of one value broadcasts in the forward pass: torch would fail only in its
        # backward (AccumulateGrad against the shared buffer's view), saying nothing of hearsay.
        peer, model, opt = make()
        model[0].bias.data = torch.zeros(1)
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.bias' changed shape from \[16\] to \[1\] after "
                                                        r"wrapping"):
            backward(peer, model)

    def test_a_model_moved_to_another_device_is_refused(self):
        peer, model, opt = make()
        model.to("meta")
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.weight' moved to torch.float32 on meta after wrapping "
                                                        r"\(it was float32 on cpu\)"):
            opt.step()

    def test_a_model_converted_to_double_is_refused(self):
        peer, model, opt = make()
        model.double()
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.weight' moved to torch.float64"):
            opt.step()

    def test_a_layer_replaced_after_wrapping_is_refused(self):
        peer, model, opt = make()
        model[2] = torch.nn.Linear(16, 4)
        with self.assertRaisesRegex(hearsay.InputError, r"not the ones wrapped \('2.weight' is new"):
            opt.step()

    def test_a_frozen_parameter_after_wrapping_is_refused(self):
        peer, model, opt = make()
        model[0].bias.requires_grad_(False)
        with self.assertRaisesRegex(hearsay.InputError, "removed, frozen or reordered"):
            opt.step()


class Gradients(unittest.TestCase):
    def test_a_non_contiguous_gradient_is_refused_by_name(self):
        peer, model, opt = make()
        model[0].weight.grad = torch.zeros(8, 16).t()
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.weight' has a non-contiguous gradient \(strides \[1, 16\]\)"):
            opt.step()
        model[0].weight.grad = torch.zeros(16, 8)  # contiguous, replaced: copied back into the buffer
        opt.step()
        self.assertEqual(model[0].weight.grad.data_ptr(), opt.flat_grads.data_ptr())

    def test_a_sparse_gradient_is_refused_by_name(self):
        class Bag(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(32, 8, sparse=True)
                self.out = torch.nn.Linear(8, 4)

            def forward(self, x):
                return self.out(self.embed((x.abs() * 4).long().clamp(max=31)).mean(1))

        model = Bag()
        peer, model, opt = make(model)
        # Into the shared (dense) gradient, torch adds a sparse one in place: that trains.
        opt.step(backward(peer, model))
        self.assertEqual(peer.steps, 1)
        # A fresh gradient (zero_grad(set_to_none=True)) stays sparse: refused.
        opt.optimizer.zero_grad(set_to_none=True)
        backward(peer, model)
        with self.assertRaisesRegex(hearsay.InputError, r"parameter 'embed.weight' has a torch.sparse_coo gradient.*sparse=False"):
            opt.step()


class Threads(unittest.TestCase):
    def test_a_second_thread_is_refused_while_a_step_runs(self):
        inside, release = threading.Event(), threading.Event()

        class Slow(torch.optim.SGD):
            def step(self, closure=None):  # the engine calls it inside opt.step(), on the stepping thread
                inside.set()
                release.wait(30)
                return super().step(closure)

        peer, model, opt = make(optimizer=Slow)
        backward(peer, model)
        done = []
        first = threading.Thread(target=lambda: done.append(opt.step()))
        first.start()
        self.assertTrue(inside.wait(30))
        try:
            with self.assertRaisesRegex(hearsay.InputError, r"step\(\) called on thread \d+ while thread \d+ is in step\(\); "
                                                            "one thread drives a peer"):
                opt.step()
            # The engine's own calls are claimed too: a batch read in the middle of the step.
            with self.assertRaisesRegex(hearsay.InputError, r"next_batch\(\) called on thread \d+ while step\(\) runs on "
                                                            r"thread \d+; one thread drives a peer"):
                peer.next_batch()
            with self.assertRaisesRegex(hearsay.InputError, r"state_dict\(\) called on thread"):
                peer.state_dict()
        finally:
            release.set()
            first.join(30)
        self.assertEqual((done, peer.steps), ([None], 1))
        # One at a time, any thread may drive it.
        other = threading.Thread(target=lambda: (backward(peer, model), opt.step()))
        other.start()
        other.join(30)
        self.assertEqual(peer.steps, 2)


if __name__ == "__main__":
    unittest.main()
