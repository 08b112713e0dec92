"""What the routers share: ``ApiDeps``, what every route needs, built once per app (the
storage, tools and queues it acts on, and the caller's tenant), and ``Router``.

Routers are built by a function of the deps (``router(deps)``), not at import, so two apps in
one process (tests, the local stack) never share a router: powertools points an included
router at the app that included it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from agentq.api.models import CURSOR_PATTERN, MAX_CURSOR_CHARS, MAX_LISTING_PAGE, TASK_ID_PATTERN
from agentq.control.defaults import Defaults
from agentq.core.endusers import MAX_USER_CHARS, USER_PATTERN, Caller
from agentq.core.errors import ValidationError
from agentq.core.providers.scripted import builtin_script_names
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

F = TypeVar("F", bound=Callable[..., Any])

TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="a task id")]


# A page cursor: its bounds are documented, not enforced by the validator (which would answer
# 422); the view decodes it and answers anything it did not issue 400 invalid_cursor.
def page_cursor(max_chars: int = MAX_CURSOR_CHARS) -> Any:
    """The ``cursor`` query parameter of a listing whose cursors are at most ``max_chars`` long."""
    return Query(
        description="next_cursor of the previous page, unchanged (base64url, at most "
        f"{max_chars} characters; a cursor of another listing or task is 400 invalid_cursor)",
        json_schema_extra={"maxLength": max_chars, "pattern": CURSOR_PATTERN},
    )


PageCursor = Annotated[str | None, page_cursor()]
# ?limit= of a listing of whole long items (versions, schedules, rules): a page holds fewer once
# they pass LISTING_PAGE_BYTES as JSON.
ListingLimit = Annotated[
    int,
    Query(
        ge=1, le=MAX_LISTING_PAGE,
        description=f"items per page, at most {MAX_LISTING_PAGE} (fewer once they pass 2 MB as JSON): follow next_cursor",
    ),
]  # fmt: skip


def user_query(description: str) -> Any:
    """The ``user`` query parameter of a read narrowed to one end user's tasks: the
    submission's rule for a user (``core.endusers``); what a token's caller gets is
    ``Caller.reads_for``'s."""
    return Query(min_length=1, max_length=MAX_USER_CHARS, pattern=USER_PATTERN, description=description)


@dataclass(frozen=True)
class ApiDeps:
    store: Storage
    tools: ToolRegistry
    queues: TaskQueues
    fanout: Any
    defaults: Defaults
    tenant: Callable[[], str]  # the current request's tenant (the resolver answered 401 if none)
    operator: Callable[[], bool] = lambda: False  # may the current request's key read every tenant's usage
    caller: Callable[[], Caller] = lambda: Caller("local", names_users=True)  # whom the request acts for
    mcp: Any = None  # the deployment's MCP servers (core.tools.mcp.McpServers): listed when an agent is created


def visible(deps: ApiDeps, task_id: str) -> None:
    """For a caller acting as one end user: 404 unless ``task_id`` is that user's (a key's caller
    acts for its whole tenant, which the control operation checks itself, without this read)."""
    caller = deps.caller()
    if caller.bound:
        from agentq.api.task_view import owned

        owned(deps.store, task_id, caller)


def builtin_script_only(script: Any) -> None:
    """Over HTTP a script is inline or a built-in name, never a path on the server: the
    scripted provider would read any file it names."""
    if isinstance(script, str) and script not in builtin_script_names():
        raise ValidationError(
            f"script: unknown script {script!r}; built-in scripts: {', '.join(builtin_script_names())} (or send the script inline)",
            field="script",
        )


class Router(APIGatewayRouter):
    """powertools' REST router with the annotations its ``__init__`` and ``exception_handler``
    lack, so the routes and handlers registered on it stay typed."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]

    def exception_handler(self, exc_class: type[Exception] | list[type[Exception]]) -> Callable[[F], F]:
        return cast("Callable[[F], F]", super().exception_handler(exc_class))
