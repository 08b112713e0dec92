"""A task as the API shows it: its status view (budget, children, activity in words, latency,
retry, pending approval), its summary line for list pages, and the tenant check every read of a
task goes through (``owned``). Built from the store alone, never from the clock."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentq.api.models import (
    GOAL_PREVIEW_CHARS,
    BudgetView,
    ChildrenSummary,
    GradeView,
    LapsedHoldView,
    LatencyView,
    MoneyView,
    PendingCall,
    RetryView,
    TaskLinks,
    TaskSummary,
    TaskView,
    TokenUsage,
)
from agentq.core.call_keys import is_key_of
from agentq.core.endusers import Caller
from agentq.core.errors import TaskNotFound
from agentq.core.models import (
    LLMStep,
    ModelChoice,
    RetryState,
    StepRecord,
    Task,
    TaskStatus,
    asks_for_calls,
)
from agentq.core.pricing import NO_MONEY_CAP, usd_text
from agentq.core.records import BudgetState
from agentq.core.workspace import has_workspace
from agentq.storage.budget_items import budget_state, with_unfolded
from agentq.storage.container import Storage

# --------------------------------------------------------------- task views


def _links(task_id: str) -> TaskLinks:
    return TaskLinks.for_task(task_id)


def owned(store: Storage, task_id: str, caller: Caller) -> Task:
    """The task if ``caller`` may see it (its tenant's; a caller acting as one end user: that
    user's only); any other is simply not found (404, no oracle)."""
    task = store.tasks.get(task_id)
    if not caller.sees(task.tenant, task.user):
        raise TaskNotFound(f"no task {task_id!r}", field="task_id")
    return task


def children_summary(store: Storage, task: Task) -> ChildrenSummary:
    return _children(store, task)[0]


def _children(store: Storage, task: Task) -> tuple[ChildrenSummary, list[BudgetState]]:
    """The task's sub-agents counted by status, and their budgets, from the one read of their
    META items (the budget is on META: ``storage.budgets``)."""
    ids = [child for spawn in store.spawns.list(task.task_id) for child in spawn.children]
    if not ids:
        return ChildrenSummary(total=0, by_status={}, task_ids=[]), []
    read = store.tasks.read_many(ids)
    counts = Counter(child.status.value for child, _ in read)
    budgets = [budget_state(item) for _, item in read if "cap" in item]
    return ChildrenSummary(total=len(ids), by_status=dict(sorted(counts.items())), task_ids=ids[:100]), budgets


def activity(
    store: Storage,
    task: Task,
    children: ChildrenSummary,
    question: str | None,
    approver: str | None = None,
    last: StepRecord | None = None,
) -> str | None:
    """What the task is doing now, in words a person watching it wants: a task of an end user
    waiting on an ask only its tenant decides says so, so a user's app shows "waiting for the
    operator" rather than a button its token cannot press. ``last``: its last committed step
    (read by ``task_view`` for a running task)."""
    status = task.status
    if status is TaskStatus.BLOCKED:
        deps = store.tasks.get_many(task.submission.depends_on)
        done = sum(1 for d in deps if d.status is TaskStatus.SUCCEEDED)
        left = [d.task_id for d in deps if d.status is not TaskStatus.SUCCEEDED]
        return f"blocked: {done} of {len(task.submission.depends_on)} dependencies succeeded; waiting for {', '.join(left[:3])}"
    if status is TaskStatus.QUEUED:
        if task.messages_received > task.messages_delivered and task.step:
            return "queued to answer your message"
        waits = None if task.slots else store.slots.waits_on(task)
        if waits is not None:
            return _parked(task, waits)
        if task.lease_epoch:
            return f"queued to resume after step {task.step}"
        return f"queued ({task.submission.priority} priority), waiting for a worker"
    if status is TaskStatus.PAUSED:
        who = " by the tenant (its API key decides, not the user's token)" if approver == "tenant" and task.user else ""
        return f"waiting for approval{who}: {question}" if question else "paused"
    if status is TaskStatus.IDLE:
        return "interrupted: waiting for your next message (POST /tasks/{id}/messages)"
    if status is TaskStatus.WAITING and task.batch:
        return f"waiting for its turn's batch {task.batch.get('id')} (economy): it runs again when the batch ends"
    if status is TaskStatus.WAITING:
        done = sum(n for s, n in children.by_status.items() if TaskStatus(s).terminal)
        return f"waiting for sub-agents: {done} of {children.total} finished"
    retry = task.retrying
    if retry is not None:
        # No countdown here: the view reads no clock (see task_view); ``retry.next_attempt_at``
        # says when, and each client counts down to it with its own clock.
        if retry.scope == "deferral":
            return f"deferred before its next call ({retry.code}): {retry.message}"
        who = "the model call" if retry.scope == "call" else "the task"
        return f"retrying {who}: attempt {retry.attempt} of {retry.max_attempts} failed ({retry.code}: {retry.message})"
    if status is TaskStatus.RUNNING:
        who = f" on {task.lease_owner}" if task.lease_owner else ""
        if last is not None and isinstance(last.body, LLMStep) and last.body.tool_uses():
            names = ", ".join(u["name"] for u in last.body.tool_uses())
            return f"running tools: {names} (step {last.number + 1}){who}"
        return (
            f"waiting for the model: turn {task.llm_steps + 1} of at most {task.submission.constraints.max_steps}{who}"
        )
    return None


def _parked(task: Task, waits: str) -> str:
    """A queued task the gate parked (``queueing.fairness``): it waits for a slot, not for a
    worker, and no worker will take it before one frees."""
    key = task.submission.concurrency
    if waits == "key" and key is not None:
        return (
            f"queued: waiting on its concurrency key {key.key!r} (at most {key.limit} running); it starts when one "
            "of the key's tasks stops"
        )
    if waits == "tenant":
        return "queued: waiting for a slot under your tenant's running limit; it starts when one of your tasks stops"
    if waits == "tier":
        return (
            f"queued: waiting for a slot of the {task.submission.priority} tier (your running limit there keeps a "
            "reserve for other tenants); it starts when one of your tasks of that tier stops"
        )
    return "queued: waiting for a share of the full fleet; it starts when a slot frees"


def task_view(store: Storage, task: Task) -> TaskView:
    """The task as the API shows it: a function of its stored records only, never of the clock.

    Why: the console and ``watch`` poll with ETags (api/conditional.py), and a view that read
    the clock (an elapsed time "to now", a countdown) would differ on every poll, so a task
    that has not changed would never get its 304. Open intervals are therefore null while the
    task runs, and clients measure them from ``started_at``/``created_at`` themselves.
    """
    # The budget first, then the children's: a child folded in between is missed by this one
    # view, never counted twice (``with_unfolded``).
    try:
        own: BudgetState | None = store.budgets.get(task.budget_id)
    except TaskNotFound:
        own = None
    children, child_budgets = _children(store, task)
    budget: BudgetView | None = None
    if own is not None:
        b = with_unfolded(own, child_budgets)  # for a root, the whole tree's as it says
        money = None
        if b.cap_micros < NO_MONEY_CAP:
            money = MoneyView(
                cap_usd=usd_text(b.cap_micros), used_usd=usd_text(b.used_micros), known_usd=usd_text(b.known_micros),
                unknown_usd=usd_text(b.unknown_micros), reserved_usd=usd_text(b.reserved_micros),
                available_usd=usd_text(b.available_micros),
            )  # fmt: skip
        budget = BudgetView(
            cap=b.cap, used=b.used, known=b.known, unknown=b.unknown, reserved=b.reserved, available=b.available,
            cost_usd=str(b.cost_usd), tokens_in=b.tokens_in, tokens_out=b.tokens_out, money=money,
        )  # fmt: skip
    # The last committed step: what a running task does, a paused one's held calls, and where a
    # root may be forked. One Query (and the step's S3 object when it was offloaded), made for a
    # root task, which is forkable, and for a running or paused one, which read it before.
    reads_last = task.parent_id is None or task.status in (TaskStatus.RUNNING, TaskStatus.PAUSED)
    last = store.steps.last(task.task_id, upto=task.step) if reads_last and task.step else None
    question = approver = pending_id = None
    pending_calls: list[PendingCall] = []
    if task.status is TaskStatus.PAUSED:
        pending = store.approvals.pending(task.task_id)
        if pending is not None:
            question, approver, pending_id = pending.question, pending.approver, pending.use_id
        pending_calls = _pending_calls(last, pending_id)
    end = task.finished_at
    sub = task.submission
    return TaskView(
        task_id=task.task_id,
        status=task.status,
        user=task.user,
        goal=sub.goal,
        provider=sub.provider,
        agent=sub.agent,
        overridden=list(sub.overridden or ()),
        live_text=task.live_text if task.status is TaskStatus.RUNNING and task.inflight else None,
        model=sub.model,
        fallbacks=list(sub.fallbacks),
        answered_by=ModelChoice.model_validate(task.answered_by) if task.answered_by else None,
        priority=sub.priority,
        step=task.step,
        llm_steps=task.llm_steps,
        max_steps=sub.constraints.max_steps,
        tokens=TokenUsage(
            input=task.tokens_in,
            output=task.tokens_out,
            total=task.tokens_in + task.tokens_out,
            budget=budget.cap if budget else sub.constraints.max_tokens,
        ),
        budget=budget,
        cost_usd=str(task.cost_usd),
        result=task.result,
        error=task.error,
        grade=grade_view(task.grade),
        activity=activity(store, task, children, question, approver, last),
        retry=retry_view(task.retrying),
        lapsed_holds=[
            LapsedHoldView(tokens=hold.amount, usd=usd_text(hold.micros), step=hold.step, epoch=epoch, until=hold.until)
            for epoch, hold in sorted(task.lapsed_holds.items())
        ],
        pending_approval=question,
        pending_approver=approver,
        pending_tool_use_id=pending_id,
        pending_calls=pending_calls,
        parent_id=task.parent_id,
        root_id=task.root_id,
        depth=task.depth,
        forked_from=task.forked_from,
        fork_at_step=None if task.parent_id is not None else fork_at_step(task, last),
        depends_on=task.submission.depends_on,
        has_workspace=has_workspace(sub.workspace, sub.constraints.tools),
        children=children,
        metadata=dict(sub.metadata),
        created_at=task.created_at,
        updated_at=task.updated_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
        latency=LatencyView(
            pickup_seconds=_round(task.pickup_latency),
            resumes=task.resume_count,
            last_resume_gap_seconds=_round(task.last_resume_gap),
            run_seconds=_round(end - task.started_at) if end is not None and task.started_at else None,
            total_seconds=round(end - task.created_at, 3) if end is not None else None,
        ),
        links=_links(task.task_id),
    )


def fork_at_step(task: Task, last: StepRecord | None) -> int:
    """The last step a fork of ``task`` may copy up to (``POST /tasks/{id}/fork``'s ``at_step``):
    its last committed step, or the one before when that is the model's turn asking for tool
    calls (``asks_for_calls``: a paused task's held calls, a waiting parent's spawn), which the
    fork refuses. The console's fork form offered the last step, which such a task refused."""
    return task.step - 1 if last is not None and asks_for_calls(last.body) else task.step


def _pending_calls(last: StepRecord | None, held: str | None) -> list[PendingCall]:
    """The tool calls of the last committed turn: what a paused task will do once a person
    decides, by the model's ids. ``held``: the key of the approval pending (the view's
    ``pending_tool_use_id``), which is ``agentq-<step>-<id>`` for a call whose id an earlier call
    had (core.call_keys): the call it names is marked, as no listed id equals that key."""
    if last is None or not isinstance(last.body, LLMStep):
        return []
    number = last.number
    return [
        PendingCall(
            tool_use_id=use["id"],
            name=use["name"],
            input=use.get("input") or {},
            held=held is not None and is_key_of(held, str(use["id"]), number),
        )
        for use in last.body.tool_uses()
    ]


def retry_view(retry: RetryState | None) -> RetryView | None:
    if retry is None:
        return None
    return RetryView(
        scope=retry.scope,
        attempt=retry.attempt,
        max_attempts=retry.max_attempts,
        error={"code": retry.code, "message": retry.message, "status_code": retry.status_code},
        failed_at=retry.at,
        next_attempt_at=retry.next_at,
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def task_summary(task: Task) -> TaskSummary:
    goal = task.submission.goal
    return TaskSummary(
        task_id=task.task_id,
        status=task.status,
        user=task.user,
        goal=goal if len(goal) <= GOAL_PREVIEW_CHARS else goal[: GOAL_PREVIEW_CHARS - 1] + "…",
        priority=task.submission.priority,
        step=task.step,
        tokens_total=task.tokens_in + task.tokens_out,
        cost_usd=str(task.cost_usd),
        parent_id=task.parent_id,
        metadata=dict(task.submission.metadata),
        created_at=task.created_at,
        finished_at=task.finished_at,
        links=_links(task.task_id),
    )


def grade_view(grade: dict[str, Any] | None) -> GradeView | None:
    """META's grade (``core.engine._grade.GradeTurn.meta``) as the API shows it."""
    if not grade:
        return None
    return GradeView(
        attempt=int(grade["attempt"]), max_attempts=int(grade["max_attempts"]), score=grade.get("score"),
        bar=float(grade["bar"]), passed=bool(grade["passed"]), feedback=str(grade.get("feedback") or ""),
        error=grade.get("error"), step=int(grade["step"]), grades=int(grade.get("grades", 1)),
        tokens_in=int(grade.get("tokens_in", 0)), tokens_out=int(grade.get("tokens_out", 0)),
        cost_usd=str(grade.get("cost_usd", "0")), online=grade.get("online"),
    )  # fmt: skip
