"""xdist's workers forked from the run's fork server (tests/forked_xdist_worker.py): the program
runs warm, ends as an interpreter ends (threads joined, exit handlers run, its exit code or its
signal), and cannot outlive the process xdist started."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentq_dev import forkserver

from tests import forked_xdist_worker
from tests.helpers import wait_for

WRAPPER = Path(forked_xdist_worker.__file__).resolve()


def _worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python tests/forked_xdist_worker.py ARGS``, as xdist starts it."""
    return subprocess.Popen(
        [sys.executable, str(WRAPPER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_the_worker_runs_forked_warm_joins_its_threads_runs_its_exit_handlers_and_exits_with_its_code() -> None:
    assert os.environ.get(forkserver.ENV_VAR)  # tests/conftest.py started the fork server
    code = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('exit handlers ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread joined', flush=True))).start()\n"
        "print('warm' if 'moto' in sys.modules else 'cold', sys.dont_write_bytecode, flush=True)\n"
        "raise SystemExit(3)\n"
    )
    # (the first request waits for the fork server's imports: seconds, more on a loaded machine)
    out, err = (proc := _worker("-u", "-B", "-c", code)).communicate(timeout=180)
    assert (proc.returncode, out.split("\n")) == (3, ["warm True", "thread joined", "exit handlers ran", ""]), err


_SLEEPER = "import os, signal, sys, time\n{handler}print(os.getpid(), flush=True)\ntime.sleep(120)\n"


@pytest.mark.parametrize(
    ("handler", "ended"),
    [("signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n", 7), ("", -signal.SIGTERM)],
    ids=["handled", "default"],
)
def test_a_signal_to_the_wrapper_is_the_workers_and_the_wrapper_ends_as_it_ended(handler: str, ended: int) -> None:
    proc = _worker("-c", _SLEEPER.format(handler=handler))
    try:
        worker = _first_line(proc)
        assert worker != proc.pid  # forked, not the interpreter run in its place
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == ended
        wait_for(lambda: not _alive(worker), timeout=30, what="the worker's end")
    finally:
        proc.kill()


def test_a_sigkilled_wrapper_takes_its_worker_with_it() -> None:
    proc = _worker("-c", _SLEEPER.format(handler=""))
    try:
        worker = _first_line(proc)
        assert worker != proc.pid and _alive(worker)
        proc.kill()  # what execnet does to a worker that does not end when told
        proc.wait(timeout=30)
        wait_for(lambda: not _alive(worker), timeout=30, what="the worker's end")
    finally:
        proc.kill()


def test_only_plain_local_workers_are_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    given = ["popen", "popen//python=python3.12", "ssh=host//python=python3"]
    forked = forked_xdist_worker.specs(given)
    assert forked[0] == f"popen//python={sys.executable} {WRAPPER}" and forked[1:] == given[1:]
    monkeypatch.delenv(forkserver.ENV_VAR)
    assert forked_xdist_worker.specs(given) == given  # no fork server: started as xdist would
    # and a wrapper started without one runs the interpreter itself
    code = "import sys; print('moto' in sys.modules)"
    out, _ = (proc := _worker("-c", code, env=dict(os.environ))).communicate(timeout=180)
    assert (proc.returncode, out) == (0, "False\n")


def test_this_suites_xdist_workers_are_forked() -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not an xdist worker (pytest -n 0)")
    assert os.getsid(0) == os.getpid()  # a forked process is a session of its own; xdist's cold ones are not


@pytest.mark.parametrize("args", [[], ["-c"], ["-X", "-c", "pass"], ["-c", "pass", "-c", "pass"]])
def test_a_command_line_it_does_not_take_is_a_usage_error(args: list[str]) -> None:
    _, err = (proc := _worker(*args)).communicate(timeout=60)
    assert proc.returncode == 2 and "usage: python" in err


def _first_line(proc: subprocess.Popen[str]) -> int:
    """The worker's first line (its pid), waited for as long as a loaded machine may take."""
    assert proc.stdout is not None and select.select([proc.stdout], [], [], 180)[0], "no line from the worker"
    return int(proc.stdout.readline())


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by the fork server, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
