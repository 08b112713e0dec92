"""MCP's tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663, the 2026-07-28 wire) on
agentq's MCP server (``api.mcp_server``): a call of an agent's tool from a client that declares
the extension on the request is answered at once with a task handle, ``resultType: "task"``,
and the client follows the task with ``tasks/get``, answers what it asks with ``tasks/update``
and stops it with ``tasks/cancel``.

The handle IS the agentq task's id: ``control.submit`` has written the task before the handle
is returned, so a ``tasks/get`` on it resolves from then on, from any API process (a restarted
one, another Lambda instance: the server keeps nothing between requests), and whatever happens
to a worker the task is agentq's durable task (resumed by another worker, run once). The task's
state is read from the store at each request and mapped (``detailed``):

- queued, blocked, running: ``working``; waiting: ``working`` too, unless a sub-agent below it
  waits on an approval (next);
- paused for an approval (a vault credential's too): ``input_required``, its ``inputRequests``
  one form elicitation keyed ``approval-<tool use id>`` (``approved``, ``note``), the decision;
  waiting for sub-agents of which some are paused for one: ``input_required``, one elicitation
  keyed ``approval-<sub-agent's task id>.<tool use id>`` each, decided on that sub-agent
  (``api.mcp_asks``: the walk of the tree, bounded); to an end user's token, an approval only
  the tenant decides is no input it can give: the task is ``working`` ("waiting for the
  tenant's approval"), and an answer to it is ``-32602`` naming why, nothing decided;
- idle (interrupted): ``input_required``, a form elicitation keyed ``message-<n>`` (``text``),
  the message it takes to go on;
- succeeded: ``completed``, ``result`` the ``CallToolResult`` the blocking call answers;
- failed, timed out, over budget: ``completed`` with that result's ``isError: true`` (the spec
  keeps ``failed`` for JSON-RPC errors; an agent's failure is a tool's error, as when blocking);
- cancelled: ``cancelled``;
- reopened after it ended (a follow-up, a redrive, a raised budget): as it first ended, for good
  (``TaskItems.first_end``, read by ``api.mcp_server``): the extension's terminal states have no
  way out, and ``result`` is what the tools/call would have answered.

Keys of ``inputRequests`` are never reused in a task's life (a tool use's id, a sub-agent's
with its task id; the count of messages delivered when it went idle), and an answer to a key
that is no longer outstanding is ignored, as the spec asks: a repeated ``tasks/update`` decides
once (its message is sent under an idempotency key made of the task and the key).

A client that does not declare the extension on the request (every client of the 2025-11-25
handshake: the extension is not defined there) gets the blocking answer from ``tools/call`` and
``-32021`` from the ``tasks/*`` methods. ``tasks/result`` and ``tasks/list`` are not served
(SEP-2663 removed them: ``-32601``). A task nobody has, or another tenant's (another end user's,
for a token's caller), is ``-32602`` "task not found", as the spec says. A ``tasks/*`` request
whose ``Mcp-Name`` header is missing or not its ``taskId`` is ``-32020`` (HTTP 400:
``require_name``), as the transport answers any request whose routing headers disagree with it. Task status
notifications are not sent: the server is stateless (JSON answers, no stream to send them on).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from agentq.api.mcp_asks import Asked, Asks, approvals
from agentq.api.models import MAX_NOTE_CHARS
from agentq.core.endusers import NotTheApprover
from agentq.core.errors import IllegalTransition
from agentq.core.models import MAX_MESSAGE_CHARS, Task, TaskStatus

EXTENSION = "io.modelcontextprotocol/tasks"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
POLL_INTERVAL_MS = 1000
MISSING_CAPABILITY = -32021
INVALID_PARAMS = -32602
TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
# What is "working" unless it waits on an approval the caller may decide (``detailed``).
_WORKING = frozenset({TaskStatus.QUEUED, TaskStatus.BLOCKED, TaskStatus.RUNNING, TaskStatus.WAITING, TaskStatus.PAUSED})


def declares_tasks(meta: Any, protocol_version: str | None) -> bool:
    """Whether this request's client declared the extension: in its per-request capabilities
    (``_meta``), on the 2026-07-28 wire (the only one the extension is defined for)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    if protocol_version not in MODERN_PROTOCOL_VERSIONS or not isinstance(meta, dict):
        return False
    capabilities = meta.get(CAPABILITIES_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def require_tasks(meta: Any, protocol_version: str | None) -> None:
    """``-32021`` for a ``tasks/*`` request of a client that did not declare the extension."""
    if not declares_tasks(meta, protocol_version):
        from mcp.shared.exceptions import MCPError

        raise MCPError(
            code=MISSING_CAPABILITY,
            message="Missing required client capability",
            data={"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
        )


def require_name(headers: Any, protocol_version: str | None, task_id: str) -> None:
    """``-32020`` (HTTP 400) for a ``tasks/*`` request of the 2026-07-28 wire whose ``Mcp-Name``
    header is missing or is not its ``params.taskId``: SEP-2663 has the client set it so that
    intermediaries route by it, and the transport refuses a request whose routing headers
    disagree with its body. The ``mcp`` SDK checks it for ``tools/call``, ``prompts/get`` and
    ``resources/read`` only (``NAME_BEARING_METHODS``); this is the same check (its header
    decoding, code and message) for the extension's methods. Earlier wires have no such
    header (their clients get ``-32021``: ``require_tasks``). ``headers``: the HTTP request's
    (the handler context's ``request``), None off HTTP."""
    from mcp.shared.exceptions import MCPError
    from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
    from mcp_types.jsonrpc import HEADER_MISMATCH
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    if headers is None or protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return
    if decode_header_value(headers.get(MCP_NAME_HEADER)) != task_id:
        raise MCPError(
            code=HEADER_MISMATCH,
            message=f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter",
        )


def not_found(task_id: str) -> Exception:
    return invalid(f"Failed to retrieve task: task {task_id!r} not found")


def invalid(message: str) -> Exception:
    from mcp.shared.exceptions import MCPError

    return MCPError(code=INVALID_PARAMS, message=message)


def task_params_type() -> Any:
    """The params of ``tasks/get`` and ``tasks/cancel``, validated by the ``mcp`` runner (a
    malformed one is ``-32602`` invalid params before any handler runs)."""
    from mcp_types import RequestParams

    class TaskParams(RequestParams):
        task_id: str = Field(alias="taskId", pattern=TASK_ID_PATTERN)

    return TaskParams


def update_params_type() -> Any:
    from mcp_types import RequestParams

    class UpdateParams(RequestParams):
        task_id: str = Field(alias="taskId", pattern=TASK_ID_PATTERN)
        input_responses: dict[str, dict[str, Any]] = Field(alias="inputResponses", max_length=16)

    return UpdateParams


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _ttl_ms(task: Task) -> int | None:
    """The extension's ``ttlMs`` ("from creation ... null for unlimited", and it may change): an
    unfinished task is kept while it runs, null; an ended one is deleted by the table's TTL at
    META's ``expires_at`` (the deployment's retention, stamped when it ended), so from then on
    the time from its creation to that moment. A reopened task (a follow-up) is null again."""
    if task.expires_at is None:
        return None
    return max(0, int((task.expires_at - task.created_at) * 1000))


def _base(task: Task, status: str, message: str | None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "taskId": task.task_id,
        "status": status,
        "createdAt": _iso(task.created_at),
        "lastUpdatedAt": _iso(task.updated_at or task.created_at),
        "ttlMs": _ttl_ms(task),
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if message:
        base["statusMessage"] = message
    return base


def handle(task: Task) -> dict[str, Any]:
    """The ``CreateTaskResult`` a ``tools/call`` answers with: the task just written."""
    return {"resultType": "task", **_base(task, "working", f"agentq task {task.status.value}")}


def _approval_form(asked: Asked) -> dict[str, Any]:
    """An approval as a form elicitation: its question (a sub-agent's says whose), and the
    decision's schema."""
    pending = asked.pending
    ask = pending.question
    if pending.credential:
        name, host = pending.credential.get("name", ""), pending.credential.get("host", "")
        ask = f"{ask}\n\nAdd the credential {name!r} (for {host}) to the vault, then approve to go on."
    if asked.below:
        ask = f"{ask}\n\n(asked by sub-agent {asked.task.task_id} of this task, which waits for it)"
    schema = {
        "type": "object",
        "properties": {
            "approved": {"type": "boolean", "title": "Approve", "description": "approve the request"},
            "note": {"type": "string", "title": "Note", "description": "a note the agent reads"},
        },
        "required": ["approved"],
    }
    return {"method": "elicitation/create", "params": {"mode": "form", "message": ask, "requestedSchema": schema}}


def input_requests(task: Task, asks: Asks, user: str | None = None) -> dict[str, Any]:
    """What a paused, waiting or interrupted task asks, as the extension's ``inputRequests``
    (form elicitations, keyed so that a key is never reused in the task's life): the approvals
    it waits on (``api.mcp_asks``: its own, or its sub-agents') that ``user``, the caller's
    end user (a token's), may decide; an interrupted task's next message."""
    if task.status is TaskStatus.IDLE:
        schema = {
            "type": "object",
            "properties": {"text": {"type": "string", "title": "Message", "description": "your message"}},
            "required": ["text"],
        }
        form = {"mode": "form", "message": "Interrupted: send a message to go on.", "requestedSchema": schema}
        return {f"message-{task.messages_delivered}": {"method": "elicitation/create", "params": form}}
    return {asked.key: _approval_form(asked) for asked in asks.decidable(user)}


def detailed(task: Task, asks: Asks, result: dict[str, Any], user: str | None = None) -> dict[str, Any]:
    """The extension's ``DetailedTask`` of an agentq task (``tasks/get``'s answer); ``asks``:
    the approvals it waits on (``api.mcp_asks.approvals``); ``result``: the ``CallToolResult``
    of the task as it is (read only once it ended). ``user``: the caller's end user (a
    token's), to whom an approval only the tenant decides is no input it can give: the task is
    ``working``, waiting for the tenant."""
    if task.status in (TaskStatus.PAUSED, TaskStatus.WAITING):
        mine = asks.decidable(user)
        if mine:
            what = "waiting for approval"
            if any(a.below for a in mine):
                what = f"waiting for approval of {len(mine)} request(s) of its sub-agents"
            if asks.cut:
                what += " (its tree was not read whole: more may show once these are decided)"
            return {**_base(task, "input_required", what), "inputRequests": input_requests(task, asks, user)}
        if asks.asked:
            first = asks.asked[0]
            whose = f" of sub-agent {first.task.task_id}" if first.below else ""
            return _base(task, "working",
                         f"waiting for the tenant's approval{whose} (its API key decides): {first.pending.question}")  # fmt: skip
    if task.status in _WORKING:
        return _base(task, "working", f"agentq task {task.status.value}")
    if task.status is TaskStatus.IDLE:
        asked = input_requests(task, asks)
        return {**_base(task, "input_required", "interrupted, waiting for a message"), "inputRequests": asked}
    if task.status is TaskStatus.CANCELLED:
        return _base(task, "cancelled", str((task.error or {}).get("message") or "cancelled"))
    return {**_base(task, "completed", f"agentq task {task.status.value}"), "result": result}


def message_key(task_id: str, key: str) -> str:
    """The idempotency key of a message a ``tasks/update`` sends: the same answer, repeated,
    sends it once."""
    return "mcp-task-" + hashlib.sha256(f"{task_id}\n{key}".encode()).hexdigest()[:40]


def answer(deps: Any, caller: Any, task: Task, responses: dict[str, dict[str, Any]]) -> None:
    """Apply a ``tasks/update``'s ``inputResponses`` to what the task asks now; an answer to a
    key that is not outstanding (never asked, answered already, superseded) is ignored. An
    approval of a sub-agent is decided on that sub-agent: its key is one the walk of this
    task's tree found now (``api.mcp_asks``), so it is of this tree and the caller may see it."""
    from agentq.control import operations
    from agentq.control.conversations import send_message

    asks = approvals(deps.store, task, caller)
    for asked in asks.asked:
        if asked.key in responses and not asked.pending.may_decide(caller.user):  # refused, not ignored
            raise invalid(NotTheApprover(asked.task.task_id, asked.pending.use_id, caller.user).message)
    held = {asked.key: asked for asked in asks.decidable(caller.user)}
    for key in input_requests(task, asks, caller.user):
        response = responses.get(key)
        if not isinstance(response, dict):
            continue
        action, content = response.get("action"), response.get("content")
        content = content if isinstance(content, dict) else {}
        where = f"inputResponses.{key}.content"
        try:
            if key in held and action in ("accept", "decline"):
                note = content.get("note", "")
                if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
                    raise invalid(f"{where}.note: a string of at most {MAX_NOTE_CHARS:,} characters")
                approved = action == "accept" and content.get("approved") is True
                # The key names the call: decided meanwhile, and the next one held, this answer
                # is not that call's (IllegalTransition: no longer outstanding, below).
                asked = held[key]
                operations.decide(deps.store, deps.queues, asked.task.task_id, approved=approved, note=note,
                                  by=caller.tenant, by_user=caller.user, tenant=task.tenant,
                                  tool_use_id=asked.pending.use_id)  # fmt: skip
            elif key.startswith("message-") and action == "accept":
                text = content.get("text")
                if not isinstance(text, str) or not 0 < len(text) <= MAX_MESSAGE_CHARS:
                    raise invalid(f"{where}.text: a string of 1 to {MAX_MESSAGE_CHARS:,} characters")
                send_message(deps.store, deps.queues, task.task_id, text, tenant=task.tenant,
                             idempotency_key=message_key(task.task_id, key))  # fmt: skip
        except IllegalTransition:
            continue  # decided or resumed meanwhile: no longer outstanding
        except NotTheApprover as exc:  # another approval, the tenant's, asked meanwhile
            raise invalid(exc.message) from None


def cancel(deps: Any, task: Task) -> None:
    """Cancel the task and its sub-agents; one that has ended is acknowledged as it is (the
    spec's cancellation is a request the server may not honour)."""
    from agentq.control import operations

    if task.status.terminal:
        return
    try:
        operations.cancel(deps.store, task.task_id, tenant=task.tenant, fanout=deps.fanout, queues=deps.queues,
                          slots=deps.defaults.running_slots(deps.store))  # fmt: skip
    except IllegalTransition:
        return  # it ended meanwhile
