"""The blocking tools' waits and answers on agentq's MCP server (``api.mcp_server``): an agent's
tool called without the tasks extension, ``agentq_task`` and ``agentq_message`` wait up to their
``wait_seconds`` for the task to stop (end, go ``idle``, or pause for a person) and answer an
``Outcome``: its status, and its result once it ended, or what to do while it runs (``next``).
The same ``CallToolResult`` is a task handle's result (``api.mcp_tasks``)."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, Field

from agentq.api.mcp_asks import approvals
from agentq.api.views import task_result
from agentq.control.conversations import send_message
from agentq.control.operations import owned_task
from agentq.core.call_keys import is_cap_approval
from agentq.core.endusers import Caller
from agentq.core.errors import TaskNotFound
from agentq.core.models import Task, TaskStatus
from agentq.core.records import ApprovalRecord

STATUS_TOOL = "agentq_task"
MESSAGE_TOOL = "agentq_message"
POLL_SECONDS = 0.2
LOOK_SECONDS = 2.0  # how often a blocking call walks a waiting task's tree for a paused sub-agent


class Outcome(BaseModel):
    """What every tool answers, as structured content: the task, and its result once it ended."""

    task_id: str
    status: str
    result: Any = Field(default=None, description="the agent's output: JSON with an output schema, else its text")
    error: dict[str, Any] | None = None
    next: str | None = Field(default=None, description="what to do while it runs")


def tool_result(outcome: Outcome) -> Any:
    """The ``CallToolResult`` of an outcome: the blocking call's answer, and a task's result."""
    import mcp_types as types

    failed = outcome.status not in ("succeeded", "queued", "running", "blocked", "waiting", "paused", "idle")
    return types.CallToolResult(
        content=[types.TextContent(text=_text(outcome))],
        structured_content=outcome.model_dump(mode="json"),
        is_error=failed,
    )


def seen(deps: Any, caller: Caller, task_id: str) -> Task:
    """The task, if this caller may see it: another tenant's, or another user's for a token's
    caller, is not found (as GET /tasks/{id} answers)."""
    task = owned_task(deps.store, task_id, caller.tenant)
    if not caller.sees(task.tenant, task.user):
        raise TaskNotFound(f"no task {task_id!r}", field="task_id")
    return task


def check(deps: Any, caller: Caller, task_id: str, seconds: float) -> Outcome:
    """``agentq_task``: the task once it stopped, or as it is after ``seconds``."""
    return outcome(deps, wait(deps, seen(deps, caller, task_id), seconds, caller=caller), caller)


def message(deps: Any, caller: Caller, task_id: str, text: str, key: str | None, seconds: float) -> Outcome:
    """``agentq_message``: the message sent (once under ``key``), and the answer that takes it in."""
    seen(deps, caller, task_id)
    accepted = send_message(deps.store, deps.queues, task_id, text, tenant=caller.tenant, idempotency_key=key)
    task = deps.store.tasks.get(task_id)
    # Not before the message is in the conversation: the task's status may still be the answer before it.
    return outcome(deps, wait(deps, task, seconds, heard=accepted.message.seq, caller=caller), caller)


def wait(deps: Any, task: Task, seconds: float, heard: int = 0, caller: Caller | None = None) -> Task:
    """The task once it has stopped (ended, or ``idle`` waiting for a message) with the first
    ``heard`` messages delivered, or as it is after ``seconds``. A task waiting for sub-agents
    of which one is paused for a person (as ``caller`` sees them) has stopped too: waiting would
    not bring its answer. Its tree is walked (``api.mcp_asks``, bounded) every ``LOOK_SECONDS``,
    not at each poll."""
    deadline = time.monotonic() + seconds
    looked = 0.0
    while not _stopped(task, heard) and time.monotonic() < deadline:
        if caller is not None and task.status is TaskStatus.WAITING and time.monotonic() - looked >= LOOK_SECONDS:
            looked = time.monotonic()
            if approvals(deps.store, task, caller).asked:
                break
        time.sleep(POLL_SECONDS)
        task = deps.store.tasks.get(task.task_id)
    return task


def _stopped(task: Task, heard: int) -> bool:
    if task.status.terminal and task.status is not TaskStatus.SUCCEEDED:
        return True  # failed, cancelled, ...: no answer is coming
    if task.status is TaskStatus.PAUSED:
        return True  # it waits for a person: waiting here would not bring its answer
    return (task.status.terminal or task.status is TaskStatus.IDLE) and task.messages_delivered >= heard


def outcome(deps: Any, task: Task, caller: Caller) -> Outcome:
    """What a tool answers of the task as it is; a waiting one's sub-agents paused for a person
    (as ``caller`` sees them: ``api.mcp_asks``) are what it waits on, said as its own pause is."""
    if task.status is TaskStatus.PAUSED:
        return Outcome(task_id=task.task_id, status=task.status.value, next=_paused(deps, task))
    if task.status is TaskStatus.IDLE:
        return Outcome(
            task_id=task.task_id,
            status=task.status.value,
            next=f"interrupted, waiting for a message: call {MESSAGE_TOOL} with this task_id to go on",
        )
    if task.status is TaskStatus.WAITING:
        asked = approvals(deps.store, task, caller).asked
        if asked:
            child, more = asked[0].task, len(asked) - 1
            also = f" ({more} more of its sub-agents wait for a person too)" if more else ""
            said = _paused_text(child, asked[0].pending)
            return Outcome(task_id=task.task_id, status=task.status.value,
                           next=f"waiting for its sub-agent {child.task_id}{also}, which is {said}")  # fmt: skip
    if not task.status.terminal:
        return Outcome(
            task_id=task.task_id,
            status=task.status.value,
            next=f"still {task.status.value}: call {STATUS_TOOL} with this task_id (and wait_seconds) for its result",
        )
    ended = task_result(task)
    result = ended.output if ended.output is not None else ended.result
    return Outcome(task_id=task.task_id, status=task.status.value, result=result, error=ended.error)


def _paused(deps: Any, task: Task) -> str:
    return _paused_text(task, deps.store.approvals.pending(task.task_id))


def _paused_text(task: Task, pending: ApprovalRecord | None) -> str:
    """What a paused task waits for and who can act on it. Only a person decides (the model
    calling these tools is never trusted to approve its own agent's request: no tool here
    decides, and a message to the task is not a decision)."""
    if pending is None:  # asked and decided meanwhile, or its request not written yet
        what = "paused, waiting for a person's decision"
    elif is_cap_approval(pending.use_id):  # a budget pause: a cap's soft threshold (core.caps.approval_id)
        what = f"paused before its next model call, waiting for a person's approval to spend on: {pending.question}"
    elif pending.credential:
        name, host = pending.credential.get("name", ""), pending.credential.get("host", "")
        what = (f"paused, waiting for a person to add the credential {name!r} (for {host}) to the vault and "
                f"approve: {pending.question}")  # fmt: skip
    else:
        what = f"paused, waiting for a person's approval of a tool call: {pending.question}"
    if pending is not None and pending.approver == "tenant":
        what += " (only the tenant decides this one, with an API key: an end user's token may not)"
    return (
        f"{what}. It does not go on until a person of your organisation approves or rejects it (agentq approve "
        f"{task.task_id} / agentq reject {task.task_id}, the console's approval button, or POST "
        f"/tasks/{task.task_id}/approve); neither you nor a message to the task can approve it. Tell your user; "
        f"then call {STATUS_TOOL} with this task_id (and wait_seconds) for its result"
    )


def _text(outcome: Outcome) -> str:
    if outcome.next is not None:
        return f"task {outcome.task_id} is {outcome.status}; {outcome.next}"
    if outcome.status == "succeeded":
        return outcome.result if isinstance(outcome.result, str) else json.dumps(outcome.result)
    return f"task {outcome.task_id} ended {outcome.status}: {json.dumps(outcome.error)}"
