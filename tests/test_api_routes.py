"""Every route of the HTTP API through the real Lambda handler (functions/api/handler.py), fed
API Gateway proxy events with the tenant where the authorizer puts it: happy paths, each error
path with its status and error code, limits, idempotent submits, and tenant isolation.
Tasks are run in-process by the engine (no workers), so every state is reached on purpose."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentq.api.http_server import proxy_event
from agentq.api.models import (
    MAX_BODY_BYTES,
    TRACE_PAGE_BYTES,
    LLMCallEvent,
    TaskView,
    ToolCallEvent,
    TracePage,
    TransitionEvent,
)
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import MAX_GOAL_CHARS, Lease, LLMStep, TaskStatus, Usage
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_registry, build_store, session
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.helpers import call as tool_call
from tests.helpers import dynamo
from tests.lambda_support import FakeLambdaContext, load_handler

A, B = "tenant-a", "tenant-b"
SCRIPT = {"turns": [{"text": "hi"}]}
SUB = {"goal": "say hi", "provider": "scripted", "script": SCRIPT}
TOOLS_SCRIPT = {
    "turns": [
        {"text": "looking", "tool_calls": [tool_call("lookup", query="alpha", size=40)]},
        {
            "text": "and again",
            "tool_calls": [tool_call("lookup", query="beta", size=30), tool_call("lookup", query="gamma", size=30)],
        },
        {"text": "done looking"},
    ]
}
APPROVAL_SCRIPT = {
    "turns": [
        {"text": "", "tool_calls": [tool_call("request_approval", question="Ship it?")]},
        {"text": "shipped"},
    ]
}


@dataclass
class Api:
    handler: Any
    store: Storage
    settings: Settings

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str | None = A,
        headers: dict[str, str] | None = None,
        raw: str | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        payload = raw if raw is not None else (json.dumps(body) if body is not None else None)
        resp = self.handler.lambda_handler(
            proxy_event(method, path, hdrs, payload, tenant=tenant), FakeLambdaContext(30)
        )
        out = {k: v[-1] for k, v in (resp.get("multiValueHeaders") or {}).items()} | (resp.get("headers") or {})
        return resp["statusCode"], (json.loads(resp["body"]) if resp.get("body") else None), out

    def submit(self, body: dict[str, Any] | None = None, tenant: str = A, **headers: str) -> str:
        status, data, _ = self.call("POST", "/tasks", body or SUB, tenant=tenant, headers=headers)
        assert status == 202, data
        return str(data["task_id"])

    def run(self, task_id: str) -> None:
        engine = Engine(
            self.store, worker_id="test:1", tools=build_registry(self.settings), config=EngineConfig(lease_seconds=5)
        )
        engine.run(task_id)

    def items(self) -> int:
        return int(dynamo(self.store).client.scan(TableName=self.settings.table, Select="COUNT")["Count"])


def lambda_api(moto_server: MotoServer, prefix: str) -> Iterator[Api]:
    """The API's Lambda handler over a deployment of its own (named ``prefix`` and a random
    tail) on the shared moto server, its variables set for the module's tests."""
    settings = Settings.for_prefix(
        f"{prefix}{uuid.uuid4().hex[:10]}", moto_server.endpoint_url, tool_modules=("tests.effect_tools",)
    )
    provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
    mp = pytest.MonkeyPatch()
    for key, value in settings.env().items():
        mp.setenv(key, value)
    try:
        yield Api(handler=load_handler("api"), store=build_store(settings), settings=settings)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def api(moto_server: MotoServer) -> Iterator[Api]:
    yield from lambda_api(moto_server, "r")


def error(data: Any) -> dict[str, Any]:
    assert set(data) == {"error"}, data
    assert {"code", "message"} <= set(data["error"]) <= {"code", "message", "field"}
    return dict(data["error"])


# ------------------------------------------------------------------ submit


def test_submit_answers_202_with_the_id_links_and_location_and_queues_the_task(api: Api) -> None:
    status, data, headers = api.call("POST", "/tasks", {**SUB, "priority": "high", "metadata": {"team": "growth"}})
    assert status == 202 and data["status"] == "queued" and data["created"] is True
    task_id = data["task_id"]
    assert data["links"] == {"self": f"/tasks/{task_id}", "result": f"/tasks/{task_id}/result",
                             "trace": f"/tasks/{task_id}/trace", "cancel": f"/tasks/{task_id}/cancel"}  # fmt: skip
    assert headers["Location"] == f"/tasks/{task_id}"
    task = api.store.tasks.get(task_id)
    assert task.tenant == A and task.submission.priority == "high"
    queues = build_queues(api.settings)
    messages = queues.sqs.receive_message(QueueUrl=queues.url("high"), MaxNumberOfMessages=10)["Messages"]
    assert any(json.loads(m["Body"])["task_id"] == task_id for m in messages)


def test_the_same_idempotency_key_and_body_return_the_same_task_another_body_409(api: Api) -> None:
    key = f"order-{uuid.uuid4().hex}"
    first = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})
    reordered = json.dumps({"script": SCRIPT, "provider": "scripted", "goal": "say hi"}, indent=2)
    again = api.call("POST", "/tasks", raw=reordered, headers={"Idempotency-Key": key})
    assert first[0] == again[0] == 202
    assert first[1]["created"] is True and again[1]["created"] is False
    assert again[1]["task_id"] == first[1]["task_id"] and again[2]["Idempotent-Replayed"] == "true"
    before = api.items()
    status, data, _ = api.call("POST", "/tasks", {**SUB, "goal": "something else"}, headers={"Idempotency-Key": key})
    assert status == 409 and error(data) == {
        "code": "idempotency_conflict",
        "message": "this Idempotency-Key was already used with a different request body",
        "field": "Idempotency-Key",
    }
    assert api.items() == before  # nothing written
    other = api.call("POST", "/tasks", SUB, tenant=B, headers={"Idempotency-Key": key})
    assert (
        other[0] == 202 and other[1]["created"] is True and other[1]["task_id"] != first[1]["task_id"]
    )  # keys are per tenant
    record = api.store.tasks.idempotency(A, key)
    assert record is not None and record.task_id == first[1]["task_id"] and len(record.request_hash) == 64


def test_a_failed_enqueue_leaves_nothing_behind_and_the_same_key_can_be_retried(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.queueing.queues import TaskQueues

    def broken(self: TaskQueues, *args: Any, **kwargs: Any) -> str:
        raise ConnectionError("SQS is down")

    before = api.items()
    with monkeypatch.context() as m:
        m.setattr(TaskQueues, "send", broken)
        status, data, _ = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": "enqueue-fails"})
    assert status == 500 and error(data) == {
        "code": "internal_error",
        "message": "internal error; see the service logs",
    }
    assert api.items() == before  # task, budget and idempotency record all undone
    status, data, _ = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": "enqueue-fails"})
    assert status == 202 and data["created"] is True


@pytest.mark.parametrize("key", ["has space", "x" * 256, ""])
def test_a_malformed_idempotency_key_is_a_422_naming_the_header(api: Api, key: str) -> None:
    before = api.items()
    status, data, _ = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})
    assert api.items() == before
    assert status == 422 and error(data)["field"] == "idempotency-key"


@pytest.mark.parametrize(
    ("raw", "headers", "status", "code", "field"),
    [
        ("{nope", {}, 400, "invalid_json", "body"),
        ("[1, 2]", {}, 422, "validation_error", "body"),
        ("", {}, 422, "validation_error", "body"),
        (json.dumps({**SUB, "constraints": {"max_tokens": 0}}), {}, 422, "validation_error", "constraints.max_tokens"),
        (
            json.dumps({**SUB, "constraints": {"tools": ["lookup", "rm_rf"]}}),
            {},
            422,
            "validation_error",
            "constraints.tools[1]",
        ),
        (json.dumps({**SUB, "goal": "g" * (MAX_GOAL_CHARS + 1)}), {}, 422, "validation_error", "goal"),
        (json.dumps({**SUB, "colour": "blue"}), {}, 422, "validation_error", "colour"),
        (json.dumps({**SUB, "priority": "urgent"}), {}, 422, "validation_error", "priority"),
        (json.dumps({"goal": "x", "provider": "scripted"}), {}, 422, "validation_error", "script"),
        (json.dumps({**SUB, "script": "/etc/passwd"}), {}, 422, "validation_error", "script"),
        (json.dumps({**SUB, "script": "."}), {}, 422, "validation_error", "script"),
        (
            json.dumps({"goal": "g", "provider": "anthropic", "model": "claude-nova-9"}),
            {},
            422,
            "validation_error",
            "model",
        ),
        (json.dumps({**SUB, "goal": "x" * (MAX_BODY_BYTES + 1)}), {}, 413, "body_too_large", "body"),
        (json.dumps(SUB), {"Content-Type": "text/plain"}, 415, "unsupported_media_type", "Content-Type"),
        (json.dumps(SUB), {"Content-Type": "multipart/form-data"}, 415, "unsupported_media_type", "Content-Type"),
    ],
    ids=[
        "not-json",
        "not-object",
        "empty",
        "max_tokens",
        "unknown-tool",
        "goal-too-long",
        "unknown-field",
        "priority",
        "no-script",
        "script-path",
        "script-dir",
        "unpriced-model",
        "too-large",
        "text-plain",
        "multipart",
    ],
)
def test_each_bad_submission_gets_its_status_and_code_and_writes_nothing(
    api: Api, raw: str, headers: dict[str, str], status: int, code: str, field: str
) -> None:
    before = api.items()
    got, data, _ = api.call("POST", "/tasks", raw=raw, headers=headers)
    err = error(data)
    assert (got, err["code"], err.get("field")) == (status, code, field), err
    assert api.items() == before


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"goal":"a","provider":"scripted","script":{"turns":[{"text":"hi"}]},'
         '"constraints":{"max_tokens":10},"constraints":{"max_tokens":1000000}}', "constraints"),
        ('{"goal":"a","provider":"scripted","script":{"turns":[{"text":"hi"}]},'
         '"constraints":{"max_tokens":10,"max_tokens":1000000}}', "constraints.max_tokens"),
    ],
)  # fmt: skip
def test_a_body_naming_a_field_twice_is_refused_naming_it(api: Api, raw: str, field: str) -> None:
    """{"constraints": {...}, "constraints": {...}}: json.loads keeps the last and the task was
    created with it; nothing said the first was dropped (a proxy, log or WAF reading the first
    sees other limits than the ones that run)."""
    before = api.items()
    status, data, _ = api.call("POST", "/tasks", raw=raw)
    assert status == 422 and error(data) == {**error(data), "code": "duplicate_field", "field": field}, data
    assert api.items() == before


@pytest.mark.parametrize(
    "content_type", ["Application/JSON", "APPLICATION/JSON; charset=utf-8", "application/vnd.agentq+json"]
)
def test_a_json_media_type_in_any_case_is_json(api: Api, content_type: str) -> None:
    """RFC 9110 8.3.1: type and subtype are case-insensitive, and app.py's _is_json takes a
    +json type too; powertools' body parsing matched "application/json" as written and answered
    these with its own 415 (RequestUnsupportedContentType) after the resolver had let them in."""
    status, data, _ = api.call("POST", "/tasks", SUB, headers={"Content-Type": content_type})
    assert status == 202, data


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [("/tasks", {**SUB, "user": "bad user"},
      "user: 1-128 characters: a letter or digit, then letters, digits or . _ - @ + : |, not 'bad user'"),
     ("/stops", {"user": "bad user"},
      "user: 1-128 characters: a letter or digit, then letters, digits or . _ - @ + : |, not 'bad user'"),
     ("/stops", {"key": "k-1"}, "key: an API key's id (key_ and 16 hex digits, as agentq keys list shows it), not 'k-1'")],
)  # fmt: skip
def test_a_name_that_breaks_its_pattern_is_told_what_it_may_hold_not_the_regex(
    api: Api, path: str, body: dict[str, Any], says: str
) -> None:
    """`agentq stop --user "bad user"` answered "String should match pattern
    '^[A-Za-z0-9][A-Za-z0-9._@+:|-]{0,127}$'": a regex to decode, where the rule has words."""
    status, data, _ = api.call("POST", path, body)
    assert (status, error(data)["message"]) == (422, says), data


def test_a_missing_field_says_it_is_required(api: Api) -> None:
    status, data, _ = api.call("POST", "/tasks", {"provider": "scripted", "script": SCRIPT})
    assert status == 422 and error(data) == {"code": "validation_error", "message": "goal is required", "field": "goal"}


def test_a_submission_naming_no_provider_is_told_scripted_is_the_default_and_what_to_name_instead(api: Api) -> None:
    """``{"goal": "x"}``, the simplest submission, is refused for a script it never mentioned:
    the error says that ``scripted`` is what a submission naming no provider gets, and what to name."""
    before = api.items()
    status, data, _ = api.call("POST", "/tasks", {"goal": "x"})
    err = error(data)
    assert status == 422 and err["field"] == "script", err
    assert "names none" in err["message"] and "'anthropic'" in err["message"] and "agent" in err["message"], err
    assert api.items() == before
    named = error(api.call("POST", "/tasks", {"goal": "x", "provider": "scripted"})[1])  # named: no such hint
    assert named["message"] == "script: required when provider is 'scripted'", named


# ------------------------------------------------------------------- list


def test_list_is_newest_first_paginated_by_an_opaque_cursor_and_filtered_by_status(api: Api) -> None:
    tenant = f"lister-{uuid.uuid4().hex[:6]}"
    ids = []
    for i in range(5):
        ids.append(api.submit({**SUB, "goal": f"task {i}"}, tenant=tenant))
        time.sleep(0.002)  # distinct creation milliseconds
    api.run(ids[1])
    parent = api.store.tasks.get(ids[0])
    child = api.store.tasks.create(parent.submission, tenant=tenant, parent_id=ids[0], root_id=ids[0], depth=1)
    seen, cursor, pages = [], None, 0
    while True:
        status, page, _ = api.call("GET", "/tasks?limit=2" + (f"&cursor={cursor}" if cursor else ""), tenant=tenant)
        assert status == 200 and len(page["tasks"]) <= 2
        seen += [t["task_id"] for t in page["tasks"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids)) and pages == 3  # newest first, no repeats, sub-agents left out
    status, page, _ = api.call("GET", "/tasks?status=succeeded", tenant=tenant)
    assert [t["task_id"] for t in page["tasks"]] == [ids[1]] and page["tasks"][0]["tokens_total"] > 0
    status, page, _ = api.call("GET", "/tasks?include_children=true&limit=100", tenant=tenant)
    assert child.task_id in [t["task_id"] for t in page["tasks"]] and len(page["tasks"]) == 6
    summary = next(t for t in page["tasks"] if t["task_id"] == child.task_id)
    assert summary["parent_id"] == ids[0] and summary["goal"] == "task 0"


def test_a_metadata_search_finds_matching_tasks_past_the_newest_pages_and_pages_on(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.api import views
    from agentq.control.submit import parse_submission

    tenant = f"search-{uuid.uuid4().hex[:6]}"
    create = api.store.tasks.create
    older = create(parse_submission({**SUB, "metadata": {"customer": "acme", "region": "eu"}}), tenant=tenant)
    time.sleep(0.002)
    old = create(parse_submission({**SUB, "metadata": {"customer": "acme"}}), tenant=tenant)
    for i in range(130):  # newer tasks of others: the matches are far past the first page
        create(parse_submission({**SUB, "metadata": {"customer": f"other-{i}"}}), tenant=tenant)
    monkeypatch.setattr(views, "METADATA_SCAN_LIMIT", 100)  # so one call reads fewer than there are

    def search(query: str) -> list[str]:
        found, cursor, calls = [], None, 0
        while True:
            status, page, _ = api.call(
                "GET", f"/tasks?{query}" + (f"&cursor={cursor}" if cursor else ""), tenant=tenant
            )
            assert status == 200, page
            found += [t["task_id"] for t in page["tasks"]]
            calls += 1
            cursor = page["next_cursor"]
            if not cursor:
                return found
            assert calls < 10

    status, first, _ = api.call("GET", "/tasks?metadata=customer=acme&limit=1", tenant=tenant)
    assert status == 200 and first["tasks"] == [] and first["next_cursor"]  # 100 read, none matched: go on
    assert search("metadata=customer=acme&limit=1") == [old.task_id, older.task_id]
    assert search("metadata=customer=acme&metadata=region=eu") == [older.task_id]  # every pair must match
    assert search("metadata=customer=nobody") == []
    # Another tenant's tasks never match, whatever their metadata.
    status, theirs, _ = api.call("GET", "/tasks?metadata=customer=acme", tenant=B)
    assert status == 200 and not {older.task_id, old.task_id} & {t["task_id"] for t in theirs["tasks"]}
    status, data, _ = api.call("GET", "/tasks?metadata=customer", tenant=tenant)
    assert status == 422 and error(data)["field"] == "metadata"


def test_a_metadata_filter_naming_one_key_twice_is_a_422_and_never_lists_a_task_matching_only_the_last(
    api: Api,
) -> None:
    """GET /tasks?metadata=k=v, repeated: "only tasks whose metadata has it (repeat: every pair)".
    core/metadata.py parse_pairs kept the last value of a key, so team=blue&team=red listed a
    task of team red, which does not have team=blue (the order of the pairs decided the answer)."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    api.submit({**SUB, "metadata": {"team": "red"}}, tenant=tenant)
    for query in ("metadata=team=blue&metadata=team=red", "metadata=team=red&metadata=team=red"):
        status, data, _ = api.call("GET", f"/tasks?{query}", tenant=tenant)
        assert status == 422 and error(data)["field"] == "metadata", data
        assert "'team' given twice" in error(data)["message"]


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [("limit=0", 422, "limit"), ("limit=101", 422, "limit"), ("limit=ten", 422, "limit"), ("status=bogus", 422, "status"),
     ("status=", 422, "status"), ("cursor=not-a-cursor", 400, "cursor"),
     ("cursor=eyJrIjoidHJhY2UiLCJ2IjpbWzEsMCwwLDBdLDFdfQ", 400, "cursor")],  # a trace cursor
)  # fmt: skip
def test_bad_list_parameters_are_named(api: Api, query: str, status: int, field: str) -> None:
    got, data, _ = api.call("GET", f"/tasks?{query}")
    assert got == status and error(data)["field"] == field


# ------------------------------------------------------------ status views


def test_get_task_shows_status_tokens_budget_cost_timestamps_latency_and_activity(api: Api) -> None:
    task_id = api.submit()
    status, queued, _ = api.call("GET", f"/tasks/{task_id}")
    assert status == 200 and queued["status"] == "queued" and queued["activity"].startswith("queued (normal priority)")
    api.run(task_id)
    status, data, _ = api.call("GET", f"/tasks/{task_id}")
    view = TaskView.model_validate(data)
    assert view.status is TaskStatus.SUCCEEDED and view.result == "hi" and view.step == 1 and view.llm_steps == 1
    assert view.tokens.input > 0 and view.tokens.total == view.tokens.input + view.tokens.output
    assert view.budget is not None and view.budget.used == view.tokens.total and view.budget.cap == 200_000
    assert view.budget.available == view.budget.cap - view.budget.used and view.tokens.budget == view.budget.cap
    assert float(view.cost_usd) > 0 and view.activity is None and view.children.total == 0
    assert view.created_at <= view.started_at <= view.finished_at  # type: ignore[operator]
    assert (
        view.latency.pickup_seconds is not None and view.latency.resumes == 0 and view.latency.run_seconds is not None
    )
    assert view.goal == "say hi" and view.provider == "scripted" and view.max_steps == 50


@pytest.mark.parametrize(
    ("task_id", "status", "code"), [("no-such-task", 404, "task_not_found"), ("bad id!", 422, "validation_error")]
)
def test_unknown_and_malformed_task_ids(api: Api, task_id: str, status: int, code: str) -> None:
    for suffix in ("", "/result", "/trace"):
        got, data, _ = api.call("GET", f"/tasks/{task_id}{suffix}")
        assert got == status and error(data)["code"] == code and error(data)["field"] == "task_id"


def test_result_is_409_until_the_task_ends_then_complete_or_partial(api: Api) -> None:
    task_id = api.submit()
    status, data, _ = api.call("GET", f"/tasks/{task_id}/result")
    assert status == 409 and error(data)["code"] == "task_not_finished"
    api.run(task_id)
    status, data, _ = api.call("GET", f"/tasks/{task_id}/result")
    assert status == 200 and data["complete"] is True and data["result"] == "hi" and data["status"] == "succeeded"
    cancelled = api.submit()
    api.call("POST", f"/tasks/{cancelled}/cancel")
    status, data, _ = api.call("GET", f"/tasks/{cancelled}/result")
    assert (
        status == 200
        and data["complete"] is False
        and data["status"] == "cancelled"
        and data["error"]["code"] == "cancelled"
    )


# ------------------------------------------------------------------ trace


def test_trace_lists_llm_calls_tool_calls_and_transitions_in_commit_order(api: Api) -> None:
    task_id = api.submit({**SUB, "script": TOOLS_SCRIPT, "constraints": {"tools": ["lookup"]}})
    api.run(task_id)
    status, data, _ = api.call("GET", f"/tasks/{task_id}/trace")
    assert status == 200 and data["next_cursor"] is None
    events = TracePage.model_validate(data).events
    kinds = [e.type if e.type != "transition" else e.event for e in events]
    assert kinds == [
        "created",
        "claimed",
        "llm_call",
        "tool_call",
        "llm_call",
        "tool_call",
        "tool_call",
        "llm_call",
        "finished",
    ]
    assert [e.at for e in events] == sorted(e.at for e in events)
    llm, tool = events[2], events[3]
    assert isinstance(llm, LLMCallEvent) and isinstance(tool, ToolCallEvent)
    assert llm.step == 1 and llm.epoch == 1 and llm.model == "claude-sonnet-4-6"
    assert llm.tokens.input > 0 and llm.tokens.total == llm.tokens.input + llm.tokens.output
    assert llm.tool_calls == ["lookup"] and llm.text == "looking" and llm.duration_ms >= 0 and not llm.orphan
    assert tool.name == "lookup" and tool.input == {"query": "alpha", "size": 40}
    assert (
        tool.output.startswith("result for alpha") and tool.status == "ok" and tool.duration_ms >= 0 and tool.step == 2
    )
    more_tools = [e for e in events[5:7] if isinstance(e, ToolCallEvent)]
    assert [(e.input or {}).get("query") for e in more_tools] == ["beta", "gamma"]
    claimed, finished = events[1], events[-1]
    assert isinstance(claimed, TransitionEvent) and isinstance(finished, TransitionEvent)
    assert claimed.worker == "test:1" and finished.status is TaskStatus.SUCCEEDED
    # every page size gives the same events, each once
    for limit in (1, 2, 4):
        paged, cursor = [], None
        while True:
            status, page, _ = api.call(
                "GET", f"/tasks/{task_id}/trace?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
            )
            assert status == 200 and len(page["events"]) <= limit
            paged += page["events"]
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert paged == data["events"], limit


def test_trace_shows_orphan_llm_calls_and_approval_transitions(api: Api) -> None:
    task_id = api.submit({**SUB, "script": APPROVAL_SCRIPT, "constraints": {"tools": ["request_approval"]}})
    api.run(task_id)
    assert api.store.tasks.get(task_id).status is TaskStatus.PAUSED
    orphan = LLMStep(content=[{"type": "text", "text": "lost"}], stop_reason="end_turn", model="claude-haiku-4-5",
                     usage=Usage(input_tokens=7, output_tokens=3), started_at=time.time(), duration_ms=5)  # fmt: skip
    api.store.steps.record_orphan(Lease(task_id=task_id, owner="zombie:9", epoch=1, expires_at=0), 3, orphan)
    assert api.call("POST", f"/tasks/{task_id}/approve", {"note": "lgtm"})[0] == 200
    api.run(task_id)
    events = api.call("GET", f"/tasks/{task_id}/trace")[1]["events"]
    transitions = [e["event"] for e in events if e["type"] == "transition"]
    assert transitions == ["created", "claimed", "approval_requested", "approval_decided", "claimed", "finished"]
    decided = next(e for e in events if e.get("event") == "approval_decided")
    assert decided["detail"] == {"decision": "approved", "by": A, "note": "lgtm"}
    orphans = [e for e in events if e["type"] == "llm_call" and e["orphan"]]
    assert len(orphans) == 1 and orphans[0]["model"] == "claude-haiku-4-5" and orphans[0]["tokens"]["total"] == 10
    assert orphans[0]["step"] == 3 and orphans[0]["epoch"] == 1


def test_a_trace_page_of_long_texts_fits_one_lambda_answer_and_the_pages_hold_every_event_once(api: Api) -> None:
    """200 events of 16,000 'é' (the most a trace keeps of a text; 6 bytes each as the API's
    JSON escapes them) would be a 19 MB page, past a Lambda's 6 MB answer (API Gateway's 502): a
    page stops at TRACE_PAGE_BYTES, and the cursor takes the rest, each event once."""
    task_id = api.submit()
    api.run(task_id)
    text = "é" * 16_000
    for epoch in range(2, 42):  # 40 orphan calls, one per epoch: 3.8 MB escaped
        orphan = LLMStep(content=[{"type": "text", "text": text}], stop_reason="end_turn", model="claude-haiku-4-5",
                         usage=Usage(input_tokens=7, output_tokens=3), started_at=time.time(), duration_ms=5)  # fmt: skip
        api.store.steps.record_orphan(Lease(task_id=task_id, owner="zombie:9", epoch=epoch, expires_at=0), 2, orphan)
    paged, cursor, sizes = [], None, []
    while True:
        status, page, _ = api.call("GET", f"/tasks/{task_id}/trace?limit=200" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, page
        sizes.append(len(json.dumps(page)))
        paged += page["events"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(sizes) > 1 and max(sizes) <= TRACE_PAGE_BYTES + 200_000, sizes
    orphans = [(e["epoch"], e["text"]) for e in paged if e["type"] == "llm_call" and e["orphan"]]
    assert sorted(orphans) == [(epoch, text) for epoch in range(2, 42)]
    assert len({json.dumps(e, sort_keys=True) for e in paged}) == len(paged)


def test_a_trace_cursor_must_be_one_the_api_issued(api: Api) -> None:
    task_id = api.submit()
    for cursor in ("garbage", "eyJrIjoidGFza3MiLCJ2IjoiMDAwMDAwMDAwMDAwMDAwI3gifQ", "eyJrIjoidHJhY2UiLCJ2IjoiMSJ9"):
        status, data, _ = api.call("GET", f"/tasks/{task_id}/trace?cursor={cursor}")
        assert status == 400 and error(data) == {**error(data), "code": "invalid_cursor", "field": "cursor"}
    assert api.call("GET", f"/tasks/{task_id}/trace?limit=201")[0] == 422


@pytest.mark.parametrize("value", [[[1e400, 0, 1, 0], 1], [[0.0, 1e400, 1, 0], 1], [[0.0, 0, 1, 0], 1e400],
                                   [[0.0, 0, 1e400, 0], 1], [[float("nan"), 0, 1, 0], 1]])  # fmt: skip
def test_a_trace_cursor_holding_a_number_too_large_for_an_int_is_a_400_not_a_500(api: Api, value: Any) -> None:
    task_id = api.submit()
    raw = json.dumps({"k": "trace", "v": value}).replace("Infinity", "1e400")
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    status, data, _ = api.call("GET", f"/tasks/{task_id}/trace?cursor={cursor}")
    assert status == 400 and error(data) == {**error(data), "code": "invalid_cursor", "field": "cursor"}


# ---------------------------------------------------------------- control


def test_cancel_then_cancel_again_is_a_conflict(api: Api) -> None:
    task_id = api.submit()
    status, data, _ = api.call("POST", f"/tasks/{task_id}/cancel")
    assert status == 200 and data == {"task_id": task_id, "cancelled": [task_id]}
    status, data, _ = api.call("POST", f"/tasks/{task_id}/cancel")
    assert status == 409 and error(data)["code"] == "illegal_transition"
    assert api.call("POST", "/tasks/nope/cancel")[0] == 404


def test_a_cancel_that_loses_to_the_task_s_own_end_is_a_409_not_a_200_that_cancelled_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """control/operations.py cancel(): a task read live whose transition to cancelled loses to
    its own end was skipped, and the route answered 200 {"cancelled": []}; the same request a
    moment later is 409 "already succeeded". Seen live: 10 concurrent cancels of a scripted task
    all answered 200 [] and it succeeded. The cancel reads the task as it was just before its end."""
    from agentq.control import operations, subtrees

    task_id = api.submit()
    stale = api.store.tasks.get(task_id)  # queued, as the cancel reads it just before the end
    api.run(task_id)
    assert api.store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    monkeypatch.setattr(operations, "owned_task", lambda store, tid, tenant=None: stale)
    monkeypatch.setattr(subtrees, "subtree", lambda store, task: [stale])
    status, data, _ = api.call("POST", f"/tasks/{task_id}/cancel")
    assert status == 409 and error(data)["code"] == "illegal_transition", data
    assert error(data)["field"] == "task_id" and "already succeeded" in error(data)["message"]


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_approve_and_reject_resume_a_paused_task_with_the_decision(api: Api, verb: str) -> None:
    task_id = api.submit({**SUB, "script": APPROVAL_SCRIPT, "constraints": {"tools": ["request_approval"]}})
    status, data, _ = api.call("POST", f"/tasks/{task_id}/{verb}", {"note": "too early"})
    assert status == 409 and "not waiting for approval" in error(data)["message"]
    api.run(task_id)
    status, paused, _ = api.call("GET", f"/tasks/{task_id}")
    assert paused["status"] == "paused" and paused["pending_approval"] == "Ship it?"
    assert paused["activity"] == "waiting for approval: Ship it?"
    status, data, _ = api.call("POST", f"/tasks/{task_id}/{verb}", {"note": "n" * 4001})
    assert status == 422 and error(data)["field"] == "note"
    status, data, _ = api.call("POST", f"/tasks/{task_id}/{verb}", {"note": "checked", "extra": 1})
    assert status == 422 and error(data)["field"] == "extra"
    status, data, _ = api.call("POST", f"/tasks/{task_id}/{verb}")  # the body is optional
    assert status == 200 and data["status"] == "queued"
    api.run(task_id)
    steps = api.store.steps.load(task_id)
    verdict = "APPROVED" if verb == "approve" else "REJECTED"
    assert steps[1].body.results[0].content.startswith(f"{verdict} by {A}")  # type: ignore[union-attr]
    assert api.call("POST", f"/tasks/{task_id}/{verb}", {})[0] == 409


def test_a_budget_raise_resumes_a_cost_exceeded_task_and_bad_raises_are_named(api: Api) -> None:
    turns = [{"text": f"turn {i}", "tool_calls": [tool_call("lookup", query=str(i), size=1500)]} for i in range(4)] + [
        {"text": "end"}
    ]
    task_id = api.submit(
        {
            **SUB,
            "script": {"turns": turns},
            "constraints": {"tools": ["lookup"], "max_tokens": 3000, "max_output_tokens": 200},
        }
    )
    api.run(task_id)
    assert api.store.tasks.get(task_id).status is TaskStatus.COST_EXCEEDED
    for body, field in [({"add_tokens": -1}, "add_tokens"), ({"add_tokens": "lots"}, "add_tokens"), ({}, "add_tokens"),
                        ({"add_tokens": 5, "more": 1}, "more"), ({"add_steps": 10_001}, "add_steps")]:  # fmt: skip
        status, data, _ = api.call("POST", f"/tasks/{task_id}/budget", body)
        assert status == 422 and error(data)["field"] == field, body
    status, data, _ = api.call("POST", f"/tasks/{task_id}/budget", {"add_tokens": 100_000, "add_steps": 5})
    assert status == 200 and data["status"] == "queued" and data["budget"]["cap"] == 103_000 and data["max_steps"] == 55
    api.run(task_id)
    assert api.call("GET", f"/tasks/{task_id}/result")[1]["result"] == "end"
    status, data, _ = api.call("POST", f"/tasks/{task_id}/budget", {"add_tokens": 1})
    assert status == 409 and error(data)["code"] == "illegal_transition"


def test_fork_answers_202_with_the_new_task_and_bad_forks_are_named(api: Api) -> None:
    source = api.submit({**SUB, "script": TOOLS_SCRIPT, "constraints": {"tools": ["lookup"]}})
    api.run(source)
    status, data, _ = api.call("POST", f"/tasks/{source}/fork", {})
    assert status == 422 and error(data) == {
        "code": "validation_error",
        "message": "at_step is required",
        "field": "at_step",
    }
    status, data, _ = api.call("POST", f"/tasks/{source}/fork", {"at_step": 9})
    assert status == 422 and error(data)["field"] == "at_step" and "between 0 and 5" in error(data)["message"]
    items = api.items()
    for asking in (1, 3):  # the model's turns asking for calls: a fork there would make them again
        status, data, _ = api.call("POST", f"/tasks/{source}/fork", {"at_step": asking})
        assert status == 422 and error(data)["field"] == "at_step", data
        assert f"fork at step {asking + 1} to keep their results, or at step {asking - 1}" in error(data)["message"]
    assert api.items() == items
    status, data, _ = api.call("POST", f"/tasks/{source}/fork", {"at_step": 2, "constraints": {"colour": 1}})
    assert status == 422 and error(data)["field"] == "constraints.colour"
    status, data, _ = api.call("POST", f"/tasks/{source}/fork", {"at_step": 2, "script": "../../etc/passwd"})
    assert status == 422 and error(data)["field"] == "script"
    status, data, headers = api.call(
        "POST",
        f"/tasks/{source}/fork",
        {"at_step": 2, "model": "claude-haiku-4-5", "constraints": {"max_tokens": 50_000}},
    )
    assert status == 202 and data["task_id"] != source and headers["Location"] == f"/tasks/{data['task_id']}"
    assert data["forked_from"] == {"task_id": source, "step": 2} and data["step"] == 2 and data["status"] == "queued"
    assert data["model"] == "claude-haiku-4-5" and data["budget"]["cap"] == 50_000
    api.run(data["task_id"])
    fork_trace = api.call("GET", f"/tasks/{data['task_id']}/trace")[1]["events"]
    assert fork_trace[0]["event"] == "forked" and fork_trace[0]["detail"]["forked_from"]["task_id"] == source


def test_a_task_view_says_the_last_step_a_fork_copies_up_to_and_a_fork_there_is_accepted(api: Api) -> None:
    """fork_at_step: the task's step, or the one before when that is the model's turn asking for
    tool calls (a paused task's held call), which a fork refuses; null for a sub-agent."""
    assert api.call("GET", f"/tasks/{api.submit()}")[1]["fork_at_step"] == 0  # nothing committed yet
    paused = api.submit({**SUB, "script": APPROVAL_SCRIPT, "constraints": {"tools": ["request_approval"]}})
    api.run(paused)
    view = api.call("GET", f"/tasks/{paused}")[1]
    assert (view["status"], view["step"], view["fork_at_step"]) == ("paused", 1, 0), view
    assert api.call("POST", f"/tasks/{paused}/fork", {"at_step": view["step"]})[0] == 422
    assert api.call("POST", f"/tasks/{paused}/fork", {"at_step": view["fork_at_step"]})[0] == 202
    done = api.submit({**SUB, "script": TOOLS_SCRIPT, "constraints": {"tools": ["lookup"]}})
    api.run(done)
    view = api.call("GET", f"/tasks/{done}")[1]
    assert (view["status"], view["step"], view["fork_at_step"]) == ("succeeded", 5, 5), view


# ------------------------------------------------------------- isolation


def test_another_tenant_can_neither_see_nor_touch_a_task(api: Api) -> None:
    task_id = api.submit({**SUB, "script": APPROVAL_SCRIPT, "constraints": {"tools": ["request_approval"]}}, tenant=A)
    api.run(task_id)  # paused: approvable, forkable, cancellable
    before = api.store.tasks.get(task_id)
    attempts = [
        ("GET", f"/tasks/{task_id}", None),
        ("GET", f"/tasks/{task_id}/result", None),
        ("GET", f"/tasks/{task_id}/trace", None),
        ("POST", f"/tasks/{task_id}/cancel", None),
        ("POST", f"/tasks/{task_id}/approve", {"note": "mine now"}),
        ("POST", f"/tasks/{task_id}/reject", {}),
        ("POST", f"/tasks/{task_id}/budget", {"add_tokens": 1000}),
        ("POST", f"/tasks/{task_id}/fork", {"at_step": 1}),
    ]
    items = api.items()
    for method, path, body in attempts:
        status, data, _ = api.call(method, path, body, tenant=B)
        assert status == 404 and error(data) == {
            "code": "task_not_found",
            "message": f"no task {task_id!r}",
            "field": "task_id",
        }, path
    assert api.items() == items  # nothing written for B
    after = api.store.tasks.get(task_id)
    assert (after.status, after.step, after.updated_at) == (before.status, before.step, before.updated_at)
    listed = api.call("GET", "/tasks?limit=100&include_children=true", tenant=B)[1]["tasks"]
    assert task_id not in {t["task_id"] for t in listed}
    assert api.call("GET", f"/tasks/{task_id}", tenant=A)[0] == 200


def test_a_request_without_a_tenant_is_401_except_health(api: Api) -> None:
    status, data, headers = api.call("GET", "/tasks", tenant=None)
    assert status == 401 and error(data)["code"] == "unauthorized" and headers["WWW-Authenticate"] == "Bearer"
    assert api.call("POST", "/tasks", SUB, tenant=None)[0] == 401
    assert api.call("GET", "/health", tenant=None)[:2] == (200, {"status": "ok", "version": "1.0.0", "live": None})
    status, doc, _ = api.call("GET", "/openapi.json", tenant=None)
    assert status == 200 and doc["info"]["title"] == "agentq" and "/tasks/{task_id}/trace" in doc["paths"]


def test_unknown_routes_are_404_and_wrong_methods_405(api: Api) -> None:
    status, data, _ = api.call("GET", "/nowhere")
    assert status == 404 and error(data)["code"] == "route_not_found"
    status, data, headers = api.call("DELETE", "/tasks")
    assert status == 405 and error(data)["code"] == "method_not_allowed" and headers["Allow"] == "GET, HEAD, POST"
    status, data, headers = api.call("GET", "/tasks/abc/cancel")
    assert status == 405 and headers["Allow"] == "POST"


def test_head_is_answered_as_its_get_with_the_same_status_and_headers_and_no_body(api: Api) -> None:
    """RFC 9110 9.3.2: a server that answers GET answers HEAD too; each GET route was a 405."""
    task_id = api.submit()
    _, view, got_headers = api.call("GET", f"/tasks/{task_id}")
    status, data, headers = api.call("HEAD", f"/tasks/{task_id}")
    assert (status, data) == (200, None) and view["task_id"] == task_id
    assert headers["ETag"] == got_headers["ETag"] and headers["Content-Type"] == "application/json"
    status, _, _ = api.call("HEAD", f"/tasks/{task_id}", headers={"If-None-Match": got_headers["ETag"]})
    assert status == 304
    assert api.call("HEAD", "/tasks/nope")[:2] == (404, None)
    status, data, headers = api.call("HEAD", "/tasks/abc/cancel")  # no GET here: nor a HEAD
    assert (status, data, headers["Allow"]) == (405, None, "POST")


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/task", {"goal": "x"}, 404, "route_not_found"),
        ("POST", "/tasks/abc/message", {"text": "x"}, 404, "route_not_found"),
        ("POST", "/no/such/route", {"goal": "x"}, 404, "route_not_found"),
        ("PUT", "/tasks", {"goal": "x"}, 405, "method_not_allowed"),
        ("POST", "/health", {"goal": "x"}, 405, "method_not_allowed"),
    ],
)
def test_a_body_sent_to_a_route_that_does_not_exist_or_another_method_is_404_or_405_not_blamed_on_its_field(
    api: Api, method: str, path: str, body: dict[str, str], status: int, code: str
) -> None:
    """A typo'd path or method with a JSON body: the check of a body a route does not take ran on
    powertools' catch-all not-found route before the 404/405 was said, so the answer was 422
    "goal: unknown field (this route takes no body)", blaming the body's field for a wrong URL."""
    answered, data, _ = api.call(method, path, body)
    assert (answered, error(data)["code"]) == (status, code), data


def test_the_lambda_decodes_each_path_parameter_after_routing_on_the_path_as_api_gateway_sends_it(api: Api) -> None:
    """API Gateway's REST proxy event keeps ``path`` percent-encoded: routing splits it as sent
    (``%2F`` stays in its segment) and each parameter is decoded after, as the local server does."""

    def sent(method: str, path: str) -> tuple[int, Any]:
        event = proxy_event(method, "/", {}, None, tenant=A)
        event.update(path=path, resource=path)
        event["requestContext"]["path"] = path
        resp = api.handler.lambda_handler(event, FakeLambdaContext(30))
        return resp["statusCode"], json.loads(resp["body"])

    assert sent("GET", "/policies/agent%3Ashop") == sent("GET", "/policies/agent:shop")
    task_id = api.submit()
    status, data = sent("GET", f"/tasks/{task_id}%2Fresult")
    assert status == 422 and error(data)["field"] == "task_id", data
    status, data = sent("GET", "/tasks/caf%E9")
    assert status == 400 and error(data) == {"code": "invalid_path", "field": "path",
                                             "message": "path segment 'caf%E9' is not percent-encoded UTF-8"}  # fmt: skip


def test_breakers_lists_each_models_circuit_for_every_key_and_the_cli_says_when_it_probes(api: Api) -> None:
    from agentq.api.models import BreakersView
    from agentq.cli.fleet import breaker_lines
    from agentq.core.flow import Admission

    run = uuid.uuid4().hex[:8]
    opened, failing, slowed = f"anthropic/claude-open-{run}", f"openai/gpt-failing-{run}", f"openai/gpt-slow-{run}"
    while not api.store.flow.failed(opened, Admission(ok=True)):
        pass  # the fleet's failures open it
    api.store.flow.failed(failing, Admission(ok=True))
    api.store.flow.slow_down(slowed, 60)

    for tenant in (A, B):  # fleet health, not a tenant's data: every key reads the same
        status, data, _ = api.call("GET", "/breakers", tenant=tenant)
        assert status == 200, data
        listed = {f"{b['provider']}/{b['model']}": b for b in data["breakers"]}
        assert listed[opened]["state"] == "open" and listed[opened]["probe_after"] > listed[opened]["opened_at"]
        assert listed[failing]["state"] == "closed" and listed[failing]["failures"] == 1
        assert listed[slowed]["slowed_until"] > time.time()
        assert data["failures_to_open"] >= 1 and data["cooldown_seconds"] > 0

    view = BreakersView.model_validate(data)
    lines = breaker_lines(view, now=time.time())
    (line,) = [x for x in lines if x.startswith(opened)]
    assert " open since " in line and "; probe in " in line
    assert any(x.startswith(f"{failing}  closed, 1 failure(s) counted") for x in lines)
    assert any(x.startswith(slowed) and "slowed down (429) until" in x for x in lines)
    document = api.call("GET", "/openapi.json")[1]
    assert document["paths"]["/breakers"]["get"]["operationId"] == "listBreakers"
