"""hearsay.torch's peer: one peer of a cluster config, for a loop that torch runs
(docs/PYTORCH.md). The public names are re-exported by hearsay.torch."""
import argparse
import atexit
import math
import os
import signal
import sys
import threading
import weakref

import torch

from . import _engine, _tensorboard
from ._torch_state import ScriptState, rest_of_epoch
from ._engine import InputError

# The peer init() made, which DecentralizedOptimizer takes when it is given none.
_initialized = None


def _command_line(argv):
    """hearsay-peer's options, where the script was given them; the script's own stay its own."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--config")
    ap.add_argument("--peer")
    ap.add_argument("--log")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--measure-step", type=int, default=0)
    ap.add_argument("--metrics")
    args, _ = ap.parse_known_args(argv)
    return args


def _tensors(x, y, device):
    """A batch from the engine as torch takes it: features float32, token ids and labels int64."""
    x = torch.from_numpy(x)
    if x.dtype == torch.int32:
        x = x.long()
    return x.to(device), torch.from_numpy(y).long().to(device)


def _launcher(env, peers, config):
    """Which peer of `peers` this process is, from its launcher's environment, by the one
    resolution hearsay-peer uses too (include/hearsay/launcher.h): torchrun's RANK with
    WORLD_SIZE first, then a Slurm job array's SLURM_ARRAY_TASK_ID, a Slurm step's
    SLURM_PROCID, and RANK alone. Returns (name, launcher, local_rank), or (None, None, 0)
    when no launcher said. The launcher's count must be the config's."""
    found = _engine.peer_from_launcher(dict(env), list(peers), config)
    return found if found is not None else (None, None, 0)


class Peer:
    """One peer of a hearsay cluster config, for a training loop that torch runs.

    config (str): the config file; default --config on the command line, else
    $HEARSAY_CONFIG. name (str): which peer of cluster.peers; default --peer, else the
    launcher's rank (torchrun's RANK, a Slurm job array's SLURM_ARRAY_TASK_ID, Slurm's
    SLURM_PROCID), checked against its count (WORLD_SIZE, SLURM_ARRAY_TASK_COUNT,
    SLURM_NTASKS); without a cluster the peer trains alone. log (str): the JSON Lines event
    log; default --log, else the config's log.path. sets (list of str): text-format
    fragments merged over the config, after --set. quiet (bool): no progress line on
    stderr; default --quiet. min_neighbours (int), connect_timeout_s (float): the quorum
    (cluster.min_neighbours, cluster.connect_timeout_s) in place of the config's. argv
    (list of str): the command line to read (default sys.argv[1:]; [] reads none).
    handle_signals (bool): SIGTERM and SIGINT end the run after the current step.
    tensorboard_dir (str): also write log_metrics()'s scalars to a TensorBoard event file
    in this directory (no TensorBoard needed to write it). metrics (str): HOST:PORT (port 0
    picks one) to serve the peer's metrics in Prometheus's text format, as hearsay-peer
    --metrics does; default --metrics.

    Joining waits up to connect_timeout_s for the neighbours; fewer than min_neighbours of
    them up by then (default 1; 0 lets a peer start alone), or a synchronous algorithm
    without all of them, raises hearsay.InputError naming the ones missing. A bad config,
    a missing secret or data raises hearsay.InputError (a ValueError) naming the file, field
    or variable.
    """

    def __init__(self, config=None, name=None, log=None, sets=(), quiet=None, argv=None, handle_signals=True,
                 min_neighbours=None, connect_timeout_s=None, tensorboard_dir=None, metrics=None):
        args = _command_line(sys.argv[1:] if argv is None else argv)
        config = config or args.config or os.environ.get("HEARSAY_CONFIG")
        if not config:
            raise InputError("hearsay.torch.Peer: no config: pass config=, --config FILE, or set HEARSAY_CONFIG")
        sets = list(args.set) + list(sets)
        if min_neighbours is not None:
            sets.append(f"cluster {{ min_neighbours: {int(min_neighbours)} }}")
        if connect_timeout_s is not None:
            sets.append(f"cluster {{ connect_timeout_s: {float(connect_timeout_s)} }}")
        name = name or args.peer
        self.launcher, self.local_rank = None, 0
        if not name:
            peers, _ = _engine.cluster_of(config, sets)
            if len(peers) >= 2:
                name, self.launcher, self.local_rank = _launcher(os.environ, peers, config)
        self.measure_steps = args.measure_step
        # The engine's own lines on stderr say they come from the script the user ran.
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
        self._program = script or "python"
        _engine.set_program_name(self._program)
        self._said_signal = False
        # Signals are watched from before the join: SIGINT or SIGTERM while it waits for the
        # neighbours ends the wait at once, and the run then ends as stopped.
        signal_fd = self._handle_signals() if handle_signals else -1
        self._engine = _engine.Peer(config, name or "", log or args.log or "", sets, args.quiet if quiet is None else quiet,
                                    self.measure_steps > 0, signal_fd, metrics or args.metrics or "")
        self._finish_hooks = []
        self._name = self._engine.name
        self._script_state = ScriptState(self._name)
        global _last_peer
        _last_peer = weakref.ref(self)
        self._checkpoint_due = None  # the optimizer's checkpoint writer, when the last step is one to keep
        self._tensorboard = _tensorboard.EventFileWriter(tensorboard_dir) if tensorboard_dir else None
        self._closed = False
        self._rows = 0  # samples fed since the last step (every micro-batch of an accumulation)
        # The transport's threads end before the interpreter tears down (and before torch
        # frees the buffers they share), also when the script ends without finish().
        atexit.register(self._engine.close)

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
        """Ends the run on one model, as cluster.final_consensus says (default AVERAGE: it
        waits for every peer to finish, then each takes the exact mean of all peers'
        parameters, the same bits on every peer); then writes a last checkpoint and the end
        event (final accuracy, bytes sent, time to target, the consensus and this peer's
        distance from the mean before it). A run a signal stopped leaves without the
        consensus and says so on stderr; after SIGINT, finish() then raises
        KeyboardInterrupt, as Python does for an interrupted program (exit 130)."""
        self._checkpoint_due = None  # the last checkpoint (a finish hook) holds that step too
        # Before the last checkpoint, which then holds the model the cluster ends on. The
        # checkpoint and the end event are written whatever happens to it.
        try:
            self._engine.final_consensus()
        finally:
            try:
                for hook in self._finish_hooks:
                    hook()
            finally:
                self._engine.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
        stopped_by = self._engine.stop_signal
        if stopped_by:
            name = signal.Signals(stopped_by).name
            where = f"; its checkpoint is in {self.checkpoint_dir}" if self.checkpoint_dir else ""
            sys.stderr.write(f"{self._program}: peer {self.name}: stopped by {name} after {self.steps} steps{where}\n")
            sys.stderr.flush()
            if stopped_by == signal.SIGINT:
                raise KeyboardInterrupt(f"peer {self.name}: interrupted after {self.steps} steps")
        self._closed = True

    def all_reduce(self, tensor, op="sum"):
        """The script's own values combined over every peer, as torch.distributed.all_reduce:
        `tensor` (a tensor, changed in place and returned, or a number, whose result is
        returned) becomes the sum, mean, max or min (op: "sum", "mean" or "avg", "max",
        "min", or torch.distributed.ReduceOp's SUM, AVG, MAX, MIN) over the peers, computed
        in float32 in peer order, so every peer holds the same bits. Every peer calls the
        same collectives in the same order, after the optimizer is made; each waits up to
        gossip.sync_timeout_s for the others (RuntimeError if a signal stops the peer
        meanwhile). Values must be finite (InputError); at most as many as the model has
        parameters (metrics, small tensors; the model's average is finish()'s). Alone, the
        values are the result."""
        name = op if isinstance(op, str) else getattr(op, "name", str(op).split(".")[-1])
        name = {"avg": "mean"}.get(str(name).lower(), str(name).lower())
        if name not in ("sum", "mean", "max", "min"):
            raise InputError(f"all_reduce(): op {op!r}; use 'sum', 'mean' ('avg'), 'max' or 'min'")
        number = not isinstance(tensor, torch.Tensor)
        if number:
            if isinstance(tensor, bool) or not isinstance(tensor, (int, float)):
                raise InputError(f"all_reduce(): a {type(tensor).__name__}; give a tensor or a number")
            values = torch.tensor([float(tensor)], dtype=torch.float32)
        else:
            if tensor.is_complex() or tensor.dtype == torch.bool:
                raise InputError(f"all_reduce(): a {tensor.dtype} tensor; give a real one (float32 or narrower, ints)")
            values = tensor.detach().to("cpu", torch.float32).contiguous().clone()
        self._collective("all_reduce()", lambda: self._engine.all_reduce(values.data_ptr(), values.numel(), name))
        if number:
            return float(values[0])
        with torch.no_grad():
            tensor.copy_(values.view(tensor.shape))
        return tensor

    def barrier(self):
        """Returns once every peer has called it (after the optimizer is made); waits up to
        gossip.sync_timeout_s for them."""
        self._collective("barrier()", self._engine.barrier)

    def _collective(self, what, run):
        # A signal while a collective waits leaves no result to give: said as such, not as
        # the engine's bare "stop requested" (finish() in a finally block keeps the checkpoint).
        try:
            run()
        except RuntimeError as e:
            if str(e) != "stop requested" or isinstance(e, InputError):
                raise
            raise RuntimeError(f"peer {self.name}: {what}: stopped (SIGTERM or SIGINT) while it waited for the "
                               "other peers; it has no result") from None

    def stop(self):
        """Ends the run after the current step (a signal handler or another thread may call it)."""
        self._engine.stop()

    def close(self):
        """Closes the peer's links (finish() does it too)."""
        self._engine.close()
        self._closed = True

    # --- data: this peer's shard of the config's data, in the native peer's order --
    def next_batch(self, batch=None, device="cpu"):
        """The next minibatch of this peer's shard: x float32 [b, features] (images flat,
        channels last) or int64 token ids [b, context]; y int64 labels [b] or next tokens."""
        self._checkpoint_if_due()
        x, y = _tensors(*self._engine.next_batch(batch or self.batch_size), device)
        self._rows += int(x.shape[0])
        return x, y

    def batches(self, loader, per_step=1):
        """The batches of `loader` (a DataLoader, or any iterable with a len()), epoch after
        epoch, while the run goes on. The run follows this data: train.epochs passes over it
        (len(loader) batches each, `per_step` of them per step when the gradient of several
        is accumulated) or train.max_steps, whichever ends first; epochs_done, the epoch-end
        evaluations and the learning-rate schedule count its batches. A sampler with
        set_epoch (DistributedSampler) is told each epoch. Call it before the first step."""
        return _Batches(self, loader, per_step)

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
            loss_sum += float(torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
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
                      "plan": "peer.batches() writes it",
                      "eval": "use peer.log_eval(acc, loss) or peer.evaluate(model)"}

    def log_metrics(self, step=None, **scalars):
        """The script's own scalars, e.g. peer.log_metrics(loss=loss, lr=sched.get_last_lr()[0]):
        a `metrics` event in the log (docs/LOGS.md) and, with tensorboard_dir, a TensorBoard
        scalar each. step (int): default the steps taken. Each value a finite number or a
        one-element tensor; anything else raises InputError naming it."""
        if not scalars:
            raise InputError("log_metrics(): no values; give them by name, e.g. log_metrics(loss=0.4)")
        step = self.steps if step is None else step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"log_metrics(): step={step!r}; give a step count (an int >= 0), or leave it out")
        values = {}
        for name, value in scalars.items():
            if hasattr(value, "numel") and hasattr(value, "item"):  # a tensor (torch or numpy-like)
                if value.numel() != 1:
                    raise InputError(f"log_metrics(): '{name}' is a tensor of {value.numel()} elements; give one value")
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"log_metrics(): '{name}' is a {type(value).__name__}; give a number")
            if not math.isfinite(value):
                raise InputError(f"log_metrics(): '{name}' is {value}; the log and TensorBoard take finite numbers")
            values[name] = float(value)
        self._engine.log_event("metrics", {"step": step, "values": values})
        if self._tensorboard is not None:
            self._tensorboard.scalars(step, values)

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
    def register_state(self, **objects):
        """The script's own state for the peer's checkpoint, by name: a learning-rate
        scheduler, a GradScaler, any object with state_dict() and load_state_dict() (what
        torch.distributed.checkpoint calls Stateful), or a dict, whose items a resume
        replaces in place. E.g. peer.register_state(scheduler=sched, scaler=scaler,
        progress=my_dict). Before the first step; before or after the optimizer read the
        checkpoint: an object registered later takes its state when it is registered."""
        self._script_state.register(objects)

    def state_dict(self):
        """The engine's state (step count, the sampler's and the script's data's place, the
        algorithm's own: push-sum weight, public copies, outer momentum..., every link's
        error-feedback residual) and the registered objects' (register_state)."""
        return {"hearsay_peer": self._engine.save_state(), "registered": self._script_state.state()}

    def load_state_dict(self, state):
        if not isinstance(state, dict) or "hearsay_peer" not in state:
            raise InputError("load_state_dict: not a hearsay.torch.Peer state_dict (no 'hearsay_peer' key)")
        self._engine.load_state(state["hearsay_peer"])
        self._script_state.load(state.get("registered", {}))

    # --- what the config says ------------------------------------------------------
    name = property(lambda self: self._engine.name, doc="this peer's name")
    rank = property(lambda self: self._engine.rank, doc="this peer's index in cluster.peers (0 alone)")
    peers = property(lambda self: self._engine.peers, doc="the cluster's peer names, in order")
    world_size = property(lambda self: len(self._engine.peers), doc="how many peers the cluster lists (1 alone)")
    algorithm = property(lambda self: self._engine.algorithm, doc="the gossip algorithm ('alone' without a cluster)")
    synchronous = property(lambda self: self._engine.synchronous, doc="whether the algorithm steps in rounds")
    steps = property(lambda self: self._engine.steps, doc="steps taken")
    metrics_port = property(lambda self: self._engine.metrics_port, doc="the port of its metrics endpoint (0: none)")
    total_steps = property(lambda self: self._engine.total_steps, doc="steps the run will take")
    epochs_done = property(lambda self: self._engine.epochs_done, doc="passes over the data so far (fractional)")
    bytes_sent = property(lambda self: self._engine.bytes_sent, doc="bytes sent to neighbours")
    seed = property(lambda self: self._engine.seed, doc="the config's seed")
    device = property(lambda self: self._engine.device, doc="the config's device")
    threads = property(lambda self: self._engine.threads, doc="the config's threads")
    batch_size = property(lambda self: self._engine.batch_size, doc="train.batch_size")
    model_config = property(lambda self: self._engine.model_config, doc="the config's model, as a dict")
    optim_config = property(lambda self: self._engine.optim_config, doc="the config's optimizer and schedule, as a dict")
    checkpoint_dir = property(lambda self: self._engine.checkpoint_dir, doc="checkpoint.dir")
    checkpoint_every_steps = property(lambda self: self._engine.checkpoint_every_steps, doc="checkpoint.every_steps")
    resume = property(lambda self: self._engine.resume, doc="checkpoint.resume")

    def _checkpoint_if_due(self):
        # Before anything changes the state of the last step: the next batch, the next step.
        write, self._checkpoint_due = self._checkpoint_due, None
        if write is not None:
            write()

    def _take_rows(self):
        # The samples of this step: every batch fed since the last one, else the config's batch.
        rows, self._rows = self._rows, 0
        return rows or self.batch_size

    def _handle_signals(self):
        # SIGTERM (hearsay-run, Slurm) and SIGINT end the run after the current step, with
        # its end event. Python runs handlers only between bytecodes; its wakeup fd reaches
        # the engine's watcher (started before the join) while C++ waits: for the
        # neighbours, or for a synchronous round. Returns the fd the engine watches (-1:
        # not on the main thread, where signal handlers live).
        if threading.current_thread() is not threading.main_thread():
            return -1
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        return r

    def _on_signal(self, signum, frame):
        # The engine's watcher has stopped the peer; this says so, once, where the user looks.
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.stop()
        if not self._said_signal:
            self._said_signal = True
            sys.stderr.write(f"{self._program}: {signal.Signals(signum).name}: stopping after the current step "
                             "(finish() writes the end event and the checkpoint)\n")
            sys.stderr.flush()

def _rows_of(batch):
    """The samples in a batch as a DataLoader gives it: the first tensor's first dimension."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            rows = _rows_of(item)
            if rows:
                return rows
    return 0


class _Batches:
    """peer.batches(loader): the loader's batches, epoch after epoch, while the run goes on."""

    def __init__(self, peer, loader, per_step):
        try:
            n = len(loader)
        except TypeError:
            raise InputError(f"batches(): the {type(loader).__name__} has no len() (an IterableDataset?); the run's steps "
                             "follow the data's epochs, so give a loader whose dataset has a length") from None
        if int(per_step) < 1:
            raise InputError(f"batches(): per_step={per_step}; give the batches per step (1, or more to accumulate)")
        peer._engine.follow_data(n, int(per_step))
        self._peer, self._loader = peer, loader

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        peer, loader = self._peer, self._loader
        # A resumed peer goes on where its checkpoint was: that epoch, after the batches fed.
        epoch, skip = divmod(peer._engine.data_batches_fed, len(loader))
        while peer.running:
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)  # DistributedSampler: a new order each epoch
            got = 0
            for batch in rest_of_epoch(loader, skip):
                if not peer.running:
                    return
                peer._checkpoint_if_due()
                peer._engine.fed_batch()
                peer._rows += _rows_of(batch)
                got += 1
                yield batch
            if got == 0 and skip == 0:
                raise InputError(f"batches(): the {type(loader).__name__} gave no batch in epoch {epoch}")
            epoch, skip = epoch + 1, 0


def _uncaught_input_error(kind, error, tb, previous=sys.excepthook):
    """An InputError the script does not catch ends the program as hearsay-peer's do: one
    line on stderr naming the program and the peer, exit status 2 (after the exit handlers:
    the links close). Every other exception goes to the hook that was there before."""
    if not issubclass(kind, InputError):
        return previous(kind, error, tb)
    message = str(error)
    peer = _initialized if _initialized is not None else (_last_peer() if _last_peer else None)
    name = getattr(peer, "_name", None)
    if name and f"peer {name}" not in message:
        message = f"peer {name}: {message}"
    program = getattr(peer, "_program", None) or os.path.basename(sys.argv[0] or "python")
    sys.stderr.write(f"{program}: error: {message}\n")
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(2)


sys.excepthook = _uncaught_input_error
_last_peer = None  # the last Peer made, for the name in an uncaught error's line


def init(config=None, **kwargs):
    """Starts this process's peer, as torch.distributed.init_process_group starts a rank:
    the config from config= or $HEARSAY_CONFIG (or --config), the peer from the launcher's
    environment (torchrun: RANK, WORLD_SIZE, LOCAL_RANK; Slurm: SLURM_PROCID, SLURM_NTASKS,
    SLURM_LOCALID, or a job array's SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT), checked
    against cluster.peers. Keyword arguments are Peer's. Returns the Peer, which
    DecentralizedOptimizer then takes when given none. Once per process (until the peer
    is closed)."""
    global _initialized
    if _initialized is not None and not _initialized._closed:
        raise InputError(f"init(): this process is peer '{_initialized.name}' already; one peer per process "
                         "(finish() or close() it first)")
    _initialized = Peer(config, **kwargs)
    return _initialized


def is_initialized():
    """Whether init() has started a peer that is not closed yet."""
    return _initialized is not None and not _initialized._closed


def _default_peer():
    if not is_initialized():
        raise InputError("DecentralizedOptimizer: no peer: pass one, or call hearsay.torch.init() first")
    return _initialized

