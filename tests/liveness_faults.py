"""Faults for the worker-liveness tests, loaded into a real worker process as a tool module
(``AGENTQ_TOOL_MODULES``; it has no tools): what the environment asks for is patched in at
import, before the worker starts.

- ``AGENTQ_TEST_CLOCK_SKEW``: seconds added to this process's wall clock (``time.time``), a
  host whose clock is off;
- ``AGENTQ_TEST_LIVENESS_FAILS_WHILE``: a file path; while that file exists, every renewal of
  this worker's liveness item fails (a network error), while its task writes still succeed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

TOOLS: list[Any] = []

_skew = float(os.environ.get("AGENTQ_TEST_CLOCK_SKEW", "0") or 0)
if _skew:
    _real_time = time.time
    time.time = lambda: _real_time() + _skew

_failing = os.environ.get("AGENTQ_TEST_LIVENESS_FAILS_WHILE", "")
if _failing:
    from agentq.storage.workers import WorkerLiveness

    _renew = WorkerLiveness.renew

    def _renew_unless_failing(self: WorkerLiveness, life: Any, seconds: float) -> Any:
        if Path(_failing).exists():
            raise ConnectionError("test: the liveness write did not reach the table")
        return _renew(self, life, seconds)

    WorkerLiveness.renew = _renew_unless_failing  # type: ignore[method-assign]
