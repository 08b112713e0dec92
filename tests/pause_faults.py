"""A worker process that pauses itself (``SIGSTOP``) at a named crash point: a zombie stopped
exactly there, as ``AGENTQ_CRASH_AT`` kills one there (``agentq.core.faults``). Loaded as a tool
module (``AGENTQ_TOOL_MODULES``; it has no tools), patched in at import, before the worker starts.

``AGENTQ_TEST_PAUSE_AT``: ``point:nth`` as ``AGENTQ_CRASH_AT``. The process stops at that pass of
that point and goes on from it when the test sends ``SIGCONT``: whatever it writes then, it
writes as a worker whose lease lapsed while it was paused (a long GC, a frozen VM)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

TOOLS: list[Any] = []

_target = os.environ.get("AGENTQ_TEST_PAUSE_AT", "")
if _target:
    from agentq.core import faults

    _point, _, _nth = _target.partition(":")
    assert _point in faults.CRASH_POINTS, _point
    # crash_point counts passes only while AGENTQ_CRASH_AT is set: a point never passed makes it
    # count without killing anything.
    os.environ.setdefault("AGENTQ_CRASH_AT", "paused-not-killed:1")

    class _PauseAt(Counter[str]):
        """``faults._passes`` that stops this process at the ``nth`` pass of the point."""

        def __setitem__(self, key: str, value: int) -> None:
            super().__setitem__(key, value)
            if key == _point and value == int(_nth or 1):
                os.kill(os.getpid(), signal.SIGSTOP)

    faults._passes = _PauseAt()
