"""The console scripts of an installed hearsay (pyproject.toml's [project.scripts]): the
native programs and the experiment tools that the wheel carries in hearsay/bin/.

hearsay-peer and hearsay-sim replace this process with the native program, so signals,
exit status and output are the program's own. hearsay-run and hearsay-plot run the
experiment tools in this interpreter: a config's torch `program` then runs under the same
python (the venv's, where hearsay is installed).
"""
import os
import runpy
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _native(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: error: {path} is missing or not executable: this hearsay install has no "
                         "native programs (reinstall the wheel)\n")
        sys.exit(2)
    os.execv(path, [name, *sys.argv[1:]])


def _tool(script, name):
    path = os.path.join(BIN, script)
    sys.argv[0] = name
    runpy.run_path(path, run_name="__main__")


def peer():
    _native("hearsay-peer")


def sim():
    _native("hearsay-sim")


def run():
    _tool("hearsay_run.py", "hearsay-run")


def plot():
    _tool("hearsay_plot.py", "hearsay-plot")


def _mend_torchrun_std():
    """torch 1.13's torchrun (Debian's) reads --redirects and --tee by iterating its Std
    flag for the value, and Python 3.11 no longer yields a flag's zero member (Std.NONE):
    the defaults ("0") then fail with AttributeError. Looks the values up by number
    instead, where that is needed; later torch releases do so themselves."""
    import re

    from torch.distributed.elastic.multiprocessing import api
    std = api.Std
    if any(s.value == 0 for s in std):
        return
    original = std.from_str

    def from_str(vm):
        if re.fullmatch(r"\d", vm):
            return std(int(vm))
        if re.fullmatch(r"(\d:\d)(,\d:\d)*", vm):
            return {int(i): std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        return original(vm)

    std.from_str = staticmethod(from_str)


def torchrun():
    """hearsay-torchrun: torchrun (torch.distributed.run) under this interpreter, so that
    its workers run the python hearsay is installed in (a venv's; /usr/bin/torchrun runs
    the system python, which does not see the venv). The arguments are torchrun's."""
    try:
        from torch.distributed import run as torch_run
    except ImportError as e:
        sys.stderr.write(f"hearsay-torchrun: error: torch is not importable from {sys.executable} ({e}); install it, "
                         "or make the venv with --system-site-packages to see Debian's python3-torch\n")
        sys.exit(2)
    _mend_torchrun_std()
    sys.argv[0] = "hearsay-torchrun"
    torch_run.main(sys.argv[1:])
