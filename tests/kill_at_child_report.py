"""A worker that SIGKILLs itself the first time it is about to report a child's end to its
fan-out (``StepFunctionsFanout.child_finished``): the child ended and committed, its parent not
yet told. Loaded as a tool module where ``AGENTQ_TEST_KILL_AT_CHILD_REPORT`` is set
(``tests/test_fanout_report_after_a_kill.py``)."""

from __future__ import annotations

import os
import signal
from typing import Any

TOOLS: list[Any] = []

if os.environ.get("AGENTQ_TEST_KILL_AT_CHILD_REPORT"):
    from agentq.queueing.stepfunctions import StepFunctionsFanout

    def _die(self: Any, task_token: str, task_id: str, status: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    StepFunctionsFanout.child_finished = _die  # type: ignore[method-assign]
