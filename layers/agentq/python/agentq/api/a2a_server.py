"""agentq as an A2A server: each of a tenant's agents (``name`` or ``name@version``) is an A2A
agent at ``/a2a/{agent}``, its Agent Card at ``/a2a/{agent}/.well-known/agent-card.json``
(``api/routes/a2a.py``). The official ``a2a-sdk`` speaks the protocol (JSON-RPC parsing, method
routing, error codes, the server-sent events of a stream); this module is its ``RequestHandler``,
which calls the same control functions the HTTP API calls, as the MCP server does
(``api/mcp_server.py``): the core knows nothing of A2A.

- ``SendMessage`` without a ``taskId`` submits a task of the agent (``control.submit``, checked
  and budgeted as any submission; the message id is its idempotency key, so a retried send
  starts one task); with a ``taskId`` it continues that task under its double-texting policy
  (``control.conversations.send_message``: a follow-up to an interrupted task, a message at
  the next turn boundary to a running one), or, to a task paused for approval, it is
  the decision (``approve`` / ``reject`` and an optional note, or a data part
  ``{"approved": bool, "note": str, "toolUseId": str}``: the held call its status message names,
  so the decision is of that call or of none; read by ``api/a2a_messages.py``). A decision is
  bound to the call held when it first arrives (``_decide``): a retry of it (the same message id and
  text, and Idempotency-Key if any) decides that call or nothing, never the one held next. It answers with the task once it stopped
  (``input-required``, ``auth-required`` or an end) or after ``WAIT_SECONDS``, at once with
  ``returnImmediately``. A task that has ended takes no message (``UnsupportedOperationError``,
  as the protocol requires: an A2A task never restarts, where agentq would reopen an answered
  one): the next message of the conversation goes to the context (its ``contextId``), a new task.
- ``SendStreamingMessage`` / ``SubscribeToTask``: the task, then a status update at each change
  of its A2A state (and the artifacts: the result, the workspace's files): event by event where the server holds the
  connection, a subscription following the task to its end; sent whole in the API Lambda
  (``api/a2a_stream.py``). A client resumes with ``SubscribeToTask``, which starts with the task
  as it is now, so nothing committed is lost between two streams.
- ``GetTask``, ``ListTasks`` (this agent's tasks of the caller, newest first: ``api/a2a_listing.py``),
  ``CancelTask``.
- Push notification configs (``api/a2a_push.py``): created, read, listed, deleted per task (or
  given with a send, then stored before its task can run on it), each URL checked as a callback's; the task's changes are POSTed there
  signed when it waits for someone or ends (``queueing/a2a_push.py``). The tenant's keys' only:
  an end user's token, whose card says ``pushNotifications: false``, sets, reads and deletes none.

Tenancy: every call acts for the request's caller (``core.endusers.Caller``, the API's own
auth, handed in a context variable the route sets): a task of another tenant, of another end
user, or of another agent is ``TaskNotFoundError``, the same answer as an id that never existed.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentq.api import a2a_views as views
from agentq.api.a2a_listing import ListingMethods, of_agent
from agentq.api.a2a_messages import decision, decision_data, text_of
from agentq.api.a2a_push import PushConfigMethods, config_in, refuse_push
from agentq.api.a2a_stream import stopped, task_events
from agentq.api.a2a_views import HISTORY_BYTES
from agentq.api.routes.common import ApiDeps
from agentq.api.user_submission import check_user_submission
from agentq.control import operations
from agentq.control.conversations import send_message
from agentq.control.submit import parse_submission, submit_once
from agentq.core.endusers import Caller
from agentq.core.errors import AgentqError, IllegalTransition, TaskNotFound
from agentq.core.models import MAX_GOAL_CHARS, Task, TaskStatus
from agentq.queueing.a2a_artifacts import BASE_KEY
from agentq.storage.keys import new_task_id

WAIT_SECONDS = 20.0  # a blocking SendMessage: API Gateway answers within 29 s
POLL_SECONDS = 0.25

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """Whom a request acts for, and which agent it addresses (``name`` or ``name@version``)."""

    caller: Caller
    agent: str
    idempotency_key: str | None = None  # the request's Idempotency-Key header: retries of it send once
    base: str = ""  # the API's URL as the caller reached it: where a task's workspace artifact points

    @property
    def name(self) -> str:
        return self.agent.split("@", 1)[0]


call_var: contextvars.ContextVar[Call] = contextvars.ContextVar("agentq_a2a_call")


def _errors() -> Any:
    from a2a.utils import errors

    return errors


def _invalid(message: str, field: str) -> Exception:
    return _errors().InvalidParamsError(message=f"{field}: {message}", data={"field": field})  # type: ignore[no-any-return]


def _refusal(exc: AgentqError) -> Exception:
    """agentq's refusal as the protocol's error: a missing task is TaskNotFound, a task that is
    not in a state for it InvalidParams naming why, anything else refused InvalidParams."""
    errors = _errors()
    if isinstance(exc, TaskNotFound):
        return errors.TaskNotFoundError()  # type: ignore[no-any-return]
    return _invalid(exc.message, exc.field or "params")


async def _off_loop(fn: Callable[[], T]) -> T:
    """A store call (blocking boto3) on a thread, agentq's refusals as A2A's errors."""
    try:
        return await asyncio.to_thread(fn)
    except AgentqError as exc:
        raise _refusal(exc) from None


class AgentqRequestHandler(PushConfigMethods, ListingMethods):
    """The SDK's ``RequestHandler`` over agentq's control functions (built by ``build_handler``,
    which subclasses the SDK's abstract class, so importing this module does not import it)."""

    def __init__(self, deps: ApiDeps) -> None:
        self.deps = deps

    # -- reads --------------------------------------------------------------------------

    def _caller(self) -> Caller:
        return call_var.get().caller

    def _agent(self) -> str:
        return call_var.get().name

    def _owned(self, task_id: str) -> Task:
        """The task if the caller sees it and it is this agent's, else TaskNotFound."""
        call = call_var.get()
        try:
            task = self.deps.store.tasks.get(task_id) if task_id else None
        except TaskNotFound:
            task = None
        if task is None or not call.caller.sees(task.tenant, task.user) or not of_agent(task, call.name):
            raise TaskNotFound(f"task {task_id!r} not found", field="id")
        return task

    def _asked(self, task: Task) -> Any:
        """What a paused task waits for (its pending approval: a credential's is ``auth-required``,
        any other ``input-required``), else None: read only for a paused task."""
        return self.deps.store.approvals.pending(task.task_id) if task.status is TaskStatus.PAUSED else None

    def _view(
        self, task: Task, history_length: int | None = None, *, with_artifacts: bool = True, budget: int = HISTORY_BYTES
    ) -> Any:
        pending = self._asked(task)
        history = views.history(self.deps.store, task, history_length, budget=budget)
        shown = views.artifacts(self.deps.store, task) if with_artifacts else []
        return views.a2a_task(task, pending, history=history, artifacts=shown)

    async def on_get_task(self, params: Any, context: Any) -> Any:
        length = params.history_length if params.HasField("history_length") else None
        if length is not None and length < 0:
            raise _invalid("must be 0 or more", "historyLength")
        return await _off_loop(lambda: self._view(self._owned(params.id), length))

    # -- actions -------------------------------------------------------------------------

    async def on_cancel_task(self, params: Any, context: Any) -> Any:
        deps = self.deps

        def cancel() -> Any:
            task = self._owned(params.id)
            try:
                operations.cancel(deps.store, task.task_id, tenant=task.tenant, fanout=deps.fanout, queues=deps.queues,
                                  slots=deps.defaults.running_slots(deps.store))  # fmt: skip
            except IllegalTransition:
                raise _errors().TaskNotCancelableError(
                    message=f"task {task.task_id} is {task.status.value}: it has ended"
                ) from None
            return self._view(deps.store.tasks.get(task.task_id))

        return await _off_loop(cancel)

    def _start_or_continue(self, params: Any) -> tuple[Task, int]:
        """Submit a task, or hand the message to the task it names; the task and how many of
        its messages must be delivered before its state answers this one. A push config the send
        carries (``configuration.taskPushNotificationConfig``) is stored before the task can run
        on this message: a task that pauses or ends at once is notified too."""
        push = params.configuration.task_push_notification_config
        push = push if params.configuration.HasField("task_push_notification_config") else None
        message = params.message
        text = text_of(message)
        call = call_var.get()
        deps = self.deps
        if message.task_id:
            task = self._owned(message.task_id)
            if message.context_id and message.context_id != views.context_id(task):
                raise _invalid(f"task {task.task_id} is of context {views.context_id(task)!r}", "message.contextId")
            if task.status.terminal:
                # A2A ends a task for good (agentq would reopen an answered one): a new message in
                # the context (its contextId, no taskId) starts the next task instead.
                raise _ended(task, task.status.value)
            undo = self._store_push_undoably(task.task_id, task.tenant, push)[1] if push is not None else None
            try:
                return self._continue(task, message, text)
            except BaseException:
                if undo is not None:
                    undo()  # the message was refused: so is the config it came with
                raise
        if len(text) > MAX_GOAL_CHARS:
            raise _invalid(f"{len(text):,} characters; a task's first message holds at most {MAX_GOAL_CHARS:,}",
                           "message.parts")  # fmt: skip
        context = message.context_id or uuid.uuid4().hex
        raw = {
            "goal": text,
            "agent": call.agent,
            "metadata": {"via": views.VIA, views.CONTEXT_KEY: context, **({BASE_KEY: call.base} if call.base else {})},
            **({"user": call.caller.user} if call.caller.user else {}),
        }
        submission = parse_submission(raw)
        check_user_submission(call.caller, submission, deps.store)  # a token's: only what POST /tasks lets it set
        # The key names the request as sent (its digest too: the context a new task gets is drawn here)
        key = _idempotency_key(call, message.message_id, message.context_id, text)
        # The task's id is drawn here so that its push config is in place before it exists: one
        # ended or paused within the submission (a concurrency key's skip) or within milliseconds
        # on a worker finds it. A refused submission takes its config away with it.
        task_id = new_task_id()
        undo = self._store_push_undoably(task_id, call.caller.tenant, push)[1] if push is not None else None
        try:
            # The caller's key goes with the task (as POST /tasks does): that key's caps, its stop
            # and the rules naming it (``api_key``) cover the task and its sub-agents.
            submitted = submit_once(deps.store, deps.tools, submission, tenant=call.caller.tenant, queues=deps.queues,
                                    idempotency_key=key, digest=key or None, defaults=deps.defaults,
                                    task_id=task_id, key_id=call.caller.key_id)  # fmt: skip
        except BaseException:
            if undo is not None:
                undo()
            raise
        if undo is not None and submitted.task.task_id != task_id:
            # A retried send (its Idempotency-Key) found the task the first one started: the config is that task's.
            undo()
            self._store_push(submitted.task.task_id, submitted.task.tenant, push)
        return submitted.task, 0

    def _continue(self, task: Task, message: Any, text: str) -> tuple[Task, int]:
        """The message to a task that has not ended: the decision of a paused one, else a message
        under its double-texting policy."""
        deps, call = self.deps, call_var.get()
        decided = self._decide(task, message, text)
        if decided is not None:
            return decided, 0
        try:
            # The end is checked again in the write that takes the message: a task that ended since
            # the read above is refused there, never reopened.
            sent = send_message(deps.store, deps.queues, task.task_id, text, tenant=task.tenant, reopen_ended=False,
                                idempotency_key=_idempotency_key(call, message.message_id, task.task_id, text))  # fmt: skip
        except IllegalTransition as exc:
            status = exc.details.get("status")
            if isinstance(status, str) and TaskStatus(status).terminal:
                raise _ended(task, status) from None
            raise
        return deps.store.tasks.get(task.task_id), sent.message.seq

    def _decide(self, task: Task, message: Any, text: str) -> Task | None:
        """The message as a decision, and the task after it; None if it is no decision (a message
        to a task not paused, naming no call). A decision is bound to the call held when it first
        arrives (``Approvals.bind``, under ``_decision_key``: its Idempotency-Key if any, message
        id and text), so a retry of it (a timeout, a proxy's) decides that call or nothing:
        one it already decided answers the task as it is now, never deciding the call held next,
        which the person was never shown."""
        deps, call = self.deps, call_var.get()
        approvals = deps.store.approvals
        data = decision_data(message)
        key = _decision_key(call, message.message_id, task.task_id, text)
        use_id = approvals.bound(task.task_id, key)
        # A decision naming its call is one even when the task no longer waits (a double click,
        # another reviewer first): refused, not handed to the agent as a message.
        if use_id is None and task.status is not TaskStatus.PAUSED and (data is None or data[2] is None):
            return None
        approved, note, named = data if data is not None else decision(text)
        if use_id is None:
            pending = approvals.pending(task.task_id) if named is None else None
            held = named or (pending.use_id if pending is not None else None)
            use_id = approvals.bind(task.task_id, key, held) if held is not None else None
        try:
            operations.decide(deps.store, deps.queues, task.task_id, approved=approved, note=note,
                              by=call.caller.tenant, by_user=call.caller.user, tenant=task.tenant,
                              tool_use_id=use_id, decision_key=key)  # fmt: skip
        except IllegalTransition as exc:
            if use_id is not None and approvals.decided_with(task.task_id, use_id, key):
                return deps.store.tasks.get(task.task_id)  # this request decided it before: a retry
            if exc.field == "tool_use_id":  # said in A2A's name, the one the task's status message gives
                raise _invalid(exc.message, "toolUseId") from None
            raise
        return deps.store.tasks.get(task.task_id)

    def _settled(self, task: Task, heard: int, seconds: float) -> Task:
        deadline = time.monotonic() + seconds
        while not stopped(task, heard) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            task = self.deps.store.tasks.get(task.task_id)
        return task

    async def on_message_send(self, params: Any, context: Any) -> Any:
        configuration = params.configuration
        _check_send(params)
        wait = 0.0 if configuration.return_immediately else WAIT_SECONDS
        length = configuration.history_length if configuration.HasField("history_length") else None

        def send() -> Any:
            task, heard = self._start_or_continue(params)
            return self._view(self._settled(task, heard, wait), length)

        return await _off_loop(send)

    async def on_message_send_stream(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        _check_send(params)
        task, heard = await _off_loop(lambda: self._start_or_continue(params))
        async for event in task_events(self._view, self._poll, _off_loop, task, heard, follow=False):
            yield event

    async def on_subscribe_to_task(self, params: Any, context: Any) -> AsyncGenerator[Any]:
        task = await _off_loop(lambda: self._owned(params.id))
        if task.status.terminal:
            raise _errors().UnsupportedOperationError(
                message=f"task {task.task_id} has ended ({task.status.value}): GetTask reads it"
            )
        async for event in task_events(self._view, self._poll, _off_loop, task, 0, follow=True):
            yield event

    def _poll(self, task_id: str, heard: int) -> tuple[Task, Any | None]:
        """The task now, and its A2A view unless it is idle before taking ``heard`` messages in."""
        task = self.deps.store.tasks.get(task_id)
        if task.status is TaskStatus.IDLE and not stopped(task, heard):
            return task, None
        return task, self._view(task, 0)

    # -- push notification configs: api/a2a_push.py -------------------------------------

    def _store_call(self, fn: Callable[[], T]) -> Any:
        return _off_loop(fn)

    async def on_get_extended_agent_card(self, params: Any, context: Any) -> Any:
        """The card declares ``extendedAgentCard: false``: A2A 1.0 (3.3.4) answers the method with
        ``UnsupportedOperationError``; ``ExtendedAgentCardNotConfiguredError`` is for an agent
        that declares one and has none configured."""
        raise _errors().UnsupportedOperationError(message="this agent has no extended card (extendedAgentCard: false)")


def build_handler(deps: ApiDeps) -> Any:
    """The handler as an instance of the SDK's ``RequestHandler`` (its abstract methods are
    the ones ``AgentqRequestHandler`` defines)."""
    from a2a.server.request_handlers.request_handler import RequestHandler

    handler_class = type("AgentqA2AHandler", (AgentqRequestHandler, RequestHandler), {})
    return handler_class(deps)


def _idempotency_key(call: Call, message_id: str, where: str, text: str) -> str | None:
    """With an ``Idempotency-Key`` header (as the HTTP API's ``POST /tasks`` and messages take
    it), a retried send (the same key, message id, agent, context or task, and text) finds what
    the first one did, and the same key with anything else is another message; without one each
    send is a message of its own. Not the message id alone: A2A lets an agent dedupe by it
    ("MAY"), but clients reuse ids (the TCK sends one id in many tests, each meaning a new
    task), and a dedupe they did not ask for hands them an old task."""
    if call.idempotency_key is None:
        return None
    parts = (call.idempotency_key, call.agent, where, message_id, text)
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]
    return f"a2a:{call.caller.user}#{digest}" if call.caller.user else f"a2a:{digest}"


def _ended(task: Task, status: str) -> Exception:
    """A message to a task that has ended: A2A's UnsupportedOperation, naming the next task's way."""
    return _errors().UnsupportedOperationError(  # type: ignore[no-any-return]
        message=f"task {task.task_id} has ended ({status}): send a new message with contextId "
        f"{views.context_id(task)!r} and no taskId for a new task"
    )


def _decision_key(call: Call, message_id: str, task_id: str, text: str) -> str:
    """What names a decision request across its retries: its Idempotency-Key if it has one, and
    its message id and text (A2A lets an agent dedupe by message id: a client retrying a message
    sends the same one), for this task, agent and user. A reused message id with other text is
    another decision; the same id and text, without a key, the same one."""
    parts = (call.idempotency_key or "", call.caller.user or "", call.agent, task_id, message_id, text)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


def _check_send(params: Any) -> None:
    if not params.HasField("message"):
        raise _invalid("required", "message")
    if not params.message.message_id:
        raise _invalid("required", "message.messageId")
    configuration = params.configuration
    if configuration.HasField("task_push_notification_config"):  # refused before any task starts
        refuse_push(call_var.get().caller, "configuration.taskPushNotificationConfig")
        config_in(configuration.task_push_notification_config, "")
    if configuration.HasField("history_length") and configuration.history_length < 0:
        raise _invalid("must be 0 or more", "configuration.historyLength")
    modes = set(configuration.accepted_output_modes)
    if modes and not modes & {views.TEXT, views.JSON_TYPE, "text", "*/*"}:
        raise _errors().ContentTypeNotSupportedError(
            message=f"configuration.acceptedOutputModes: this agent answers {views.TEXT} or {views.JSON_TYPE}"
        )
