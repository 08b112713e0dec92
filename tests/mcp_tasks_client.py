"""The tasks extension (``io.modelcontextprotocol/tasks``) on the official ``mcp`` client's own
extension API, as a person would write it (docs/PROTOCOLS.md shows the same): the client
declares the extension on every request of the 2026-07-28 wire, a ``tools/call`` answered with a
task handle (``resultType: "task"``) is the claimed ``CreatedTask``, and ``tasks/get``,
``tasks/update``, ``tasks/cancel`` are sent with the session's ``send_request``. ``call_tool``
of a client built with ``AgentqTasks()`` follows the task to its result by itself (the claim's
resolver polls ``tasks/get``); ``session.call_tool(..., allow_claimed=True)`` hands the handle."""

from __future__ import annotations

from typing import Any, Literal

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result

EXTENSION = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


class CreatedTask(Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskState(Result):
    """``tasks/get``'s answer: the task, what it asks, its result or error."""

    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class Ack(Result):
    """The empty acknowledgement of ``tasks/update`` and ``tasks/cancel``."""

    result_type: str | None = None


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


async def get_task(session: Any, task_id: str) -> TaskState:
    return await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), TaskState)  # type: ignore[no-any-return]


async def update_task(session: Any, task_id: str, responses: dict[str, Any]) -> Ack:
    request = UpdateTask(params=UpdateParams(task_id=task_id, input_responses=responses))
    return await session.send_request(request, Ack)  # type: ignore[no-any-return]


async def cancel_task(session: Any, task_id: str) -> Ack:
    return await session.send_request(CancelTask(params=TaskIdParams(task_id=task_id)), Ack)  # type: ignore[no-any-return]


async def until(session: Any, task_id: str, statuses: tuple[str, ...], timeout: float = 60) -> TaskState:
    """``tasks/get`` at the task's poll interval until its status is one of ``statuses``."""
    with anyio.fail_after(timeout):
        while True:
            state = await get_task(session, task_id)
            if state.status in statuses:
                return state
            await anyio.sleep((state.poll_interval_ms or 1000) / 1000)


class AgentqTasks(ClientExtension):
    """Declares the extension; a task handle is followed to the tool's result."""

    identifier = EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    @staticmethod
    async def _resolve(created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        state = await until(ctx.session, created.task_id, TERMINAL, timeout=600)
        if state.status != "completed" or state.result is None:
            raise RuntimeError(f"task {created.task_id} {state.status}: {state.status_message}")
        return CallToolResult.model_validate(state.result, by_name=False)
