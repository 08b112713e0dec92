"""xdist's workers forked warm from the run's fork server, not started as new interpreters.

Why: a worker started cold imports, before its first test, what the whole suite imports; a good
part of that (moto, boto3, the model SDKs, agentq) is what the fork server
(devstack/agentq_dev/forkserver.py, started by tests/conftest.py before the workers) has imported
already. Measured (``pytest -n 6 -k nomatch``, the collection alone): 36.8 -> 24.7 CPU-s.

How: xdist starts a worker as ``PYTHON -u -c BOOTSTRAP`` and talks to it over its standard
streams (execnet). With ``--tx popen//python=...`` naming this script (``specs``), PYTHON is
``python tests/forked_xdist_worker.py``: it hands the same bootstrap and its three streams to the
fork server, waits for the forked worker, and ends as it ended (its exit code, or its signal).
Signals sent to this process (SIGTERM, SIGINT) are the worker's; and the worker watches this
process, so that a SIGKILL here (execnet's last resort) ends it too, as it would a worker of its
own. Where there is no fork server to reach (no socket, or nothing listening on it), it runs the
interpreter itself; one that fails to answer is an error (it may have forked the worker).

What differs from a cold worker: what the fork server imported is imported (pytest and its
plugins are not: they are imported after the fork, and pytest rewrites the asserts of the test
modules as usual, not those of anyio, which the model SDKs import), with the fork server's hash
seed and its frozen garbage; the worker is a session of its own. Its end is the interpreter's:
non-daemon threads are joined, then the exit handlers run (tests/xdist_exit.py's among them).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from agentq_dev import forkserver

# The forked worker's program: end with this process (WRAPPER), run CODE, then end as an
# interpreter ends (threading's shutdown, then the exit handlers, whatever the shutdown raised).
_PROGRAM = """\
import atexit, os, select, signal, sys, threading, time
sys.dont_write_bytecode = {dont_write_bytecode}
def _end_with_wrapper():
    try:
        ended = select.poll()
        ended.register(os.pidfd_open({wrapper}), select.POLLIN)
        ended.poll()
    except ProcessLookupError:
        pass
    except OSError:  # no pidfds here: look every second
        while True:
            time.sleep(1)
            try:
                os.kill({wrapper}, 0)
            except ProcessLookupError:
                break
    os.kill(os.getpid(), signal.SIGKILL)
threading.Thread(target=_end_with_wrapper, name="end-with-wrapper", daemon=True).start()
try:
    exec({code!r})
finally:
    try:
        threading._shutdown()
    finally:
        atexit._run_exitfuncs()
"""
_FORWARDED = {signal.SIGTERM, signal.SIGINT}


def specs(tx: list[str]) -> list[str]:
    """xdist's ``--tx`` specs with each plain local worker (``popen``) forked warm, when the
    fork server is up; any other spec (a chosen interpreter, a remote host) as given."""
    if not os.environ.get(forkserver.ENV_VAR):
        return tx
    python = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))}"
    return [f"popen//python={python}" if spec == "popen" else spec for spec in tx]


def main(argv: list[str]) -> int:
    """``python tests/forked_xdist_worker.py [-u] [-B] -c CODE``: CODE (xdist's bootstrap) run
    by a forked worker. ``-B`` is kept; ``-u`` needs nothing (execnet writes through descriptors
    of its own, unbuffered)."""
    if argv.count("-c") != 1 or argv[-1] == "-c" or set(argv[: argv.index("-c")]) - {"-u", "-B"}:
        print(f"usage: python {__file__} [-u] [-B] -c CODE", file=sys.stderr)
        return 2
    path = os.environ.get(forkserver.ENV_VAR)
    program = _PROGRAM.format(
        dont_write_bytecode="-B" in argv or sys.dont_write_bytecode,
        wrapper=os.getpid(),
        code=argv[argv.index("-c") + 1],
    )
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # held until there is a worker to take them
    try:
        if not path:
            raise FileNotFoundError("no fork server")
        worker = forkserver.ForkedProcess(path, ["-c", program], dict(os.environ))
    except (FileNotFoundError, ConnectionRefusedError):  # never reached a fork server: the interpreter itself
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        os.execv(sys.executable, [sys.executable, *argv])
    pidfd = None
    with contextlib.suppress(OSError):  # (no pidfds here: by its pid, which is its own until it is reaped)
        pidfd = os.pidfd_open(worker.pid)

    def forward(sig: int, _: Any) -> None:
        with contextlib.suppress(OSError):  # it has ended already
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(worker.pid, sig)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)  # a signal held meanwhile is forwarded now
    code = worker.wait()
    if code < 0:  # ended by a signal: so do we (SIGKILL and SIGSTOP have no handler to reset)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
