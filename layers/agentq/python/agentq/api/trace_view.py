"""A task's trace as the API shows it (``GET /tasks/{id}/trace``): its committed steps' LLM
calls, tool calls and messages, with the transitions and orphan calls that are not steps, in
commit order, a page at a time: at most ``limit`` events, and fewer once they pass
``TRACE_PAGE_BYTES`` as JSON (never none), so a page always fits one Lambda answer."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

from agentq.api.cursors import InvalidCursor, decode_cursor, encode_cursor, fitting
from agentq.api.models import (
    TRACE_PAGE_BYTES,
    TRACE_TEXT_CHARS,
    GradeEvent,
    LLMCallEvent,
    LLMTokens,
    MessageEvent,
    ToolCallEvent,
    TracePage,
    TransitionEvent,
)
from agentq.api.task_view import retry_view
from agentq.core.models import (
    CompactStep,
    GradeStep,
    LLMStep,
    MessageStep,
    StepRecord,
    Task,
    TaskStatus,
    ToolsStep,
    UserMessage,
)
from agentq.core.records import OrphanReason
from agentq.storage.container import Storage

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
    if isinstance(body, GradeStep):
        return [((at, 1, record.number, 0), grade_event(record, body))]
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
                    policy=r.policy,
                ),
            )
        )
    return events


def grade_event(record: StepRecord, body: GradeStep) -> GradeEvent:
    u = body.usage
    return GradeEvent(
        at=record.committed_at, step=record.number, epoch=record.epoch, attempt=body.attempt,
        max_attempts=body.max_attempts, score=body.score, bar=body.bar, passed=body.passed, feedback=body.feedback,
        error=body.error, checks=[c.model_dump(mode="json", exclude_none=True) for c in body.checks],
        tokens=LLMTokens(input=u.input_tokens, output=u.output_tokens, cache_creation=u.cache_creation_input_tokens,
                         cache_read=u.cache_read_input_tokens, total=u.total),
        cost_usd=str(body.cost_usd), started_at=body.started_at, duration_ms=body.duration_ms, replayed=body.replayed,
    )  # fmt: skip


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
) -> list[LLMCallEvent | ToolCallEvent | MessageEvent | GradeEvent]:
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
                    at=asked,
                    event="approval_requested",
                    status=TaskStatus.PAUSED,
                    detail={"question": a.question, "approver": a.approver},
                ),
            )
        )
        if a.decided_at:
            decided = a.decided_at
            user = {"by_user": a.decided_by_user} if a.decided_by_user is not None else {}
            events.append(
                (
                    (decided, 0, 0, 20_000 + i),
                    TransitionEvent(
                        at=decided,
                        event="approval_decided",
                        status=TaskStatus.QUEUED,
                        detail={"decision": a.state, "by": a.decided_by, "note": a.note or "", **user},
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
    first = ready[:limit]  # and fewer once they pass TRACE_PAGE_BYTES (a tool call's input is kept whole)
    page = first[: fitting((len(json.dumps(ev.model_dump(mode="json"))) for _, ev in first), TRACE_PAGE_BYTES)]
    more = len(ready) > len(page) or not exhausted
    next_cursor = None
    if page and more:
        steps_seen = [
            k[2] for k, ev in page if isinstance(ev, ToolCallEvent) or (isinstance(ev, LLMCallEvent) and not ev.orphan)
        ]
        last_step = max([*steps_seen, step_from])
        next_cursor = encode_cursor("trace", {"task": task.task_id, "after": list(page[-1][0]), "step": last_step})
    return TracePage(task_id=task.task_id, user=task.user, events=[ev for _, ev in page], next_cursor=next_cursor)
