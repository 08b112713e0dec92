"""Operations people perform on tasks: cancel, approve/reject, raise a budget, fork.

Core functions over the store and the queues, shared by the API and the CLI. Each one
checks first and writes second, so a refused operation changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from agentq.control.subtrees import Ending, end_tree, subtree
from agentq.control.validation import check_submission, parse_submission
from agentq.core.agents import DEFINED_BY_AGENT, DEFINED_CONSTRAINTS
from agentq.core.call_keys import OWN_KEYS
from agentq.core.endusers import NotTheApprover
from agentq.core.errors import IllegalTransition, TaskNotFound, ValidationError
from agentq.core.models import LLMStep, StepRecord, Task, TaskStatus, TaskSubmission, asks_for_calls
from agentq.core.pricing import micros
from agentq.core.records import ApprovalRecord
from agentq.core.stops import ScopeStopped, stop_covering
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.budget_items import BudgetRaise
from agentq.storage.container import Storage
from agentq.storage.running_slots import RunningSlots

log = logging.getLogger("agentq.control")

__all__ = ["cancel", "decide", "fork", "owned_task", "planned_raise", "raise_budget", "subtree"]


def owned_task(store: Storage, task_id: str, tenant: str | None) -> Task:
    """The task, if it exists and belongs to ``tenant``: another tenant's task is not found."""
    task = store.tasks.get(task_id)
    if tenant is not None and task.tenant != tenant:
        raise TaskNotFound(f"no task {task_id!r}", field="task_id")
    return task


def cancel(
    store: Storage,
    task_id: str,
    *,
    tenant: str | None = None,
    fanout: Any = None,
    reason: str = "cancelled on request",
    queues: TaskQueues | None = None,
    slots: RunningSlots | None = None,
    fenced: Mapping[str, Task] | None = None,
) -> list[str]:
    """Cancel a task and its whole subtree; returns the ids that were cancelled. A task that has
    ended, or ends by itself before its own transition, is ``IllegalTransition`` (a 409).

    Workers running any of them stop at their next step boundary (their fenced commit finds the
    task no longer running); children not started yet never start (their message finds them
    cancelled); fan-out executions are stopped where the endpoint supports it. A child a running
    task spawned after the tree was read is found by reading it again once the moves are made,
    and cancelled in turn, its execution stopped (the spawn turn starts none for a task moved
    meanwhile: it checks its fence first, ``core.engine._spawn``). Partial results are kept, and
    every child's budget is settled into its parent's, leaves first, so the root ledger closes.

    A task cancelled ``queued`` while admitted gives its slots back here and wakes the next
    waiters (``slots``: the running slots with the deployment's default limit and fleet
    capacity; default ``store.slots``), first, before the budgets are folded and the endings
    follow, which may raise. Its message, when it has one, would do it too, but a task the
    fleet's waker admitted and could not send has none, and the sweeper never lists a task that
    ended: its slots would be held for good.

    ``fenced``: tasks of the tree the caller moved to ``cancelled`` already (a stop fences its
    whole scope first, ``control.stops``), as they were before: they count as cancelled here and
    get every consequence (slots, budgets, endings), without a partial result.

    The walk is ``control.subtrees.end_tree``'s, which a sub-agent timed out by its parent's
    fan-out gets too (``subtrees.time_out_subagent``).
    """
    fenced = fenced or {}
    # A fenced task was read by the caller, of its tenant (one read fewer a tree, for a stop).
    task = fenced[task_id] if task_id in fenced else owned_task(store, task_id, tenant)
    if task.status.terminal and task_id not in fenced:
        raise IllegalTransition(f"task {task_id} is already {task.status.value}", field="task_id")
    ending = Ending(TaskStatus.CANCELLED, {"code": "cancelled", "message": reason})
    cancelled = end_tree(store, task, ending, ending, fanout=fanout, queues=queues, slots=slots, fenced=fenced)
    if task_id not in cancelled:  # its own end won the race: the same as a moment later (409)
        _root_ended(store, task_id, len(cancelled))
    return cancelled


def _root_ended(store: Storage, task_id: str, others: int) -> None:
    """The task to cancel ended by itself between its read and its transition: a cancel that
    cancelled nothing of what was asked is refused as one sent a moment later is (409, naming its
    status now), never a 200 with an empty list the caller takes for success. The sub-agents it
    did cancel are said, their consequences already taken above."""
    now = store.tasks.get(task_id).status.value
    also = f" ({others} of its sub-agents were cancelled)" if others else ""
    raise IllegalTransition(f"task {task_id} is already {now}: it ended before the cancel{also}", field="task_id")


def decide(
    store: Storage,
    queues: TaskQueues,
    task_id: str,
    *,
    approved: bool,
    note: str = "",
    by: str = "reviewer",
    tenant: str | None = None,
    by_user: str | None = None,
    tool_use_id: str | None = None,
    decision_key: str | None = None,
) -> Task:
    """Approve or reject the task's pending request; the task resumes with the decision.
    ``by``: who decided (a caller's tenant); ``by_user``: the end user, when a token decided.
    A token may decide only an ask its user may (the pending record's ``approver``, fixed when
    it was asked, so no rule is evaluated again here): else ``NotTheApprover`` (403), nothing
    changed, the task still paused.

    ``tool_use_id``: the held call the person was shown. A paused task holds one call at a time
    and, once that is decided, may run on and hold the next before a second reviewer's click, a
    double click or a retried request lands: named, the decision is of that call or of nothing
    (``IllegalTransition`` naming ``tool_use_id``, nothing changed; the write is conditioned on
    that record still pending, so a decision racing this one cannot turn it into the next
    call's). None: whatever is pending now (older clients). ``decision_key``: the request's
    (``storage.approvals.Approvals.bind``), recorded with the decision so a retry knows it as its own."""
    task = owned_task(store, task_id, tenant)
    named = store.approvals.get(task_id, tool_use_id) if tool_use_id is not None else None
    if task.status is not TaskStatus.PAUSED:
        if tool_use_id is not None and named is not None and named.state != "pending":
            raise _not_held(task, tool_use_id, named, None)  # a double click: decided, the task runs on
        raise IllegalTransition(f"task {task_id} is {task.status.value}, not waiting for approval", field="task_id")
    pending = store.approvals.pending(task_id)
    if pending is None:
        raise IllegalTransition(f"task {task_id} has no pending approval", field="task_id")
    if tool_use_id is not None and tool_use_id != pending.use_id:
        raise _not_held(task, tool_use_id, named, pending)
    if by_user is not None and not pending.may_decide(by_user):
        raise NotTheApprover(task_id, pending.use_id, by_user)
    store.approvals.decide(task_id, pending.use_id, approved=approved, note=note, by=by, by_user=by_user,
                           key=decision_key)  # fmt: skip
    queues.send(task_id, task.submission.priority, tenant=task.tenant)
    return store.tasks.get(task_id)


def _not_held(
    task: Task, named: str, record: ApprovalRecord | None, pending: ApprovalRecord | None
) -> IllegalTransition:
    """The refusal of a decision of ``named``, a call the task does not hold now (``pending``:
    the one it holds, if any): what became of it (decided already, and by whom, or never asked)
    and what is held now, so the person looks again before deciding anything.

    The held call may be one the model gave ``named`` again (its key ``agentq-<step>-<named>``,
    core.call_keys): ``named`` then names two calls, and a decision of it may be a double click
    on the earlier one, so it decides neither; the refusal says so and names the held one's key."""
    if record is None:
        what = f"task {task.task_id} never held a call {named[:64]!r}"
    elif record.state == "pending":
        what = f"the call {named[:64]!r} of task {task.task_id} is not the one it waits on"
    else:
        who = record.decided_by_user or record.decided_by or "someone"
        what = f"the call {named[:64]!r} of task {task.task_id} was {record.state} already (by {who})"
    if pending is not None and pending.step is not None and pending.use_id == f"{OWN_KEYS}{pending.step}-{named}":
        now = (f"it holds {pending.use_id[:80]!r} now, a {pending.tool or 'tool'} call the model gave the id "
               f"{named[:64]!r} again (a decision names it {pending.use_id[:80]!r}, the view's pending_tool_use_id): "
               "look at that call before deciding it")  # fmt: skip
    elif pending is not None:
        now = f"it holds {pending.use_id[:64]!r} now: look at that call before deciding it"
    else:
        now = f"it is {task.status.value} now"
    return IllegalTransition(f"{what}; {now}. Nothing was changed", field="tool_use_id")


def raise_budget(
    store: Storage,
    queues: TaskQueues,
    task_id: str,
    *,
    add_tokens: int,
    add_steps: int = 0,
    add_usd: Decimal = Decimal(0),
    tenant: str | None = None,
) -> Task:
    """Raise a root task's token cap (and optionally its step cap and its money cap); a task
    that stopped with ``cost_exceeded`` resumes from its checkpoint. A raise that comes with a
    message is written with the message instead (``control.conversations``)."""
    task = owned_task(store, task_id, tenant)
    more = planned_raise(task, add_tokens=add_tokens, add_steps=add_steps, add_usd=add_usd)
    if task.status.terminal and task.status is not TaskStatus.COST_EXCEEDED:
        raise IllegalTransition(
            f"task {task_id} is {task.status.value}; only a running or cost_exceeded task can get more budget",
            field="task_id",
        )
    if task.expires_at is not None and task.expires_at <= time.time():
        # The requeue below would be refused (TTL may delete the task at any moment): refuse
        # before the caps change, so a refused raise changes nothing.
        raise IllegalTransition(
            f"task {task_id} is {task.status.value} and its retention ran out; it is being deleted", field="task_id"
        )
    if more.changes_submission:  # raised as it is when written: a raise or a move meanwhile is kept
        store.tasks.replace_submission(task_id, more.raised, when_status=task.status)
    if more.tokens or more.micros:
        store.budgets.raise_cap(task_id, more.tokens, more.micros)
    if task.status is TaskStatus.COST_EXCEEDED:
        store.tasks.transition(task_id, TaskStatus.QUEUED, reopen=True)
        queues.send(task_id, task.submission.priority, tenant=task.tenant)
    return store.tasks.get(task_id)


def planned_raise(task: Task, *, add_tokens: int, add_steps: int = 0, add_usd: Decimal = Decimal(0)) -> BudgetRaise:
    """What raising ``task``'s caps writes, checked against what cannot change: the amounts, a
    money cap to raise, a root task. Whether its status takes a raise is the writer's to check,
    at the write (``raise_budget``; a message's accept, which checks its idempotency key first),
    and so is the submission it raises: the one the write reads (``BudgetRaise.raised``), not
    ``task``'s, which another raise or a move may have replaced since."""
    if add_tokens < 0 or add_steps < 0 or add_usd < 0 or not (add_tokens or add_steps or add_usd):
        raise ValidationError("add_tokens, add_steps and add_usd must be >= 0 and not all 0", field="add_tokens")
    if add_usd and task.submission.constraints.max_cost_usd is None:
        raise ValidationError(
            f"task {task.task_id} has no money budget (constraints.max_cost_usd) to raise", field="add_usd"
        )
    if task.root_id != task.task_id:
        raise ValidationError(
            "budgets are raised on the root task; a sub-agent's share comes from its parent", field="task_id"
        )
    more = BudgetRaise(tokens=add_tokens, micros=micros(add_usd), steps=add_steps, usd=add_usd)
    if more.changes_submission:
        more.raised(task.submission)  # refused now if the raised caps would not be valid
    return more


def fork(
    store: Storage,
    tools: ToolRegistry,
    queues: TaskQueues,
    task_id: str,
    *,
    at_step: int,
    overrides: dict[str, Any] | None = None,
    tenant: str | None = None,
) -> Task:
    """A new task that starts from ``task_id``'s committed steps 1..at_step.

    Those steps are copied, never re-executed (their side effects stay done); the fork then
    goes on under its own task id, so its tool calls get new idempotency keys. ``overrides``
    may change the provider, model, script, system prompt, constraints or priority. A fork of
    a task of ``name@N`` keeps that pin (the agent's rules, caps and stops cover it) and records
    which of the fields N defines its overrides replaced (``overridden``). A fork
    never ends on a turn whose tool calls it would make (``_fork_point``); one at the model's
    answer ends with it (``core.engine._loop``), and a message sent to it goes on from there.
    """
    source = owned_task(store, task_id, tenant)
    if source.parent_id is not None:
        raise ValidationError("fork a root task; sub-agents belong to their parent's fan-out", field="task_id")
    if not 0 <= at_step <= source.step:
        raise ValidationError(
            f"at_step must be between 0 and {source.step} (the task's last committed step)", field="at_step"
        )
    history = store.steps.load(task_id, upto=source.step)
    _fork_point(history, at_step)
    body = source.submission.model_dump(mode="json", exclude_none=True)
    body.pop("online", None)  # a fork is a what-if, not its alias's live traffic: never counted for the version
    for key, value in (overrides or {}).items():
        if key == "constraints" and isinstance(value, dict):
            body["constraints"] = {**body.get("constraints", {}), **value}
            if body.get("own_fields") is not None:  # the caller's own: a move of the fork keeps them
                body["own_fields"] = sorted({*body["own_fields"], *(f"constraints.{k}" for k in value)})
        else:
            body[key] = value
    if (
        "provider" in (overrides or {})
        and overrides
        and overrides["provider"] != "scripted"
        and "script" not in overrides
    ):
        body.pop("script", None)
    replaced = _replaced(source.submission, body)
    if replaced:  # the fork keeps its agent's name@N (its rules, caps, stops) and says what it no longer runs of N
        body["overridden"] = replaced
    submission = parse_submission(body)
    check_submission(submission, tools)
    stop = stop_covering(store.stops.list(source.tenant), source)
    if stop is not None:  # the fork would start work in a stopped scope
        raise ScopeStopped(stop)
    new = store.tasks.fork(source, submission, history[:at_step], tenant=source.tenant)
    queues.send(new.task_id, submission.priority, tenant=new.tenant)
    log.info("forked %s at step %d into %s", task_id, at_step, new.task_id)
    return new


def _replaced(source: TaskSubmission, body: dict[str, Any]) -> list[str]:
    """What of the fields its agent's version defines the fork's ``body`` changed from the
    source's (which are the version's, but for those an earlier fork replaced: kept), for a task
    that names an agent; [] for one that does not (there is no version to differ from)."""
    if source.agent is None:
        return []
    before = source.model_dump(mode="json", exclude_none=True)
    changed = {f for f in DEFINED_BY_AGENT if body.get(f) != before.get(f)}
    was, now = before.get("constraints") or {}, body.get("constraints") or {}
    changed |= {f"constraints.{f}" for f in DEFINED_CONSTRAINTS if now.get(f) != was.get(f)}
    return sorted(changed | set(source.overridden or ()))


def _fork_point(history: list[StepRecord], at_step: int) -> None:
    """Refuse a fork whose last copied step is the model's turn asking for tool calls: the
    fork's first turn would make those calls again, under its own task id, so neither its
    effect records nor its idempotency keys would know the source already made them (the
    source's next step did, or may yet), and one side effect would happen twice (ARCHITECTURE
    3). The fork that keeps their results starts at the step that ran them; the one that asks
    the model again, at the step before."""
    last = history[at_step - 1].body if at_step else None
    if not isinstance(last, LLMStep) or not asks_for_calls(last):
        return
    names = ", ".join(str(name)[:64] for name in list(dict.fromkeys(use["name"] for use in last.tool_uses()))[:5])
    asked = f"at_step {at_step} is the model's turn asking for tool calls ({names})"
    again = f"at step {at_step - 1} to ask the model again"
    if len(history) > at_step:
        made = at_step + 1
        said = f"which step {made} made: a fork from it would make them again; fork at step {made} to keep "
        said += f"their results, or {again}"
    else:
        said = f"whose results the source has not committed: a fork from it could make them a second time; fork {again}"
    raise ValidationError(f"{asked}, {said}", field="at_step")
