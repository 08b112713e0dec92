"""A fault for the parked-slots takeover test (``tests/test_fair_share_parked.py``), loaded into
a real worker process as a tool module (``AGENTQ_TOOL_MODULES``; it has no tools): with
``AGENTQ_TEST_KILLED_AT_PARKED_RELEASE`` set, the worker SIGKILLs itself when the dispatcher is
about to give back the slots of a task its run left parked (``waiting``, ``paused``, ``idle``):
a worker dying in the instant between the run's park and the release."""

from __future__ import annotations

import os
import signal
from typing import Any

TOOLS: list[Any] = []

if os.environ.get("AGENTQ_TEST_KILLED_AT_PARKED_RELEASE"):
    from agentq.core.models import TaskStatus
    from agentq.queueing.fairness import FairShare

    _release = FairShare.release

    def _killed_at_the_release(self: FairShare, task_id: str) -> list[str]:
        if self.store.tasks.get(task_id).status in (TaskStatus.WAITING, TaskStatus.PAUSED, TaskStatus.IDLE):
            os.kill(os.getpid(), signal.SIGKILL)
        return _release(self, task_id)

    FairShare.release = _killed_at_the_release  # type: ignore[method-assign]
