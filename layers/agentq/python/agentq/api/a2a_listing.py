"""A2A's ``ListTasks`` (mixed into ``api/a2a_server.AgentqRequestHandler``): this agent's tasks of
the caller, newest created first, filtered by context, A2A state and last update, paged with an
opaque ``nextPageToken`` (the tenant index's sort key of the page's last task).

A page holds at most ``pageSize`` tasks and, as the REST listings (``api/cursors.fitting``), no
more of them than fit ``PAGE_BYTES`` as JSON, whole: the rest go to ``nextPageToken``. A task's
view holds its result twice with ``includeArtifacts`` (the completed status message, the
``result`` artifact) and its share of the history: before, 12 tasks of 250 KB results answered
6 MB, past what a Lambda may answer. A task bigger than the budget alone is listed cut
(``a2a_views.cut``: its long texts cut with a note, ``metadata.agentq.truncated``); ``GetTask``
reads it whole.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

from agentq.api import a2a_views as views
from agentq.api.a2a_views import HISTORY_BYTES
from agentq.api.cursors import fitting
from agentq.api.models import LISTING_PAGE_BYTES
from agentq.api.routes.common import ApiDeps
from agentq.core.endusers import Caller
from agentq.core.models import Task
from agentq.storage.keys import TENANT_INDEX_SK

MAX_PAGE = 100
PAGE_BYTES = LISTING_PAGE_BYTES - 4_096  # the tasks' budget; the rest: the answer's envelope and token


def _errors() -> Any:
    from a2a.utils import errors

    return errors


def _invalid(message: str, field: str) -> Exception:
    return _errors().InvalidParamsError(message=f"{field}: {message}", data={"field": field})  # type: ignore[no-any-return]


def of_agent(task: Task, name: str) -> bool:
    return (task.submission.agent or "").split("@", 1)[0] == name


class ListingMethods:
    """``on_list_tasks``; the class it is mixed into gives ``deps``, ``_caller`` (whom the request
    acts for), ``_agent`` (the agent's name it addresses), ``_asked`` (what a paused task waits
    for), ``_view`` (a task's A2A view) and ``_store_call`` (a store call off the event loop,
    agentq's refusals as the protocol's errors)."""

    deps: ApiDeps
    _caller: Callable[[], Caller]
    _agent: Callable[[], str]
    _asked: Callable[[Task], Any]
    _view: Callable[..., Any]
    _store_call: Callable[[Callable[[], Any]], Any]

    async def on_list_tasks(self, params: Any, context: Any) -> Any:
        from a2a.types import ListTasksResponse

        size = params.page_size if params.HasField("page_size") else 50
        if not 1 <= size <= MAX_PAGE:
            raise _invalid(f"must be 1 to {MAX_PAGE}", "pageSize")
        length = params.history_length if params.HasField("history_length") else 0
        if length < 0:
            raise _invalid("must be 0 or more", "historyLength")
        caller, agent = self._caller(), self._agent()
        after = _decode_token(params.page_token) if params.page_token else None
        wanted_state = params.status if params.status else None
        since = (
            params.status_timestamp_after.ToMilliseconds() / 1000 if params.HasField("status_timestamp_after") else None
        )

        def page() -> Any:
            found: list[Task] = []
            last = after
            for _ in range(10):  # at most 10 index pages read per call, however rare the match
                tasks, last = self.deps.store.tasks.list_for_tenant(
                    caller.tenant, limit=MAX_PAGE, after=last, roots_only=True, user=caller.user
                )
                for task in tasks:
                    if not (caller.sees(task.tenant, task.user) and of_agent(task, agent)):
                        continue
                    if params.context_id and views.context_id(task) != params.context_id:
                        continue
                    if since is not None and (task.updated_at or task.created_at) <= since:
                        continue
                    if wanted_state is not None and views.state_of(task, self._asked(task)) != wanted_state:
                        continue
                    found.append(task)
                if last is None or len(found) >= size:
                    break
            more = found[size:]
            found = found[:size]
            share = HISTORY_BYTES // max(1, len(found))  # the page's histories share one answer's budget
            built: list[tuple[Any, int]] = []

            def sizes() -> Iterator[int]:  # each view built when ``fitting`` reads its size
                for task in found:
                    view = self._view(task, length, with_artifacts=params.include_artifacts, budget=share)
                    built.append((view, views.json_size(view)))
                    yield built[-1][1]

            kept = fitting(sizes(), PAGE_BYTES)
            tasks_out = [view for view, _ in built[:kept]]
            if tasks_out and built[0][1] > PAGE_BYTES:  # alone, and bigger than a page: listed cut
                tasks_out[0] = views.cut(tasks_out[0], PAGE_BYTES)
            token = ""
            if more or kept < len(found) or last is not None:
                from agentq.storage import keys

                edge = found[kept - 1] if kept else None
                token = _encode_token(keys.tenant_index_sk(edge.created_at, edge.task_id) if edge else str(last))
            # total_size is this page's count, not the protocol's count before pagination: a count
            # reads every task of the tenant (its index has no agent); docs/PROTOCOLS.md.
            return ListTasksResponse(tasks=tasks_out, next_page_token=token, page_size=size, total_size=kept)

        return await self._store_call(page)


def _encode_token(sk: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"a2a": sk}).encode()).decode().rstrip("=")


def _decode_token(token: str) -> str:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        sk = raw["a2a"]
    except (ValueError, KeyError, TypeError):
        raise _invalid("not a token this server issued; pass nextPageToken back unchanged", "pageToken") from None
    if not isinstance(sk, str) or not TENANT_INDEX_SK.fullmatch(sk):  # what _encode_token was given
        raise _invalid("not a token this server issued; pass nextPageToken back unchanged", "pageToken")
    return sk
