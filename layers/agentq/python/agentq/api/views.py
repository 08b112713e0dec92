"""Read-only views the HTTP API answers with: a task's status view, list pages, the trace.

Built from the store alone (no worker involved); the response shapes are ``api_models``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections import Counter
from decimal import Decimal
from typing import Any, Literal

from agentq.api.models import (
    CURSOR_PATTERN,
    GOAL_PREVIEW_CHARS,
    MAX_CURSOR_CHARS,
    TRACE_TEXT_CHARS,
    BudgetView,
    ChildrenSummary,
    LapsedHoldView,
    LatencyView,
    LLMCallEvent,
    LLMTokens,
    MessageEvent,
    MoneyView,
    PendingCall,
    RetryView,
    TaskLinks,
    TaskPage,
    TaskResult,
    TaskSummary,
    TaskView,
    TokenUsage,
    ToolCallEvent,
    TracePage,
    TransitionEvent,
)
from agentq.core.errors import AgentqError, TaskNotFound, ValidationError
from agentq.core.metadata import BadPair, parse_pairs
from agentq.core.models import (
    CompactStep,
    LLMStep,
    MessageStep,
    ModelChoice,
    RetryState,
    StepRecord,
    Task,
    TaskStatus,
    ToolsStep,
    UserMessage,
)
from agentq.core.pricing import NO_MONEY_CAP
from agentq.core.records import OrphanReason
from agentq.storage import keys
from agentq.storage.container import Storage


class InvalidCursor(ValidationError):
    """A pagination cursor this API did not issue (or issued for another listing)."""

    code = "invalid_cursor"


class NotFinished(AgentqError):
    code = "task_not_finished"


# ------------------------------------------------------------------ cursors


def encode_cursor(kind: str, value: Any) -> str:
    raw = json.dumps({"k": kind, "v": value}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_CURSOR = re.compile(CURSOR_PATTERN)


def decode_cursor(kind: str, cursor: str) -> Any:
    """The value ``encode_cursor`` put in ``cursor``, or ``InvalidCursor`` (400): a cursor that is
    too long, not base64url (which ``b64decode`` would silently skip), not JSON, or of another
    listing."""
    if len(cursor) > MAX_CURSOR_CHARS or not _CURSOR.fullmatch(cursor):
        raise InvalidCursor(
            f"cursor is not one this API issued (base64url, at most {MAX_CURSOR_CHARS} characters); "
            "pass next_cursor back unchanged",
            field="cursor",
        )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor(
            "cursor is not one this API issued; pass next_cursor back unchanged", field="cursor"
        ) from None
    if not isinstance(data, dict) or data.get("k") != kind or "v" not in data:
        raise InvalidCursor(f"cursor does not belong to this listing ({kind})", field="cursor")
    return data["v"]


_GSI1SK = re.compile(r"[0-9]{15}#[A-Za-z0-9_-]{1,128}")


# --------------------------------------------------------------- task views


def _links(task_id: str) -> TaskLinks:
    return TaskLinks.for_task(task_id)


def owned(store: Storage, task_id: str, tenant: str) -> Task:
    """The task if ``tenant`` owns it; any other tenant's task is simply not found (404, no oracle)."""
    task = store.tasks.get(task_id)
    if task.tenant != tenant:
        raise TaskNotFound(f"no task {task_id!r}", field="task_id")
    return task


def children_summary(store: Storage, task: Task) -> ChildrenSummary:
    ids = [child for spawn in store.spawns.list(task.task_id) for child in spawn.children]
    if not ids:
        return ChildrenSummary(total=0, by_status={}, task_ids=[])
    counts = Counter(child.status.value for child in store.tasks.get_many(ids))
    return ChildrenSummary(total=len(ids), by_status=dict(sorted(counts.items())), task_ids=ids[:100])


def activity(store: Storage, task: Task, children: ChildrenSummary, question: str | None) -> str | None:
    """What the task is doing now, in words a person watching it wants."""
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
        return f"waiting for approval: {question}" if question else "paused"
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
        last = store.steps.last(task.task_id, upto=task.step)
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
    return "queued: waiting for a share of the full fleet; it starts when a slot frees"


def task_view(store: Storage, task: Task) -> TaskView:
    """The task as the API shows it: a function of its stored records only, never of the clock.

    Why: the console and ``watch`` poll with ETags (api/conditional.py), and a view that read
    the clock (an elapsed time "to now", a countdown) would differ on every poll, so a task
    that has not changed would never get its 304. Open intervals are therefore null while the
    task runs, and clients measure them from ``started_at``/``created_at`` themselves.
    """
    try:
        b = store.budgets.get(task.budget_id)
        money = None
        if b.cap_micros < NO_MONEY_CAP:
            money = MoneyView(
                cap_usd=_usd(b.cap_micros), used_usd=_usd(b.used_micros), known_usd=_usd(b.known_micros),
                unknown_usd=_usd(b.unknown_micros), reserved_usd=_usd(b.reserved_micros),
                available_usd=_usd(b.available_micros),
            )  # fmt: skip
        budget: BudgetView | None = BudgetView(
            cap=b.cap, used=b.used, known=b.known, unknown=b.unknown, reserved=b.reserved, available=b.available,
            cost_usd=str(b.cost_usd), money=money,
        )  # fmt: skip
    except TaskNotFound:
        budget = None
    children = children_summary(store, task)
    question = None
    pending_calls: list[PendingCall] = []
    if task.status is TaskStatus.PAUSED:
        pending = store.approvals.pending(task.task_id)
        question = pending.question if pending else None
        pending_calls = _pending_calls(store, task)
    end = task.finished_at
    sub = task.submission
    return TaskView(
        task_id=task.task_id,
        status=task.status,
        goal=sub.goal,
        provider=sub.provider,
        agent=sub.agent,
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
        activity=activity(store, task, children, question),
        retry=retry_view(task.retrying),
        lapsed_holds=[
            LapsedHoldView(tokens=hold.amount, usd=_usd(hold.micros), step=hold.step, epoch=epoch, until=hold.until)
            for epoch, hold in sorted(task.lapsed_holds.items())
        ],
        pending_approval=question,
        pending_calls=pending_calls,
        parent_id=task.parent_id,
        root_id=task.root_id,
        depth=task.depth,
        forked_from=task.forked_from,
        depends_on=task.submission.depends_on,
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


def _pending_calls(store: Storage, task: Task) -> list[PendingCall]:
    """The tool calls of the last committed turn: what a paused task will do once a person decides."""
    last = store.steps.last(task.task_id)
    if last is None or not isinstance(last.body, LLMStep):
        return []
    return [
        PendingCall(tool_use_id=use["id"], name=use["name"], input=use.get("input") or {})
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


def _usd(micros: int) -> str:
    return str((Decimal(micros) / 1_000_000).quantize(Decimal("0.000001")))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def task_summary(task: Task) -> TaskSummary:
    goal = task.submission.goal
    return TaskSummary(
        task_id=task.task_id,
        status=task.status,
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


METADATA_SCAN_LIMIT = 1000  # tasks one metadata search reads before it answers with a cursor
_METADATA_SCAN_PAGE = 100


def parse_metadata_filter(pairs: list[str]) -> dict[str, str]:
    """``?metadata=`` words as a dict; a word that is not ``key=value`` is a ValidationError naming ``metadata``."""
    try:
        return parse_pairs(pairs)
    except BadPair as exc:
        raise ValidationError(f"metadata: {exc}", field="metadata") from None


def task_page(
    store: Storage,
    tenant: str,
    *,
    limit: int,
    cursor: str | None,
    status: TaskStatus | None,
    include_children: bool,
    metadata: dict[str, str] | None = None,
) -> TaskPage:
    """A page of the tenant's tasks, newest first. With ``metadata`` (every pair must match) the
    tasks are read in pages and filtered here, since metadata is not on the index: at most
    ``METADATA_SCAN_LIMIT`` are read per call, so a page may hold fewer matches than ``limit``
    while ``next_cursor`` says more may follow (the same contract as a status filter)."""
    after = None
    if cursor:
        after = decode_cursor("tasks", cursor)
        if not isinstance(after, str) or not _GSI1SK.fullmatch(after):
            raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    if not metadata:
        tasks, last = store.tasks.list_for_tenant(
            tenant, limit=limit, after=after, status=status, roots_only=not include_children
        )
        return TaskPage(
            tasks=[task_summary(t) for t in tasks if t.tenant == tenant],
            next_cursor=encode_cursor("tasks", last) if last else None,
        )
    found: list[Task] = []
    last = after
    # At most METADATA_SCAN_LIMIT tasks read, in listing calls of a page each (with a status
    # filter a call's index reads are bounded too), however rare the match.
    for _ in range(max(1, METADATA_SCAN_LIMIT // _METADATA_SCAN_PAGE)):
        tasks, last = store.tasks.list_for_tenant(
            tenant, limit=_METADATA_SCAN_PAGE, after=last, status=status, roots_only=not include_children
        )
        for task in tasks:
            meta = task.submission.metadata
            if task.tenant == tenant and all(meta.get(k) == v for k, v in metadata.items()):
                found.append(task)
                if len(found) == limit:  # go on after this one next time
                    return TaskPage(
                        tasks=[task_summary(t) for t in found],
                        next_cursor=encode_cursor("tasks", keys.tenant_index_sk(task.created_at, task.task_id)),
                    )
        if last is None:
            break
    return TaskPage(tasks=[task_summary(t) for t in found], next_cursor=encode_cursor("tasks", last) if last else None)


def task_result(task: Task) -> TaskResult:
    if not task.status.terminal:
        raise NotFinished(
            f"task {task.task_id} is {task.status.value}; its result is ready when it ends (GET /tasks/{task.task_id})",
            field="task_id",
        )
    output = None
    if task.submission.output_schema is not None and task.status is TaskStatus.SUCCEEDED and task.result:
        output = json.loads(task.result)  # the engine stores a valid answer as JSON, and only that
    return TaskResult(
        task_id=task.task_id,
        status=task.status,
        complete=task.status is TaskStatus.SUCCEEDED,
        result=task.result,
        output=output,
        error=task.error,
        finished_at=task.finished_at,
    )


# -------------------------------------------------------------------- trace

Key = tuple[float, int, int, int]  # (time, rank, step, index): the order events are returned in


def _cut(text: str) -> tuple[str, bool]:
    return (text, False) if len(text) <= TRACE_TEXT_CHARS else (text[:TRACE_TEXT_CHARS], True)


def _llm_event(
    number: int, epoch: int, at: float, body: LLMStep | CompactStep, *, orphan: OrphanReason | None = None
) -> LLMCallEvent:
    text, cut = _cut("\n".join(b.get("text", "") for b in body.content if b.get("type") == "text"))
    u = body.usage
    return LLMCallEvent(
        at=at,
        step=number,
        epoch=epoch,
        model=body.model,
        started_at=body.started_at,
        duration_ms=body.duration_ms,
        tokens=LLMTokens(
            input=u.input_tokens,
            output=u.output_tokens,
            cache_creation=u.cache_creation_input_tokens,
            cache_read=u.cache_read_input_tokens,
            total=u.total,
        ),
        reserved_tokens=body.reserved_tokens,
        cost_usd=str(body.cost_usd),
        stop_reason=body.stop_reason,
        attempts=body.attempts,
        text=text,
        tool_calls=[t["name"] for t in body.tool_uses()] if isinstance(body, LLMStep) else [],
        purpose="turn" if isinstance(body, LLMStep) else "compaction",
        batched=body.batched,
        provider=body.provider,
        fallback_from=body.fallback_from,
        orphan=orphan is not None,
        orphan_reason=orphan,
        truncated=cut,
    )


def _message_event(record: StepRecord, m: UserMessage) -> MessageEvent:
    text, cut = _cut(m.text)
    return MessageEvent(at=record.committed_at, step=record.number, epoch=record.epoch, message_id=m.message_id,
                        seq=m.seq, text=text, sent_at=m.sent_at, truncated=cut)  # fmt: skip


def _step_events(record: StepRecord, inputs: dict[str, dict[str, Any]]) -> list[tuple[Key, Any]]:
    body = record.body
    at = record.committed_at
    if isinstance(body, LLMStep | CompactStep):
        return [((at, 1, record.number, 0), _llm_event(record.number, record.epoch, at, body))]
    if isinstance(body, MessageStep):
        return [((at, 1, record.number, i), _message_event(record, m)) for i, m in enumerate(body.messages)]
    assert isinstance(body, ToolsStep)
    events: list[tuple[Key, Any]] = []
    for i, r in enumerate(body.results):
        output, cut = _cut(r.content)
        events.append(
            (
                (at, 1, record.number, i),
                ToolCallEvent(
                    at=at,
                    step=record.number,
                    epoch=record.epoch,
                    tool_use_id=r.tool_use_id,
                    name=r.name,
                    input=inputs.get(r.tool_use_id),
                    output=output,
                    is_error=r.is_error,
                    status=r.status,
                    side_effects=r.side_effects,
                    started_at=r.started_at,
                    duration_ms=r.duration_ms,
                    truncated=cut,
                ),
            )
        )
    return events


def _fallback_events(record: StepRecord) -> list[tuple[Key, Any]]:
    """A fallback that took over at this step, as a transition just before its LLM call (the
    step records the switch; the event stream carries it on the step's ``agent.message``)."""
    body = record.body
    if not isinstance(body, LLMStep | CompactStep) or body.fallback_from is None:
        return []
    note = body.fallback_from
    detail = {"from": {"provider": note.provider, "model": note.model}, "reason": note.reason,
              "to": {"provider": body.provider, "model": body.model}, "step": record.number}  # fmt: skip
    at = record.committed_at
    return [((at, 1, record.number, -2), TransitionEvent(at=at, event="fallback", epoch=record.epoch, detail=detail))]


def step_views(
    record: StepRecord, inputs: dict[str, dict[str, Any]]
) -> list[LLMCallEvent | ToolCallEvent | MessageEvent]:
    """A committed step as the trace shows it: its LLM call, or each of its tool calls
    (``inputs``: the input of each tool call by id, from the LLM step before)."""
    return [view for _, view in _step_events(record, inputs)]


_MARK_STATUS = {"follow_up": TaskStatus.QUEUED, "interrupted": TaskStatus.IDLE}


def _side_events(store: Storage, task: Task) -> list[tuple[Key, Any]]:
    """Transitions (from META, approvals and spawns) and orphan LLM calls: the few events that are
    not steps, all read at once."""
    events: list[tuple[Key, Any]] = []
    first: Literal["forked", "created"] = "forked" if task.forked_from else "created"
    detail = {"forked_from": task.forked_from} if task.forked_from else {"priority": task.submission.priority}
    # always first: a fork's copied steps keep their source's (earlier) commit times
    events.append(
        ((0.0, 0, 0, 0), TransitionEvent(at=task.created_at, event=first, status=TaskStatus.QUEUED, detail=detail))
    )
    if task.submission.depends_on:  # it waited for these before its first claim
        events.append(
            (
                (0.0, 0, 0, 1),
                TransitionEvent(at=task.created_at, event="blocked", status=TaskStatus.BLOCKED,
                                detail={"depends_on": task.submission.depends_on}),
            )
        )  # fmt: skip
    for i, claim in enumerate(store.tasks.claims(task.task_id)):
        at = claim.at
        events.append(
            (
                (at, 0, 0, i + 1),
                TransitionEvent(
                    at=at,
                    event="claimed",
                    status=TaskStatus.RUNNING,
                    worker=claim.worker,
                    epoch=claim.epoch,
                    detail={} if claim.takeover is None else {"takeover": claim.takeover},
                ),
            )
        )
    for i, a in enumerate(store.approvals.list(task.task_id)):
        asked = a.asked_at
        events.append(
            (
                (asked, 0, 0, 10_000 + i),
                TransitionEvent(
                    at=asked, event="approval_requested", status=TaskStatus.PAUSED, detail={"question": a.question}
                ),
            )
        )
        if a.decided_at:
            decided = a.decided_at
            events.append(
                (
                    (decided, 0, 0, 20_000 + i),
                    TransitionEvent(
                        at=decided,
                        event="approval_decided",
                        status=TaskStatus.QUEUED,
                        detail={"decision": a.state, "by": a.decided_by, "note": a.note or ""},
                    ),
                )
            )
    for i, spawn in enumerate(store.spawns.list(task.task_id)):
        at = spawn.created_at
        events.append(
            (
                (at, 2, 0, 30_000 + i),
                TransitionEvent(
                    at=at,
                    event="spawned",
                    status=TaskStatus.WAITING,
                    detail={"children": spawn.children, "state": spawn.state},
                ),
            )
        )
    # A conversation's turns that are not steps: follow-ups, interrupts and the stops they caused.
    for i, mark in enumerate(store.messages.marks(task.task_id)):
        said = {"after_step": mark.after_step, **({"message": mark.message} if mark.message is not None else {})}
        events.append(
            (
                (mark.at, 0, 0, 50_000 + i),
                TransitionEvent(at=mark.at, event=mark.kind, status=_MARK_STATUS.get(mark.kind), detail=said),
            )
        )
    for orphan in store.steps.orphans(task.task_id):
        number, epoch, call = orphan.number, orphan.epoch, orphan.call
        at = call.started_at + call.duration_ms / 1000
        events.append(((at, 1, number, -1), _llm_event(number, epoch, at, call, orphan=orphan.reason)))
    if task.retry is not None:  # the latest retry (earlier ones are replaced by it)
        r = task.retry
        view = retry_view(r)
        assert view is not None
        events.append(
            (
                (r.at, 2, 0, 40_000),
                TransitionEvent(at=r.at, event="retry_scheduled", detail=view.model_dump()),
            )
        )
    if task.status.terminal and task.finished_at:
        events.append(
            (
                (task.finished_at, 3, 0, 0),
                TransitionEvent(
                    at=task.finished_at,
                    event="finished",
                    status=task.status,
                    detail={"error": task.error} if task.error else {},
                ),
            )
        )
    return events


def _trace_cursor(task: Task, value: Any) -> tuple[Key, int]:
    """(the last event's key, the step to read from) of a trace cursor of ``task``, checked as
    strictly as an event id (``api/events.py``): another task's cursor, or one naming what this
    trace cannot hold (a negative or non-finite time, a step past the task's), is ``InvalidCursor``,
    where it was read as a valid place (an empty page, or the whole trace again)."""
    bad = InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    if not isinstance(value, dict) or set(value) != {"task", "after", "step"}:
        raise bad
    if value["task"] != task.task_id:
        raise InvalidCursor(f"cursor is another task's trace cursor, not task {task.task_id}'s", field="cursor")
    key, step = value["after"], value["step"]
    if not (isinstance(key, list) and len(key) == 4 and all(type(n) is int for n in [*key[1:], step])):
        raise bad  # type(): a JSON true is not a number
    at, rank, number, index = key
    last = task.step + 1  # an orphan call's number: the step it never committed
    if not (
        type(at) in (int, float)
        and math.isfinite(at)
        and 0 <= at <= time.time() + 86_400
        and 0 <= rank <= 3
        and 0 <= number <= last
        and -1 <= index <= 1_000_000
        and 1 <= step <= max(1, last)
    ):
        raise InvalidCursor(
            f"cursor names a place task {task.task_id}'s trace does not have; pass next_cursor back unchanged",
            field="cursor",
        )
    return (float(at), rank, number, index), step


def trace_page(store: Storage, task: Task, *, limit: int, cursor: str | None) -> TracePage:
    """A page of the task's events in commit order.

    Steps are read from where the previous page stopped (never the whole history); the other
    events are few and read whole. The cursor holds the last event's sort key and the step it
    came from.
    """
    after: Key | None = None
    step_from = 1
    if cursor:
        after, step_from = _trace_cursor(task, decode_cursor("trace", cursor))
    want = limit + 2
    steps = store.steps.range(task.task_id, max(1, step_from - 1), want, upto=task.step)
    exhausted = len(steps) < want
    inputs = {
        use["id"]: use.get("input") or {}
        for record in steps
        if isinstance(record.body, LLMStep)
        for use in record.body.tool_uses()
    }
    events: list[tuple[Key, Any]] = []
    for record in steps:
        events.extend(_step_events(record, inputs))
        events.extend(_fallback_events(record))
    horizon: Key | None = None if exhausted else max(k for k, _ in events)
    events.extend(_side_events(store, task))
    events.sort(key=lambda e: e[0])
    ready = [e for e in events if (after is None or e[0] > after) and (horizon is None or e[0] <= horizon)]
    page = ready[:limit]
    more = len(ready) > limit or not exhausted
    next_cursor = None
    if page and more:
        steps_seen = [
            k[2] for k, ev in page if isinstance(ev, ToolCallEvent) or (isinstance(ev, LLMCallEvent) and not ev.orphan)
        ]
        last_step = max([*steps_seen, step_from])
        next_cursor = encode_cursor("trace", {"task": task.task_id, "after": list(page[-1][0]), "step": last_step})
    return TracePage(task_id=task.task_id, events=[ev for _, ev in page], next_cursor=next_cursor)
