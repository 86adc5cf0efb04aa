"""hearsay: decentralized, asynchronous training across sites.

The engine (C++) under a Python training loop: `hearsay.torch` wraps a torch model and
optimizer so that each step gossips through the engine (docs/PYTORCH.md).
"""
from ._engine import InputError, __version__, algorithms, with_cuda  # noqa: F401

__all__ = ["InputError", "algorithms", "with_cuda", "__version__"]
