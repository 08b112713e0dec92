"""An xdist worker leaves without the interpreter's final teardown, once its exit handlers ran.

Why: when a worker has sent its last report and its session fixtures are down, what is left of
its life is CPython's finalization of a heap of ~450 MB (moto's backends, hypothesis, boto3's
service models, the test modules): ~2 CPU-s a worker, measured as the gap between its last exit
handler and its end. Six workers do it at once on two cores, and xdist waits for the last, so
the run ended ~6 s after its last test. The exit handlers (``atexit``: logging's flush,
temporary directories, coverage's data) all still run, in their order; what no longer runs is a
cleanup left to an object's ``__del__`` at teardown, which nothing in this suite relies on (its
processes and directories are ended by fixtures). The controller, whose exit status is the run's,
ends as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

import pytest


def _leave() -> None:
    """Registered after the session, so called before the exit handlers registered earlier, which
    it runs (those registered after it have run already), then ends the process."""
    atexit.unregister(_leave)
    atexit._run_exitfuncs()  # the rest, last registered first, as the interpreter would
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a stream closed or gone: nothing to write
            stream.flush()
    os._exit(0)  # never read: xdist learns a worker's results and crashes over its channel, not from this


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker, not the controller or a run without -n
        atexit.register(_leave)
