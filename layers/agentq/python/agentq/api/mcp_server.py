"""agentq as an MCP server: each of a tenant's agents is a tool another agent platform (Claude
Code, Claude Desktop, an agent of agentq's own) can call, served at ``/mcp`` (``api/routes/mcp.py``).

A call of agent ``support`` submits a task of ``support`` with the call's goal and optional
constraints (through ``control.submit``, so it is checked and budgeted as any submission) and
waits up to ``wait_seconds`` for it to end: the result comes back (the agent's structured output
too, when it has an output schema), or, for a longer run, the task id, which ``agentq_task``
checks on later (and waits for again), and ``agentq_message`` talks to: a follow-up to an answered
task, or a message to one still running (``control.conversations``, so it is delivered once, at
the agent's next turn boundary), waiting for the answer that takes it in. Tools are listed per
request from the tenant's agents, so a new agent is a new tool at once; the server keeps no state
between requests.

The caller is the request's (the API key's or the user token's, as for every route), handed to
the handlers in a context variable the route sets: one server object serves every tenant. A call
may name the end user it acts for (``user``) under POST /tasks's rule (``Caller.acting_user``: a
key created ``--act-for-users`` may name any; a user's token acts as its user and may name no
other), and a token's caller reaches only its own user's tasks with ``agentq_task`` and
``agentq_message``.
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentq import __version__
from agentq.api import mcp_tasks
from agentq.api.errors import describe_validation_error
from agentq.api.mcp_asks import approvals
from agentq.api.mcp_outcomes import (
    MESSAGE_TOOL,
    STATUS_TOOL,
    Outcome,
    check,
    message,
    outcome,
    seen,
    tool_result,
    wait,
)
from agentq.api.user_submission import check_user_submission
from agentq.control.submit import parse_submission, request_hashes, submit_once
from agentq.core.agents import NAME_PATTERN
from agentq.core.endusers import Caller
from agentq.core.errors import AgentqError, IdempotencyConflict, TaskNotFound
from agentq.core.models import MAX_GOAL_CHARS, MAX_MESSAGE_CHARS, MAX_TIMEOUT_SECONDS, Task
from agentq.core.models.submission import EndUser
from agentq.storage.agents import AgentNotFound

RESERVED_TOOLS = frozenset({STATUS_TOOL, MESSAGE_TOOL})
MAX_WAIT_SECONDS = 25.0  # API Gateway answers within 29 s: a run longer than this comes back as its task id
DEFAULT_WAIT_SECONDS = 20.0
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,128}$"  # visible ASCII, as POST /tasks's Idempotency-Key

INTERNAL_ERROR = -32603
Handler = Callable[[Any, Any], Awaitable[Any]]
log = logging.getLogger("agentq.api")

caller_var: contextvars.ContextVar[Caller] = contextvars.ContextVar("agentq_mcp_caller")


class CallConstraints(BaseModel):
    """The constraints a caller may set on the task it starts (the agent's defaults fill the rest)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(strict=True, default=None, ge=1, le=1_000_000_000)
    max_cost_usd: Decimal | None = Field(default=None, gt=0, le=1_000_000)
    max_steps: int | None = Field(strict=True, default=None, ge=1, le=10_000)
    timeout_seconds: int | None = Field(strict=True, default=None, ge=1, le=MAX_TIMEOUT_SECONDS)


class AgentCall(BaseModel):
    """A call of an agent's tool."""

    model_config = ConfigDict(extra="forbid")

    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS, description="what the agent is to do")
    constraints: CallConstraints | None = Field(default=None, description="limits of the task (optional)")
    user: EndUser | None = Field(
        default=None,
        description="the end user the task acts for (a key allowed to act for users; a user's token acts as its own)",
    )
    idempotency_key: str | None = Field(
        default=None,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="the same key starts the task once however often the call is repeated with the same arguments",
    )
    wait_seconds: float = Field(
        strict=True,
        default=DEFAULT_WAIT_SECONDS,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="how long to wait for the result; a longer run answers with its task id",
    )


class TaskCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$", description="the task id an agent's tool answered with")
    wait_seconds: float = Field(
        strict=True, default=0, ge=0, le=MAX_WAIT_SECONDS, description="wait this long for it to end"
    )


class TaskMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$", description="the task to talk to")
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="your message to the agent")
    idempotency_key: str | None = Field(
        default=None,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="the same key sends the message once however often the call is repeated",
    )
    wait_seconds: float = Field(
        strict=True,
        default=DEFAULT_WAIT_SECONDS,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="how long to wait for the answer that takes your message in",
    )


@dataclass(frozen=True)
class McpDeps:
    """What the tools act on: the API's own deps (``api.routes.common.ApiDeps``)."""

    store: Any
    tools: Any
    queues: Any
    defaults: Any
    fanout: Any = None  # what tasks/cancel stops a fan-out's executions with


def build_server(deps: McpDeps) -> Any:
    """The ``mcp`` package's low-level server with agentq's handlers: the tools, and the tasks
    extension's methods (``api.mcp_tasks``)."""
    import mcp_types as types
    from mcp.server.lowlevel.server import Server

    async def list_tools(ctx: Any, params: Any) -> Any:
        import anyio

        agents = await anyio.to_thread.run_sync(deps.store.agents.list, caller_var.get().tenant)
        tools = [
            types.Tool(
                name=agent.name,
                description=(agent.description or f"Run agentq agent {agent.name!r}")
                + f" (version {agent.latest_version}). Starts a task with your goal and waits up to wait_seconds; "
                f"a longer run answers with its task_id: check on it with {STATUS_TOOL}.",
                input_schema=AgentCall.model_json_schema(),
                output_schema=Outcome.model_json_schema(),
            )
            for agent in agents
            if agent.name not in RESERVED_TOOLS
        ]
        tools.append(
            types.Tool(
                name=STATUS_TOOL,
                description="Check on a task an agent's tool started: its status, and its result once it ended "
                "(optionally wait for it).",
                input_schema=TaskCheck.model_json_schema(),
                output_schema=Outcome.model_json_schema(),
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        tools.append(
            types.Tool(
                name=MESSAGE_TOOL,
                description="Send a message to a task an agent's tool started: a follow-up once it has answered "
                "(it continues the same conversation), or a message it takes at its next turn while it runs. "
                "Waits up to wait_seconds for the answer that takes the message in.",
                input_schema=TaskMessage.model_json_schema(),
                output_schema=Outcome.model_json_schema(),
            )
        )
        return types.ListToolsResult(tools=tools)

    @guarded("tools/call")
    async def call_tool(ctx: Any, params: Any) -> Any:
        import anyio

        tenant = caller_var.get()
        name = params.name
        if name not in RESERVED_TOOLS:
            await anyio.to_thread.run_sync(lambda: _known_agent(deps, tenant, name))
        model = TaskCheck if name == STATUS_TOOL else TaskMessage if name == MESSAGE_TOOL else AgentCall
        try:  # only the arguments: a pydantic error raised below (a stored item's) is no caller's
            parsed = model.model_validate(dict(params.arguments or {}))
        except ValidationError as exc:  # the arguments, each named as the caller wrote it
            text = f"invalid arguments: {_argument_errors(exc)}"
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        try:
            if isinstance(parsed, TaskCheck):
                answer = await anyio.to_thread.run_sync(
                    partial(check, deps, tenant, parsed.task_id, parsed.wait_seconds)
                )
            elif isinstance(parsed, TaskMessage):
                said = partial(message, deps, tenant, parsed.task_id, parsed.text, parsed.idempotency_key)
                answer = await anyio.to_thread.run_sync(partial(said, parsed.wait_seconds))
            elif mcp_tasks.declares_tasks(ctx.meta, ctx.protocol_version):
                # The handle once the task is written: a tasks/get on it resolves from now on.
                started = await anyio.to_thread.run_sync(partial(_start_agent, deps, tenant, name, parsed))
                return mcp_tasks.handle(started)
            else:
                answer = await anyio.to_thread.run_sync(partial(_run_agent, deps, tenant, name, parsed))
        except AgentqError as exc:
            where = f" ({exc.field})" if exc.field else ""
            return types.CallToolResult(content=[types.TextContent(text=f"{exc.message}{where}")], is_error=True)
        return tool_result(answer)

    server = Server("agentq", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)
    add_task_methods(server, deps)
    return server


def add_task_methods(server: Any, deps: McpDeps) -> None:
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel`` (``api.mcp_tasks``), and the
    extension declared in the server's capabilities (initialize and server/discover)."""
    import anyio

    server.extensions[mcp_tasks.EXTENSION] = {}

    def owned(caller: Caller, task_id: str) -> Task:
        """The task as its handle shows it: as it first ended, once a follow-up, a redrive or a
        raised budget reopened it (``TaskItems.first_end``), since the extension's completed,
        failed and cancelled have no way out and ``result`` is what the tools/call answered;
        the conversation goes on for agentq_message, agentq_task and the REST API, not for
        the handle (nothing asked, nothing cancelled of the run after it). Else as it is."""
        try:
            task = seen(deps, caller, task_id)
        except TaskNotFound:
            raise mcp_tasks.not_found(task_id) from None
        return deps.store.tasks.first_end(task) or task

    def read(caller: Caller, task_id: str) -> dict[str, Any]:
        task = owned(caller, task_id)
        result: dict[str, Any] = {}
        if task.status.terminal:  # else no result: the answer shows what it waits on (mcp_tasks.detailed)
            result = tool_result(outcome(deps, task, caller)).model_dump(by_alias=True, mode="json", exclude_none=True)
        return mcp_tasks.detailed(task, approvals(deps.store, task, caller), result, user=caller.user)

    @guarded("tasks/get")
    async def get_task(ctx: Any, params: Any) -> Any:
        mcp_tasks.require_name(getattr(ctx.request, "headers", None), ctx.protocol_version, params.task_id)
        mcp_tasks.require_tasks(ctx.meta, ctx.protocol_version)
        caller = caller_var.get()
        return await anyio.to_thread.run_sync(lambda: read(caller, params.task_id))

    @guarded("tasks/update")
    async def update_task(ctx: Any, params: Any) -> Any:
        mcp_tasks.require_name(getattr(ctx.request, "headers", None), ctx.protocol_version, params.task_id)
        mcp_tasks.require_tasks(ctx.meta, ctx.protocol_version)
        caller = caller_var.get()
        await anyio.to_thread.run_sync(
            lambda: mcp_tasks.answer(deps, caller, owned(caller, params.task_id), params.input_responses)
        )
        return {}

    @guarded("tasks/cancel")
    async def cancel_task(ctx: Any, params: Any) -> Any:
        mcp_tasks.require_name(getattr(ctx.request, "headers", None), ctx.protocol_version, params.task_id)
        mcp_tasks.require_tasks(ctx.meta, ctx.protocol_version)
        caller = caller_var.get()
        await anyio.to_thread.run_sync(lambda: mcp_tasks.cancel(deps, owned(caller, params.task_id)))
        return {}

    server.add_request_handler("tasks/get", mcp_tasks.task_params_type(), get_task)
    server.add_request_handler("tasks/update", mcp_tasks.update_params_type(), update_task)
    server.add_request_handler("tasks/cancel", mcp_tasks.task_params_type(), cancel_task)


def guarded(method: str) -> Callable[[Handler], Handler]:
    """A handler whose failures are the protocol's errors, never an exception's text: an
    ``MCPError`` as raised; an ``AgentqError`` (the caller's to fix: a stopped scope, a
    refused message) ``-32602`` with its message; anything else is the server's fault (a
    throttled or refused store call, a stored item this release cannot read, a bug): logged,
    and ``-32603`` "internal error; see the service logs", as the REST API answers it (500).
    Unguarded, the ``mcp`` package answered a 2025-11-25 client ``{"code": 0, "message":
    str(exc)}`` and a pydantic error raised by the store ``-32602`` "Invalid request parameters"."""

    def wrap(handler: Handler) -> Handler:
        async def run(ctx: Any, params: Any) -> Any:
            from mcp.shared.exceptions import MCPError

            try:
                return await handler(ctx, params)
            except MCPError:
                raise
            except AgentqError as exc:
                where = f" ({exc.field})" if exc.field else ""
                raise mcp_tasks.invalid(f"{exc.message}{where}") from None
            except Exception:
                log.exception("mcp: %s failed", method)
                raise MCPError(code=INTERNAL_ERROR, message="internal error; see the service logs") from None

        return run

    return wrap


def _argument_errors(exc: ValidationError) -> str:
    """pydantic's errors in the API's words (``constraints.max_steps: ...``), without the help
    URL its ``str()`` adds to each: what a model calling the tool can act on."""
    return "; ".join(describe_validation_error(e)[0] for e in exc.errors(include_url=False))


def _known_agent(deps: McpDeps, caller: Caller, name: str) -> None:
    """MCP's "Unknown tool" (JSON-RPC ``-32602``) for a name that is no agent of the caller's
    tenant (none by that name, or a name no agent can have: ``support@2`` too, which
    ``tools/list`` never offers): the spec's protocol error for a request naming a tool the
    server does not have, which a model cannot fix by changing its arguments; an ``isError``
    result is for what it can (the tools spec's "Error Handling", 2025-11-25)."""
    if re.fullmatch(NAME_PATTERN, name) is None or not _has_agent(deps, caller, name):
        from mcp.shared.exceptions import MCPError

        shown = name if len(name) <= 128 else f"{name[:128]}..."
        raise MCPError(code=mcp_tasks.INVALID_PARAMS, message=f"Unknown tool: {shown}")


def _has_agent(deps: McpDeps, caller: Caller, name: str) -> bool:
    try:
        deps.store.agents.latest(caller.tenant, name)
    except AgentNotFound:
        return False
    return True


def _run_agent(deps: McpDeps, caller: Caller, agent: str, call: AgentCall) -> Outcome:
    return outcome(deps, wait(deps, _start_agent(deps, caller, agent, call), call.wait_seconds, caller=caller), caller)


def _start_agent(deps: McpDeps, caller: Caller, agent: str, call: AgentCall) -> Task:
    """Submit the agent's task (written before this returns)."""
    constraints = call.constraints.model_dump(mode="json", exclude_none=True) if call.constraints else {}
    raw: dict[str, Any] = {"goal": call.goal, "agent": agent, "constraints": constraints, "metadata": {"via": "mcp"}}
    user = caller.acting_user(call.user)  # before anything is written: a refused user submits nothing
    if user is not None:
        raw["user"] = user
    submission = parse_submission(raw)
    check_user_submission(caller, submission, deps.store)  # a token's: only what POST /tasks lets it set
    key = None if call.idempotency_key is None else call_key(user, call.idempotency_key)
    try:
        # The key is bound to the call as sent (POST /tasks's digest of it: the agent, goal,
        # constraints and user; not wait_seconds, which starts nothing), so a retry matches
        # even after a new version of the agent.
        submitted = submit_once(deps.store, deps.tools, submission, tenant=caller.tenant, queues=deps.queues,
                                idempotency_key=key, digest=request_hashes(submission), defaults=deps.defaults,
                                key_id=caller.key_id)  # fmt: skip
    except IdempotencyConflict:
        raise IdempotencyConflict(
            "this idempotency_key started a task of another call (another agent, goal, constraints or user); "
            "a retry repeats the call it retries, and a new call takes a new key",
            field="idempotency_key",
        ) from None
    return submitted.task


def call_key(user: str | None, key: str) -> str:
    """The name of a tools/call's ``idempotency_key`` record: one end user's keys apart from
    another's and from the tenant's (as POST /tasks scopes them, ``control.submit.user_scoped_key``),
    and all of them apart from POST /tasks's and A2A's keys, so a key a client uses on both
    never finds the other's task. A space joins the parts: no key (visible ASCII) and no user
    holds one, POST /tasks's names hold at most one, and ``-`` (no user) begins no user's name."""
    return f"mcp {user or '-'} {key}"
