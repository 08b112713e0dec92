"""Event ids the API never issued, made from ones it did: a position whose parts are each
within the task's log but not together (a ``seq`` ahead of the step it names). Each must be a
400 ``invalid_cursor`` or resume exactly after a real event: never ids that were never issued,
never a resume that leaves out events that follow it, never a 204 where events follow."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from agentq.api.client import Client

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call

ASKS_TWICE = {
    **SCRIPTED,
    "constraints": {"tools": ["lookup"], "tool_policies": {"lookup": "ask"}},
    "script": {
        "turns": [
            {"text": "one", "tool_calls": [call("lookup", query="a", size=20)]},
            {"text": "two", "tool_calls": [call("lookup", query="b", size=20)]},
            {"text": "done"},
        ]
    },
}


def _get(api: ApiStack, path: str, accept: str) -> tuple[int, Any]:
    req = urllib.request.Request(api.url + path, headers={"Accept": accept, "Authorization": f"Bearer {api.key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read().decode()
            if accept == "application/json":
                return resp.status, [e["id"] for e in json.loads(raw)["events"]]
            return resp.status, [line[4:] for line in raw.splitlines() if line.startswith("id: ")]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_an_event_id_whose_seq_is_not_its_steps_is_refused_or_resumes_exactly(api_stack: ApiStack) -> None:
    client = Client(api_stack.url, api_stack.key)
    task_id = api_stack.submit(ASKS_TWICE)
    for _ in range(2):  # two approvals: events logged between steps (EVENT# items)
        api_stack.until(task_id, lambda v: v["status"] in ("paused", "succeeded"))
        client.approve(task_id)
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    issued = [str(e.id) for e in client.iter_events(task_id, stream=False) if e.committed]
    assert any(":1." in i for i in issued) and len(issued) >= 12
    forged = [f"{task_id}:1.999.2.0", f"{task_id}:0.999.2.0", f"{task_id}:1.999.0.0", f"{task_id}:2.0.3.99"]
    # and within the log's range: each issued position with its seq put a step early
    for i in issued:
        step, seq, rank, sub = (int(n) for n in i.partition(":")[2].split("."))
        if step and seq and f"{task_id}:{step - 1}.{seq}.{rank}.{sub}" not in issued:
            forged.append(f"{task_id}:{step - 1}.{seq}.{rank}.{sub}")
    for cursor in forged:
        for accept in ("application/json", "text/event-stream"):
            status, got = _get(
                api_stack, f"/tasks/{task_id}/events?after={urllib.parse.quote(cursor)}&limit=200", accept
            )
            if status == 400:
                assert got["error"]["code"] == "invalid_cursor", (cursor, got)
                continue
            # Not refused: then what follows some event the API issued, all of it, with its ids.
            assert status in (200, 204), (cursor, accept, status, got)
            got = got if status == 200 else []
            assert set(got) <= set(issued), f"{cursor} ({accept}): ids never issued: {sorted(set(got) - set(issued))}"
            assert got == issued[len(issued) - len(got) :], f"{cursor} ({accept}): {got} is not a tail of {issued}"
            assert got and got[-1] == issued[-1], f"{cursor} ({accept}): the task's end left out ({status}, {got})"
    # a stream's resume names the header it came in
    req = urllib.request.Request(f"{api_stack.url}/tasks/{task_id}/events", headers={
        "Accept": "text/event-stream", "Authorization": f"Bearer {api_stack.key}", "Last-Event-ID": f"{task_id}:1.999.2.0"})  # fmt: skip
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("a forged Last-Event-ID was taken")
    except urllib.error.HTTPError as err:
        code, error = err.code, json.loads(err.read())["error"]
    assert (code, error["code"], error["field"]) == (400, "invalid_cursor", "Last-Event-ID")
