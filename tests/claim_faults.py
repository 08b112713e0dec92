"""A fault for the events hub's takeover test, loaded into a real worker process as a tool module
(``AGENTQ_TOOL_MODULES``; it has no tools): with ``AGENTQ_TEST_KILLED_AFTER_CLAIM_WRITE`` set,
the worker SIGKILLs itself as soon as a claim's META write has landed, before any of the claim's
``CLAIM#`` records (``TaskLeases.claim``): a claimer that dies there, its claim in the event log
from META alone."""

from __future__ import annotations

import os
import signal
from typing import Any

TOOLS: list[Any] = []

if os.environ.get("AGENTQ_TEST_KILLED_AFTER_CLAIM_WRITE"):
    from agentq.storage.leases import TaskLeases

    _claim_write = TaskLeases._claim_write

    def _killed_after_the_write(self: TaskLeases, task_id: str, update: Any, now: float) -> Any:
        meta = _claim_write(self, task_id, update, now)
        if meta is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return meta

    TaskLeases._claim_write = _killed_after_the_write  # type: ignore[method-assign]
