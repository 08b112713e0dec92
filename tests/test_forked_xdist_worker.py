"""xdist's workers forked from the run's fork server (tests/forked_xdist_worker.py): the program
runs warm, with its exit handlers and its exit code, as the interpreter xdist would start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentq.local import forkserver

from tests import forked_xdist_worker

ROOT = Path(__file__).resolve().parent.parent


def _worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tests.forked_xdist_worker ARGS``, as xdist starts it (from the repository)."""
    return subprocess.run(
        [sys.executable, "-m", forked_xdist_worker.MODULE, *args],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_worker_runs_forked_warm_then_its_exit_handlers_and_exits_with_its_code() -> None:
    assert os.environ.get(forkserver.ENV_VAR)  # tests/conftest.py started the fork server
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('exit handlers ran', flush=True))\n"
        "print('warm' if 'moto' in sys.modules else 'cold', sys.dont_write_bytecode, flush=True)\n"
        "raise SystemExit(3)\n"
    )
    done = _worker("-u", "-B", "-c", code)
    assert (done.returncode, done.stdout.split("\n")) == (3, ["warm True", "exit handlers ran", ""]), done.stderr


def test_only_plain_local_workers_are_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    given = ["popen", "popen//python=python3.12", "ssh=host//python=python3"]
    forked = forked_xdist_worker.specs(given)
    assert forked[0] == f"popen//python={sys.executable} -m tests.forked_xdist_worker" and forked[1:] == given[1:]
    monkeypatch.delenv(forkserver.ENV_VAR)
    assert forked_xdist_worker.specs(given) == given  # no fork server: started as xdist would
    # and a wrapper started without one runs the interpreter itself
    cold = _worker("-c", "import sys; print('moto' in sys.modules)", env=dict(os.environ))
    assert (cold.returncode, cold.stdout) == (0, "False\n"), cold.stderr


@pytest.mark.parametrize("args", [[], ["-c"], ["-X", "-c", "pass"], ["-c", "pass", "-c", "pass"]])
def test_a_command_line_it_does_not_take_is_a_usage_error(args: list[str]) -> None:
    done = _worker(*args)
    assert done.returncode == 2 and "usage: python -m tests.forked_xdist_worker" in done.stderr
