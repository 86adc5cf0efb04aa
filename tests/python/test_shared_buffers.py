"""hearsay.torch: the model's memory is the engine's, and a step runs torch's optimizer."""
import unittest

import torch

import hearsay
import hearsay.torch as ht
from alone_peer import CONFIG, backward, make  # noqa: E402



class SharedBuffers(unittest.TestCase):
    def test_parameters_are_views_of_the_buffer_the_engine_reads(self):
        peer, model, opt = make()
        self.assertEqual(peer._engine.engine_params_address, opt.flat_params.data_ptr())
        start, end = opt.flat_params.data_ptr(), opt.flat_params.data_ptr() + 4 * opt.flat_params.numel()
        for p in model.parameters():
            self.assertTrue(start <= p.data_ptr() < end, "a parameter outside the flat buffer")
        with torch.no_grad():
            model[0].weight[3, 5] = 7.25  # torch writes ...
            model[2].bias.fill_(-1.5)
        engine = peer._engine.engine_params()  # ... the engine reads the same memory
        self.assertTrue(torch.equal(torch.from_numpy(engine), opt.flat_params))
        self.assertEqual(engine[3 * 8 + 5], 7.25)
        # and what the engine writes there is torch's parameter
        values = torch.arange(opt.flat_params.numel(), dtype=torch.float32)
        peer._engine.engine_write_params(values.numpy())
        self.assertEqual(float(model[0].weight[0, 1]), 1.0)
        self.assertEqual(float(model[2].bias[-1]), float(opt.flat_params.numel() - 1))

    def test_gradient_torch_computes_is_the_one_the_engine_reads(self):
        peer, model, opt = make()
        opt.zero_grad()
        backward(peer, model)
        grads = torch.from_numpy(peer._engine.engine_grads())
        self.assertGreater(float(grads.abs().sum()), 0)
        self.assertTrue(torch.equal(grads, torch.cat([p.grad.reshape(-1) for p in model.parameters()])))

    def test_step_runs_the_torch_optimizer_on_the_shared_memory(self):
        peer, model, opt = make(lr=0.1)
        # set_to_none drops the views: step() puts the new gradients back into the buffer.
        opt.optimizer.zero_grad(set_to_none=True)
        loss = backward(peer, model)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        before = opt.flat_params.clone()
        opt.step(loss)
        self.assertEqual(peer.steps, 1)
        self.assertTrue(torch.allclose(opt.flat_params, before - 0.1 * grads, atol=1e-7))
        for p in model.parameters():
            self.assertTrue(opt.flat_grads.data_ptr() <= p.grad.data_ptr() < opt.flat_grads.data_ptr() + 4 * opt.flat_grads.numel())

    def test_training_alone_learns_and_stops_at_the_configured_steps(self):
        peer, model, opt = make(lr=0.1)
        first = None
        while peer.running:
            opt.zero_grad()
            loss = backward(peer, model)
            first = first if first is not None else float(loss)
            opt.step(loss)
        self.assertEqual(peer.steps, peer.total_steps)
        self.assertEqual(peer.total_steps, 16)  # 1 epoch of 512 samples in batches of 32
        acc, loss = peer.evaluate(model)
        self.assertLess(loss, first)
        peer.finish()

    def test_state_dict_restores_the_step_count_and_sampler(self):
        peer, model, opt = make()
        for _ in range(3):
            opt.zero_grad()
            opt.step(backward(peer, model))
        state = opt.state_dict()
        x_next, _ = peer.next_batch()
        peer2, model2, opt2 = make()
        opt2.load_state_dict(state)
        self.assertEqual(peer2.steps, 3)
        self.assertTrue(torch.equal(opt2.flat_params, opt.flat_params))
        x2, _ = peer2.next_batch()
        self.assertTrue(torch.equal(x2, x_next))

    def test_log_writes_schema_events_and_refuses_others(self):
        peer, model, opt = make()
        peer.log("checkpoint", step=0, path="x.pt", write_s=0.1)
        with self.assertRaisesRegex(hearsay.InputError, "no_such_field"):
            peer.log("checkpoint", step=0, path="x.pt", write_s=0.1, no_such_field=1)
        with self.assertRaisesRegex(hearsay.InputError, "no_such_event"):
            peer.log("no_such_event")
        # The engine's own events go through the engine, which tracks what they say.
        with self.assertRaisesRegex(hearsay.InputError, "log_eval"):
            peer.log("eval", step=0, epoch=0.0, test_acc=0.5, test_loss=1.0, eval_s=0.1)

    def test_a_parameter_moved_out_of_the_buffer_is_refused(self):
        peer, model, opt = make()
        model[0].weight.data = model[0].weight.data.clone()
        opt.zero_grad()
        with self.assertRaisesRegex(hearsay.InputError, "no longer lives in the shared buffer"):
            opt.step(backward(peer, model))

    def test_checkpoint_dir_saves_and_a_new_peer_resumes(self):
        import tempfile
        d = tempfile.mkdtemp()
        sets = ['checkpoint { dir: "%s" every_steps: 2 }' % d]
        peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=sets)
        model = torch.nn.Linear(8, 4)
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        for _ in range(5):
            opt.zero_grad()
            opt.step(backward(peer, model))
        peer.finish()  # writes the last checkpoint
        peer2 = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=sets)
        model2 = torch.nn.Linear(8, 4)
        opt2 = ht.DecentralizedOptimizer(model2, torch.optim.SGD(model2.parameters(), lr=0.1), peer2)
        self.assertEqual(peer2.steps, 5)
        self.assertTrue(torch.equal(opt2.flat_params, opt.flat_params))


if __name__ == "__main__":
    unittest.main()
