"""What a torch peer's checkpoint carries beside the model and optimizer: the script's own
objects (a learning-rate scheduler, a GradScaler, a dict of its own), registered by name
with peer.register_state(), and its place in its own data (docs/PYTORCH.md, "Resuming").

An object is what torch.distributed.checkpoint calls Stateful (state_dict() and
load_state_dict()), or a plain dict, whose items a resume replaces in place. Resuming
works in either order: a checkpoint read before an object is registered keeps that
object's state until it is, and one registered first takes it when the checkpoint is read.
"""
import copy
import inspect
import itertools
import sys

from ._engine import InputError


def _stateful(obj):
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _state_of(obj):
    """obj.state_dict() without the methods bound to obj itself: torch 1.13's OneCycleLR
    keeps its annealing function that way, and pickling it would pickle the scheduler, its
    optimizer and the peer. The object built again on resume has its own."""
    state = obj.state_dict()
    if isinstance(state, dict):
        state = {k: v for k, v in state.items() if not (inspect.ismethod(v) and v.__self__ is obj)}
    return state


class ScriptState:
    """The registered objects of one peer, and the states a checkpoint held for them."""

    def __init__(self, peer_name):
        self._peer_name = peer_name
        self._objects = {}  # name -> object
        self._pending = {}  # name -> state from a checkpoint, for an object not registered yet
        self._after_load = []  # callables run after each object's state is loaded
        self._stepped = False  # a step was taken in this process

    def register(self, objects):
        for name, obj in objects.items():
            if self._stepped:
                raise InputError(f"peer {self._peer_name}: register_state({name}=...) after the first step; register what "
                                 "the checkpoint carries before the loop, so a resume can restore it before it is used")
            if name in self._objects:
                raise InputError(f"peer {self._peer_name}: register_state(): '{name}' is registered already")
            if not (_stateful(obj) or isinstance(obj, dict)):
                raise InputError(f"peer {self._peer_name}: register_state({name}=...): a {type(obj).__name__} has no "
                                 "state_dict()/load_state_dict(); give a scheduler, a GradScaler, a sampler or any "
                                 "object with both, or a dict")
            self._objects[name] = obj
            if name in self._pending:
                self._load(name, obj, self._pending.pop(name))

    def state(self):
        """{name: state} of every registered object, as they are now (deep copies of dicts)."""
        return {name: _state_of(obj) if _stateful(obj) else copy.deepcopy(obj) for name, obj in self._objects.items()}

    def load(self, states):
        """Restores each registered object from `states`; keeps the rest for register()."""
        if not isinstance(states, dict):
            raise InputError(f"peer {self._peer_name}: load_state_dict: 'registered' is a {type(states).__name__}, "
                             "not a dict")
        for name, state in states.items():
            if name in self._objects:
                self._load(name, self._objects[name], state)
            else:
                self._pending[name] = state

    def after_load(self, fn):
        """fn() runs after every object's state is loaded (the optimizer puts back its
        groups' rates, which a scheduler built after the resume had set to its first)."""
        self._after_load.append(fn)

    def stepping(self):
        """Before each step: at the first, a state the checkpoint carried that nothing took is
        said, once, where the user looks."""
        if self._stepped:
            return
        self._stepped = True
        if self._pending:
            sys.stderr.write(f"hearsay: peer {self._peer_name}: the checkpoint carries state for "
                             f"{', '.join(repr(n) for n in sorted(self._pending))} that no register_state() took "
                             "before the first step: it is not restored\n")
            sys.stderr.flush()

    def _load(self, name, obj, state):
        try:
            if _stateful(obj):
                obj.load_state_dict(state)
            elif isinstance(state, dict):
                obj.clear()
                obj.update(copy.deepcopy(state))
            else:
                raise TypeError(f"the checkpoint holds a {type(state).__name__} for it, not a dict")
        except (TypeError, KeyError, ValueError, RuntimeError) as e:
            raise InputError(f"peer {self._peer_name}: the checkpoint's state for '{name}' does not load into the "
                             f"{type(obj).__name__} registered under that name: {e}") from e
        for fn in self._after_load:
            fn()


class _SkippedBatches:
    """A batch sampler without its first `skip` batches: their indices are drawn (the order
    is the sampler's) but no sample is loaded."""

    def __init__(self, batch_sampler, skip):
        self._batch_sampler, self._skip = batch_sampler, skip

    def __len__(self):
        return max(len(self._batch_sampler) - self._skip, 0)

    def __iter__(self):
        return itertools.islice(iter(self._batch_sampler), self._skip, None)


def rest_of_epoch(loader, skip):
    """The batches of `loader`'s current epoch after its first `skip`: for a map-style
    DataLoader, a loader over the same dataset, workers and collation whose batch sampler
    drops those batches' indices unloaded; for anything else, its batches after drawing
    and dropping `skip` of them."""
    from torch.utils.data import DataLoader, IterableDataset
    if skip == 0:
        return loader
    if isinstance(loader, DataLoader) and loader.batch_sampler is not None and not isinstance(loader.dataset, IterableDataset):
        kwargs = dict(batch_sampler=_SkippedBatches(loader.batch_sampler, skip), num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
                      worker_init_fn=loader.worker_init_fn, generator=loader.generator)
        if loader.num_workers > 0:
            kwargs.update(multiprocessing_context=loader.multiprocessing_context, prefetch_factor=loader.prefetch_factor)
        return DataLoader(loader.dataset, **kwargs)
    return itertools.islice(iter(loader), skip, None)
