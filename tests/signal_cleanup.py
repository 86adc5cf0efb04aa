"""For the scripts that make things outside themselves (tests/hosts/test_hosts.py:
namespaces; tests/slurm/test_slurm.py: daemons): runs a script's main so that SIGTERM and
SIGHUP (a CI timeout, a closed terminal) unwind through its finally blocks, and what it
made is removed as on any other end."""
import signal
import sys


def exit_on_signal(signum, _frame):
    sys.exit(128 + signum)


def run(main):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, exit_on_signal)
    sys.exit(main())
