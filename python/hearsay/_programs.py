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
