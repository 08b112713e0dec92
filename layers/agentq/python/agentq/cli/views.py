"""How the CLI shows tasks to a person: the status block, the task table, the trace tree and
the live ``watch`` view (rich). Every function takes the API's models and returns text or a
rich renderable; nothing here talks to the API."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from agentq.api.models import (
    GradeView,
    LLMCallEvent,
    MessageEvent,
    RetryView,
    TaskSummary,
    TaskView,
    ToolCallEvent,
    TransitionEvent,
)
from agentq.core.models import TaskStatus

STATUS_STYLE = {
    "queued": "cyan",
    "blocked": "dim cyan",
    "running": "bold blue",
    "waiting": "magenta",
    "paused": "yellow",
    "idle": "yellow",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "red",
    "cost_exceeded": "bold red",
    "timed_out": "red",
    "failed_outcome": "bold red",
}


# Why a call was paid for and never committed, as the trace says it (``LLMCallEvent.orphan_reason``).
ORPHAN_LABELS = {
    "interrupted": "interrupted: answer discarded, never committed; paid",
    "lease_lost": "orphan: lease lost, never committed; paid",
    "timed_out": "timed out: answered after the task's timeout cut it, never committed; paid",
    "commit_failed": "commit failed: the store failed its write, never committed; paid",
}


def n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def status_text(status: TaskStatus | str) -> Text:
    value = status.value if isinstance(status, TaskStatus) else str(status)
    return Text(value, style=STATUS_STYLE.get(value, ""))


def children_line(view: TaskView) -> str:
    c = view.children
    if not c.total:
        return "none"
    return f"{c.total}: " + ", ".join(f"{count} {status}" for status, count in c.by_status.items())


def budget_line(view: TaskView, *, now: float | None = None) -> str:
    if view.budget is None:
        return f"{n(view.tokens.total)} tokens used of {n(view.tokens.budget)}"
    b = view.budget
    pct = 100 * b.used / b.cap if b.cap else 0
    return f"{n(b.used)} / {n(b.cap)} tokens ({pct:.1f}%){unknown_text(b.unknown)}{reserved_text(view, now=now)}"


def unknown_text(unknown: int) -> str:
    """The part of ``used`` no provider reported: calls whose outcomes no one learned, each
    counted at its hold (the cap must count them; a bill need not)."""
    return f" ({n(unknown)} of them unknown: calls whose outcome no worker learned)" if unknown else ""


def reserved_text(view: TaskView, *, now: float | None = None) -> str:
    """What the budget holds back, by why: calls in flight (``reserved``), and the holds kept
    for calls of workers that lost the lease, which may still complete and be charged: those
    are said as such, with when they go back, since a finished task can show them for minutes."""
    assert view.budget is not None
    lapsed = sum(h.tokens for h in view.lapsed_holds)
    parts = []
    if view.budget.reserved - lapsed > 0:
        parts.append(f"{n(view.budget.reserved - lapsed)} reserved")
    if lapsed:
        until = max((h.until for h in view.lapsed_holds if h.until is not None), default=None)
        held = f"{n(lapsed)} held for a call a lost worker may still complete"
        if until is not None:
            held += ", returned now" if now is not None and until <= now else f", until {when(until)}"
        parts.append(held)
    return "".join(f", {part}" for part in parts)


def money_line(view: TaskView) -> str:
    """The money budget, when the task has one: ``; budget $used / $cap (+ $reserved held)``."""
    money = view.budget.money if view.budget else None
    if money is None:
        return ""
    held = f" (+ ${money.reserved_usd} held)" if money.reserved_usd.strip("0.") else ""
    unknown = f" (${money.unknown_usd} of it unknown)" if Decimal(money.unknown_usd) else ""
    return f"; budget ${money.used_usd} / ${money.cap_usd}{unknown}{held}"


def status_block(view: TaskView) -> str:
    """``agentq status``: one fact a line, stable labels a person or a grep can read."""
    lat = view.latency
    now = time.time()
    lines = [
        f"task      {view.task_id}",
        f"status    {view.status.value}",
        f"goal      {cut(view.goal, 100)}",
        f"model     {model_text(view)}   priority {view.priority}",
        f"steps     {view.step} ({view.llm_steps} LLM turns of at most {view.max_steps})",
        f"tokens    {n(view.tokens.input)} in, {n(view.tokens.output)} out; budget {budget_line(view, now=now)}",
        f"cost      ${view.cost_usd}"
        + (f" (tree ${view.budget.cost_usd})" if view.budget and view.budget.cost_usd != view.cost_usd else "")
        + money_line(view),
        f"children  {children_line(view)}",
        f"created   {when(view.created_at)}   started {when(view.started_at)}   finished {when(view.finished_at)}",
        f"latency   pickup {secs(lat.pickup_seconds)}, resumes {lat.resumes}, run {secs(lat.run_seconds)}, total {secs(lat.total_seconds)}",
    ]
    if view.fallbacks:
        lines.append("fallbacks " + ", ".join(f"{c.provider} / {c.model}" for c in view.fallbacks))
    if view.parent_id:
        lines.append(f"parent    {view.parent_id} (depth {view.depth})")
    if view.forked_from:
        lines.append(f"forked    from {view.forked_from.get('task_id')} at step {view.forked_from.get('step')}")
    if view.activity:
        lines.append(f"activity  {view.activity}")
    if view.pending_tool_use_id:
        lines.append(f"held      {view.pending_tool_use_id} (agentq approve|reject --tool-use-id names it)")
    if view.retry:
        lines.append(f"retry     {retry_line(view.retry, now=now)}")
    if view.grade:
        lines.append(f"grade     {grade_line(view.grade)}")
    if view.error:
        lines.append(f"error     {view.error.get('code', '')}: {view.error.get('message', '')}")
    if view.result:
        lines.append("result    " + cut(view.result, 300))
    return "\n".join(lines)


def held_call(view: TaskView) -> str:
    """What ``agentq approve|reject`` decides, shown before it sends the decision: the held
    call's name (the decision sends it, so it decides this call or nothing), the question, and
    the turn's calls as the model asked for them (the held one marked: the one the view marks
    ``held``, as the name is ``agentq-<step>-<id>`` for an id an earlier call had), each on a
    line, cut.
    The model wrote all of it: a character a terminal would act on is shown as ``?``."""
    lines = [f"held call {view.pending_tool_use_id}: {cut(view.pending_approval or '', 300)}"]
    for c in view.pending_calls:
        mark = "->" if c.held else "  "
        lines.append(f"  {mark} {c.name} {cut(json.dumps(c.input, ensure_ascii=False), 300)}")
    return "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in "\n".join(lines))


def grade_line(grade: GradeView) -> str:
    """The latest grade against the task's outcome, and what grading cost (counted in the cost above)."""
    verdict = (
        f"grader failed ({grade.error.get('code')})" if grade.error else "passed" if grade.passed else "below the bar"
    )
    score = "-" if grade.score is None else f"{grade.score:.2f}"
    line = f"{verdict}: {score} (bar {grade.bar:.2f}), attempt {grade.attempt} of {grade.max_attempts}"
    if grade.tokens_in or grade.tokens_out:
        line += f"; grading {n(grade.tokens_in + grade.tokens_out)} tokens, ${grade.cost_usd}"
    return line + (f"; feedback: {cut(grade.feedback, 200)}" if grade.feedback else "")


def model_text(view: TaskView) -> str:
    """The model that answers the task now: a fallback that took over first, then the task's own."""
    own = f"{view.provider} / {view.model}"
    if view.answered_by is None:
        return own
    return f"{view.answered_by.provider} / {view.answered_by.model} (fallback; the task's own: {own})"


def fallback_text(note: Any, provider: str | None, model: str) -> str:
    """``fallback: X took over from Y (reason)``: a step whose model is not the one its turn wanted."""
    return f"fallback: {provider or '?'} / {model} took over from {note.provider} / {note.model} ({note.reason})"


def retry_line(retry: RetryView, *, now: float | None = None) -> str:
    """Which attempt failed and how, and when the next one is (with how far off, given ``now``)."""
    e = retry.error
    if retry.scope == "deferral":  # nothing failed: the call was put off (an open circuit, a rate limit)
        line = f"deferred: {e.get('code')}: {cut(str(e.get('message') or ''), 160)}; next try {when(retry.next_attempt_at)}"
    else:
        who = "model call" if retry.scope == "call" else "delivery"
        status = f" HTTP {e.get('status_code')}" if e.get("status_code") else ""
        line = (
            f"{who} attempt {retry.attempt} of {retry.max_attempts} failed: {e.get('code')}{status}: "
            f"{cut(str(e.get('message') or ''), 160)}; next try {when(retry.next_attempt_at)}"
        )
    if now is None:
        return line
    return line + (f" (in {secs(retry.next_attempt_at - now)})" if retry.next_attempt_at > now else " (due now)")


def task_table(tasks: list[TaskSummary]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("TASK", "STATUS", "STEP", "TOKENS", "COST", "CREATED"):
        table.add_column(column, no_wrap=True, min_width=len(column))
    table.add_column("GOAL", overflow="fold", ratio=1)
    for t in tasks:
        table.add_row(
            t.task_id,
            status_text(t.status),
            str(t.step),
            n(t.tokens_total),
            f"${t.cost_usd}",
            when(t.created_at),
            cut(t.goal, 60),
        )
    return table


# -------------------------------------------------------------------- trace


def _json_preview(value: Any, width: int) -> str:
    return cut(json.dumps(value, separators=(",", ":"), default=str), width)


def event_line(event: Any, origin: float) -> Text:
    """One trace event in a line: what happened, when (from submission), what it cost."""
    at = Text.assemble((f"+{event.at - origin:7.2f}s ", "dim"))
    if isinstance(event, TransitionEvent):
        d = event.detail
        what = {
            "created": f"created ({d.get('priority', 'normal')} priority)",
            "forked": f"forked from {(d.get('forked_from') or {}).get('task_id')} at step {(d.get('forked_from') or {}).get('step')}",
            "claimed": f"claimed by {event.worker} (epoch {event.epoch}{', resumed' if d.get('takeover') else ''})",
            "follow_up": f"follow-up: message {d.get('message')} reopened the conversation",
            "interrupt_requested": "interrupt asked for" + (f" by message {d['message']}" if d.get("message") else ""),
            "interrupted": "interrupted: idle until the next message",
            "approval_requested": f"approval requested: {cut(str(d.get('question') or ''), 80)}",
            "approval_decided": f"approval {d.get('decision')} by {d.get('by')}"
            + (f" (end user {d['by_user']})" if d.get("by_user") else "")
            + (f": {cut(str(d.get('note')), 60)}" if d.get("note") else ""),
            "spawned": f"spawned {len(d.get('children') or [])} sub-agents",
            "fallback": f"fallback: {(d.get('to') or {}).get('provider')} / {(d.get('to') or {}).get('model')} took "
            f"over from {(d.get('from') or {}).get('provider')} / {(d.get('from') or {}).get('model')} "
            f"({d.get('reason')})",
            "finished": f"finished: {event.status.value if event.status else '?'}"
            + (f" ({(d.get('error') or {}).get('code')})" if d.get("error") else ""),
        }.get(event.event, event.event)
        if event.event == "retry_scheduled":
            what = f"retry: {retry_line(RetryView.model_validate(d))}"
        style = "bold" if event.event in ("claimed", "finished") else ""
        if event.event == "finished" and event.status is not None:
            style = STATUS_STYLE.get(event.status.value, style)
        return Text.assemble(at, (what, style))
    if isinstance(event, LLMCallEvent):
        t = event.tokens
        if event.purpose == "compaction":  # its text is a summary the conversation goes on from, not an answer
            calls = " → compaction: the conversation goes on from its summary"
        elif event.tool_calls:
            calls = f" → {', '.join(event.tool_calls)}"
        else:
            calls = " → answer" if event.stop_reason == "end_turn" else ""
        line = Text.assemble(
            at,
            (f"step {event.step} ", "bold"),
            f"LLM {event.provider + '/' if event.provider else ''}{event.model} · {n(t.input)} in / {n(t.output)} out tokens · {event.duration_ms:,} ms · ${event.cost_usd}{calls}",
        )
        if event.fallback_from is not None:
            line.append(f"  [{fallback_text(event.fallback_from, event.provider, event.model)}]", style="yellow")
        if event.orphan:
            line.append(f"  [{ORPHAN_LABELS.get(event.orphan_reason or '', 'never committed; paid')}]", style="yellow")
        return line
    if isinstance(event, ToolCallEvent):
        style = "red" if event.is_error else ""
        return Text.assemble(
            at,
            (f"tool {event.name}", "bold"),
            (
                f" · {event.duration_ms:,} ms · {event.status}{' · side effect' if event.side_effects else ''}"
                f" · in {_json_preview(event.input, 60)} → {cut(event.output, 80)!r}",
                style,
            ),
        )
    if isinstance(event, MessageEvent):
        return Text.assemble(at, (f"step {event.step} ", "bold"), ("you: ", "bold cyan"), repr(cut(event.text, 100)))
    return Text.assemble(at, str(event))


def trace_tree(task_id: str, view: TaskView | None, events: list[Any]) -> Tree:
    """The trace as a tree: each worker claim holds what happened from it to the next claim (the
    LLM calls it made, each LLM call the tool calls of its turn, and the transitions meanwhile:
    an interrupt asked for, an approval asked and decided, a retry), so the lines read in time
    order from top to bottom; the claims and the end stand at the top."""
    origin = view.created_at if view else (events[0].at if events else time.time())
    label = Text.assemble((f"task {task_id}", "bold"))
    if view:
        label.append(" ")
        label.append_text(status_text(view.status))
        label.append(
            f" · {view.step} steps · {n(view.tokens.total)} tokens · ${view.cost_usd} · {secs(view.latency.total_seconds)}"
        )
    root = Tree(label)
    session: Tree | None = None  # the claim running now
    turn: tuple[int, Tree] | None = None  # its latest LLM call (step, node), while nothing came after it
    for event in events:
        line = event_line(event, origin)
        if isinstance(event, TransitionEvent) and event.event == "fallback":
            continue  # the LLM call it led to says it, under its claim
        if isinstance(event, TransitionEvent) and event.event in ("claimed", "finished"):
            node = root.add(line)
            session = node if event.event == "claimed" else None
            turn = None
        elif isinstance(event, LLMCallEvent):
            turn = (event.step, (session or root).add(line))
        elif isinstance(event, ToolCallEvent) and turn is not None and turn[0] == event.step - 1:
            turn[1].add(line)  # a tool call of that turn
        else:  # a transition meanwhile, a message, a tool call whose turn is not the latest line
            (session or root).add(line)
            turn = None
    return root


# -------------------------------------------------------------------- watch


def _bar(completed: float, total: float, label: str, *, warn_at: float = 0.9) -> Table:
    ratio = completed / total if total else 0
    style = "red" if ratio >= warn_at else "green"
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=32)
    grid.add_column()
    grid.add_row(
        ProgressBar(
            total=max(total, 1), completed=min(completed, total), width=32, complete_style=style, finished_style=style
        ),
        label,
    )
    return grid


def watch_view(view: TaskView, recent: list[Text]) -> RenderableType:
    """The live view of ``agentq watch``: steps and tokens as bars, children, what it is doing."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", justify="right")
    grid.add_column()
    grid.add_row("status", Text.assemble(status_text(view.status), (f"   {model_text(view)}", "dim")))
    grid.add_row("goal", cut(view.goal, 90))
    grid.add_row(
        "steps",
        _bar(
            view.llm_steps,
            view.max_steps,
            f"{view.llm_steps} / {view.max_steps} LLM turns (step {view.step})",
            warn_at=1.0,
        ),
    )
    used = view.budget.used if view.budget else view.tokens.total
    cap = view.budget.cap if view.budget else view.tokens.budget
    grid.add_row("tokens", _bar(used, cap, budget_line(view, now=time.time())))
    grid.add_row("cost", f"${view.cost_usd}{money_line(view)}")
    grid.add_row("children", children_line(view))
    activity = view.activity or (f"finished {view.status.value}" if view.status.terminal else "-")
    grid.add_row("now", Text(activity, style="italic"))
    if view.live_text:  # a streamed call in flight, as far as the last heartbeat saw it
        grid.add_row("writing", Text("…" + view.live_text[-240:].replace("\n", " "), style="dim"))
    lat = view.latency
    elapsed = lat.total_seconds if lat.total_seconds is not None else time.time() - view.created_at
    grid.add_row("timing", f"pickup {secs(lat.pickup_seconds)} · resumes {lat.resumes} · elapsed {secs(elapsed)}")
    if view.retry:
        grid.add_row("retry", Text(retry_line(view.retry, now=time.time()), style="yellow"))
    if view.error:
        grid.add_row("error", Text(f"{view.error.get('code', '')}: {view.error.get('message', '')}", style="red"))
    parts: list[RenderableType] = [grid]
    if recent:
        parts.append(Text("recent", style="bold"))
        parts.extend(recent)
    return Panel(Group(*parts), title=f"agentq watch {view.task_id}", title_align="left")
