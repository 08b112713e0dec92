"""xdist's workers forked warm from the run's fork server, not started as new interpreters.

Why: a worker started cold imports, before its first test, what the whole suite imports; about
half of that (moto, boto3, the model SDKs, agentq: ~2.5 of the ~4.5 CPU-s each of six workers
spent before its first test) is what the fork server (agentq/local/forkserver.py, started by
tests/conftest.py before the workers) has imported already.

How: xdist starts a worker as ``PYTHON -u -c BOOTSTRAP`` and talks to it over its standard
streams (execnet). With ``--tx popen//python=...`` naming this module (``specs``), PYTHON is
``python -m tests.forked_xdist_worker``: it hands the same bootstrap and its three streams to
the fork server, waits for the forked worker and exits with its code. The worker is the program
xdist would have started: pytest and its plugins are imported after the fork (so pytest
rewrites the asserts of the test modules and plugins as usual), in the requester's environment
and directory; only what the fork server had imported is shared. A forked program's exit
handlers do not run by themselves (the fork server's child leaves with ``os._exit``), so the
worker runs them when its bootstrap returns, as the interpreter would (tests/xdist_exit.py's
among them).
"""

from __future__ import annotations

import os
import signal
import sys

from agentq.local import forkserver

MODULE = "tests.forked_xdist_worker"


def specs(tx: list[str]) -> list[str]:
    """xdist's ``--tx`` specs with each plain local worker (``popen``) forked warm, when the
    fork server is up; any other spec (a chosen interpreter, a remote host) as given."""
    if not os.environ.get(forkserver.ENV_VAR):
        return tx
    return [f"popen//python={sys.executable} -m {MODULE}" if spec == "popen" else spec for spec in tx]


def main(argv: list[str]) -> int:
    """``python -m tests.forked_xdist_worker [-u] [-B] -c CODE``: CODE (xdist's bootstrap) run
    by a forked worker, then its exit handlers, as at an interpreter's end. ``-B`` is kept;
    ``-u`` needs nothing (execnet writes through descriptors of its own, unbuffered)."""
    if argv.count("-c") != 1 or argv[-1] == "-c" or set(argv[: argv.index("-c")]) - {"-u", "-B"}:
        print(f"usage: python -m {MODULE} [-u] [-B] -c CODE", file=sys.stderr)
        return 2
    if not os.environ.get(forkserver.ENV_VAR):  # no fork server: the interpreter, as xdist would start it
        os.execv(sys.executable, [sys.executable, *argv])
    code = argv[argv.index("-c") + 1]
    run = "\n".join([
        "import atexit, sys",
        f"sys.dont_write_bytecode = {'-B' in argv}",
        "try:",
        f"    exec({code!r})",
        "finally:",
        "    atexit._run_exitfuncs()",
    ])  # fmt: skip
    worker = forkserver.ForkedProcess(os.environ[forkserver.ENV_VAR], ["-c", run], dict(os.environ))
    signal.signal(signal.SIGTERM, lambda *_: worker.terminate())  # xdist's stop is the worker's
    signal.signal(signal.SIGINT, lambda *_: worker.send_signal(signal.SIGINT))
    return worker.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
