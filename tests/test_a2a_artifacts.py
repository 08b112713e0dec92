"""A completed A2A task's artifacts (``queueing/a2a_artifacts.py``): the ``result``, and for a
task with a workspace a ``workspace`` artifact listing its files as of its last committed step,
each a URL on this API (``GET /tasks/{id}/files/{path}?step=N``, the A2A call's own auth). The
official ``a2a-sdk`` client against the local stack with auth on and real workers; the files are
written by the agent's tools in the bubblewrap sandbox, their names chosen to be awkward in a URL.
``GetTask``, a stream's last events and the completion push show the same artifacts."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.core.models import TaskStatus
from agentq.core.workspace import Entry, check_path
from agentq.queueing.a2a_artifacts import MAX_LISTED_FILES, file_parts, file_url

from tests.api_support import ApiStack
from tests.helpers import call as tool_call
from tests.helpers import wait_for
from tests.test_a2a_push import _call
from tests.test_a2a_push import receiver as receiver  # the fixture
from tests.test_a2a_server import _agent, _final, _get, _message, _rpc, _send, _state, _with_client
from tests.webhook_receiver import Receiver

needs_sandbox = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")

# Names a model might write: spaces, URL delimiters, percent signs, non-ASCII, a directory
# named like an encoded "..": each must come back byte for byte at its own URL.
FILES: dict[str, bytes] = {
    "notes.md": b"# notes\n",
    "src/a b#?&=%.txt": b"weird but legal\n",
    "h\u00e9llo w\u00f6rld.txt": "caf\u00e9 \u2615\n".encode(),
    "%2e%2e/x.txt": b"not a parent\n",
    "blob.bin": b"\x00\xff\x01binary\x80\n",
}
TURNS: list[dict[str, Any]] = [
    *[{"text": "", "tool_calls": [tool_call("write_file", path=p, content=c.decode())]}
      for p, c in FILES.items() if p != "blob.bin"],
    {"text": "", "tool_calls": [tool_call("shell", command="printf '\\000\\377\\001binary\\200\\n' > blob.bin")]},
    {"text": "wrote them"},
]  # fmt: skip


def _workspace_agent(api_stack: ApiStack, turns: list[dict[str, Any]] = TURNS) -> str:
    return _agent(api_stack, turns, tools=["write_file", "shell"])


def _as_dict(artifacts: Any) -> list[dict[str, Any]]:
    from google.protobuf.json_format import MessageToDict

    return [MessageToDict(a) for a in artifacts]


# A blocking ``SendMessage`` answers within its wait (20 s) with the task as it is then, which on a
# busy machine may still be working: these wait for the agentq task's end (``ApiStack.until``).


def _ended(view: dict[str, Any]) -> bool:
    return TaskStatus(view["status"]).terminal


async def _to_its_end(client: Any, api_stack: ApiStack, task: Any) -> Any:
    """The SDK's task once it has ended: ``task`` itself when the answer found it ended."""
    if _state(task) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
        await anyio.to_thread.run_sync(lambda: api_stack.until(task.id, _ended, timeout=90))
        task = await client.get_task(_get(task.id))
    return task


def _task_at_its_end(api_stack: ApiStack, agent: str, task_id: str) -> dict[str, Any]:
    """``GetTask``'s task (JSON-RPC over HTTP) once it has ended."""
    api_stack.until(task_id, _ended, timeout=90)
    return dict(_call(api_stack, agent, "GetTask", {"id": task_id})["result"])


def _fetch(url: str, key: str | None) -> httpx.Response:
    headers = {"Accept": "application/octet-stream", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.get(url, headers=headers, timeout=30)


@needs_sandbox
def test_a_workspace_task_lists_its_files_each_at_a_url_that_gives_its_exact_bytes_to_its_tenant_only(
    api_stack: ApiStack,
) -> None:
    name = _workspace_agent(api_stack)

    async def work(client: Any) -> Any:
        sent = (await _final(client.send_message(_message("write the files"))))[-1].task
        task = await _to_its_end(client, api_stack, sent)
        return task, await client.get_task(_get(task.id))

    task, got = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work)
    assert _state(task) == "TASK_STATE_COMPLETED", task
    assert [a.name for a in task.artifacts] == ["result", "workspace"]
    assert task.artifacts[0].parts[0].text == "wrote them"
    workspace = _as_dict(task.artifacts)[1]
    assert _as_dict(got.artifacts) == _as_dict(task.artifacts)  # GetTask shows the same
    last_step = api_stack.http("GET", f"/tasks/{task.id}")[1]["step"]
    meta = workspace["metadata"]["agentq"]
    assert meta["step"] == last_step and meta["files"] == len(FILES) and meta["truncated"] is False
    assert meta["bytes"] == meta["listedBytes"] == sum(len(b) for b in FILES.values())
    parts = {p["filename"]: p for p in workspace["parts"]}
    assert set(parts) == set(FILES)
    assert parts["notes.md"]["mediaType"] == "text/markdown" and parts["blob.bin"]["mediaType"]
    for path, content in FILES.items():
        part = parts[path]
        assert part["url"].startswith(f"{api_stack.url}/tasks/{task.id}/files/")
        assert part["url"].endswith(f"?step={last_step}")
        assert int(part["metadata"]["agentq"]["size"]) == len(content)
        mine = _fetch(part["url"], api_stack.key)
        assert mine.status_code == 200 and mine.content == content, (path, mine.status_code, mine.content)
        assert _fetch(part["url"], api_stack.other_key).status_code == 404  # another tenant's key
        assert _fetch(part["url"], None).status_code == 401  # the URL holds no secret


@needs_sandbox
def test_a_stream_ends_with_the_same_artifacts_as_get_task(api_stack: ApiStack) -> None:
    name = _workspace_agent(api_stack)

    async def work(client: Any) -> Any:
        events = await _final(client.send_message(_message("write the files")))
        streamed = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
        task_id = events[0].task.id
        return events, streamed, await client.get_task(_get(task_id))

    events, streamed, got = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work, streaming=True)
    assert _state(events[-1].status_update) == "TASK_STATE_COMPLETED"
    assert [a.name for a in streamed] == ["result", "workspace"]
    assert _as_dict(streamed) == _as_dict(got.artifacts)


@needs_sandbox
def test_the_completion_push_carries_the_task_with_the_artifacts_get_task_shows(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    paused = _agent(api_stack, [{"text": "", "tool_calls": [tool_call("request_approval", question="Go?")]}, *TURNS],
                    tools=["write_file", "shell", "request_approval"])  # fmt: skip
    data = _call(api_stack, paused, "SendMessage", _send("write the files")["params"])
    task_id = data["result"]["task"]["id"]
    assert data["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", data
    _call(api_stack, paused, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": receiver.url})
    _call(api_stack, paused, "SendMessage", _send("approve", taskId=task_id)["params"])
    done = _task_at_its_end(api_stack, paused, task_id)
    assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
    wait_for(lambda: any("task" in body for _, body in receiver.taken()), timeout=60, what="the completion push")
    (pushed,) = [body["task"] for _, body in receiver.taken() if "task" in body]
    got = _call(api_stack, paused, "GetTask", {"id": task_id})["result"]
    assert [a["name"] for a in pushed["artifacts"]] == ["result", "workspace"]
    assert pushed["artifacts"] == got["artifacts"]


def test_a_task_without_a_workspace_has_only_its_result(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "just words"}])
    status, data = _rpc(api_stack, name, _send("say something"))
    assert status == 200, data
    task = data["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [a["name"] for a in task["artifacts"]] == ["result"]


@needs_sandbox
def test_past_the_cap_the_listing_is_cut_and_its_metadata_says_so(api_stack: ApiStack) -> None:
    many = MAX_LISTED_FILES + 5
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [tool_call("shell", command=f"for i in $(seq {many}); do echo $i > f$i; done")]},
             {"text": "made"}]  # fmt: skip
    name = _workspace_agent(api_stack, turns)
    data = _rpc(api_stack, name, _send("make many files"))[1]
    task = _task_at_its_end(api_stack, name, data["result"]["task"]["id"])
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    (workspace,) = [a for a in task["artifacts"] if a["name"] == "workspace"]
    meta = workspace["metadata"]["agentq"]
    assert meta["files"] == many and meta["listedFiles"] == MAX_LISTED_FILES == len(workspace["parts"])
    assert meta["truncated"] is True and f"/tasks/{task['id']}/files" in meta["truncatedReason"]


# -- names are untrusted: no listed URL leaves the task's files ---------------------------------

SEGMENT = st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=0, max_size=12)
PATHS = st.lists(st.one_of(SEGMENT, st.sampled_from(["..", ".", "", "%2e%2e", "..%2f", "?", "#"])), min_size=1,
                 max_size=4).map("/".join) | st.sampled_from(["/etc/passwd", "../../x", "a/../../b", "a//b"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(PATHS, min_size=1, max_size=6, unique=True), step=st.integers(0, 10_000))
def test_every_listed_url_names_exactly_its_file_under_the_tasks_files_and_no_other_path_is_listed(
    paths: list[str], step: int
) -> None:
    base, task_id = "https://api.example.com/v1", "t-123"
    entries = [Entry(path=p, kind="f", mode=0o644, size=3, digest="0" * 64) for p in paths]
    parts, meta = file_parts(entries, base, task_id, step)
    valid = []
    for p in paths:
        try:
            check_path(p)
            valid.append(p)
        except ValueError:
            pass
    assert [part["filename"] for part in parts] == valid[:MAX_LISTED_FILES]
    assert meta.get("withheldFiles", 0) == len(paths) - len(valid)
    prefix = f"/v1/tasks/{task_id}/files/"
    for part in parts:
        url = urlsplit(part["url"])
        assert (url.scheme, url.netloc, url.query, url.fragment) == ("https", "api.example.com", f"step={step}", "")
        assert url.path.startswith(prefix)
        # Each segment decodes to the file's own segment: no "/" or ".." appears unencoded.
        encoded = url.path.removeprefix(prefix).split("/")
        assert [unquote(s) for s in encoded] == part["filename"].split("/")
        assert all(s not in ("", ".", "..") for s in encoded)


def test_a_file_url_percent_encodes_every_reserved_character() -> None:
    assert file_url("http://h", "t1", "a b/c?d#e%f", 3) == "http://h/tasks/t1/files/a%20b/c%3Fd%23e%25f?step=3"
