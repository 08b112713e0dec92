"""A provider error never carries a whole body (issue 39, item 6: ``--wait`` printed moto's HTML
500 page at each of 25 attempts). A body that is an HTML page (a proxy's, a load balancer's, a
local stack's) is named by its status, size and title; any other text is cut to an excerpt:
in the failure a task ends with, and in every retry notice status and the trace show.

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

from agentq.core.errors import ProviderError
from agentq.core.providers import LLMRequest
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.base import RetryNotice, reporting_retries
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import EXCERPT_CHARS, RetryPolicy, excerpt

from tests.fake_messages_api import FakeMessagesAPI
from tests.fake_messages_api import FakeReply as MessagesReply
from tests.fake_model_servers import FakeChatCompletions, FakeConverse, FakeReply, Sleeps, point_boto3_at

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
