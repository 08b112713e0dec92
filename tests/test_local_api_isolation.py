"""Concurrent requests to the local API server stay apart: the powertools resolver keeps the
request it is answering on the class (``BaseRouter.current_event``), so two threads inside it at
once would answer with each other's event. 200 clients of two tenants hit `agentq dev --auth`
over real HTTP at once; every answer and every task written must be its own request's."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentq_dev.stack import LocalStack

CLIENTS = 200  # 100 per tenant, each: POST /tasks, then GET it with its own key and the other's


@pytest.fixture(scope="module")
def auth_stack() -> Iterator[LocalStack]:
    with LocalStack(prefix=f"iso{uuid.uuid4().hex[:8]}", workers=0, auth=True) as stack:
        yield stack


def _http(url: str, method: str, key: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_200_concurrent_clients_of_two_tenants_never_see_or_write_each_other_s_request(
    auth_stack: LocalStack,
) -> None:
    assert auth_stack.api_server is not None
    url = auth_stack.api_server.url
    keys = {"team-a": auth_stack.create_api_key("team-a"), "team-b": auth_stack.create_api_key("team-b")}
    start = threading.Barrier(CLIENTS)

    def client(n: int) -> dict[str, Any]:
        tenant, other = ("team-a", "team-b") if n % 2 else ("team-b", "team-a")
        goal = f"request {n} of {tenant} {uuid.uuid4().hex}"
        body = {"goal": goal, "provider": "scripted", "script": {"turns": [{"text": goal}]}, "metadata": {"n": str(n)}}
        start.wait()
        posted = _http(f"{url}/tasks", "POST", keys[tenant], body)
        out: dict[str, Any] = {"n": n, "tenant": tenant, "goal": goal, "post": posted}
        if posted[0] == 202:
            task_id = posted[1]["task_id"]
            out["own"] = _http(f"{url}/tasks/{task_id}", "GET", keys[tenant])
            out["other"] = _http(f"{url}/tasks/{task_id}", "GET", keys[other])
        return out

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        answers = list(pool.map(client, range(CLIENTS)))

    statuses = [a["post"][0] for a in answers] + [a[k][0] for a in answers for k in ("own", "other") if k in a]
    assert [s for s in statuses if s >= 500] == []
    assert [a["post"] for a in answers if a["post"][0] != 202] == []
    task_ids = [a["post"][1]["task_id"] for a in answers]
    assert len(set(task_ids)) == CLIENTS  # no answer names another request's task

    store = auth_stack.store()
    for answer, task_id in zip(answers, task_ids, strict=True):
        code, view = answer["own"]
        assert code == 200 and view["task_id"] == task_id and view["goal"] == answer["goal"], answer
        assert view["metadata"] == {"n": str(answer["n"])}
        code, refusal = answer["other"]
        assert code == 404 and refusal["error"]["code"] == "task_not_found", answer
        task = store.tasks.get(task_id)  # what was written: this request's body and tenant
        assert task.tenant == answer["tenant"] and task.submission.goal == answer["goal"], (answer, task)
