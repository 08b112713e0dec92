"""A call to an agent another service runs (A2A), as OpenTelemetry's GenAI conventions name it:
an ``invoke_agent {gen_ai.agent.name}`` CLIENT span (``gen_ai.invoke_agent.client``), and the
W3C trace context sent with each request, so a remote that traces carries the trace on.

Only the trace context goes: no baggage, which could hold what the remote should not read.
Tests: ``tests/test_a2a_remote_span.py``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from agentq.observe.otel import tracer

# The conventions require a provider; behind a remote agent agentq cannot know the model's, so
# the provider it names is the protocol it speaks (a custom value, as the conventions allow).
A2A_PROVIDER = "a2a"


def invoke_agent_attributes(name: str, url: str, *, description: str | None = None) -> dict[str, Any]:
    """The span's attributes at its start: the name the agent definition gives the remote agent,
    and the server it is on (``server.port`` the scheme's when the URL names none)."""
    where = urlsplit(url)
    port = where.port or (443 if where.scheme == "https" else 80)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": A2A_PROVIDER,
        "gen_ai.agent.name": name,
        "server.address": where.hostname or "",
        "server.port": port,
    }
    if description:
        attributes["gen_ai.agent.description"] = description[:1000]
    return attributes


def trace_headers() -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) of the current span; empty when tracing is off."""
    if tracer() is None:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier
