"""Issue 40: a 200 that is a page (a captive portal's, a gateway's), read to the end its framing
declared, began no reply, so its hold goes back; anything else that is not a reply may be part
of one and stays counted as possibly billed (ARCHITECTURE 4, ``core/providers/pages.py``).

Through each provider's own ``complete`` and its real SDK (the Anthropic and OpenAI SDKs over
httpx, boto3 over urllib3), streamed and not, against local servers speaking their wire, six
replies, each failing the call's one attempt:

- a page sent as ``text/html``: not maybe billed, streamed or not;
- the page sent as JSON: not maybe billed when the call is not streamed (its body is read as
  a reply); streamed, the SDK reads it as the stream it should be and finds none: maybe billed;
- the page cut in the middle (its headers, half its body, a reset): maybe billed. botocore reads
  such a body as ``{}`` without a word, so Converse's check is ours (``whole_or_cut``);
- a Message's first bytes framed as a whole body (what a proxy that cut a reply and framed what
  it had would send): maybe billed;
- valid JSON that is no reply (a reply of another shape may still be a billed one): maybe billed;
- the page sent HTTP/1.0-style, no length, ending where the connection closes (it could have
  been cut anywhere): maybe billed.
"""

from __future__ import annotations

import dataclasses
import gzip
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import boto3
import botocore.config
import openai
import pytest

from agentq.core.errors import ProviderError
from agentq.core.providers import LLMRequest
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.openai_provider import OpenAIProvider
from agentq.core.providers.retry import RetryPolicy

from tests.fake_messages_api import FakeMessagesAPI, malformed_json, wrong_shape
from tests.fake_model_servers import FakeChatCompletions, FakeConverse, FakeReply

# Whole not JSON, cut in the middle, JSON of another shape, unframed: which may have been billed.
MAYBE_BILLED = [False, True, True, True]

PAGE = b"<html><head><title>Sign in to the network</title></head><body>Accept the terms</body></html>"
ONE_ATTEMPT = RetryPolicy(max_attempts=1)
# Page, page as JSON, page cut, a Message's first bytes, JSON of another shape, unframed page:
# which of them may have been billed.
WHOLE_CALL = [False, False, True, True, True, True]
STREAMED_CALL = [False, True, True, True, True, True]


def _failure(provider: Any, model: str, max_tokens: int) -> ProviderError:
    """The one attempt's failure. A cut body fails as a malformed reply (botocore) or as a broken
    connection (httpx), possibly billed; every other case here is malformed."""
    ask = LLMRequest(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens)
    with pytest.raises(ProviderError) as failure:
        provider.complete(ask)
    assert failure.value.code in ("malformed_response", "provider_unreachable"), failure.value
    assert failure.value.code == "malformed_response" or failure.value.maybe_billed, failure.value
    return failure.value


def _maybe_billed(provider: Any, model: str, max_tokens: int) -> bool:
    return _failure(provider, model, max_tokens).maybe_billed


@pytest.fixture
def unframed() -> Iterator[str]:
    """A server that answers every request HTTP/1.0-style: a 200 with no length, ``PAGE``, then
    closes the connection (the body ends where the connection does)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # so the loop sees ``stop`` (closing the socket does not end an accept)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                while len(rest) < length:
                    rest += conn.recv(65536)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n" + PAGE)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _anthropic(base_url: str) -> AnthropicProvider:
    client = anthropic.Anthropic(api_key="k", base_url=base_url, max_retries=0, timeout=10)
    return AnthropicProvider(client=client, retry=ONE_ATTEMPT)


def _openai(base_url: str) -> OpenAIProvider:
    client = openai.OpenAI(api_key="k", base_url=base_url, max_retries=0, timeout=10)
    return OpenAIProvider(client=client, retry=ONE_ATTEMPT)


def _converse(endpoint: str) -> BedrockConverseProvider:
    config = botocore.config.Config(retries={"total_max_attempts": 1}, read_timeout=10, connect_timeout=5)
    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=endpoint, config=config,
                          aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
    return BedrockConverseProvider(client, retry=ONE_ATTEMPT)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_anthropic_a_whole_200_that_is_no_reply_gives_its_hold_back_and_a_cut_or_unframed_one_does_not(
    monkeypatch: pytest.MonkeyPatch, unframed: str, streamed: bool
) -> None:
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0" if streamed else "8192")
    page = dataclasses.replace(malformed_json(), raw=PAGE, content_type="text/html")
    as_json = dataclasses.replace(page, content_type="application/json")
    with FakeMessagesAPI() as fake:
        fake.enqueue(page, as_json, dataclasses.replace(page, cut_at=0.5), malformed_json(), wrong_shape())
        provider = _anthropic(fake.base_url)
        outcomes = [_maybe_billed(provider, "claude-sonnet-4-6", 100) for _ in range(5)]
    outcomes.append(_maybe_billed(_anthropic(unframed), "claude-sonnet-4-6", 100))
    assert outcomes == (STREAMED_CALL if streamed else WHOLE_CALL)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_openai_a_whole_200_that_is_no_reply_gives_its_hold_back_and_a_cut_or_unframed_one_does_not(
    monkeypatch: pytest.MonkeyPatch, unframed: str, streamed: bool
) -> None:
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0" if streamed else "8192")
    page = FakeReply(200, raw=PAGE, content_type="text/html")
    as_json = dataclasses.replace(page, content_type="application/json")
    prefix = FakeReply(200, raw=b'{"id": "chatcmpl-1", "object": "chat.compl')
    other = FakeReply(200, raw=b'{"object": "error page"}')  # raw: sent as it is, streamed or not
    with FakeChatCompletions() as fake:
        fake.enqueue(page, as_json, dataclasses.replace(page, cut_at=0.5), prefix, other)
        provider = _openai(fake.openai_base_url)
        outcomes = [_maybe_billed(provider, "gpt-4.1-mini", 100) for _ in range(5)]
    outcomes.append(_maybe_billed(_openai(unframed + "/v1"), "gpt-4.1-mini", 100))
    assert outcomes == (STREAMED_CALL if streamed else WHOLE_CALL)


def test_converse_a_whole_200_that_is_no_reply_gives_its_hold_back_and_a_cut_or_unframed_one_does_not(
    unframed: str,
) -> None:
    page = FakeReply(200, raw=PAGE, content_type="text/html")
    as_json = dataclasses.replace(page, content_type="application/json")
    prefix = FakeReply(200, raw=b'{"output": {"message": {"role": "assist')
    with FakeConverse() as fake:
        fake.enqueue(page, as_json, dataclasses.replace(page, cut_at=0.5), prefix, FakeReply(200, {"status": "ok"}))
        provider = _converse(fake.base_url)
        failures = [_failure(provider, "us.amazon.nova-pro-v1:0", 100) for _ in range(5)]
    failures.append(_failure(_converse(unframed), "us.amazon.nova-pro-v1:0", 100))
    assert [f.maybe_billed for f in failures] == WHOLE_CALL
    assert "a 200 cut in its body" in failures[2].message  # botocore alone would have read it as {}


@pytest.mark.parametrize(
    "reply",
    [
        FakeReply(200, raw=gzip.compress(PAGE), headers={"content-encoding": "gzip"}, content_type="text/html"),
        FakeReply(200, raw=b"\xff\xfe{\x00}\x00"),
    ],
    ids=["gzip page", "not UTF-8"],
)
def test_converse_an_encoded_or_undecodable_200_is_a_malformed_reply_that_may_have_been_billed(
    reply: FakeReply,
) -> None:
    """botocore neither decodes a compressed body nor survives one that is not UTF-8 (a bare
    ``UnicodeDecodeError``): each is a malformed reply, retried, possibly billed."""
    with FakeConverse() as fake:
        fake.enqueue(reply)
        failure = _failure(_converse(fake.base_url), "us.amazon.nova-pro-v1:0", 100)
    assert (failure.code, failure.maybe_billed) == ("malformed_response", True)


def test_converse_a_streamed_call_answered_with_a_page_is_a_malformed_reply_that_may_have_been_billed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ConverseStream reads whatever comes as AWS's event stream; a page fails its checksum
    (botocore's ``eventstream.ParserError``): a malformed reply, possibly billed, never an
    unclassified error."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0")
    with FakeConverse() as fake:
        fake.enqueue(FakeReply(200, raw=PAGE, content_type="text/html"))
        failure = _failure(_converse(fake.base_url), "us.amazon.nova-pro-v1:0", 100)
        assert fake.requests[0].path.endswith("/converse-stream")
    assert (failure.code, failure.maybe_billed) == ("malformed_response", True)
