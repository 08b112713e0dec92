"""`agentq events` against event streams that misbehave: one sent in chunks (as the events hub
streams through a Lambda function URL) that drops in the middle of a chunk is resumed after the
last event received, each event printed once; one that keeps hanging up, or whose data is not an
event, ends in a line and exit 1, never a traceback. And `events` exits as `watch` and `result`
do: 1 when the task it followed ended other than succeeded (its epilog said so; it exited 0)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator

import pytest

from tests import fake_api
from tests.fake_api import END, Fake, Ran, Request, chunk, not_found, reply, sse, stream_head

agentq = fake_api.agentq


@pytest.fixture
def drops_mid_chunk() -> Iterator[Fake]:
    """Events e1, e2, then 7 bytes of a 64-byte chunk and the connection closes; a reconnect
    gets the events after the one it names (``after=``), e3 and e4 (succeeded), and the end."""
    streams = []

    def handle(h: Request, n: int) -> None:
        if "/events" not in h.path:
            return not_found(h)
        streams.append(h.path)
        stream_head(h)
        if len(streams) == 1:
            chunk(h, sse(1))
            chunk(h, sse(2))
            h.wfile.write(b"40\r\nid: e3\n")
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        after = int(h.path.split("after=e")[1]) if "after=e" in h.path else 0
        for i in range(after + 1, 5):
            chunk(h, sse(i, "succeeded" if i == 4 else "running"))
        chunk(h, END)
        h.wfile.write(b"0\r\n\r\n")
        h.close_connection = True

    yield from fake_api.serve(handle)


def test_events_resume_after_a_chunked_stream_drops_mid_chunk_each_event_once(
    agentq: Callable[..., Ran], drops_mid_chunk: Fake
) -> None:
    ran = agentq(drops_mid_chunk.url, "events", "t1", "--json")
    assert ran.returncode == 0, ran
    assert [json.loads(line)["id"] for line in ran.stdout.splitlines()] == ["e1", "e2", "e3", "e4"]
    streams = [p for p in drops_mid_chunk.paths if "/events" in p]
    assert streams == ["/tasks/t1/events", "/tasks/t1/events?after=e2"], drops_mid_chunk.paths


@pytest.fixture
def hangs_up() -> Iterator[Fake]:
    """Every stream request: the connection closed before any answer."""

    def handle(h: Request, n: int) -> None:
        if "/events" not in h.path:
            return not_found(h)
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True

    yield from fake_api.serve(handle)


def test_events_from_a_stream_that_keeps_hanging_up_end_in_a_line_with_exit_1(
    agentq: Callable[..., Ran], hangs_up: Fake
) -> None:
    ran = agentq(hangs_up.url, "events", "t1")
    assert ran.returncode == 1, ran
    assert ran.stderr.startswith(f"agentq: cannot reach {hangs_up.url}") and ran.stderr.count("\n") == 1, ran.stderr
    assert sum("/events" in p for p in hangs_up.paths) > 3  # it reconnected before giving up


@pytest.fixture(params=[b"data: <html>not an event</html>\n\n", b'data: {"id": "e1", "type": "task.status"}\n\n',
                        b"data: \xff\xfe not UTF-8\n\n"], ids=["not-json", "not-an-event", "not-utf8"])  # fmt: skip
def garbled_stream(request: pytest.FixtureRequest) -> Iterator[Fake]:
    def handle(h: Request, n: int) -> None:
        if "/events" not in h.path:
            return not_found(h)
        reply(h, 200, request.param, "text/event-stream")

    yield from fake_api.serve(handle)


def test_an_event_stream_whose_data_is_not_an_event_is_said_in_a_line_with_exit_1(
    agentq: Callable[..., Ran], garbled_stream: Fake
) -> None:
    ran = agentq(garbled_stream.url, "events", "t1")
    assert ran.returncode == 1, ran
    assert ran.stderr.startswith(f"agentq: malformed event stream from {garbled_stream.url}/tasks/t1/events"), ran
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert sum("/events" in p for p in garbled_stream.paths) == 1  # said, not read again and again


@pytest.fixture(params=["failed", "succeeded"])
def ends(request: pytest.FixtureRequest) -> Iterator[tuple[Fake, str]]:
    """A task's stream to its end (failed, or succeeded), and how it ended; its result says so."""
    status = request.param

    def handle(h: Request, n: int) -> None:
        if h.path.startswith("/tasks/t1/events"):
            return reply(h, 200, sse(1) + sse(2, status) + END, "text/event-stream")
        if h.path.startswith("/tasks/t1/result"):
            error = {"code": "tool_error", "message": "it broke"} if status == "failed" else None
            result = {"task_id": "t1", "status": status, "result": "done" if error is None else None,
                      "complete": error is None, "error": error, "finished_at": 1002.0}  # fmt: skip
            return reply(h, 200, json.dumps(result))
        return not_found(h)

    for fake in fake_api.serve(handle):
        yield fake, status


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_events_exit_1_when_the_task_followed_ended_other_than_succeeded_as_watch_does(
    agentq: Callable[..., Ran], ends: tuple[Fake, str], json_flag: list[str]
) -> None:
    fake, status = ends
    ran = agentq(fake.url, "events", "t1", *json_flag)
    assert ran.returncode == (0 if status == "succeeded" else 1), ran
    if not json_flag:
        assert f"finished {status}" in ran.stdout and f"answer ({status})" in ran.stdout, ran.stdout
