"""``agentq.Client``: the HTTP API from Python, typed with the server's own models.

    from agentq import Client
    client = Client("https://...", api_key="aq_...")          # or AGENTQ_URL / AGENTQ_API_KEY
    accepted = client.submit({"goal": "...", "provider": "anthropic"})
    view = client.wait(accepted.task_id)                      # TaskView once the task ends
    for event in client.iter_trace(accepted.task_id): ...
    for event in client.iter_events(accepted.task_id): ...   # live, resumable (Last-Event-ID)

Every API error is raised as ``ApiError`` (``status``, ``code``, ``message``, ``field``), or one
of its subclasses by status: ``InvalidRequest`` (400/413/415/422), ``AuthenticationError``
(401/403), ``NotFound`` (404), ``Conflict`` (409), ``ServerError`` (5xx), or ``UnexpectedAnswer``
(a 2xx that is not the route's answer: not JSON, or another shape). An unreachable API (or an
answer cut short) raises ``ConnectionFailed``; a wait that runs out raises ``WaitTimeout``.

``submit`` sends an ``Idempotency-Key`` (a fresh one unless you pass yours), so the client can
retry a submit whose answer was lost without creating a second task.

This module holds the API's resources (tasks, agents, schedules, conversations, waiting); the
HTTP underneath them (one call and its retries, the event stream, the errors) is
``api.http_client``, whose names are re-exported here.
"""

from __future__ import annotations

import base64
import time
import urllib.parse
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentq.api.memory_client import MemoryStoresClient

from agentq.api.client_agents import AgentCalls
from agentq.api.client_pages import pages
from agentq.api.http_client import ApiError as ApiError
from agentq.api.http_client import AuthenticationError as AuthenticationError
from agentq.api.http_client import Conflict as Conflict
from agentq.api.http_client import ConnectionFailed as ConnectionFailed
from agentq.api.http_client import InvalidRequest as InvalidRequest
from agentq.api.http_client import NotFound as NotFound
from agentq.api.http_client import ServerError as ServerError
from agentq.api.http_client import UnexpectedAnswer as UnexpectedAnswer
from agentq.api.http_client import WaitTimeout as WaitTimeout
from agentq.api.http_client import _error_of as _error_of
from agentq.api.http_client import _NotStreaming as _NotStreaming
from agentq.api.http_client import _seg as _seg
from agentq.api.models import (
    MAX_MESSAGE_PAGE,
    MAX_PAGE_SIZE,
    BreakersView,
    CancelResult,
    CloseResult,
    EventPage,
    FileDiff,
    FileEntry,
    FileList,
    Health,
    InterruptResult,
    MessageAccepted,
    MessageList,
    MessageView,
    ScheduleList,
    ScheduleView,
    SpendView,
    TaskAccepted,
    TaskComparison,
    TaskEvent,
    TaskPage,
    TaskResult,
    TaskSummary,
    TaskView,
    TraceEvent,
    TracePage,
    WebhookSecret,
    WorkspaceUploaded,
)
from agentq.api.models.vault import CredentialList
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.vault import CredentialInfo

TERMINAL = frozenset(s.value for s in TaskStatus if s.terminal)
HUB_RETRY_SECONDS = 30.0  # after the events hub failed, the API's route serves the stream this long


class Client(AgentCalls):
    @property
    def memory(self) -> MemoryStoresClient:
        """The tenant's memory stores (``agentq.api.memory_client``)."""
        from agentq.api.memory_client import MemoryStoresClient

        return MemoryStoresClient(self)

    # ------------------------------------------------------------- the API

    def health(self) -> Health:
        return self._get(Health, "/health")

    def _hub(self) -> str | None:
        """The events hub's URL, if the deployment names one (asked once per client)."""
        if not hasattr(self, "_hub_url"):
            try:
                live = self.health().live
            except (ApiError, ConnectionFailed):
                live = None
            self._hub_url = live.url.rstrip("/") if live is not None else None
        return self._hub_url

    def spend(self, hours: float = 24, user: str | None = None) -> SpendView:
        """What this tenant's task trees spent in the last ``hours``, known and unknown apart
        (``GET /usage/spend``)."""
        query = {"hours": f"{hours:g}", **({"user": user} if user is not None else {})}
        return self._get(SpendView, f"/usage/spend?{urllib.parse.urlencode(query)}")

    def breakers(self) -> BreakersView:
        """The fleet's circuit breakers per provider and model (``GET /breakers``)."""
        return self._get(BreakersView, "/breakers")

    def openapi(self) -> dict[str, Any]:
        """The API's OpenAPI document."""
        return dict(self.request("GET", "/openapi.json"))

    def submit(
        self,
        submission: TaskSubmission | Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> TaskAccepted:
        """Submit a task: a ``TaskSubmission``, a dict of one, or its fields as keywords
        (``client.submit(goal="...", provider="anthropic")``)."""
        if isinstance(submission, TaskSubmission):
            # Only what the caller set: the server fills the rest with its deployment's defaults.
            body: dict[str, Any] = submission.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        else:
            body = dict(submission or {})
        body.update(fields)
        key = idempotency_key or f"client-{uuid.uuid4().hex}"
        return self.call(TaskAccepted, "POST", "/tasks", body, headers={"Idempotency-Key": key}, retry=True)

    # ------------------------------------------------------------ agents

    def create_schedule(self, spec: dict[str, Any]) -> ScheduleView:
        return self.call(ScheduleView, "POST", "/schedules", spec, retry=True)

    def list_schedules(self) -> list[ScheduleView]:
        """Every schedule, by name (following the pages: one holds at most 2 MB)."""
        read = pages(lambda cursor: self._get(ScheduleList, "/schedules", limit=100, cursor=cursor))
        return [schedule for page in read for schedule in page.schedules]

    def get_schedule(self, name: str) -> ScheduleView:
        return self._get(ScheduleView, f"/schedules/{_seg(name, 'name')}")

    def delete_schedule(self, name: str) -> ScheduleView:
        return self.call(ScheduleView, "DELETE", f"/schedules/{_seg(name, 'name')}")

    def put_credential(
        self,
        name: str,
        value: str,
        *,
        hosts: list[str],
        user: str | None = None,
        kind: str = "bearer",
        header: str | None = None,
        username: str | None = None,
    ) -> CredentialInfo:
        """Write a credential to the vault (docs/VAULTS.md); the answer never holds its value."""
        body = {"value": value, "hosts": hosts, "kind": kind, "user": user, "header": header, "username": username}
        sent = {k: v for k, v in body.items() if v is not None}
        return self.call(CredentialInfo, "PUT", f"/vault/credentials/{_seg(name, 'name')}", sent, retry=True)

    def list_credentials(self, user: str | None = None) -> list[CredentialInfo]:
        return self._get(CredentialList, "/vault/credentials", user=user).credentials

    def delete_credential(self, name: str, user: str | None = None) -> CredentialInfo:
        return self.call(CredentialInfo, "DELETE", f"/vault/credentials/{_seg(name, 'name')}", query={"user": user})

    def webhook_secret(self) -> str:
        """This tenant's callback signing secret (``agentq.core.webhooks.verify`` checks with it)."""
        return self._get(WebhookSecret, "/webhooks/secret").secret

    # ------------------------------------------------------------- tasks

    def get(self, task_id: str) -> TaskView:
        return self._get(TaskView, f"/tasks/{_seg(task_id)}")

    def list_tasks(
        self,
        status: TaskStatus | str | None = None,
        *,
        limit: int = 20,
        cursor: str | None = None,
        include_children: bool = False,
        metadata: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> TaskPage:
        """One page of tasks (``user``: of those acting for that end user), newest first; pass ``page.next_cursor`` for the next (``iter_tasks``
        follows them). ``limit``: 1 to ``MAX_PAGE_SIZE`` (100) tasks; the API refuses more with
        a 422 naming ``limit``. ``metadata``: only tasks whose metadata has every pair; a call
        reads at most 1,000 tasks, so a page may then hold fewer than ``limit``, even none,
        with a cursor to go on."""
        status_value = status.value if isinstance(status, TaskStatus) else status
        return self._get(
            TaskPage,
            "/tasks",
            status=status_value,
            limit=limit,
            cursor=cursor,
            include_children=include_children or None,
            metadata=[f"{k}={v}" for k, v in (metadata or {}).items()] or None,
            user=user,
        )

    def iter_tasks(
        self,
        status: TaskStatus | str | None = None,
        *,
        page_size: int = MAX_PAGE_SIZE,
        include_children: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> Iterator[TaskSummary]:
        """Every task (matching ``status`` and ``metadata``), newest first, following the cursors."""
        for page in pages(
            lambda cursor: self.list_tasks(
                status, limit=page_size, cursor=cursor, include_children=include_children, metadata=metadata
            )
        ):
            yield from page.tasks

    def result(self, task_id: str) -> TaskResult:
        """A finished task's result (``complete`` is False for a partial one); Conflict
        (``task_not_finished``) while it runs."""
        return self._get(TaskResult, f"/tasks/{_seg(task_id)}/result")

    def trace(self, task_id: str, *, limit: int = 100, cursor: str | None = None) -> TracePage:
        return self._get(TracePage, f"/tasks/{_seg(task_id)}/trace", limit=limit, cursor=cursor)

    def compare(self, task_id: str, other_id: str) -> TaskComparison:
        """Two runs side by side and the first step that differs (``agentq diff``)."""
        return self._get(TaskComparison, f"/tasks/{_seg(task_id)}/compare/{_seg(other_id, 'other_id')}")

    def iter_trace(self, task_id: str, *, page_size: int = 200) -> Iterator[TraceEvent]:
        """Every event of the task's trace, in commit order."""
        for page in pages(lambda cursor: self.trace(task_id, limit=page_size, cursor=cursor)):
            yield from page.events

    def events(self, task_id: str, *, after: str | None = None, tree: bool = False, limit: int = 100) -> EventPage:
        """One JSON page of the task's events after ``after`` (an event id or ``next_cursor``)."""
        return self._get(EventPage, f"/tasks/{_seg(task_id)}/events", after=after, tree=tree, limit=limit)

    def iter_events(
        self,
        task_id: str,
        *,
        after: str | None = None,
        tree: bool = False,
        stream: bool = True,
        poll_interval: float = 1.0,
    ) -> Generator[TaskEvent, None, None]:
        """The task's events (with ``tree``, its sub-agents' too) from after ``after`` until
        every watched task has ended. Reads the server-sent stream and reconnects after the
        last event it received (as ``Last-Event-ID`` would) when it drops, so no committed event is lost or repeated; falls back
        to polling JSON pages when the server does not stream (or ``stream=False``).
        Uncommitted events (``committed`` false: live text) come too, while streaming.

        Where the deployment runs an events hub (``GET /health`` names it under ``live``), the
        stream is read there; when the hub fails (unreachable, a 5xx, a dropped stream) or is
        full (429, its cap of open streams) the API's own route takes over from the last event id, and the hub is tried again
        ``HUB_RETRY_SECONDS`` later. Either way an event already yielded is never yielded again
        (ids are positions: the same event has the same id on both)."""
        cursor = after
        failures = 0
        seen: set[str] = set()
        hub = self._hub() if stream else None
        hub_failed_at: float | None = None
        while stream:
            on_hub = hub is not None and (hub_failed_at is None or time.monotonic() - hub_failed_at > HUB_RETRY_SECONDS)
            try:
                for event in self._sse(task_id, cursor, tree, base=hub if on_hub else None):
                    failures = 0
                    if event is None:  # the stream's end: every watched task has ended
                        return
                    if event.id:
                        if event.id in seen:
                            continue
                        seen.add(event.id)
                        cursor = event.id
                    yield event
            except _NotStreaming:
                stream = False
                break
            except (ConnectionFailed, ServerError):  # _sse's: refused, hung up, or dropped mid-chunk
                if on_hub:
                    hub_failed_at = time.monotonic()  # the API's route at once, from the last id
                    continue
                failures += 1
                if failures > 8 + self.retries:
                    raise
            except ApiError as exc:
                if on_hub and exc.status == 429:  # the hub's cap of open streams: the API's route, as for a 5xx
                    hub_failed_at = time.monotonic()
                    continue
                raise
            time.sleep(min(0.1 * 2**failures, 2.0))  # the stream dropped (or a batch ended): resume
        while True:
            page = self.events(task_id, after=cursor, tree=tree, limit=200)
            yield from page.events
            cursor = page.next_cursor or cursor
            if page.done:
                return
            if not page.events:
                time.sleep(poll_interval)

    # ------------------------------------------------------------ files

    def files(self, task_id: str, *, step: int | None = None, after: str | None = None, limit: int = 1000) -> FileList:
        """A page of the task's workspace entries as committed step ``step`` left them (default the last)."""
        return self._get(FileList, f"/tasks/{_seg(task_id)}/files", step=step, after=after, limit=limit)

    def iter_files(self, task_id: str, *, step: int | None = None) -> Iterator[FileEntry]:
        """Every entry, page by page, of one step's workspace (the step pinned by the first page)."""
        page = self.files(task_id, step=step)
        pinned = page.step
        yield from page.files
        while page.next_after is not None:
            page = self.files(task_id, step=pinned, after=page.next_after)
            yield from page.files

    def upload_workspace(self, archive: bytes) -> str:
        """Upload a tar or zip archive as starting files; the ``upload`` a submission's
        ``workspace.upload`` names (``POST /workspace-uploads``)."""
        body = {"archive_b64": base64.b64encode(archive).decode()}
        answer = self.call(WorkspaceUploaded, "POST", "/workspace-uploads", body, retry=True)
        return answer.upload

    def file(self, task_id: str, path: str, *, step: int | None = None) -> bytes:
        """One file's bytes as committed step ``step`` left it."""
        quoted = urllib.parse.quote(path, safe="/")
        raw: bytes = self.request(
            "GET",
            f"/tasks/{_seg(task_id)}/files/{quoted}",
            query={"step": step},
            headers={"Accept": "application/octet-stream"},
            decode=False,
        )
        return raw

    def diff(self, task_id: str, first: int, last: int | None = None) -> FileDiff:
        """What changed in the task's files from step ``first`` to ``last`` (default the last step)."""
        steps = f"{first}..{'' if last is None else last}"
        return self._get(FileDiff, f"/tasks/{_seg(task_id)}/diff", steps=steps)

    def cancel(self, task_id: str) -> CancelResult:
        return self.call(CancelResult, "POST", f"/tasks/{_seg(task_id)}/cancel")

    def approve(self, task_id: str, note: str = "", tool_use_id: str | None = None) -> TaskView:
        """Approve the held call ``tool_use_id`` (the view's ``pending_tool_use_id``; ``Conflict``
        naming it once that call is decided or another is held). None: whatever is held then."""
        return self._decide("approve", task_id, note, tool_use_id)

    def reject(self, task_id: str, note: str = "", tool_use_id: str | None = None) -> TaskView:
        return self._decide("reject", task_id, note, tool_use_id)

    def _decide(self, verb: str, task_id: str, note: str, tool_use_id: str | None) -> TaskView:
        body: dict[str, Any] = {"note": note, **({"tool_use_id": tool_use_id} if tool_use_id is not None else {})}
        return self.call(TaskView, "POST", f"/tasks/{_seg(task_id)}/{verb}", body)

    def raise_budget(
        self, task_id: str, add_tokens: int = 0, add_steps: int = 0, add_usd: Decimal | str | None = None
    ) -> TaskView:
        body: dict[str, Any] = {"add_tokens": add_tokens, "add_steps": add_steps}
        if add_usd:
            body["add_usd"] = str(add_usd)
        return self.call(TaskView, "POST", f"/tasks/{_seg(task_id)}/budget", body)

    def fork(self, task_id: str, at_step: int, **overrides: Any) -> TaskView:
        """A new task from ``task_id``'s steps 1..at_step; overrides: provider, model, script,
        system, constraints (a partial dict), priority, metadata. Returns the new task."""
        body = {"at_step": at_step, **{k: v for k, v in overrides.items() if v is not None}}
        return self.call(TaskView, "POST", f"/tasks/{_seg(task_id)}/fork", body)

    # -------------------------------------------------------- conversation

    def send(
        self,
        task_id: str,
        text: str,
        *,
        idempotency_key: str | None = None,
        add_tokens: int = 0,
        add_steps: int = 0,
        add_usd: Decimal | str | None = None,
    ) -> MessageAccepted:
        """Send the task a message: delivered at its next turn boundary, or a follow-up that
        continues an answered or interrupted task. Retried safely (an Idempotency-Key)."""
        body: dict[str, Any] = {"text": text, "add_tokens": add_tokens, "add_steps": add_steps}
        if add_usd:
            body["add_usd"] = str(add_usd)
        key = idempotency_key or f"client-{uuid.uuid4().hex}"
        path = f"/tasks/{_seg(task_id)}/messages"
        return self.call(MessageAccepted, "POST", path, body, headers={"Idempotency-Key": key}, retry=True)

    def messages(self, task_id: str) -> list[MessageView]:
        """Every message the task was sent, in the order it reads them (following the pages)."""
        return [m for page in pages(lambda cursor: self.message_page(task_id, cursor=cursor)) for m in page.messages]

    def message_page(self, task_id: str, *, limit: int = MAX_MESSAGE_PAGE, cursor: str | None = None) -> MessageList:
        """One page of the task's messages; pass ``page.next_cursor`` for the next."""
        return self._get(MessageList, f"/tasks/{_seg(task_id)}/messages", limit=limit, cursor=cursor)

    def interrupt(self, task_id: str) -> InterruptResult:
        """Stop the agent at its earliest safe point; it waits ``idle`` for the next message."""
        return self.call(InterruptResult, "POST", f"/tasks/{_seg(task_id)}/interrupt")

    def close_conversation(self, task_id: str) -> CloseResult:
        return self.call(CloseResult, "POST", f"/tasks/{_seg(task_id)}/close")

    # ------------------------------------------------------------- waiting

    def wait_for(
        self,
        task_id: str,
        predicate: Callable[[TaskView], bool],
        *,
        timeout: float = 3600,
        poll: float = 0.5,
        on_update: Callable[[TaskView], None] | None = None,
    ) -> TaskView:
        """Poll until ``predicate(view)``; ``on_update`` sees every view that differs from the last."""
        deadline = time.monotonic() + timeout
        last: tuple[Any, ...] | None = None
        while True:
            view = self.get(task_id)
            state = (view.status, view.step, view.tokens.total, view.activity)
            if on_update is not None and state != last:
                on_update(view)
            last = state
            if predicate(view):
                return view
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} still {view.status.value} after {timeout:g}s", view)
            time.sleep(poll)

    def wait(
        self,
        task_id: str,
        *,
        timeout: float = 3600,
        poll: float = 0.5,
        on_update: Callable[[TaskView], None] | None = None,
    ) -> TaskView:
        """The task's view once it has stopped: ended (succeeded, failed, cancelled, cost_exceeded,
        timed_out, failed_outcome), or ``idle`` after an interrupt, waiting for a message."""
        return self.wait_for(task_id, _stopped, timeout=timeout, poll=poll, on_update=on_update)

    def wait_for_status(
        self, task_id: str, *statuses: TaskStatus | str, timeout: float = 3600, poll: float = 0.5
    ) -> TaskView:
        """The task's view once it is in one of ``statuses`` (or has ended)."""
        wanted = {TaskStatus(s) for s in statuses}
        return self.wait_for(task_id, lambda v: v.status in wanted or v.status.terminal, timeout=timeout, poll=poll)

    def run(
        self, submission: TaskSubmission | Mapping[str, Any] | None = None, *, timeout: float = 3600, **fields: Any
    ) -> TaskView:
        """Submit and wait: the ended task's view."""
        return self.wait(self.submit(submission, **fields).task_id, timeout=timeout)


def _stopped(view: TaskView) -> bool:
    return view.status.terminal or view.status is TaskStatus.IDLE
