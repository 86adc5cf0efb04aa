"""hearsay: decentralized, asynchronous training across sites.

The engine (C++) under a Python training loop: `hearsay.torch` wraps a torch model and
optimizer so that each step gossips through the engine (docs/PYTORCH.md).
"""
from ._version import __version__

try:
    from . import _engine
except ImportError as e:  # the extension is missing or built for another python
    raise ImportError(f"hearsay {__version__}: its native extension hearsay._engine could not be loaded from "
                      f"{__path__[0]}: {e} (rebuild or reinstall hearsay for this python)") from e

if _engine.__version__ != __version__:
    raise ImportError(f"hearsay: the Python package is version {__version__} but its native extension "
                      f"{_engine.__file__} is version {_engine.__version__}: they come from different builds "
                      "(reinstall the wheel, or rebuild with make build)")

from ._engine import InputError, algorithms, with_cuda  # noqa: E402

__all__ = ["InputError", "algorithms", "with_cuda", "__version__"]
