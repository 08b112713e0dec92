"""Every tool call a task made, as its policy rules read them (``context.history``: ``tools``,
``ok_tools``, ``tool_calls``; docs/POLICIES.md), whatever its run loaded of its steps.

A run that claims a compacted task loads the steps from the latest compaction on (``_loop``), so
the calls before it are in no step the run holds: read from those alone, a rule that forbids a
call when the history holds one ("one charge per task", "no charge once an untrusted page was
fetched") forgot them and let a second one run. So each compaction carries the history of every
call before it (``CompactStep.tools``, written with the step: no write of its own), and the
history is the latest compaction's plus the tools steps after it. A compaction written before it
carried one (a task in flight at the deploy) has the steps before it read once a run, when the
history is first wanted (one Query), and the next compaction carries it on.
"""

from __future__ import annotations

from agentq.core.engine._session import Session
from agentq.core.models import CompactStep, StepRecord, ToolHistory, ToolsStep
from agentq.core.ports import StepLog


def task_tools(s: Session, steps: StepLog | None) -> ToolHistory:
    """Every committed tool call of the task: the latest compaction's history (or the steps
    before it, for one that carries none: read from ``steps`` once a run) and those after it."""
    start, base = 0, ToolHistory()
    for i in range(len(s.steps) - 1, -1, -1):
        record = s.steps[i]
        if isinstance(record.body, CompactStep):
            start = i + 1
            base = record.body.tools if record.body.tools is not None else _before(s, steps, record.number)
            break
    else:
        if s.steps and s.steps[0].number > 1:  # loaded from a step on with no compaction there
            base = _before(s, steps, s.steps[0].number)
    return base.adding(_made(s.steps[start:]))


def _before(s: Session, steps: StepLog | None, number: int) -> ToolHistory:
    """The history of the steps before ``number``, read from the store once a run. Without a
    store to read, none: as before compactions carried one."""
    if s.tools_before is None or s.tools_before[0] != number:
        loaded = steps.load(s.task_id, upto=number - 1) if steps is not None and number > 1 else []
        s.tools_before = (number, ToolHistory().adding(_made(loaded)))
    return s.tools_before[1]


def _made(records: list[StepRecord]) -> list[tuple[str, str]]:
    return [(r.name, r.status) for record in records if isinstance(record.body, ToolsStep) for r in record.body.results]
