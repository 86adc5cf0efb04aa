"""hearsay.torch as a PyTorch user drives it (issue 25): gradient accumulation with
no_sync(), the script's own DataLoader (2 worker processes) with steps and epochs that
follow it, mixed precision, TorchScript models (torch.compile refused before wrapping),
where the buffers go, and the public names."""
import json
import os
import tempfile
import unittest

import torch
from torch.utils.data import DataLoader, TensorDataset

import hearsay
import hearsay.torch as ht

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(HERE, "alone-synthetic.textproto")


def alone(*sets, log=""):
    return ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=list(sets), log=log)


def net(seed=0, batchnorm=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 16)] + ([torch.nn.BatchNorm1d(16)] if batchnorm else []) + [torch.nn.ReLU(),
                                                                                           torch.nn.Linear(16, 4)]
    return torch.nn.Sequential(*layers)


def events(path, kind):
    with open(path) as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]


class NoSync(unittest.TestCase):
    def test_accumulated_micro_batches_equal_one_step_on_their_sum(self):
        # Peer A: two micro-batches of 16, the first under no_sync(), then one step. Peer B:
        # one step on the same 32 samples. The same data in the same order (the native sampler).
        pa, pb = alone(), alone()
        ma, mb = net(), net()
        oa = ht.DecentralizedOptimizer(ma, torch.optim.SGD(ma.parameters(), lr=0.1, momentum=0.9), pa)
        ob = ht.DecentralizedOptimizer(mb, torch.optim.SGD(mb.parameters(), lr=0.1, momentum=0.9), pb)
        for _ in range(3):
            oa.zero_grad()
            total = 0.0
            for micro in range(2):
                x, y = pa.next_batch(16)
                with (oa.no_sync() if micro == 0 else _nothing()):
                    loss = torch.nn.functional.cross_entropy(ma(x), y) / 2
                    loss.backward()
                total += float(loss)
            oa.step(total)
            ob.zero_grad()
            x, y = pb.next_batch(32)
            loss = torch.nn.functional.cross_entropy(mb(x), y)
            loss.backward()
            ob.step(loss)
            self.assertAlmostEqual(total, float(loss), places=5)
        self.assertEqual((pa.steps, pb.steps), (3, 3))
        self.assertEqual(pa.epochs_done, pb.epochs_done)
        self.assertTrue(torch.allclose(oa.flat_params, ob.flat_params, atol=1e-6),
                        float((oa.flat_params - ob.flat_params).abs().max()))

    def test_step_and_zero_grad_inside_no_sync_are_refused(self):
        peer = alone()
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        x, y = peer.next_batch()
        with opt.no_sync():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            with self.assertRaisesRegex(hearsay.InputError, r"step\(\) inside no_sync\(\)"):
                opt.step()
            with self.assertRaisesRegex(hearsay.InputError, r"zero_grad\(\) inside no_sync\(\)"):
                opt.zero_grad()
        opt.step()  # after the block: the accumulated gradient goes
        self.assertEqual(peer.steps, 1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OwnData(unittest.TestCase):
    def loader(self, rows=640, batch=32, workers=2):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(rows, 8, generator=g)
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, num_workers=workers,
                          persistent_workers=workers > 0)

    def train(self, peer, loader, per_step=1):
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        losses = []
        for i, (x, y) in enumerate(peer.batches(loader, per_step=per_step)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if (i + 1) % per_step == 0:
                opt.step(loss)
                opt.zero_grad()
                losses.append(float(loss))
        return losses

    def test_a_dataloader_with_two_workers_sets_the_steps_and_epochs(self):
        # The config's own data (512 synthetic samples, 16 steps an epoch) is not the one fed:
        # 2 epochs of the loader's 20 batches are 40 steps, and epochs count its batches.
        log = os.path.join(tempfile.mkdtemp(), "peer.jsonl")
        peer = alone("train { epochs: 2 }", log=log)
        losses = self.train(peer, self.loader(workers=2))
        self.assertEqual(peer.total_steps, 40)
        self.assertEqual(peer.steps, 40)
        self.assertEqual(peer.epochs_done, 2.0)
        self.assertLess(sum(losses[-5:]) / 5, sum(losses[:5]) / 5)
        peer.finish()
        plan = events(log, "plan")  # the optimizer went out with the config's 32 steps first
        self.assertEqual([(e["total_steps"], e["batches_per_epoch"]) for e in plan], [(40, 20)])
        end = events(log, "end")[0]
        self.assertEqual((end["steps"], end["epoch"]), (40, 2.0))

    def test_max_steps_is_not_cut_short_by_epochs_of_data_the_script_does_not_feed(self):
        # max_steps 60 with the default 5 epochs: over the config's synthetic shard that was 16
        # steps an epoch; over the loader's 20 batches 5 epochs are 100, so max_steps rules.
        peer = alone("train { max_steps: 60 epochs: 5 }")
        self.train(peer, self.loader(workers=0))
        self.assertEqual((peer.total_steps, peer.steps), (60, 60))
        self.assertEqual(peer.epochs_done, 3.0)

    def test_accumulating_two_batches_a_step_halves_the_steps(self):
        peer = alone("train { epochs: 1 }")
        self.train(peer, self.loader(workers=0), per_step=2)
        self.assertEqual((peer.total_steps, peer.steps, peer.epochs_done), (10, 10, 1.0))

    def test_a_loader_without_a_length_and_late_data_are_refused(self):
        peer = alone()

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter([(torch.zeros(8), 0)])

        with self.assertRaisesRegex(hearsay.InputError, "no len"):
            peer.batches(DataLoader(Stream(), batch_size=4))
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        x, y = peer.next_batch()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with self.assertRaisesRegex(hearsay.InputError, "after step 1; give it before the first step"):
            peer.batches(self.loader(workers=0))


class MixedPrecision(unittest.TestCase):
    def test_autocast_bfloat16_trains_on_the_shared_float32_buffers(self):
        peer = alone("train { epochs: 3 }")
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        first = last = None
        while peer.running:
            x, y = peer.next_batch()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
                self.assertEqual(logits.dtype, torch.bfloat16)
                loss = torch.nn.functional.cross_entropy(logits, y)
            loss.backward()
            opt.step(loss)
            first = float(loss) if first is None else first
            last = float(loss)
        self.assertLess(last, first)
        for p in model.parameters():  # still float32 views of the buffers the engine reads
            self.assertEqual((p.dtype, p.grad.dtype), (torch.float32, torch.float32))
            self.assertTrue(opt.flat_params.data_ptr() <= p.data_ptr() < opt.flat_params.data_ptr() + 4 * opt.flat_params.numel())
        self.assertTrue(torch.equal(torch.from_numpy(peer._engine.engine_params()), opt.flat_params))

    def test_grad_scaler_step_runs_the_peer_step(self):
        # torch's GradScaler hands itself to step() (the _step_supports_amp_scaling protocol);
        # torch 1.13 has it only for CUDA and disables it here, where it passes the step on.
        peer = alone()
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        self.assertTrue(opt._step_supports_amp_scaling)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
        for _ in range(3):
            x, y = peer.next_batch()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt, loss)
            scaler.update()
        self.assertEqual(peer.steps, 3)

    def test_a_model_made_half_after_wrapping_is_refused(self):
        peer = alone()
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        model.half()
        with self.assertRaisesRegex(hearsay.InputError, r"parameter '0.weight' moved to torch.float16 on cpu after wrapping"):
            opt.step()


class Compiled(unittest.TestCase):
    def check_trains(self, compile_):
        peer = alone()
        model = net(batchnorm=True)
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        x, y = peer.next_batch()
        run = compile_(model, x)
        before = opt.flat_params.clone()
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(run(x), y)
            loss.backward()
            opt.step(loss)
            x, y = peer.next_batch()
        self.assertFalse(torch.equal(before, opt.flat_params))
        # The compiled module computes with the very parameters the engine steps (in training
        # mode: a trace keeps the mode it was traced in).
        with torch.no_grad():
            self.assertTrue(torch.equal(run(x), model(x)))
            opt.flat_params[:16 * 8].zero_()  # the first layer's weight, through the engine's memory
            self.assertTrue(torch.equal(run(x), model(x)))
        self.assertEqual(peer.steps, 5)

    def test_torchscript_script_after_wrapping(self):
        self.check_trains(lambda model, x: torch.jit.script(model))

    def test_torchscript_trace_after_wrapping(self):
        self.check_trains(lambda model, x: torch.jit.trace(model, x))

    @unittest.skipUnless(hasattr(torch, "compile"), "torch.compile is torch 2's")
    def test_a_model_compiled_before_wrapping_is_refused(self):
        peer = alone()
        model = torch.compile(net())
        with self.assertRaisesRegex(hearsay.InputError, "compiled .* before it was wrapped"):
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)


class Buffers(unittest.TestCase):
    def cluster(self, algorithm, *sets, name="a"):
        # A two-peer cluster whose other peer never comes (min_neighbours 0): the layout only.
        path = os.path.join(tempfile.mkdtemp(), "c.textproto")
        with open(path, "w") as f:
            f.write('name: "x"\ndata { format: SYNTHETIC synthetic_dim: 8 num_classes: 4 }\n'
                    'cluster {\n  id: "c"\n  secret_env: "HEARSAY_TEST_API_SECRET"\n  connect_timeout_s: 0.2\n'
                    '  min_neighbours: 0\n'
                    f'  gossip {{ algorithm: "{algorithm}" sync_timeout_s: 1 }}\n'
                    '  peers { name: "a" address: "127.0.0.1:17482" }\n  peers { name: "b" address: "127.0.0.1:17483" }\n}\n')
        os.environ["HEARSAY_TEST_API_SECRET"] = "a secret of the torch api test"
        peer = ht.Peer(path, name=name, argv=[], quiet=True, handle_signals=False, sets=list(sets))
        self.addCleanup(peer.close)  # its port, for the next test
        return peer

    def test_asynchronous_buffers_travel_in_the_model_after_the_parameters(self):
        peer = self.cluster("adpsgd")
        model = net(batchnorm=True)
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        self.assertEqual(opt.buffer_mode, "average")
        params = sum(p.numel() for p in model.parameters())
        bn = model[1]
        self.assertEqual(opt.flat_params.numel(), params + 32)  # running_mean and running_var, not the count
        self.assertEqual(bn.running_mean.data_ptr(), opt.flat_params[params:].data_ptr())
        self.assertEqual(bn.running_var.data_ptr(), opt.flat_params[params + 16:].data_ptr())
        x, y = peer.next_batch()
        torch.nn.functional.cross_entropy(model(x), y).backward()  # BatchNorm writes its statistics there
        engine = torch.from_numpy(peer._engine.engine_params())
        self.assertTrue(torch.equal(engine[params:params + 16], bn.running_mean))
        self.assertFalse(torch.equal(bn.running_mean, torch.zeros(16)))
        peer.close()

    def test_broadcast_under_an_asynchronous_algorithm_is_refused(self):
        peer = self.cluster("adpsgd")
        model = net(batchnorm=True)
        with self.assertRaisesRegex(hearsay.InputError, "buffers='broadcast' needs a synchronous algorithm.*adpsgd"):
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer, buffers="broadcast")
        peer.close()

    def test_synchronous_buffers_lie_beside_the_model_and_default_to_broadcast(self):
        # A synchronous peer needs its neighbour at the start: b joins from a thread.
        import threading
        other = {}
        wait = "cluster { connect_timeout_s: 30 }"
        t = threading.Thread(target=lambda: other.setdefault("b", self.cluster("allreduce", wait, name="b")))
        t.start()
        peer = self.cluster("allreduce", wait)
        t.join()
        model = net(batchnorm=True)
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        self.assertEqual(opt.buffer_mode, "broadcast")  # DDP's default
        self.assertEqual(opt.flat_params.numel(), sum(p.numel() for p in model.parameters()))
        self.assertEqual(model[1].running_var.data_ptr(), opt.flat_buffers[16:].data_ptr())
        peer.close()

    def test_a_buffer_that_is_not_finite_is_refused_by_name(self):
        peer = self.cluster("adpsgd")
        model = net(batchnorm=True)
        model[1].running_var[3] = float("inf")
        with self.assertRaisesRegex(hearsay.InputError, "buffer '1.running_var' holds values that are not finite"):
            ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        peer.close()


class Output(unittest.TestCase):
    def test_a_run_prints_each_progress_line_once_and_nothing_at_a_clean_end(self):
        import subprocess
        bin_dir = os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin"))
        r = subprocess.run([os.path.join(bin_dir, "hearsay-python"), os.path.join(ROOT, "examples", "torch", "fmnist.py"),
                            "--config", CONFIG, "--set", "model { hidden: [8] }"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stderr.splitlines()  # not a terminal: plain lines
        self.assertTrue(lines, "no progress line")
        self.assertEqual(len(lines), len(set(lines)), r.stderr)
        self.assertRegex(lines[-1], r"^torch-alone step 16  epoch 1\.00  ")


class PublicNames(unittest.TestCase):
    def test_all_lists_exactly_the_public_names_and_the_docs_name_each(self):
        public = sorted(n for n in dir(ht) if not n.startswith("_"))
        self.assertEqual(public, sorted(ht.__all__))  # not os, argparse or torch
        with open(os.path.join(ROOT, "docs", "PYTORCH.md")) as f:
            docs = f.read()
        for name in ht.__all__:
            self.assertTrue(f"`{name}" in docs, name)
        # Every keyword of Peer, init, DecentralizedOptimizer and its step is documented.
        import inspect
        for fn in (ht.Peer.__init__, ht.DecentralizedOptimizer.__init__, ht.DecentralizedOptimizer.step, ht.Peer.batches):
            for arg in inspect.signature(fn).parameters:
                if arg != "self":
                    self.assertTrue(f"`{arg}`" in docs or f"`{arg}=" in docs, f"{fn.__qualname__}: {arg}")
        for var in ("HEARSAY_CONFIG", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                    "SLURM_ARRAY_TASK_ID", "HEARSAY_SECRET"):
            self.assertTrue(f"`{var}`" in docs, var)


def train_to_the_end(peer, model, opt, after_step):
    """Steps on the config's data until the run ends, calling after_step(loss) after each."""
    while peer.running:
        x, y = peer.next_batch()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step(loss)
        after_step(loss)


class TorchTools(unittest.TestCase):
    """torch's own tools take the wrapper as the optimizer it wraps (issue 42)."""

    def wrapped(self, peer, lr=0.1, **kwargs):
        model = net()
        return model, ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=lr, **kwargs), peer)

    def test_the_wrapper_is_a_torch_optimizer_and_step_lr_sets_the_rate_each_step_uses(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "log.jsonl")
            peer = alone("train { max_steps: 4 }", "log { every_steps: 1 }", log=log)
            model, opt = self.wrapped(peer)
            self.assertIsInstance(opt, torch.optim.Optimizer)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
            train_to_the_end(peer, model, opt, lambda loss: sched.step())
            peer.finish()
            rates = [e["lr"] for e in events(log, "step")]
            self.assertEqual(len(rates), 4)
            for got, want in zip(rates, [0.1, 0.1, 0.01, 0.01]):
                self.assertAlmostEqual(got, want, places=6)

    def test_one_cycle_lr_takes_the_wrapper_and_its_momentum(self):
        peer = alone()
        model, opt = self.wrapped(peer, momentum=0.9)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=6)
        seen = []
        for _ in range(3):
            x, y = peer.next_batch()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            seen.append(opt.param_groups[0]["lr"])
            sched.step()
        self.assertEqual(opt.param_groups[0]["lr"], sched.get_last_lr()[0])
        self.assertEqual(len(set(seen)), 3)  # the cycle moved the rate every step
        self.assertIs(opt.defaults, opt.optimizer.defaults)

    def test_a_param_group_added_after_wrapping_is_refused(self):
        peer = alone()
        model, opt = self.wrapped(peer)
        with self.assertRaisesRegex(hearsay.InputError, r"add_param_group\(\): the parameters a peer trains are fixed"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})


class Metrics(unittest.TestCase):
    def test_user_scalars_reach_the_log_and_a_tensorboard_event_file(self):
        from hearsay import _tensorboard
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "log.jsonl")
            board = os.path.join(d, "tb")
            peer = ht.Peer(CONFIG, argv=[], quiet=True, handle_signals=False, sets=["train { max_steps: 3 }"], log=log,
                           tensorboard_dir=board)
            model = net()
            opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
            train_to_the_end(peer, model, opt, lambda loss: peer.log_metrics(loss=loss, lr=opt.param_groups[0]["lr"]))
            peer.log_metrics(step=99, accuracy=1)
            peer.finish()
            # The script evaluated nothing: the end event has no accuracy, not one of 0.
            [end] = events(log, "end")
            self.assertIsNone(end["final_test_acc"])
            self.assertIsNone(end["final_test_loss"])
            got = [(e["step"], e["values"]) for e in events(log, "metrics")]
            self.assertEqual([s for s, _ in got], [1, 2, 3, 99])
            self.assertEqual(sorted(got[0][1]), ["loss", "lr"])
            self.assertEqual(got[3][1], {"accuracy": 1.0})
            files = os.listdir(board)
            self.assertEqual(len(files), 1)
            self.assertTrue(files[0].startswith("events.out.tfevents."))
            scalars = _tensorboard.read_scalars(os.path.join(board, files[0]))
            self.assertEqual([s for s, _ in scalars], [1, 2, 3, 99])
            for (step, values), (_, logged) in zip(scalars, got):
                for name, v in logged.items():
                    self.assertAlmostEqual(values[name], v, places=5)  # float32 in the event file

    def test_metrics_serves_the_torch_peer_s_steps_and_loss_in_prometheus_text(self):
        import urllib.request
        peer = alone("train { max_steps: 4 }")
        self.assertEqual(peer.metrics_port, 0)  # none unless asked for
        peer.close()
        peer = ht.Peer(CONFIG, argv=["--metrics", "127.0.0.1:0"], quiet=True, handle_signals=False,
                       sets=["train { max_steps: 4 }"])
        self.assertGreater(peer.metrics_port, 0)
        model = net()
        opt = ht.DecentralizedOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), peer)
        train_to_the_end(peer, model, opt, lambda loss: None)
        text = urllib.request.urlopen(f"http://127.0.0.1:{peer.metrics_port}/metrics", timeout=10).read().decode()
        peer.finish()
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}
        self.assertEqual(values["hearsay_steps_total"], 4)
        self.assertIn("hearsay_train_loss", values)
        self.assertIn('framework="torch"', text)

    def test_bad_scalars_are_refused_naming_them(self):
        peer = alone()
        cases = [({"loss": float("nan")}, r"'loss' is nan"), ({"acc": "high"}, r"'acc' is a str; give a number"),
                 ({"w": torch.zeros(3)}, r"'w' is a tensor of 3 elements"), ({}, r"no values"),
                 ({"ok": True}, r"'ok' is a bool")]
        for scalars, message in cases:
            with self.assertRaisesRegex(hearsay.InputError, message):
                peer.log_metrics(**scalars)
        with self.assertRaisesRegex(hearsay.InputError, r"step=-1"):
            peer.log_metrics(step=-1, loss=1.0)


if __name__ == "__main__":
    unittest.main()
