"""A2A streams event by event (``api/a2a_stream.py``, ``api/live_stream.py``): the official
``a2a-sdk`` client against the local stack, whose API server holds the connection as the
streaming function does in AWS. Each test orders its steps by what the client has received,
never by a timer: a request that ends the task is sent only after an event of the stream
arrived, so that event was sent before the task ended."""

from __future__ import annotations

from typing import Any

import anyio

from tests.api_support import ApiStack
from tests.test_a2a_server import APPROVAL_TURNS, _agent, _message, _rpc, _send, _state, _with_client


def _subscribe(client: Any, task_id: str) -> Any:
    from a2a.types import SubscribeToTaskRequest

    return client.subscribe(SubscribeToTaskRequest(id=task_id)).__aiter__()


def _kind(event: Any) -> str:
    if event.HasField("task"):
        return f"task:{_state(event.task)}"
    if event.HasField("status_update"):
        return f"status:{_state(event.status_update)}"
    if event.HasField("artifact_update"):
        return f"artifact:{event.artifact_update.artifact.artifact_id}"
    return "other"


# The states a stream may show between the task waiting for input and its result: ``submitted``
# if a read fell between the answer and the next claim, ``working`` unless the run was quicker
# than one read of it; each stream reads the task on its own, so which of them it shows varies.
BETWEEN = ["status:TASK_STATE_SUBMITTED", "status:TASK_STATE_WORKING"]


def _assert_followed_to_completion(kinds: list[str], task_id: str) -> None:
    """A stream of a paused task answered elsewhere: the task as it was (input required), states
    in the task's order (submitted before working, never after), the result, completed."""
    assert kinds[0] == "task:TASK_STATE_INPUT_REQUIRED", kinds
    assert kinds[-2:] == [f"artifact:{task_id}-result-0", "status:TASK_STATE_COMPLETED"], kinds
    between = kinds[1:-2]
    assert set(between) <= set(BETWEEN) and between == sorted(between, key=BETWEEN.index), kinds


def _paused_task(api_stack: ApiStack, name: str) -> str:
    status, data = _rpc(api_stack, name, _send("ship the release"))
    assert status == 200 and data["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", data
    return str(data["result"]["task"]["id"])


def _answer(api_stack: ApiStack, name: str, task_id: str) -> None:
    """Another request (a blocking SendMessage of its own connection) approves the task."""
    status, data = _rpc(api_stack, name, _send("approve", taskId=task_id))
    assert status == 200 and data["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", data


def test_a_subscription_sends_the_task_at_once_and_follows_input_required_to_completed_answered_elsewhere(
    api_stack: ApiStack,
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused_task(api_stack, name)

    async def work(client: Any) -> list[Any]:
        events = _subscribe(client, task_id)
        first = await events.__anext__()  # sent before anything answered the task: it cannot have ended
        await anyio.to_thread.run_sync(_answer, api_stack, name, task_id)
        return [first, *[e async for e in events]]

    events = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work, streaming=True)
    _assert_followed_to_completion([_kind(e) for e in events], task_id)  # to its end, through states in order
    assert [e.artifact_update.artifact.parts[0].text for e in events if e.HasField("artifact_update")] == ["shipped"]


def test_concurrent_subscribers_each_follow_the_task_to_the_same_end_and_one_leaving_stops_no_other(
    api_stack: ApiStack,
) -> None:
    """Each stream reads the task when the hub's poller says it changed, so a state the task
    holds only between two reads (``submitted`` between the answer and the next claim) may be
    seen by one subscriber and not another (api/a2a_stream.py): what every one of them gets is
    the task as it was, states in the protocol's order, the same artifacts and the same end."""
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused_task(api_stack, name)
    subscribers = 4

    async def work(client: Any) -> list[list[Any]]:
        streams = [_subscribe(client, task_id) for _ in range(subscribers)]
        firsts = [await s.__anext__() for s in streams]  # every stream is open and has its first event
        await streams[-1].aclose()  # one subscriber leaves before the task goes on
        await anyio.to_thread.run_sync(_answer, api_stack, name, task_id)
        received: list[list[Any]] = [[] for _ in streams[:-1]]

        async def drain(i: int) -> None:
            received[i] = [firsts[i], *[e async for e in streams[i]]]

        async with anyio.create_task_group() as group:
            for i in range(len(streams) - 1):
                group.start_soon(drain, i)
        return received

    received = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work, streaming=True)
    sequences = [[_kind(e) for e in events] for events in received]
    assert len(sequences) == subscribers - 1
    for kinds in sequences:
        _assert_followed_to_completion(kinds, task_id)
    # Each status update is later than the one before it, in every stream.
    for events in received:
        stamps = [e.status_update.status.timestamp.ToMilliseconds() for e in events if e.HasField("status_update")]
        assert stamps == sorted(stamps), stamps


def test_a_streamed_send_sends_its_first_event_while_the_task_runs_and_ends_with_the_task(
    api_stack: ApiStack,
) -> None:
    """The first event arrives while the task is still running (it is cancelled only after that
    event was received), and the stream goes on to the cancellation: sent whole, the stream
    would end (its window over) before anything cancelled it."""
    from a2a.types import CancelTaskRequest

    name = _agent(api_stack, [{"text": "slow", "latency_seconds": 60}])

    async def work(client: Any) -> list[Any]:
        events = client.send_message(_message("take your time")).__aiter__()
        first = await events.__anext__()
        task_id = first.task.id
        seen = [first]
        if _kind(first) == "task:TASK_STATE_WORKING":
            await client.cancel_task(CancelTaskRequest(id=task_id))
        async for event in events:  # the task goes from submitted to working; then it is cancelled
            seen.append(event)
            if _kind(event) == "status:TASK_STATE_WORKING":
                await client.cancel_task(CancelTaskRequest(id=task_id))
        return seen

    events = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work, streaming=True)
    kinds = [_kind(e) for e in events]
    assert kinds[0].startswith("task:"), kinds
    assert "TASK_STATE_WORKING" in " ".join(kinds[:2]), kinds
    assert kinds[-1] == "status:TASK_STATE_CANCELED", kinds
