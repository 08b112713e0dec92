"""A worker that stops dead at a crash point, in this process: the in-memory twin's stand-in for
a worker process that ``AGENTQ_CRASH_AT`` SIGKILLs (``agentq.core.faults``).

What a SIGKILL does to the storage is that the worker writes nothing more, ever: no cleanup, no
lease release, no heartbeat. A thread that blocks at the same pass of the same crash point does
exactly that, while the test goes on (a successor claims once the lease lapses, the test reads
what was left behind). The engine runs with no heartbeat (as the killed process's heartbeat
died with it) and its lease lapses on its own. It stays blocked until the test is over; then it
unwinds with an exception nothing in the engine catches, writing at most what a fenced worker
could (its epoch is long gone) into a store the test no longer reads.

The point is counted in the stopped thread only, as ``AGENTQ_CRASH_AT`` counts in the killed
process only, so ``after_step_put:3`` is that worker's third pass, not the process's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from agentq.core import faults
from agentq.core.engine import Engine, RunResult


class _Unwound(BaseException):
    """Raised in the stopped thread once its test is over (not an Exception: nothing catches it)."""


class _StopAt(Counter[str]):
    """``faults._passes`` that blocks ``victim`` at the ``nth`` pass of ``point``."""

    def __init__(self, point: str, nth: int, victim: threading.Thread, *, wakes: bool = False) -> None:
        super().__init__()
        self.point, self.nth, self.victim, self.wakes = point, nth, victim, wakes
        self.own: Counter[str] = Counter()
        self.stopped = threading.Event()
        self.release = threading.Event()

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        if threading.current_thread() is not self.victim:
            return
        self.own[key] += 1
        if key == self.point and self.own[key] == self.nth:
            self.stopped.set()
            self.release.wait()
            if not self.wakes:
                raise _Unwound


@dataclass
class Stopped:
    """The stopped worker: ``result`` is set only if it ran to the end without reaching the point."""

    thread: threading.Thread
    result: list[RunResult] = field(default_factory=list)


@contextlib.contextmanager
def stopped_at(
    engine: Engine, task_id: str, crash_at: str, monkeypatch: pytest.MonkeyPatch, timeout: float = 60,
    *, wakes: bool = False,
) -> Iterator[Stopped]:  # fmt: skip
    """Run ``engine`` on ``task_id`` in a thread until ``crash_at`` (``point:nth``, as
    ``AGENTQ_CRASH_AT``), where it stops for good; yields once it has stopped there. ``wakes``:
    it is paused, not killed (SIGSTOP): when the block ends it goes on from the point, a zombie
    whose lease has lapsed meanwhile, and the context waits for its run's end."""
    point, _, nth = crash_at.partition(":")
    assert point in faults.CRASH_POINTS, point
    stopped = Stopped(thread=threading.Thread(target=lambda: None))  # replaced below

    def run() -> None:
        with contextlib.suppress(_Unwound):
            stopped.result.append(engine.run(task_id, keeper=lambda _: contextlib.nullcontext()))

    stopped.thread = threading.Thread(target=run, name=f"stopped-at-{crash_at}", daemon=True)
    passes = _StopAt(point, int(nth or 1), stopped.thread, wakes=wakes)
    with monkeypatch.context() as patched:
        patched.setenv("AGENTQ_CRASH_AT", "stopped-in-process:1")  # no such point: crash_point only counts
        patched.setattr(faults, "_passes", passes)
        stopped.thread.start()
        give_up = time.monotonic() + timeout
        while not passes.stopped.wait(0.05):
            assert stopped.thread.is_alive(), f"the worker ended before {crash_at}: {stopped.result}"
            assert time.monotonic() < give_up, f"the worker did not reach {crash_at} in {timeout} s"
        try:
            yield stopped
        finally:
            passes.release.set()
            stopped.thread.join(30)


def resume(engine: Engine, task_id: str, wait_seconds: float = 20, poll_seconds: float = 0.05) -> RunResult:
    """Run ``task_id`` as ``agentq run-task --wait`` does (``agentq.worker.run_task``) on a
    store of the test's own: retry the claim while a dead worker's lease is live, and wait out a
    deferral (a lost lease's call that may still complete)."""
    give_up = time.monotonic() + wait_seconds
    while True:
        result = engine.run(task_id)
        if result.outcome == "deferred":
            wait = float((result.error or {}).get("retry_after") or poll_seconds)
        elif result.outcome == "not_claimed" and not engine.store.tasks.get(task_id).status.terminal:
            wait = poll_seconds
        else:
            return result
        if time.monotonic() + wait > give_up:
            return result
        time.sleep(wait)
