"""A process's model calls share one SDK client per setting, and so its connection
(agentq/core/providers/shared_clients.py): every call of a task, streamed or not, comes on the
connection its first call opened, for Anthropic, Claude on Bedrock and OpenAI, although the engine asks the
provider factory for a provider at every call. A setting changed in the environment (a rotated
key, a header), another server and a forked child each get a client of their own, and the
connection a child inherited stays its parent's.

Each fake server numbers the connections it accepts and records which one each request came
on. The engine runs on the in-memory twin: what is tested is the provider's side."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest, default_provider_factory
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS

from tests.fake_messages_api import FakeMessagesAPI, RecordedRequest, point_anthropic_at, text_reply, tool_use_reply
from tests.fake_model_servers import FakeChatCompletions, chat_completion
from tests.helpers import in_forked_child, sent_key

STORAGE = "memory"
TURNS = 5  # model calls a task makes: four lookups, then the answer


@pytest.fixture
def messages_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as api:
        point_anthropic_at(api, monkeypatch.setenv, "sk-ant-first")
        monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
        yield api


def _run(
    store: Storage, registry: ToolRegistry, provider: Literal["anthropic", "bedrock", "openai"], model: str
) -> None:
    submission = TaskSubmission(goal="look up five things", provider=provider, model=model)
    submission.constraints.tools = ["lookup"]
    task_id = store.tasks.create(submission, tenant="t").task_id
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    assert result.status is TaskStatus.SUCCEEDED, result.error


@pytest.mark.parametrize("stream_above", ["0", "1000000"], ids=["streamed", "whole"])
def test_every_call_of_an_anthropic_task_comes_on_the_connection_its_first_call_opened(
    stream_above: str,
    messages_api: FakeMessagesAPI,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", stream_above)
    messages_api.enqueue(*[tool_use_reply("lookup", {"query": str(n)}) for n in range(TURNS - 1)], text_reply("done"))
    _run(store, registry, "anthropic", "claude-sonnet-4-6")

    assert len(messages_api.requests) == TURNS
    assert [r.body.get("stream", False) for r in messages_api.requests] == [stream_above == "0"] * TURNS
    assert len({r.connection for r in messages_api.requests}) == 1


def test_every_call_of_a_claude_on_bedrock_task_comes_on_the_connection_its_first_call_opened(
    messages_api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_BEDROCK_BASE_URL", messages_api.base_url)
    for name, value in LOCAL_CREDENTIALS.items():  # what SigV4 signs each request with
        monkeypatch.setenv(name, value)
    messages_api.enqueue(*[tool_use_reply("lookup", {"query": str(n)}) for n in range(TURNS - 1)], text_reply("done"))
    _run(store, registry, "bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0")

    assert [r.path.endswith("/invoke") for r in messages_api.requests] == [True] * TURNS
    assert all(r.headers["authorization"].startswith("AWS4-HMAC-SHA256") for r in messages_api.requests)
    assert len({r.connection for r in messages_api.requests}) == 1


def test_every_call_of_an_openai_task_comes_on_the_connection_its_first_call_opened(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeChatCompletions() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        server.enqueue(
            *[chat_completion(None, [("lookup", {"query": str(n)})]) for n in range(TURNS - 1)],
            chat_completion("done"),
        )
        _run(store, registry, "openai", "gpt-4.1-mini")

    assert len(server.requests) == TURNS
    assert len({r.connection for r in server.requests}) == 1


def _call() -> None:
    """One call as the engine makes it: a provider from the factory, for this call alone."""
    submission = TaskSubmission(goal="hi", provider="anthropic", model="claude-sonnet-4-6")
    request = LLMRequest(model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    default_provider_factory(submission).complete(request)


@pytest.mark.parametrize(
    ("variable", "value", "sent"),
    [
        ("ANTHROPIC_API_KEY", "sk-ant-rotated", lambda r: sent_key(r) == "sk-ant-rotated"),
        ("ANTHROPIC_CUSTOM_HEADERS", "x-gateway: team-b", lambda r: r.headers.get("x-gateway") == "team-b"),
    ],
    ids=["rotated-key", "custom-header"],
)
def test_a_setting_changed_in_the_environment_is_what_the_next_call_is_made_with(
    variable: str,
    value: str,
    sent: Callable[[RecordedRequest], bool],
    messages_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages_api.enqueue(text_reply("one"), text_reply("two"), text_reply("three"))
    _call()
    monkeypatch.setenv(variable, value)
    _call()
    _call()

    first, second, third = messages_api.requests
    assert not sent(first) and sent(second) and sent(third)
    assert second.connection != first.connection and third.connection == second.connection  # a new client, kept


@pytest.mark.parametrize("token", ["a-gateway-token", ""], ids=["token", "empty-token"])
def test_with_a_key_and_an_auth_token_in_the_environment_the_call_is_made_with_the_key(
    token: str, messages_api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", token)
    messages_api.enqueue(text_reply("one"))
    _call()

    [request] = messages_api.requests
    assert sent_key(request) == "sk-ant-first"  # as the SDK picks when it reads both itself


def test_another_server_gets_the_call_and_the_first_keeps_its_connection(
    messages_api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages_api.enqueue(text_reply("one"), text_reply("three"))
    _call()
    with FakeMessagesAPI() as other:
        other.enqueue(text_reply("two"))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", other.base_url)
        _call()
        monkeypatch.setenv("ANTHROPIC_BASE_URL", messages_api.base_url)
        _call()

    assert len(other.requests) == 1
    assert (
        len(messages_api.requests) == 2 and messages_api.requests[0].connection == messages_api.requests[1].connection
    )


def test_a_forked_child_opens_a_connection_of_its_own_and_leaves_its_parents_alone(
    messages_api: FakeMessagesAPI,
) -> None:
    messages_api.enqueue(text_reply("parent"), text_reply("child"), text_reply("parent again"))
    _call()
    in_forked_child(_call)  # one call
    _call()

    parent, child, parent_again = (r.connection for r in messages_api.requests)
    assert child != parent and parent_again == parent
