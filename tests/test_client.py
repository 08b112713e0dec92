"""`agentq.Client` against the local stack over HTTP: typed answers (the server's own models),
the waiting helpers, and an exception per kind of failure."""

from __future__ import annotations

import pytest

import agentq
from agentq.api.client import (
    ApiError,
    AuthenticationError,
    Client,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    WaitTimeout,
)
from agentq.api.models import LLMCallEvent, ToolCallEvent, TransitionEvent
from agentq.core.errors import AgentqError
from agentq.core.models import MAX_MESSAGE_CHARS, TaskStatus, TaskSubmission

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call


@pytest.fixture
def client(api_stack: ApiStack) -> Client:
    return agentq.Client(api_stack.url, api_stack.key)


def test_submit_wait_result_and_trace_are_typed(client: Client) -> None:
    script = {"turns": [{"text": "look", "tool_calls": [call("lookup", query="typed")]}, {"text": "typed answer"}]}
    accepted = client.submit(
        TaskSubmission.model_validate({**SCRIPTED, "script": script, "constraints": {"tools": ["lookup"]}})
    )
    assert accepted.status is TaskStatus.QUEUED and accepted.created
    assert accepted.links.self_ == f"/tasks/{accepted.task_id}"
    seen: list[TaskStatus] = []
    view = client.wait(accepted.task_id, timeout=60, poll=0.05, on_update=lambda v: seen.append(v.status))
    assert view.status is TaskStatus.SUCCEEDED and view.result == "typed answer"
    assert seen[-1] is TaskStatus.SUCCEEDED and view.tokens.total > 0 and view.budget is not None
    result = client.result(accepted.task_id)
    assert result.complete and result.result == "typed answer"
    events = list(client.iter_trace(accepted.task_id, page_size=2))
    assert [type(e) for e in events] == [
        TransitionEvent,
        TransitionEvent,
        LLMCallEvent,
        ToolCallEvent,
        LLMCallEvent,
        TransitionEvent,
    ]
    assert isinstance(events[3], ToolCallEvent) and events[3].input == {"query": "typed"}


def test_the_same_idempotency_key_returns_the_same_task(client: Client) -> None:
    first = client.submit(SCRIPTED, idempotency_key="client-key-1")
    again = client.submit(dict(SCRIPTED), idempotency_key="client-key-1")
    assert first.task_id == again.task_id and first.created and not again.created
    with pytest.raises(Conflict) as err:
        client.submit({**SCRIPTED, "goal": "else"}, idempotency_key="client-key-1")
    assert err.value.status == 409 and err.value.code == "idempotency_conflict" and err.value.field == "Idempotency-Key"
    assert client.submit(goal="fields as keywords", provider="scripted", script="research").created


def test_listing_follows_cursors_newest_first(api_stack: ApiStack) -> None:
    mine = Client(api_stack.url, api_stack.stack.create_api_key("lister"))
    ids = [mine.submit(SCRIPTED).task_id for _ in range(3)]
    page = mine.list_tasks(limit=2)
    assert [t.task_id for t in page.tasks] == ids[::-1][:2] and page.next_cursor
    assert [t.task_id for t in mine.iter_tasks(page_size=1)] == ids[::-1]
    for task_id in ids:
        mine.wait(task_id, timeout=60, poll=0.05)
    assert [t.task_id for t in mine.iter_tasks(TaskStatus.SUCCEEDED, page_size=2)] == ids[::-1]
    assert list(mine.iter_tasks("failed")) == []


def test_control_calls_and_waiting_for_a_status(client: Client) -> None:
    turns = [{"text": "", "tool_calls": [call("request_approval", question="go?")]}, {"text": "went"}]
    task_id = client.submit(
        {**SCRIPTED, "script": {"turns": turns}, "constraints": {"tools": ["request_approval"]}}
    ).task_id
    paused = client.wait_for_status(task_id, TaskStatus.PAUSED, timeout=60, poll=0.05)
    assert paused.status is TaskStatus.PAUSED and paused.pending_approval == "go?"
    # resumed: queued, or already picked up by a worker by the time the view is read
    assert client.approve(task_id, "fine").status in (TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.SUCCEEDED)
    assert client.wait(task_id, timeout=60, poll=0.05).result == "went"
    fork = client.fork(task_id, at_step=0, script={"turns": [{"text": "forked"}]}, constraints={"max_tokens": 9_000})
    assert fork.forked_from == {"task_id": task_id, "step": 0} and fork.budget is not None and fork.budget.cap == 9_000
    slow = {
        "turns": [
            {"text": f"t{i}", "latency_seconds": 0.5, "tool_calls": [call("lookup", query="q")]} for i in range(20)
        ]
    }
    slow_id = client.submit({**SCRIPTED, "script": slow, "constraints": {"tools": ["lookup"]}}).task_id
    assert client.cancel(slow_id).cancelled == [slow_id]
    with pytest.raises(WaitTimeout) as waited:
        client.wait_for(slow_id, lambda v: False, timeout=0.1, poll=0.05)
    assert waited.value.view.status is TaskStatus.CANCELLED


def test_the_client_reads_every_message_of_a_task_following_the_pages(client: Client) -> None:
    turns = [{"text": "", "tool_calls": [call("request_approval", question="go?")]}, {"text": "went"}]
    task_id = client.submit(
        {**SCRIPTED, "script": {"turns": turns}, "constraints": {"tools": ["request_approval"]}}
    ).task_id
    client.wait_for_status(task_id, TaskStatus.PAUSED, timeout=60, poll=0.05)  # messages wait while it is paused
    long = "\u00e9" * (MAX_MESSAGE_CHARS - 3)  # 192 KB of JSON each: eleven pass one page's 2 MB
    for i in range(12):
        client.send(task_id, f"{i}:{long}")
    first = client.message_page(task_id)
    assert 0 < len(first.messages) < 12 and first.next_cursor
    assert [int(m.text.split(":")[0]) for m in client.messages(task_id)] == list(range(12))
    client.cancel(task_id)


def test_each_failure_is_its_own_exception_with_status_code_and_field(api_stack: ApiStack, client: Client) -> None:
    with pytest.raises(NotFound) as not_found:
        client.get("no-such-task")
    assert (not_found.value.status, not_found.value.code, not_found.value.field) == (404, "task_not_found", "task_id")
    with pytest.raises(InvalidRequest) as invalid:
        client.submit({**SCRIPTED, "constraints": {"max_tokens": 0}})
    assert invalid.value.status == 422 and invalid.value.field == "constraints.max_tokens"
    assert "HTTP 422 validation_error" in str(invalid.value)
    with pytest.raises(Conflict):
        client.result(
            client.submit({**SCRIPTED, "script": {"turns": [{"text": "slow", "latency_seconds": 2}]}}).task_id
        )
    with pytest.raises(AuthenticationError) as auth:
        Client(api_stack.url, "aq_" + "z" * 43).list_tasks()
    assert auth.value.status == 401 and auth.value.code == "unauthorized"
    with pytest.raises(ConnectionFailed):
        Client("http://127.0.0.1:9", "k", retries=0).health()
    assert all(issubclass(kind, ApiError) for kind in (NotFound, InvalidRequest, Conflict, AuthenticationError))
    assert client.health().status == "ok"


def test_a_body_over_the_paths_limit_is_the_servers_413_naming_body_raised_before_it_is_sent(
    api_stack: ApiStack, client: Client
) -> None:
    """Sent, a body far over the limit was cut off mid-upload by the server (which refuses on
    the length alone), and the client said "cannot reach" (BrokenPipe): the 413 is said here."""
    from agentq.api.models.base import MAX_BODY_BYTES, MAX_UPLOAD_BODY_BYTES

    before = len(client.list_tasks(limit=100).tasks)
    just_over = {**SCRIPTED, "goal": "x" * MAX_BODY_BYTES}
    for body in ({**SCRIPTED, "goal": "x" * 5_000_000}, just_over):
        with pytest.raises(InvalidRequest) as refused:
            client.request("POST", "/tasks", body)
        assert (refused.value.status, refused.value.code, refused.value.field) == (413, "body_too_large", "body")
        assert "nothing was sent" in refused.value.message
    status, answer, _ = api_stack.http("POST", "/tasks", just_over)  # what the server says of the same body
    assert status == 413 and (answer["error"]["code"], answer["error"]["field"]) == ("body_too_large", "body")
    assert len(client.list_tasks(limit=100).tasks) == before
    # An upload's larger limit is the server's to judge: the body goes out (and is refused for what it holds).
    with pytest.raises(InvalidRequest) as upload:
        client.request("POST", "/workspace-uploads", {"archive": "A" * (MAX_BODY_BYTES + 1)})
    assert upload.value.status != 413, upload.value
    assert MAX_UPLOAD_BODY_BYTES > MAX_BODY_BYTES + 100


def test_a_client_needs_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTQ_URL", raising=False)
    with pytest.raises(AgentqError, match="AGENTQ_URL"):
        Client()
    monkeypatch.setenv("AGENTQ_URL", "http://example.invalid/")
    monkeypatch.setenv("AGENTQ_API_KEY", "aq_env")
    from_env = Client()
    assert from_env.url == "http://example.invalid" and from_env.api_key == "aq_env"


@pytest.mark.parametrize(
    ("url", "key", "field", "says"),
    [("http://127.0.0.1:9\n", "aq_x", "url", "a line end or a control character"),
     ("http://127.0.0.1:9/a b", "aq_x", "url", "a space"),
     ("http://[::1", "aq_x", "url", "not a URL: Invalid IPv6 URL"),
     ("http://x:port", "aq_x", "url", "not a URL: Port could not be cast"),
     ("https://", "aq_x", "url", "names no host"),
     ("http://127.0.0.1:9/p\u00e4th", "aq_x", "url", "outside ASCII in its path"),
     ("http://127.0.0.1:9/prod/console/", "aq_x", "url", "the console's URL, the web page the API serves under "
      "/console: the API's is http://127.0.0.1:9/prod"),
     ("http://127.0.0.1:9", "aq_abc\n", "api_key", "a line end pasted with it?"),
     ("http://127.0.0.1:9", "aq abc", "api_key", "a space"),
     ("http://127.0.0.1:9", "\u043a\u043b\u044e\u0447", "api_key", "outside printable ASCII")],
)  # fmt: skip
def test_a_url_or_key_no_request_can_carry_is_refused_naming_it(url: str, key: str, field: str, says: str) -> None:
    """Taken, each raised a ValueError (or UnicodeEncodeError) from deep inside urllib at the first call."""
    with pytest.raises(AgentqError) as refused:
        Client(url, key)
    assert refused.value.field == field and says in refused.value.message, refused.value
