"""The spawn turn: sub-agents created once, their execution started once, the parent parked in
``waiting`` until the fan-out wakes it, then the children's ends turned into one tool result.

The SPAWN record is written (fenced) with the children's shares taken from the parent's budget
in the same transaction, so a parent killed anywhere in the spawn resumes it without creating a
child twice or taking a share twice (ARCHITECTURE 5); the other calls of the turn run before it
and their outcomes are kept on the record. A workspace call in that turn is refused with a tool
error (``WORKSPACE_IN_SPAWN_TURN``): the turn parks before any checkpoint (``_workspace``), so
what it wrote would not survive the wake.

A child spawned with ``workspace: "parent"`` starts from the parent's workspace as of the spawn
(``core.fanout.parent_workspace``: its manifest, content shared); what the child changed comes
back to the parent only as ``workspace_changes`` in its entry of the spawn result (the paths and a
bounded diff, ``Workspaces.child_changes``), never into the parent's files by itself: the parent's
model applies what it wants with its own tools, so its workspace changes only by its own steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentq import observe
from agentq.core.call_keys import CallRef, own_record
from agentq.core.engine._operation import RecordedOperation, Settled
from agentq.core.engine._session import Session
from agentq.core.engine._tool_call import ToolCaller, error_outcome
from agentq.core.engine.conversation import conversation, final_text, task_tools
from agentq.core.engine.result import RunResult
from agentq.core.errors import BudgetExceeded, IllegalTransition
from agentq.core.fanout import (
    SPAWN_TOOL,
    SUBAGENT_DEADLINE,
    FanoutLauncher,
    SpawnRejected,
    child_outcome,
    parse_spawn_input,
    plan_children,
    render_spawn_result,
)
from agentq.core.models import Task, TaskStatus, ToolOutcome
from agentq.core.ports import BudgetLedger, SpawnBook, StepLog, SubtreeTimeout, TaskLeases
from agentq.core.pricing import NO_MONEY_CAP
from agentq.core.records import SpawnRecord
from agentq.core.workspace import WORKSPACE_TOOLS

# A spawn turn parks the task with its other calls' results on the spawn record and no
# checkpoint of the workspace, so a change they made would be lost at the wake: refused instead.
WORKSPACE_IN_SPAWN_TURN = (
    f"not run: the workspace tools (and python_exec in a workspace) do not run in a turn that calls "
    f"{SPAWN_TOOL}; call them in a turn of their own"
)


@dataclass(frozen=True)
class SpawnPorts:
    """What a spawn reads and writes: its record, the parent's budget, the children's tasks and
    (for a child cut off at its deadline) their steps, and what ends such a child with
    everything under it (``time_out``, control's: ``core.ports.SubtreeTimeout``). Without it
    (an engine built with no control, a test's) the child alone is moved."""

    spawns: SpawnBook
    budgets: BudgetLedger
    tasks: TaskLeases
    steps: StepLog
    time_out: SubtreeTimeout | None = None


class Spawn(RecordedOperation[SpawnRecord, "list[ToolOutcome] | RunResult"]):
    after_create = "after_spawn"

    def __init__(
        self,
        ports: SpawnPorts,
        fanout: FanoutLauncher,
        tools: ToolCaller,
        s: Session,
        uses: list[dict[str, Any]],
        spawn_use: dict[str, Any],
        decided: dict[str, ToolOutcome],
        changes: Callable[[Task], dict[str, Any] | None] | None = None,
    ) -> None:
        self.ports, self.fanout, self.tools, self.s = ports, fanout, tools, s
        self.changes = changes  # a child that started from this workspace: what it changed (_workspace)
        self.uses, self.spawn_use, self.decided = uses, spawn_use, decided
        self.call = s.call(spawn_use)
        self.key = self.call.first  # the spawn record's (and its children's ids'): ``core.call_keys``

    def check(self) -> SpawnRecord | None:
        self.key, record = own_spawn(self.ports.spawns, self.s.task_id, self.call)
        return record

    def create(self) -> None:
        """Run the turn's other calls, then write the record with the children planned from
        what is left of the budget; a spawn the limits or the budget refuse settles the turn
        with the refusal as the spawn's result."""
        s, uses, spawn_use = self.s, self.uses, self.spawn_use
        allowlist = task_tools(s.task.submission)
        notes = self.tools.notes_for(s)
        pending = [
            self.decided.get(use["id"])
            or (
                error_outcome(use, f"only one {SPAWN_TOOL} call is carried out per turn")
                if use["name"] == SPAWN_TOOL
                else error_outcome(use, WORKSPACE_IN_SPAWN_TURN)
                if s.workspace is not None and use["name"] in (*WORKSPACE_TOOLS, "python_exec")
                else self.tools.call(s, use, allowlist, notes)
            )
            for use in uses
            if use is not spawn_use
        ]
        try:
            spec = parse_spawn_input(spawn_use.get("input") or {})
            budget = self.ports.budgets.get(s.task.budget_id)
            money = budget.available_micros if budget.cap_micros < NO_MONEY_CAP else None
            plans = plan_children(s.task, self.key, spec, budget.available, available_micros=money)
            max_concurrency = spec.max_concurrency or len(plans)
            self.ports.spawns.create(s.lease, s.task, self.key, plans, pending, max_concurrency, step=self.call.step)
        except (SpawnRejected, BudgetExceeded) as exc:
            if isinstance(exc, BudgetExceeded):
                observe.record_budget_refusal("task")
            refused = error_outcome(spawn_use, str(exc))
            by_id = {o.tool_use_id: o for o in [*pending, refused]}
            raise Settled([by_id[u["id"]] for u in uses]) from None

    def check_again(self) -> SpawnRecord | None:
        record = self.check()
        assert record is not None, "a spawn record just written must be readable"
        return record

    def act(self, record: SpawnRecord | None) -> list[ToolOutcome] | RunResult:
        assert record is not None
        task, spawn_id = self.s.task, self.key
        if record.state == "creating":  # a crash cut the child writes short: redo them
            self.ports.spawns.write_children(self.s.lease, task, spawn_id, record.plans)
        children = self.ports.tasks.get_many(record.children)
        if not record.execution_arn:
            # Fenced first: a cancel that moved this task since its SPAWN was written (and read
            # the tree before it, so stopped no execution of it) must not find the children
            # started by a run it ended. Its next read of the tree cancels them; this keeps their
            # execution from starting at all (a write on the record, which is ``created`` here).
            self.ports.spawns.mark(task.task_id, spawn_id, lease=self.s.lease, state="created")
            arn = self.fanout.start(
                parent=task,
                spawn_id=spawn_id,
                children=[(c.task_id, c.submission.constraints.timeout_seconds) for c in children],
                max_concurrency=record.max_concurrency,
            )
            self.ports.spawns.mark(task.task_id, spawn_id, lease=self.s.lease, execution_arn=arn)
        if not record.woken and not all(c.status.terminal for c in children):
            self.ports.tasks.transition(task.task_id, TaskStatus.WAITING, lease=self.s.lease)
            self.s.task = task.model_copy(update={"status": TaskStatus.WAITING})
            return RunResult(task.task_id, "waiting", status=TaskStatus.WAITING)
        entries = []
        for child in children:
            ended = child  # as it ended, after a timeout is recorded
            timed_out = not child.status.terminal
            if timed_out:  # its execution iteration gave up: stop it, and what it started, where they stand
                moved = self._time_out(child)
                ended = self.ports.tasks.get(child.task_id)
                timed_out = moved or ended.status is TaskStatus.TIMED_OUT or not ended.status.terminal
            self.ports.budgets.settle_child(task.budget_id, child.task_id, lease=self.s.lease)
            changes = self.changes(ended) if self.changes is not None else None
            entries.append(child_outcome(ended, timed_out=timed_out, changes=changes))
        spawn_outcome = ToolOutcome(
            tool_use_id=self.spawn_use["id"],
            name=SPAWN_TOOL,
            content=render_spawn_result(entries),
            started_at=record.created_at,
            duration_ms=int((time.time() - record.created_at) * 1000),
        )
        by_id = {o.tool_use_id: o for o in [*record.pending, spawn_outcome]}
        return [by_id[u["id"]] for u in self.uses]

    def _time_out(self, child: Task) -> bool:
        """End ``child``, whose deadline passed, ``timed_out``: with its subtree (its sub-agents
        stopped and folded into it, so its budget closes before the fold into this task's), or
        alone where no ``time_out`` was handed in. True when it was moved."""
        if self.ports.time_out is not None:
            return self.ports.time_out(child)
        partial = final_text(conversation(child.submission.goal, self.ports.steps.load(child.task_id)))
        error = {"code": "timeout", "message": SUBAGENT_DEADLINE}
        try:
            self.ports.tasks.transition(child.task_id, TaskStatus.TIMED_OUT, result=partial, error=error)
        except IllegalTransition:
            return False
        return True


def own_spawn(spawns: SpawnBook, task_id: str, call: CallRef) -> tuple[str, SpawnRecord | None]:
    """The key of the spawn ``call`` makes, and its record if one was written (``core.call_keys``)."""
    return own_record(call, lambda key: spawns.get(task_id, key), lambda r: (r.step, None, r.created_at))
