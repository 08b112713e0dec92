"""A call to a remote A2A agent is in the trace as OpenTelemetry's GenAI conventions write it:
an ``invoke_agent {gen_ai.agent.name}`` CLIENT span per contact (``gen_ai.invoke_agent.client``,
docs/gen-ai/gen-ai-agent-spans.md of open-telemetry/semantic-conventions-genai), its error's
code its ``error.type``, and the W3C trace context of that span sent with every request of the
contact, the card's included, and nothing else of the trace (no baggage).

Real parts: the a2a-sdk client (``core.tools.a2a_remote``), the a2a-sdk server of
tests/a2a_servers/desk.py in a process of its own, writing down the headers each request came
with, and the OTLP exporter sending to a local receiver."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.models import RemoteAgentRef
from agentq.core.tools.a2a_remote import RemoteAgents, RemoteUnreachable
from agentq.observe import otel

from tests.helpers import wait_for
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.test_otel_genai_conventions import CLIENT, INVOKE_AGENT, check_span

ROOT = Path(__file__).resolve().parent.parent

# "Invoke agent client span": the internal span's attributes, and the server's.
INVOKE_AGENT_CLIENT = dataclasses.replace(
    INVOKE_AGENT,
    kind=CLIENT,
    conditional={**INVOKE_AGENT.conditional, "server.port": "If `server.address` is set."},
    recommended=INVOKE_AGENT.recommended | {"server.address"},
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    port, where = _free_port(), tmp_path_factory.mktemp("desk")
    headers = where / "headers.jsonl"
    env = {**os.environ, "DESK_LEDGER": str(where / "received.jsonl"), "DESK_HEADERS": str(headers),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    env.pop("DESK_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "tests.a2a_servers.desk", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, timeout=30, what="the a2a-sdk desk server")
        yield port, headers
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        otel.reset()
        try:
            yield receiver
        finally:
            otel.reset()  # flushes what was sent into the receiver, then forgets the endpoint


def _ref(port: int, **extra: Any) -> RemoteAgentRef:
    return RemoteAgentRef(name="desk", card_url=f"http://127.0.0.1:{port}/.well-known/agent-card.json",
                          host=f"127.0.0.1:{port}", **extra)  # fmt: skip


def _spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    otel.flush()
    return [s for s in receiver.spans if s.name.startswith("invoke_agent")]


def test_each_contact_is_an_invoke_agent_client_span_and_each_request_carries_its_trace_context(
    desk: tuple[int, Path], traced: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, headers = desk
    monkeypatch.setenv("AGENTQ_A2A_ALLOW", f"127.0.0.1:{port}")
    before = len(headers.read_text().splitlines()) if headers.exists() else 0
    ref = _ref(port, description="answers after a while")
    sent = RemoteAgents().send(ref, "ask: which?", key="k-span-1", credential=None)  # a task that asks
    looked = RemoteAgents().look(ref, {"task_id": sent.task_id, "url": sent.url}, None)
    assert sent.task_id and looked.task_id == sent.task_id

    spans = _spans(traced)
    assert len(spans) == 2  # the send and the look, one span each
    for span in spans:
        check_span(span, INVOKE_AGENT_CLIENT, {"gen_ai.agent.name", "gen_ai.agent.description",
                                               "gen_ai.conversation.id", "server.port"})  # fmt: skip
        assert span.name == "invoke_agent desk" and span.status_code == 0
        assert span.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert span.attributes["gen_ai.conversation.id"] == sent.context_id
        assert (span.attributes["server.address"], span.attributes["server.port"]) == ("127.0.0.1", port)

    requests = [json.loads(line) for line in headers.read_text().splitlines()[before:]]
    assert [r["path"] for r in requests] == ["/.well-known/agent-card.json", "/", "/"]  # card, send, look
    by_span = {f"00-{s.trace_id:032x}-{s.span_id:016x}" for s in spans}  # then its flags: sampled
    assert {r["traceparent"][:-3] for r in requests} == by_span  # each request under its own contact's span
    assert all(int(r["traceparent"][-2:], 16) & 1 for r in requests)
    assert requests[0]["traceparent"] == requests[1]["traceparent"]  # the card read is the send's contact
    assert all(r["baggage"] is None for r in requests)


def test_a_contact_that_fails_is_a_span_whose_error_type_is_its_code(
    traced: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = _free_port()  # nothing listens there
    monkeypatch.setenv("AGENTQ_A2A_ALLOW", f"127.0.0.1:{closed}")
    with pytest.raises(RemoteUnreachable):
        RemoteAgents(timeout=2).send(_ref(closed), "hello", key="k-span-2", credential=None)
    (span,) = _spans(traced)
    check_span(span, INVOKE_AGENT_CLIENT, {"error.type", "server.port"})
    assert span.attributes["error.type"] == "remote_unreachable" and span.status_code == 2
    assert [name for name, _ in span.events] == ["exception"]


def test_with_tracing_off_a_contact_sends_no_trace_context(
    desk: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, headers = desk
    monkeypatch.setenv("AGENTQ_A2A_ALLOW", f"127.0.0.1:{port}")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    otel.reset()
    before = len(headers.read_text().splitlines()) if headers.exists() else 0
    assert RemoteAgents().send(_ref(port), "whoami:1", key="k-span-3", credential=None).state == "completed"
    requests = [json.loads(line) for line in headers.read_text().splitlines()[before:]]
    assert requests and all(r["traceparent"] is None for r in requests)
