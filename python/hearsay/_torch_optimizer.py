"""hearsay.torch's optimizer wrapper: a torch optimizer whose every step runs the peer's
gossip algorithm (docs/PYTORCH.md). The public names are re-exported by hearsay.torch."""
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import weakref

import torch

from . import _engine
from ._engine import InputError
from ._torch_peer import _default_peer

BUFFER_MODES = ("average", "broadcast", "local")


def _compiled(model):
    """Whether torch.compile (torch 2) has wrapped `model` already."""
    dynamo = getattr(torch, "_dynamo", None)
    optimized = getattr(getattr(dynamo, "eval_frame", None), "OptimizedModule", None)
    return (optimized is not None and isinstance(model, optimized)) or hasattr(model, "_orig_mod")


def _shared_buffers(model):
    """The model's floating-point buffers that its state_dict holds (BatchNorm's running
    statistics; not a non-persistent buffer such as an attention mask, nor an integer
    count), as [(name, tensor)], each tensor once."""
    out, seen = [], set()
    for prefix, module in model.named_modules():
        transient = getattr(module, "_non_persistent_buffers_set", set())
        for name, b in getattr(module, "_buffers", {}).items():
            if b is None or name in transient or not b.is_floating_point() or id(b) in seen:
                continue
            seen.add(id(b))
            out.append((f"{prefix}.{name}" if prefix else name, b))
    return out


class DecentralizedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer so that each step() runs the peer's gossip algorithm.

    It is a torch.optim.Optimizer: torch's learning-rate schedulers (StepLR, OneCycleLR...),
    GradScaler and code that checks isinstance(opt, torch.optim.Optimizer) take it as
    they take the optimizer it wraps. Its param_groups, state and defaults are the wrapped
    optimizer's own objects, so a scheduler's rate is the one step() uses.

    model (torch.nn.Module): its parameters that require a gradient (float32, on one
    device) move into one flat tensor and their gradients into another; each becomes a
    view of its slice, so the engine reads and writes the memory torch uses. A model
    compiled with torch.compile is refused: wrap first, then compile. TorchScript modules
    (torch.jit.script, torch.jit.trace) are taken as they are.
    optimizer (torch.optim.Optimizer): over the model's parameters; the engine calls its
    step() inside step().
    peer (Peer): default the one hearsay.torch.init() started.
    lr_from_config (bool): set the optimizer's learning rate from the config's schedule
    before each step (the native peer's); else torch's own rate (and schedulers) rule.
    buffers (str): what becomes of the model's floating-point buffers that its state_dict
    holds (BatchNorm's running statistics): "broadcast" (peer 0's, to every peer after every
    step: DDP's way; synchronous algorithms only), "average" (the mean over the peers:
    exactly after every step under a synchronous algorithm, mixed with the model as the
    parameters are under an asynchronous one), or "local" (each peer's own). Default
    "broadcast" under a synchronous algorithm, as DDP does, and "average" under an
    asynchronous one, which has no step that every peer takes together.
    """

    # torch's GradScaler hands itself to step() (grad_scaler=) instead of skipping the
    # step on an overflow: a skipped step would leave the cluster's round without this peer.
    _step_supports_amp_scaling = True

    def __init__(self, model, optimizer, peer=None, lr_from_config=False, buffers=None):
        peer = peer if peer is not None else _default_peer()
        if peer._engine.attached:
            raise InputError("DecentralizedOptimizer: this peer already has a model")
        if _compiled(model):
            raise InputError("DecentralizedOptimizer: the model was compiled (torch.compile) before it was wrapped; wrap "
                             "the plain module, then compile it: opt = DecentralizedOptimizer(model, ...); "
                             "model = torch.compile(model)")
        if buffers is None:
            buffers = "broadcast" if peer.synchronous else "average"
        if buffers not in BUFFER_MODES:
            raise InputError(f"DecentralizedOptimizer: buffers={buffers!r}; use one of {', '.join(BUFFER_MODES)}")
        if buffers == "broadcast" and not peer.synchronous and peer.world_size > 1:
            raise InputError(f"DecentralizedOptimizer: buffers='broadcast' needs a synchronous algorithm (peer 0's buffers "
                             f"to every peer after each round); {peer.algorithm} is asynchronous: 'average' mixes them "
                             "with the model, 'local' keeps each peer's own")
        self.model, self.optimizer, self.peer = model, optimizer, peer
        self.lr_from_config = lr_from_config
        self.buffer_mode = buffers if peer.world_size > 1 else "local"
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
        shared = _shared_buffers(model) if self.buffer_mode != "local" else []
        for name, b in shared:
            if b.dtype != torch.float32 or b.device != self.device:
                raise InputError(f"DecentralizedOptimizer: buffer '{name}' is {b.dtype} on {b.device}; shared buffers are "
                                 f"float32 on the parameters' device ({self.device}); buffers='local' keeps them apart")
            if not bool(torch.isfinite(b).all()):
                raise InputError(f"DecentralizedOptimizer: buffer '{name}' holds values that are not finite, which no "
                                 "average keeps; register it with persistent=False, or pass buffers='local'")
        # Under an asynchronous algorithm the buffers follow the parameters in the model the
        # engine gossips (their gradient stays zero); under a synchronous one they lie in a
        # buffer of their own that the engine averages or broadcasts after each round.
        with_model = shared if not peer.synchronous else []
        beside = shared if peer.synchronous else []
        n = sum(p.numel() for _, p in named) + sum(b.numel() for _, b in with_model)
        self.flat_params = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.flat_grads = torch.zeros(n, dtype=torch.float32, device=self.device)
        nb = sum(b.numel() for _, b in beside)
        self.flat_buffers = torch.zeros(nb, dtype=torch.float32, device=self.device) if nb else None
        views, offset = [], 0
        self._params = []  # (name, parameter, offset, size, shape)
        for name, p in named:
            k = p.numel()
            self.flat_params[offset:offset + k].copy_(p.detach().reshape(-1))
            p.data = self.flat_params[offset:offset + k].view_as(p)
            p.grad = self.flat_grads[offset:offset + k].view_as(p)
            # Codecs and PowerSGD see matrices: [out, everything else], as hearsay's own layers.
            shape = [int(p.shape[0]), k // int(p.shape[0])] if p.dim() >= 2 else [k]
            views.append((name, offset, k, shape))
            self._params.append((name, p, offset, k, tuple(p.shape)))
            offset += k
        self._buffers = []  # (name, buffer, flat tensor, offset, size, shape)
        for name, b in with_model:
            k = b.numel()
            self.flat_params[offset:offset + k].copy_(b.reshape(-1))
            b.data = self.flat_params[offset:offset + k].view_as(b)
            views.append(("buffer:" + name, offset, k, [k]))
            self._buffers.append((name, b, self.flat_params, offset, k, tuple(b.shape)))
            offset += k
        at = 0
        for name, b in beside:
            k = b.numel()
            self.flat_buffers[at:at + k].copy_(b.reshape(-1))
            b.data = self.flat_buffers[at:at + k].view_as(b)
            self._buffers.append((name, b, self.flat_buffers, at, k, tuple(b.shape)))
            at += k
        self._param_ids = [id(p) for _, p, *_ in self._params]
        device = "cpu" if self.device.type == "cpu" else f"cuda:{self.device.index or 0}"
        if device != "cpu" and not _engine.with_cuda:
            raise InputError(f"DecentralizedOptimizer: the model is on {device} but this hearsay was built without CUDA")
        self._lr_given = None
        self._step_times, self._last_step = [], None
        self._step_lock, self._stepping_thread = threading.Lock(), None
        self._accumulating = False  # inside no_sync()
        self._skip_local_step = False  # a GradScaler found this step's gradient overflowed
        self._resumed_groups = []  # the optimizer's saved groups, without their parameters, once a checkpoint is read
        self._checkpoint_path = (os.path.join(peer.checkpoint_dir, peer.name + ".pt") if peer.checkpoint_dir else None)
        resuming = bool(self._checkpoint_path and peer.resume and os.path.exists(self._checkpoint_path))
        # The engine holds the callback, and the optimizer the peer: a weak reference keeps
        # the two from holding each other forever.
        this = weakref.ref(self)
        peer._engine.attach(self.flat_params.data_ptr(), self.flat_grads.data_ptr(), n, views, device,
                            f"torch {type(model).__name__} ({n} parameters)", lambda lr: this()._optimizer_step(lr),
                            join=not resuming,  # a resumed peer goes on from its own state
                            buffers=self.flat_buffers.data_ptr() if nb else 0, num_buffers=nb,
                            buffer_sharing=self.buffer_mode if nb else "broadcast")
        # After each registered object's load, the optimizer's saved groups come back (see
        # load_state_dict).
        peer._script_state.after_load(lambda: this() and this()._restore_groups())
        if resuming:
            self.load_state_dict(torch.load(self._checkpoint_path, map_location=self.device))
        peer._finish_hooks.append(self._save_checkpoint)
        # A parameter reshaped after wrapping (its .data replaced) would fail first inside
        # torch's backward (AccumulateGrad: the gradient's shape against the shared buffer's
        # view) with no word of the wrapping: a hook on each parameter's gradient, before it
        # is accumulated, says what changed (the check step() makes). Tensor hooks hold for
        # TorchScript and traced copies too, which share these parameters.
        def shape_check(shape):
            def check(grad):
                opt = this()
                if opt is not None and tuple(grad.shape) != shape:
                    opt._check_model()
                return grad
            return check
        for _, p, _, _, shape in self._params:
            p.register_hook(shape_check(shape))

    # torch.optim.Optimizer's __init__ is not run: it would make param_groups and state
    # of its own. These are the wrapped optimizer's, which its step() reads.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def add_param_group(self, param_group):
        raise InputError("DecentralizedOptimizer.add_param_group(): the parameters a peer trains are fixed when it is "
                         "wrapped (they move into one shared buffer); give every group to the torch optimizer before "
                         "wrapping it")

    def __repr__(self):
        return f"DecentralizedOptimizer({self.optimizer!r}, peer {self.peer.name!r}, {self.peer.algorithm})"

    def zero_grad(self, set_to_none=False):
        """Zeroes the shared gradient buffer (gradients stay views of it)."""
        if self._accumulating:
            raise InputError("zero_grad() inside no_sync() would drop the gradient being accumulated; call it before "
                             "the first micro-batch")
        self.flat_grads.zero_()

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation, as DDP's no_sync(): inside it, backward() adds each
        micro-batch's gradient to the shared buffer and nothing is sent; the next step()
        outside it sends and applies the sum as one step over all the micro-batches' samples
        (their rows count as that step's batch). step() and zero_grad() inside it are refused:
        either would lose the micro-batches."""
        if self._accumulating:
            raise InputError("no_sync(): already inside no_sync()")
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def step(self, loss=None, correct=0, count=None, grad_scaler=None):
        """One step of the peer: the local optimizer step with the algorithm's
        communication around it. loss (tensor or number): the batch's mean loss, for the
        log and the divergence check; correct (int): how many predictions were right; count
        (int): the step's samples (default: the rows of every batch fed since the last step,
        through next_batch() or batches(), else train.batch_size). grad_scaler: given by
        GradScaler.step(opt): the gradient is unscaled first, and a step whose gradient
        overflowed sends zeros and skips torch's optimizer (under an asynchronous algorithm;
        a synchronous one applies the others' mean, as every peer of the round does)."""
        if self._accumulating:
            raise InputError("step() inside no_sync(): the accumulated gradient is sent by the step() after the block")
        if not self._step_lock.acquire(blocking=False):
            raise InputError(f"DecentralizedOptimizer.step() called on thread {threading.get_ident()} while thread "
                             f"{self._stepping_thread} is in step(); one thread drives a peer")
        try:
            self._stepping_thread = threading.get_ident()
            self._step(loss, correct, count, grad_scaler)
        finally:
            self._stepping_thread = None
            self._step_lock.release()

    def _step(self, loss, correct, count, grad_scaler):
        self.peer._checkpoint_if_due()
        self._check_model()
        self._adopt_grads()
        self._skip_local_step = False
        if grad_scaler is not None and grad_scaler.is_enabled():
            self._unscale(grad_scaler)
        if self.lr_from_config:
            for g in self.optimizer.param_groups:
                g["lr"] = self.peer.lr
        # The rate the engine scales: the first group's that is not zero (a frozen group
        # listed first must not hide the algorithm's scaling from the others).
        lr = next((float(g["lr"]) for g in self.optimizer.param_groups if g["lr"] > 0), 0.0)
        self._lr_given = lr
        self.peer._script_state.stepping()
        rows = self.peer._take_rows()
        count = int(count if count is not None else rows)
        loss_sum = float(loss) * count if loss is not None else 0.0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.peer._engine.step(loss_sum, int(correct), count, lr)
        if self.peer.measure_steps:
            self._measure()
        # The checkpoint of this step is written when the next batch is drawn (or the next
        # step starts): by then the script has done its own bookkeeping of this step
        # (scheduler.step(), its counters), which the checkpoint carries, and nothing has
        # yet changed the model (a forward pass moves BatchNorm's statistics).
        every = self.peer.checkpoint_every_steps
        if self._checkpoint_path and every > 0 and self.peer.steps % every == 0:
            self.peer._checkpoint_due = self._save_checkpoint

    def _unscale(self, scaler):
        # GradScaler's own unscale_ (unless the script called it), over the views in the
        # shared buffer, which also records whether the scaled gradient overflowed.
        try:
            from torch.amp.grad_scaler import OptState  # torch 2.3 on
        except ImportError:
            from torch.cuda.amp.grad_scaler import OptState
        state = scaler._per_optimizer_states[id(self)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(self)
        overflowed = sum(float(v.item()) for v in state["found_inf_per_device"].values()) != 0
        if overflowed:
            # Nothing non-finite leaves this peer (a neighbour would refuse it, a round could
            # not go on): it contributes zeros, and scaler.update() lowers its scale.
            self.flat_grads.zero_()
            self._skip_local_step = not self.peer.synchronous

    def _check_model(self):
        # The model must still be the one wrapped: the same parameter objects, in the shared
        # buffer, of the shapes they had. Anything else would train apart from the engine.
        now = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if [id(p) for _, p in now] != self._param_ids:
            wrapped = {name: p for name, p, *_ in self._params}
            for n, p in now:
                was = wrapped.get(n)
                if was is None or p is was:
                    continue
                if p.device != self.device or p.dtype != torch.float32:
                    raise InputError(f"DecentralizedOptimizer: parameter '{n}' moved to {p.dtype} on {p.device} after "
                                     f"wrapping (it was float32 on {self.device}); move or convert the model before "
                                     "wrapping its optimizer")
                raise InputError(f"DecentralizedOptimizer: the model's parameters are not the ones wrapped ('{n}' is new: "
                                 "a layer replaced after wrapping?); wrap the model as it will train")
            new = [n for n, _ in now if n not in wrapped]
            raise InputError("DecentralizedOptimizer: the model's parameters are not the ones wrapped"
                             + (f" ('{new[0]}' is new)" if new else " (one was removed, frozen or reordered)")
                             + "; wrap the model as it will train")
        for name, p, offset, k, shape in self._params:
            self._check_place("parameter", name, p, self.flat_params, offset, k, shape)
        for name, b, flat, offset, k, shape in self._buffers:
            self._check_place("buffer", name, b, flat, offset, k, shape)

    def _check_place(self, what, name, t, flat, offset, k, shape):
        if t.device != flat.device or t.dtype != torch.float32:
            raise InputError(f"DecentralizedOptimizer: {what} '{name}' moved to {t.dtype} on {t.device} after wrapping "
                             f"(it was float32 on {flat.device}); move or convert the model before wrapping its optimizer")
        if tuple(t.shape) != shape:
            raise InputError(f"DecentralizedOptimizer: {what} '{name}' changed shape from {list(shape)} to "
                             f"{list(t.shape)} after wrapping; wrap the model as it will train")
        if t.data_ptr() != flat[offset:offset + k].data_ptr() or not t.is_contiguous():
            raise InputError(f"DecentralizedOptimizer: {what} '{name}' no longer lives in the shared buffer (replaced "
                             "by an assignment, .to(), .half()?); move the model before wrapping its optimizer")

    def _adopt_grads(self):
        # A gradient torch replaced (zero_grad(set_to_none=True), or assigned) goes back into
        # the shared buffer; a missing one is zero.
        for name, p, offset, k, shape in self._params:
            view = self.flat_grads[offset:offset + k]
            g = p.grad
            if g is None:
                view.zero_()
            elif g.layout != torch.strided or g.data_ptr() != view.data_ptr() or not g.is_contiguous():
                if g.layout != torch.strided:
                    raise InputError(f"DecentralizedOptimizer: parameter '{name}' has a {g.layout} gradient; hearsay's "
                                     "buffers are dense (an Embedding(sparse=True)? use sparse=False)")
                if not g.is_contiguous():
                    raise InputError(f"DecentralizedOptimizer: parameter '{name}' has a non-contiguous gradient (strides "
                                     f"{list(g.stride())}); assign a contiguous one (.contiguous()) or let backward() write it")
                if g.dtype != torch.float32 or g.device != view.device or tuple(g.shape) != shape:
                    raise InputError(f"DecentralizedOptimizer: parameter '{name}' has a gradient of {g.dtype} "
                                     f"{list(g.shape)} on {g.device}; it needs float32 {list(shape)} on {view.device}")
                view.copy_(g.reshape(-1))
            else:
                continue
            p.grad = view.view_as(p)

    def _optimizer_step(self, lr):
        # The engine calls this inside step(); lr is the algorithm's (all-reduce's linear
        # scaling, gossip_grad's staleness scale): torch's groups follow it for this step.
        if self._skip_local_step:
            return
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
        """The model's, torch optimizer's and engine's state (peer.state_dict())."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self.peer.state_dict()}

    def parameters_written(self):
        """Say so after writing the parameters in place between steps (a constraint applied
        after step()): between steps the engine copies them for the next step's sends
        while torch computes, and takes that copy again. load_state_dict() says it itself."""
        self.peer._engine.params_written()

    def load_state_dict(self, state):
        self.parameters_written()  # before the write: the engine's copy between steps ends first
        with torch.no_grad():
            self.model.load_state_dict(state["model"])  # copies into the views: still shared
        self.optimizer.load_state_dict(state["optimizer"])
        # A scheduler built after this (its first step sets its first rate) and then given
        # its saved state (register_state) leaves the groups' rates at that first one:
        # each registered object's load puts the saved groups' hyperparameters back.
        self._resumed_groups = [{k: v for k, v in g.items() if k != "params"} for g in state["optimizer"]["param_groups"]]
        self.peer.load_state_dict(state)

    def _restore_groups(self):
        for group, saved in zip(self.optimizer.param_groups, self._resumed_groups):
            group.update(saved)

    def _save_checkpoint(self):
        if not self._checkpoint_path:
            return
        os.makedirs(os.path.dirname(self._checkpoint_path) or ".", exist_ok=True)
        t0 = time.perf_counter()
        tmp = self._checkpoint_path + ".tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, self._checkpoint_path)
        self.peer.log("checkpoint", step=self.peer.steps, path=self._checkpoint_path,
                      bytes=os.path.getsize(self._checkpoint_path), write_s=time.perf_counter() - t0)
