"""An xdist worker leaves without the interpreter's final teardown, once its exit handlers ran.

Why: when a worker has sent its last report and its session fixtures are down, what is left of
its life is CPython's finalization of a heap of ~450 MB (moto's backends, hypothesis, boto3's
service models, the test modules): ~2 CPU-s a worker, measured as the gap between its last exit
handler and its end. Six workers do it at once on two cores, and xdist waits for the last, so
the run ended ~6 s after its last test. Nothing in that teardown is seen outside the process: the
exit handlers (``atexit``: logging's flush, temporary directories, coverage's data) are what a
program may count on at exit, and they all still run, in their order. The controller, whose exit
status is the run's, ends as usual.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

import pytest


def _leave() -> None:
    """Registered last, so called first among the exit handlers: runs the others, then ends."""
    atexit.unregister(_leave)
    atexit._run_exitfuncs()  # the rest, last registered first, as the interpreter would
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a stream closed or gone: nothing to write
            stream.flush()
    os._exit(0)  # the worker's status when it ends normally; xdist reads its results, not this


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker, not the controller or a run without -n
        atexit.register(_leave)
