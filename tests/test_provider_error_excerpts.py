"""A provider error never carries a whole body (issue 39, item 6: ``--wait`` printed moto's HTML
500 page at each of 25 attempts). A body that is an HTML page (a proxy's, a load balancer's, a
local stack's) is named by its status, size and title; any other text is cut to an excerpt:
in the failure a task ends with, and in every retry notice status and the trace show. Nor
does it carry the provider's key, when a server echoes the one it was sent.

Through each provider's real SDK against its local wire-protocol server, and over the whole
domain of bodies for the excerpt itself (Hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import TaskSubmission
from agentq.core.providers import LLMRequest
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.base import RetryNotice, reporting_retries
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import EXCERPT_CHARS, RetryPolicy, excerpt
from agentq.core.tools import ToolRegistry
from agentq.observe.redaction import REDACTED
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, error_reply, point_anthropic_at
from tests.fake_messages_api import FakeReply as MessagesReply
from tests.fake_model_servers import (
    FakeChatCompletions,
    FakeConverse,
    FakeReply,
    Sleeps,
    chat_error,
    point_boto3_at,
)

STORAGE = "memory"

# What moto answers for a service it does not serve (werkzeug's page), and a proxy's, padded.
MOTO_500 = (
    "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n<h1>Internal Server Error</h1>\n"
    "<p>The server encountered an internal error and was unable to complete your request.</p>\n"
)
PROXY_403 = (
    "<HTML><HEAD><TITLE>403 Forbidden</TITLE></HEAD><BODY><H1>Forbidden</H1>"
    + "<!-- padding -->" * 2000
    + "</BODY></HTML>"
)
RETRY = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=1)


@contextmanager
def failing(provider: str, status: int, page: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Any]]:
    """The provider's server answering every call with ``status`` and ``page``; yields a
    function that makes one call (its retries included)."""
    body = page.encode()
    request = LLMRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    if provider == "anthropic":
        with FakeMessagesAPI() as api:
            api.enqueue(*[MessagesReply(status, None, raw=body) for _ in range(RETRY.max_attempts)])
            made = AnthropicProvider(api_key="k", base_url=api.base_url, retry=RETRY, sleep=Sleeps())
            yield lambda: made.complete(request.model_copy(update={"model": "claude-sonnet-4-5"}))
    elif provider == "openai":
        with FakeChatCompletions() as chat:
            chat.enqueue(*[FakeReply(status, raw=body, content_type="text/html") for _ in range(RETRY.max_attempts)])
            made_openai = OpenAIProvider(api_key="k", base_url=chat.openai_base_url, retry=RETRY, sleep=Sleeps())
            yield lambda: made_openai.complete(request.model_copy(update={"model": "gpt-4.1-mini"}))
    else:
        with FakeConverse() as converse:
            point_boto3_at(converse, monkeypatch.setenv)
            converse.enqueue(
                *[FakeReply(status, raw=body, content_type="text/html") for _ in range(RETRY.max_attempts)]
            )
            made_converse = BedrockConverseProvider(region="us-east-1", retry=RETRY, sleep=Sleeps())
            yield lambda: made_converse.complete(request.model_copy(update={"model": "us.amazon.nova-pro-v1:0"}))


@pytest.mark.parametrize("provider", ["anthropic", "openai", "bedrock-converse"])
@pytest.mark.parametrize(("status", "page", "title"), [(500, MOTO_500, "500 Internal Server Error"),
                                                         (403, PROXY_403, "403 Forbidden")])  # fmt: skip
def test_an_html_error_page_becomes_its_status_and_title_in_the_failure_and_every_retry_notice(
    provider: str, status: int, page: str, title: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    notices: list[RetryNotice] = []
    with (
        failing(provider, status, page, monkeypatch) as call,
        reporting_retries(notices.append),
        pytest.raises(ProviderError) as failed,
    ):
        call()
    messages = [failed.value.message, *(n.message for n in notices)]
    assert len(notices) == (RETRY.max_attempts - 1 if status == 500 else 0)  # a 403 is not retried
    for message in messages:
        assert f"({status}" in message and "HTML page" in message and message.endswith(title), message
        assert "<" not in message and len(message) < 100 + EXCERPT_CHARS, message


@given(st.text())
def test_an_excerpt_of_any_body_is_short_and_keeps_a_short_text_whole(body: str) -> None:
    said = excerpt(body)
    assert len(said) <= EXCERPT_CHARS
    if "<" not in body and len(" ".join(body.split())) <= EXCERPT_CHARS:
        assert said == " ".join(body.split())


_words = st.text(st.characters(exclude_characters="<>&", exclude_categories=["Cs"]), max_size=300)


@given(title=_words, text=_words, prefix=st.sampled_from(["", "Error code: 502 - "]),
       opening=st.sampled_from(["<!DOCTYPE html>", "<html>", "<HTML lang=en>", "<head>", "<title>"]))  # fmt: skip
def test_an_excerpt_of_any_html_page_names_it_by_its_title_with_no_markup(
    title: str, text: str, prefix: str, opening: str
) -> None:
    page = f"{opening}<head><title>{title}</title></head><body><p>{text}</p></body></html>"
    said = excerpt(prefix + page)
    assert "<" not in said and "HTML page" in said and len(said) <= EXCERPT_CHARS
    shown = " ".join(title.split())[:120]
    assert said.startswith(prefix.strip()) and (not shown or said.endswith((shown, "…")))


# --- the provider's key, echoed ---------------------------------------------------------------


def echoing(provider: str, key: str, status: int, said: str) -> tuple[Callable[[], Any], Any]:
    """(a call through ``provider``'s SDK sent ``key``, the server), the server answering every
    attempt ``status`` with ``said``: a server that echoes the key it was sent (OpenAI masks
    it; an OpenAI-compatible server, a gateway or a proxy may not)."""
    request = LLMRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    if provider == "anthropic":
        api = FakeMessagesAPI()
        api.enqueue(*[error_reply(status, "authentication_error", said) for _ in range(RETRY.max_attempts)])
        made = AnthropicProvider(api_key=key, base_url=api.base_url, retry=RETRY, sleep=Sleeps())
        return lambda: made.complete(request.model_copy(update={"model": "claude-sonnet-4-5"})), api
    chat = FakeChatCompletions()
    chat.enqueue(*[chat_error(status, "invalid_api_key", said) for _ in range(RETRY.max_attempts)])
    made_openai = OpenAIProvider(api_key=key, base_url=chat.openai_base_url, retry=RETRY, sleep=Sleeps())
    return lambda: made_openai.complete(request.model_copy(update={"model": "gpt-4.1-mini"})), chat


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize("status", [401, 500], ids=["refused", "retried"])
def test_the_providers_key_a_server_echoes_is_redacted_from_the_failure_and_every_retry_notice(
    provider: str, status: int
) -> None:
    """The key quoted by the server in its error (in any spelling the redactor knows:
    ``observe.redaction.spellings``) never reaches the failure's message or a retry's notice
    (the task's error, its events, its trace): the provider registers its key with the
    process's redactor when it is made, and the server's words are redacted before they are
    excerpted, so a long body cannot cut a key in two. Before, the 401's message was
    "Incorrect API key provided: <the whole key>"."""
    key = f"{provider[:9]}-live-Q7f3Zp0Ww9xYk2"
    head = f"Incorrect API key provided: {key}. "
    said = head + "." * (180 - len(head) - 8) + f" Bearer {key}"  # the second one from char 180, across the cut
    call, server = echoing(provider, key, status, said)
    notices: list[RetryNotice] = []
    with server, reporting_retries(notices.append), pytest.raises(ProviderError) as failed:
        call()
    messages = [failed.value.message, *(n.message for n in notices)]
    assert len(notices) == (RETRY.max_attempts - 1 if status == 500 else 0)
    for message in messages:
        assert key[:12] not in message and message.count(REDACTED) == 2, message


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_the_providers_key_echoed_back_in_an_error_never_reaches_the_tasks_error(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    """Through the engine, the key read from the environment as a worker reads it: the task's
    error, which the tenant reads, names the failure and not the operator's key."""
    key = f"sk-{provider}-env-TOPSECRET-0123456789abcdef"
    if provider == "anthropic":
        server: Any = FakeMessagesAPI()
        server.enqueue(error_reply(401, "authentication_error", f"invalid x-api-key: {key}"))
        point_anthropic_at(server, monkeypatch.setenv, key)
        model = "claude-sonnet-4-5"
    else:
        server = FakeChatCompletions()
        server.enqueue(chat_error(401, "invalid_api_key", f"Incorrect API key provided: {key}."))
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", key)
        model = "gpt-4.1-mini"
    with server:
        submission = TaskSubmission(goal="say done", provider=provider, model=model)  # type: ignore[arg-type]
        task_id = store.tasks.create(submission, tenant="t").task_id
        Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
    error = store.tasks.get(task_id).error or {}
    assert error.get("code") == "invalid_api_key" and key not in str(error) and REDACTED in str(error), error


def test_a_bedrock_api_key_converse_sends_is_redacted_from_what_the_process_writes_once_the_provider_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """botocore sends ``AWS_BEARER_TOKEN_BEDROCK`` (a Bedrock API key) in place of SigV4 (over
    HTTPS only, so no local server here echoes it): the provider registers it as the others
    register theirs, and an error that quotes it is excerpted without it."""
    key = "ABSKQmVkcm9ja0FQSUtleS1lY2hvZWQtYmFjaw"
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", key)
    assert key in excerpt(f"The security token included in the request is invalid: {key}")
    BedrockConverseProvider(region="us-east-1", retry=RETRY, sleep=Sleeps())
    assert excerpt(f"The security token included in the request is invalid: {key}") == (
        f"The security token included in the request is invalid: {REDACTED}"
    )


def test_the_placeholder_a_keyless_local_server_is_sent_is_not_redacted_anywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local server that wants no key (Ollama, vLLM) is sent ``not-needed``: that is no key,
    and kept by the redactor it would be rewritten in every log line and every run's output."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    OpenAIProvider(base_url="http://127.0.0.1:9/v1", retry=RETRY, sleep=Sleeps())
    assert excerpt("the header said Bearer not-needed") == "the header said Bearer not-needed"
