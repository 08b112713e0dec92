"""agentq's tasks and agents in A2A's shapes (the ``a2a-sdk`` protobuf types): what the A2A
server (``api/a2a_server.py``) answers with. Read-only: nothing here writes.

States. A2A's task model is agentq's, less durable, so every agentq status has one A2A state
(``core/a2a_states.py``): ``queued``/``blocked`` are ``submitted`` (no compute yet); ``running``/``waiting`` (children
running) are ``working``; ``paused`` is ``input-required`` with the approval's question in the
status message, or ``auth-required`` when the pause waits for a vault credential
(``request_credential``: its record names the credential and host); ``idle`` (interrupted, waiting
for a person's message) is ``input-required``; ``succeeded`` is ``completed``; ``cancelled`` is
``canceled``; every other end (``failed``, ``timed_out``, ``cost_exceeded``, and any end added
later) is ``failed``, with agentq's own status and error in the metadata.

Usage and cost go into the task's metadata under ``agentq`` (``status``, ``agent``, ``steps``,
``tokensIn``, ``tokensOut``, ``costUsd`` as a decimal string): A2A has no field for them.
A completed task's artifacts (``queueing/a2a_artifacts.py``): the result (``result``: the agent's
structured output as a data part when it has an output schema, else its text) and, when it has a
workspace, its files (``workspace``: each a URL on this API, its media type and size).
"""

from __future__ import annotations

import json
from typing import Any

from agentq.api.cursors import fitting
from agentq.core.a2a_states import state_name
from agentq.core.models import Task, TaskStatus
from agentq.core.records import ApprovalRecord
from agentq.queueing.a2a_artifacts import JSON_TYPE as JSON_TYPE
from agentq.queueing.a2a_artifacts import TEXT as TEXT
from agentq.queueing.a2a_artifacts import artifacts as task_artifacts
from agentq.storage.container import Storage

CONTEXT_KEY = "a2a_context_id"  # the submission's metadata key holding the A2A contextId
VIA = "a2a"


def state_of(task: Task, pending: ApprovalRecord | None) -> Any:
    from a2a.types import TaskState

    return TaskState.Value(state_name(task.status, credential=pending is not None and bool(pending.credential)))


def context_id(task: Task) -> str:
    return str(task.submission.metadata.get(CONTEXT_KEY) or task.task_id)


def agent_message(task: Task, parts: list[Any]) -> Any:
    from a2a.types import Message, Role

    step = f"{task.task_id}-s{task.step}-{task.status.value}"
    return Message(message_id=step, context_id=context_id(task), task_id=task.task_id, role=Role.ROLE_AGENT,
                   parts=parts)  # fmt: skip


def _text(text: str) -> Any:
    from a2a.types import Part

    return Part(text=text, media_type=TEXT)


def _data(value: Any) -> Any:
    from a2a.types import Part
    from google.protobuf.json_format import ParseDict
    from google.protobuf.struct_pb2 import Value

    return Part(data=ParseDict(json.loads(json.dumps(value, default=str)), Value()), media_type=JSON_TYPE)


def status_message(task: Task, pending: ApprovalRecord | None) -> Any | None:
    """What the agent asks or says with its state: the approval's question (and how to answer
    it, and who may: ``approver``), the credential it waits for, the reason it was interrupted
    or failed."""
    if task.status is TaskStatus.PAUSED and pending is not None:
        if pending.credential:
            name, host = pending.credential.get("name", ""), pending.credential.get("host", "")
            ask = (f"{pending.question}\n\nAdd the credential {name!r} (for {host}) to the vault, then send a "
                   "message 'approve' to go on, or 'reject' to go on without it.")  # fmt: skip
            what = {"kind": "credential", "toolUseId": pending.use_id, "credential": pending.credential}
        else:
            ask = (f"{pending.question}\n\nReply 'approve' (a note may follow); anything else rejects the request, "
                   "your message its note.")  # fmt: skip
            if pending.approver == "tenant":
                ask += " Only the tenant decides this one (a reply with its API key): an end user's token may not."
            what = {"kind": "approval", "toolUseId": pending.use_id, "question": pending.question,
                    "approver": pending.approver}  # fmt: skip
        return agent_message(task, [_text(ask), _data({"agentq": what})])
    if task.status is TaskStatus.IDLE:
        return agent_message(task, [_text("Interrupted: send a message to go on.")])
    if task.status.terminal and task.status is not TaskStatus.SUCCEEDED and task.error:
        return agent_message(task, [_text(str(task.error.get("message") or task.status.value))])
    if task.status is TaskStatus.SUCCEEDED and task.result is not None:
        return agent_message(task, [_text(task.result)])
    return None


def usage(task: Task) -> dict[str, Any]:
    """agentq's status, the agent's version, steps, tokens and cost (a decimal string), in
    A2A's camelCase (the protocol's JSON names every field so, metadata included)."""
    return {
        "status": task.status.value,
        "agent": task.submission.agent,
        "steps": task.step,
        "tokensIn": task.tokens_in,
        "tokensOut": task.tokens_out,
        "costUsd": str(task.cost_usd),
        **({"error": task.error} if task.error else {}),
    }


def artifacts(store: Storage, task: Task) -> list[Any]:
    """The task's artifacts (``queueing/a2a_artifacts.py``: the one function the completion push
    reads too) as the SDK's types."""
    from a2a.types import Artifact
    from google.protobuf.json_format import ParseDict

    return [ParseDict(a, Artifact()) for a in task_artifacts(store, task)]


def a2a_task(
    task: Task, pending: ApprovalRecord | None, *, history: list[Any] | None = None, artifacts: list[Any] | None = None
) -> Any:
    from a2a.types import Task as A2ATask
    from a2a.types import TaskStatus as A2AStatus
    from google.protobuf.struct_pb2 import Struct
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp()
    stamp.FromMilliseconds(int((task.updated_at or task.created_at) * 1000))
    status = A2AStatus(state=state_of(task, pending), timestamp=stamp)
    said = status_message(task, pending)
    if said is not None:
        status.message.CopyFrom(said)
    meta = Struct()
    meta.update({"agentq": json.loads(json.dumps(usage(task), default=str))})
    out = A2ATask(id=task.task_id, context_id=context_id(task), status=status, artifacts=artifacts or [],
                  history=history or [], metadata=meta)  # fmt: skip
    return out


def user_message(task: Task, text: str, message_id: str) -> Any:
    from a2a.types import Message, Role

    return Message(message_id=message_id, context_id=context_id(task), task_id=task.task_id, role=Role.ROLE_USER,
                   parts=[_text(text)])  # fmt: skip


# A task's history as GetTask, ListTasks and SendMessage show it: without historyLength, the last
# DEFAULT_HISTORY of its items (the goal, then each message sent); and, whatever historyLength
# asks, no more of them than fit HISTORY_BYTES as JSON (escaped: a character may take six bytes)
# for the whole answer, the latest kept first and never none. A task takes up to 1,000 messages
# of 32,000 characters: read whole, an answer could pass 100 MB.
DEFAULT_HISTORY = 100
HISTORY_BYTES = 2_000_000


def history(store: Storage, task: Task, length: int | None, *, budget: int = HISTORY_BYTES) -> list[Any]:
    """The last ``length`` items of ``task``'s history (None: ``DEFAULT_HISTORY``; 0: none),
    fewer once they pass ``budget`` bytes; only the messages shown are read."""
    if length == 0:
        return []
    want = DEFAULT_HISTORY if length is None else length
    received = task.messages_received
    first = max(1, received - want + 1)
    items: list[tuple[str, str]] = [(m.text, f"{task.task_id}-m{m.seq}")
                                    for m in store.messages.listed(task.task_id, after=first - 1, upto=received)]  # fmt: skip
    if want > received:
        items.insert(0, (task.submission.goal, f"{task.task_id}-goal"))
    # the latest first: each text escaped, and the message's ids around it
    kept = fitting((len(json.dumps(text)) + 200 for text, _ in reversed(items)), budget)
    return [user_message(task, text, message_id) for text, message_id in items[len(items) - kept :]]


def json_size(view: Any) -> int:
    """The bytes of ``view`` (a protocol message) as an answer's JSON, at most: its characters
    escaped to ASCII, where the answer writes UTF-8 (six bytes of escape for a character of at
    most four)."""
    from google.protobuf.json_format import MessageToDict

    return len(json.dumps(MessageToDict(view), separators=(",", ":")))


MIN_CUT_CHARS = 1_000


def cut(view: Any, budget: int) -> Any:
    """A copy of the task ``view`` that fits ``budget`` bytes as JSON (``json_size``): each text
    part (its status message, its artifacts, its history) longer than a limit cut there with a
    note saying so, a data part longer than it replaced by such a note, the limit halved until
    the task fits (or a part is down to ``MIN_CUT_CHARS``), and ``metadata.agentq.truncated``
    set. How ``ListTasks`` lists a task bigger than its page's budget alone: ``GetTask`` reads it
    whole."""
    from a2a.types import Task as A2ATask

    limit = max(budget // 4, MIN_CUT_CHARS)
    while True:
        out = A2ATask()
        out.CopyFrom(view)
        messages = [out.status.message, *out.history]
        for parts in [m.parts for m in messages] + [a.parts for a in out.artifacts]:
            for part in parts:
                _cut_part(part, limit)
        out.metadata["agentq"]["truncated"] = True
        if json_size(out) <= budget or limit <= MIN_CUT_CHARS:
            return out
        limit = max(limit // 2, MIN_CUT_CHARS)


def _cut_part(part: Any, limit: int) -> None:
    kind = part.WhichOneof("content")
    if kind == "text" and len(part.text) > limit:
        part.text = (f"{part.text[:limit]}\n[cut to {limit:,} of its {len(part.text):,} characters to fit the "
                     "listing: GetTask reads the whole task]")  # fmt: skip
    elif kind == "data":
        size = json_size(part.data)
        if size > limit:
            part.text = f"[a data part of {size:,} bytes, left out to fit the listing: GetTask reads the whole task]"
            part.media_type = TEXT
