"""hearsay.torch: a torch training loop as a hearsay peer (docs/PYTORCH.md).

    peer = hearsay.torch.Peer("cluster.textproto")        # --config/--peer/RANK as hearsay-peer
    model = Net()
    opt = hearsay.torch.DecentralizedOptimizer(model, torch.optim.AdamW(model.parameters()), peer)
    while peer.running:
        x, y = peer.next_batch()                            # or any DataLoader's batch
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
import argparse
import atexit
import json
import os
import signal
import statistics
import sys
import threading
import time
import weakref

import torch

from . import _engine
from ._engine import InputError

__all__ = ["Peer", "DecentralizedOptimizer", "InputError"]


def _command_line(argv):
    """hearsay-peer's options, where the script was given them; the script's own stay its own."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--config")
    ap.add_argument("--peer")
    ap.add_argument("--log")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--measure-step", type=int, default=0)
    args, _ = ap.parse_known_args(argv)
    return args


def _tensors(x, y, device):
    """A batch from the engine as torch takes it: features float32, token ids and labels int64."""
    x = torch.from_numpy(x)
    if x.dtype == torch.int32:
        x = x.long()
    return x.to(device), torch.from_numpy(y).long().to(device)


class Peer:
    """One peer of a hearsay cluster config, for a training loop that torch runs.

    config: the config file (default: --config on the command line, else $HEARSAY_CONFIG).
    name: which peer of the cluster (default: --peer, else SLURM_PROCID or RANK), as for
    hearsay-peer; without a cluster the peer trains alone. log: the JSON Lines event log
    (default: --log, else the config's log.path). sets: text-format fragments merged over
    the config (as --set). Joining the cluster waits for the neighbours
    (cluster.connect_timeout_s); with fewer than cluster.min_neighbours of them up by then
    (default 1; 0 lets a peer start alone) it raises hearsay.InputError naming the ones
    missing, as a synchronous algorithm does without all. A bad config, a missing secret or data raises
    hearsay.InputError (a ValueError) that names the file, field or variable.
    """

    def __init__(self, config=None, name=None, log=None, sets=(), quiet=None, argv=None, handle_signals=True):
        args = _command_line(sys.argv[1:] if argv is None else argv)
        config = config or args.config or os.environ.get("HEARSAY_CONFIG")
        if not config:
            raise InputError("hearsay.torch.Peer: no config: pass config=, --config FILE, or set HEARSAY_CONFIG")
        self.measure_steps = args.measure_step
        self._engine = _engine.Peer(config, name or args.peer or "", log or args.log or "",
                                    list(args.set) + list(sets), args.quiet if quiet is None else quiet,
                                    self.measure_steps > 0)
        self._finish_hooks = []
        self._batch_rows = None
        # The transport's threads end before the interpreter tears down (and before torch
        # frees the buffers they share), also when the script ends without finish().
        atexit.register(self._engine.close)
        if handle_signals:
            self._handle_signals()

    # --- the run -----------------------------------------------------------------
    @property
    def running(self):
        """Whether the loop goes on: steps left, not stopped (SIGTERM), target not reached alone."""
        return self._engine.running

    @property
    def eval_due(self):
        """Whether the config evaluates after the step just taken (train.eval_every_*, epoch ends, the last step)."""
        return self._engine.eval_due

    @property
    def lr(self):
        """The learning rate of the config's schedule (optim) for the next step."""
        return self._engine.scheduled_lr()

    def finish(self):
        """Writes the end event (final accuracy, bytes sent, time to target) and a last checkpoint."""
        for hook in self._finish_hooks:
            hook()
        self._engine.finish()

    def stop(self):
        """Ends the run after the current step (a signal handler may call it)."""
        self._engine.stop()

    def close(self):
        """Closes the peer's links (finish() does it too)."""
        self._engine.close()

    # --- data: this peer's shard of the config's data, in the native peer's order --
    def next_batch(self, batch=None, device="cpu"):
        """The next minibatch of this peer's shard: x float32 [b, features] (images flat,
        channels last) or int64 token ids [b, context]; y int64 labels [b] or next tokens."""
        x, y = _tensors(*self._engine.next_batch(batch or self.batch_size), device)
        self._batch_rows = int(x.shape[0])
        return x, y

    def test_batches(self, batch=None, device="cpu"):
        """The config's test set (text: validation windows) in batches of eval_batch_size."""
        batch = batch or self._engine.eval_batch_size
        for start in range(0, self._engine.test_size, batch):
            yield _tensors(*self._engine.test_batch(start, batch), device)

    @torch.no_grad()
    def evaluate(self, model, device=None, log=True):
        """Accuracy and mean cross-entropy of `model`'s logits on the test set (per token
        for text), written as an eval event unless log=False. Returns (acc, loss). The
        batches go to `device`, by default the model's."""
        device = device or next(model.parameters()).device
        was_training = model.training
        model.eval()
        loss_sum, correct, count = 0.0, 0, 0
        for x, y in self.test_batches(device=device):
            logits = model(x)
            logits = logits.reshape(-1, logits.shape[-1])
            y = y.reshape(-1)
            loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
            count += int(y.numel())
        model.train(was_training)
        acc, loss = correct / max(count, 1), loss_sum / max(count, 1)
        if log:
            self.log_eval(acc, loss)
        return acc, loss

    def log_eval(self, test_acc, test_loss):
        """An eval event for the model as it is after the last step."""
        self._engine.record_eval(float(test_acc), float(test_loss))

    # Events the engine writes itself, from what it tracks (an eval also decides the time to
    # target and the end event's accuracy): a script writes them through the engine.
    _ENGINE_EVENTS = {"start": "the engine writes it at attach", "step": "opt.step() writes it",
                      "end": "peer.finish() writes it", "gossip": "the engine writes it", "resume": "load_state_dict() writes it",
                      "eval": "use peer.log_eval(acc, loss) or peer.evaluate(model)"}

    def log(self, event, **fields):
        """Writes an event of the log's schema (docs/LOGS.md), e.g. peer.log("checkpoint",
        step=..., path=..., write_s=...); a field the schema does not have, or of another
        type, raises InputError, as do the events the engine writes itself."""
        if event in self._ENGINE_EVENTS:
            raise InputError(f"log(): '{event}' events are the engine's: {self._ENGINE_EVENTS[event]}")
        self._engine.log_event(event, fields)

    def native_initial_params(self):
        """The config's native model's initial weights (model, seed), [(name, numpy array)]
        in its order: a torch copy of the same network can start from them."""
        return self._engine.native_initial_params()

    # --- state -------------------------------------------------------------------------
    def state_dict(self):
        """The engine's state: step count, sampler, the algorithm's own (push-sum weight,
        public copies, outer momentum...) and every link's error-feedback residual."""
        return {"hearsay_peer": self._engine.save_state()}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or "hearsay_peer" not in state:
            raise InputError("load_state_dict: not a hearsay.torch.Peer state_dict (no 'hearsay_peer' key)")
        self._engine.load_state(state["hearsay_peer"])

    # --- what the config says ------------------------------------------------------
    name = property(lambda self: self._engine.name)
    rank = property(lambda self: self._engine.rank)
    peers = property(lambda self: self._engine.peers)
    algorithm = property(lambda self: self._engine.algorithm)
    synchronous = property(lambda self: self._engine.synchronous)
    steps = property(lambda self: self._engine.steps)
    total_steps = property(lambda self: self._engine.total_steps)
    epochs_done = property(lambda self: self._engine.epochs_done)
    bytes_sent = property(lambda self: self._engine.bytes_sent)
    seed = property(lambda self: self._engine.seed)
    device = property(lambda self: self._engine.device)
    threads = property(lambda self: self._engine.threads)
    batch_size = property(lambda self: self._engine.batch_size)
    model_config = property(lambda self: self._engine.model_config)
    optim_config = property(lambda self: self._engine.optim_config)
    checkpoint_dir = property(lambda self: self._engine.checkpoint_dir)
    checkpoint_every_steps = property(lambda self: self._engine.checkpoint_every_steps)
    resume = property(lambda self: self._engine.resume)

    def _handle_signals(self):
        # SIGTERM (hearsay-run, Slurm) and SIGINT end the run after the current step, with
        # its end event. Python runs handlers only between bytecodes; the wakeup fd reaches
        # the engine while a step waits for a synchronous round.
        if threading.current_thread() is threading.main_thread():  # signal handlers live there
            r, w = os.pipe()
            os.set_blocking(w, False)
            signal.set_wakeup_fd(w)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self._engine.stop())
            self._engine.watch_signals(r)


class DecentralizedOptimizer:
    """Wraps a torch optimizer so that each step() runs the peer's gossip algorithm.

    The model's parameters (all of them, one device, float32) move into one flat tensor
    and their gradients into another; each parameter and gradient becomes a view of its
    slice, so the engine reads and writes the memory torch uses. lr_from_config: set the
    optimizer's learning rate from the config's schedule before each step (the native
    peer's); else torch's own rate (and schedulers) rule.
    """

    def __init__(self, model, optimizer, peer, lr_from_config=False):
        if peer._engine.attached:
            raise InputError("DecentralizedOptimizer: this peer already has a model")
        self.model, self.optimizer, self.peer = model, optimizer, peer
        self.lr_from_config = lr_from_config
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise InputError("DecentralizedOptimizer: the model has no parameters that require a gradient")
        devices = {p.device for _, p in named}
        dtypes = {p.dtype for _, p in named}
        if len(devices) != 1 or dtypes != {torch.float32}:
            raise InputError(f"DecentralizedOptimizer: parameters must be float32 on one device; found {sorted(map(str, dtypes))} "
                             f"on {sorted(map(str, devices))}")
        in_model = {id(p) for _, p in named}
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in in_model:
                    raise InputError("DecentralizedOptimizer: the optimizer holds a parameter the model does not train")
        self.device = devices.pop()
        n = sum(p.numel() for _, p in named)
        self.flat_params = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.flat_grads = torch.zeros(n, dtype=torch.float32, device=self.device)
        views, offset = [], 0
        self._params = []
        for name, p in named:
            k = p.numel()
            self.flat_params[offset:offset + k].copy_(p.detach().reshape(-1))
            p.data = self.flat_params[offset:offset + k].view_as(p)
            p.grad = self.flat_grads[offset:offset + k].view_as(p)
            # Codecs and PowerSGD see matrices: [out, everything else], as hearsay's own layers.
            shape = [int(p.shape[0]), k // int(p.shape[0])] if p.dim() >= 2 else [k]
            views.append((name, offset, k, shape))
            self._params.append((p, offset, k))
            offset += k
        device = "cpu" if self.device.type == "cpu" else f"cuda:{self.device.index or 0}"
        if device != "cpu" and not _engine.with_cuda:
            raise InputError(f"DecentralizedOptimizer: the model is on {device} but this hearsay was built without CUDA")
        self._lr_given = None
        self._step_times, self._last_step = [], None
        self._checkpoint_path = (os.path.join(peer.checkpoint_dir, peer.name + ".pt") if peer.checkpoint_dir else None)
        resuming = bool(self._checkpoint_path and peer.resume and os.path.exists(self._checkpoint_path))
        # The engine holds the callback, and the optimizer the peer: a weak reference keeps
        # the two from holding each other forever.
        this = weakref.ref(self)
        peer._engine.attach(self.flat_params.data_ptr(), self.flat_grads.data_ptr(), n, views, device,
                            f"torch {type(model).__name__} ({n} parameters)", lambda lr: this()._optimizer_step(lr),
                            join=not resuming)  # a resumed peer goes on from its own state
        if resuming:
            self.load_state_dict(torch.load(self._checkpoint_path, map_location=self.device))
        peer._finish_hooks.append(self._save_checkpoint)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=False):
        """Zeroes the shared gradient buffer (gradients stay views of it)."""
        self.flat_grads.zero_()

    def step(self, loss=None, correct=0, count=None):
        """One step of the peer: the local optimizer step with the algorithm's
        communication around it. loss: the batch's mean loss (a tensor or a number), for the
        log; correct: how many predictions were right; count: the batch's rows (default:
        the last next_batch's, else the config's batch size)."""
        self._adopt_grads()
        if self.lr_from_config:
            for g in self.optimizer.param_groups:
                g["lr"] = self.peer.lr
        # The rate the engine scales: the first group's that is not zero (a frozen group
        # listed first must not hide the algorithm's scaling from the others).
        lr = next((float(g["lr"]) for g in self.optimizer.param_groups if g["lr"] > 0), 0.0)
        self._lr_given = lr
        count = int(count if count is not None else (self.peer._batch_rows or self.peer.batch_size))
        loss_sum = float(loss) * count if loss is not None else 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.peer._engine.step(loss_sum, int(correct), count, lr)
        if self.peer.measure_steps:
            self._measure()
        every = self.peer.checkpoint_every_steps
        if self._checkpoint_path and every > 0 and self.peer.steps % every == 0 and self.peer.running:
            self._save_checkpoint()

    def _adopt_grads(self):
        # A gradient torch replaced (zero_grad(set_to_none=True), or assigned) goes back into
        # the shared buffer; a missing one is zero. A parameter moved out of the buffer
        # (model.to(), .half(), an assignment) would train apart from the engine: refused.
        for p, offset, k in self._params:
            if p.data_ptr() != self.flat_params[offset:offset + k].data_ptr():
                raise InputError("DecentralizedOptimizer: a parameter no longer lives in the shared buffer (moved by "
                                 ".to(), .half() or an assignment?); move the model before wrapping its optimizer")
            view = self.flat_grads[offset:offset + k]
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
            else:
                continue
            p.grad = view.view_as(p)

    def _optimizer_step(self, lr):
        # The engine calls this inside step(); lr is the algorithm's (all-reduce's linear
        # scaling, gossip_grad's staleness scale): torch's groups follow it for this step.
        ratio = lr / self._lr_given if self._lr_given else 1.0
        saved = None
        if abs(ratio - 1.0) > 1e-6:  # the engine's rate is float32: equal within its rounding
            saved = [g["lr"] for g in self.optimizer.param_groups]
            for g in self.optimizer.param_groups:
                g["lr"] = g["lr"] * ratio
        try:
            self.optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            if saved is not None:
                for g, v in zip(self.optimizer.param_groups, saved):
                    g["lr"] = v

    def _measure(self):
        # hearsay-run's experiment.emulate_compute: the median time between steps alone.
        now = time.perf_counter()
        if self._last_step is not None:
            self._step_times.append(now - self._last_step)
        self._last_step = now
        if len(self._step_times) >= self.peer.measure_steps + 3 or (self._step_times[3:] and not self.peer.running):
            times = self._step_times[3:]
            print(json.dumps({"step_s": statistics.median(times), "steps": len(times), "device": str(self.device)}))
            sys.stdout.flush()
            os._exit(0)

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self.peer.state_dict()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.model.load_state_dict(state["model"])  # copies into the views: still shared
        self.optimizer.load_state_dict(state["optimizer"])
        self.peer.load_state_dict(state)

    def _save_checkpoint(self):
        if not self._checkpoint_path:
            return
        os.makedirs(os.path.dirname(self._checkpoint_path) or ".", exist_ok=True)
        t0 = time.perf_counter()
        tmp = self._checkpoint_path + ".tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, self._checkpoint_path)
        self.peer.log("checkpoint", step=self.peer.steps, path=self._checkpoint_path, write_s=time.perf_counter() - t0)
