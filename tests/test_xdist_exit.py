"""tests/xdist_exit.py: an xdist worker runs its exit handlers and flushes its output, then ends
without finalising its heap; the controller (or a run without xdist) ends as usual.

The programs run as new interpreters, not forked from the fork server: a forked process ends
with ``os._exit`` (devstack/agentq_dev/forkserver.py), so it never reaches the interpreter's teardown
this is about."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.api_support import ROOT

PROGRAM = """
import atexit, sys
from types import SimpleNamespace

from tests import xdist_exit

marks = sys.argv[1]
atexit.register(lambda: open(f"{marks}/exit-handler", "w").close())


class Finalised:  # what the interpreter's teardown collects at the end
    def __del__(self, path=f"{marks}/finalised", opener=open):
        opener(path, "w").close()


KEPT = Finalised()
config = SimpleNamespace(workerinput={}) if sys.argv[2] == "worker" else SimpleNamespace()
xdist_exit.pytest_unconfigure(config)
sys.stdout.write("buffered, not flushed")
"""


def _end(tmp_path: Path, role: str) -> tuple[int, str, list[str]]:
    marks = tmp_path / role
    marks.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(marks), role],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == ""
    return done.returncode, done.stdout, sorted(p.name for p in marks.iterdir())


def test_a_worker_runs_its_exit_handlers_and_flushes_its_output_then_ends_without_finalising(tmp_path: Path) -> None:
    assert _end(tmp_path, "worker") == (0, "buffered, not flushed", ["exit-handler"])


def test_the_controller_ends_as_usual_finalising_its_heap(tmp_path: Path) -> None:
    # Also what shows that the worker's test would see a finalisation if there were one.
    assert _end(tmp_path, "controller") == (0, "buffered, not flushed", ["exit-handler", "finalised"])
