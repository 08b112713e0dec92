"""OpenTelemetry traces by OTLP/HTTP, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (X-Ray stays
the default tracer: ``observe/tracing.py``). ADOT, Langfuse, Honeycomb and Datadog take them.

One trace per root task, whatever worker runs it and however often it resumes: its trace id is
derived from the root task's id, and the span id of each invocation of a task from the task's id
and the invocation's number, so a run started anywhere, any time, hangs its spans under the same
parent without reading anything first:

    invoke_agent <agent>                 one invocation of the task (emitted when it ends)
      run                                one claim of it by a worker (a resume is another; its id
                                         derived from the lease's epoch: a takeover sends a dead one's)
        step <n>                         one step: an LLM turn or a tools turn
          chat <model>                   the model call (CLIENT), GenAI attributes; retries as events
          execute_tool <tool>            each tool call (INTERNAL)
          execute_tool spawn_subagents   a spawn: its id derived from the tool call's
            invoke_agent <child>         each sub-agent, a child of the spawning call

An invocation is what a task does from its submission, or from the write that reopened it (a
follow-up to an answered or interrupted conversation, a redrive, a raised budget: META's
``invocation`` counts them), to its next end (an answer, a failure, ``idle``). A conversation of
three answers is three ``invoke_agent`` spans with three ids, each holding its own runs.

The attributes follow OpenTelemetry's GenAI semantic conventions (gen-ai-agent-spans.md,
gen-ai-spans.md); the GenAI client metrics are ``observe/otel_metrics.py``. Spans go out through
a batch processor flushed at the end of every run (a Lambda may be frozen right after). Without
the endpoint, or without the ``otel`` extra installed, every function here does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import time
import traceback
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from agentq.observe import otel_metrics
from agentq.observe.otlp import ENDPOINT_VARIABLE, SERVICE_NAME, configured, export_timeout, in_lambda, resource

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from agentq.core.models import LostClaim, Task
    from agentq.core.records import BudgetState

log = logging.getLogger("agentq.observe")

Attributes = Mapping[str, str | int | float | bool | list[str]]

ENDUSER_ID = "enduser.id"  # opentelemetry.semconv._incubating.attributes.enduser_attributes.ENDUSER_ID (an extra)

# agentq provider name -> gen_ai.provider.name (the conventions' well-known values; "scripted" is ours)
GENAI_PROVIDERS = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "bedrock-converse": "aws.bedrock",
                   "openai": "openai"}  # fmt: skip

# The longest attribute value a span or event carries (the SDK's own setting overrides it): a
# server's error page, an exception's text, never a whole echoed request.
ATTRIBUTE_LENGTH_VARIABLE = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
ATTRIBUTE_LENGTH_DEFAULT = 4096
STATUS_LENGTH = 500

# Set around the start of a span whose id is derived rather than random (``_DerivedIds``).
_forced_span_id: ContextVar[int | None] = ContextVar("agentq_otel_span_id", default=None)
_forced_trace_id: ContextVar[int | None] = ContextVar("agentq_otel_trace_id", default=None)
# The run in progress (``task_run``): whether a claim took its task over (``superseded``).
_run_state: ContextVar[dict[str, bool] | None] = ContextVar("agentq_otel_run", default=None)


def genai_provider(provider: str) -> str:
    return GENAI_PROVIDERS.get(provider, provider)


def trace_id_of(root_id: str) -> int:
    """The trace of a root task and all its sub-agents: 128 bits of its id's SHA-256."""
    return int.from_bytes(hashlib.sha256(f"agentq-trace:{root_id}".encode()).digest()[:16], "big") or 1


def span_id_of(*parts: str) -> int:
    """A span id that any worker derives alike (a task's span, a spawn's)."""
    return int.from_bytes(hashlib.sha256(":".join(("agentq-span", *parts)).encode()).digest()[:8], "big") or 1


def invocation_span_id(task_id: str, invocation: int) -> int:
    """The ``invoke_agent`` span of a task's ``invocation``-th invocation (0: from its submission)."""
    return span_id_of("task", task_id) if invocation == 0 else span_id_of("task", task_id, f"invocation-{invocation}")


@functools.cache
def _provider() -> Any:
    """The process's TracerProvider, or None (decided once; ``reset`` forgets it)."""
    if not configured():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    except ImportError:
        log.warning("%s is set but OpenTelemetry is not installed (agentq's otel extra, docs/INSTALL.md): no traces",
                    ENDPOINT_VARIABLE)  # fmt: skip
        return None

    class DerivedIds(RandomIdGenerator):
        """Random ids, except for the spans whose ids are derived (``_forced_*``)."""

        def generate_span_id(self) -> int:
            return _forced_span_id.get() or super().generate_span_id()

        def generate_trace_id(self) -> int:
            return _forced_trace_id.get() or super().generate_trace_id()

    # Unbounded by default in the SDK: a 400 whose body quotes a 240 KB request would ride on the span.
    length = None if ATTRIBUTE_LENGTH_VARIABLE in os.environ else ATTRIBUTE_LENGTH_DEFAULT
    limits = SpanLimits(max_attribute_length=length)
    provider = TracerProvider(resource=resource(), id_generator=DerivedIds(), span_limits=limits)
    exporter = OTLPSpanExporter(timeout=export_timeout("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"))  # and the other settings
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer() -> Tracer | None:
    provider = _provider()
    return provider.get_tracer("agentq") if provider is not None else None


def enabled() -> bool:
    return _provider() is not None


def reset() -> None:
    """Flush and forget the providers: the next span reads the environment again (tests)."""
    provider = _provider()
    if provider is not None:
        provider.shutdown()
    otel_metrics.reset()  # decided apart (a call may have asked before any span did)
    _provider.cache_clear()


def flush(timeout_seconds: float = 5.0, *, metrics: bool | None = None) -> None:
    """The spans ended so far out now (a run's end: the process may be frozen or killed next);
    and the metric points too when ``metrics``, by default in a Lambda only: a long-lived
    worker's periodic reader sends them every minute, and each flush waits on the collector."""
    provider = _provider()
    if provider is None:
        return
    if not provider.force_flush(int(timeout_seconds * 1000)):
        log.warning("OpenTelemetry: spans not exported within %.0fs", timeout_seconds)
    if (in_lambda() if metrics is None else metrics) and not otel_metrics.flush(int(timeout_seconds * 1000)):
        log.warning("OpenTelemetry: metrics not exported within %.0fs", timeout_seconds)


def _remote_parent(trace_id: int, span_id: int) -> Any:
    """The context of a span sent by another run (or to be): sampled as the root of its trace is
    (``OTEL_TRACES_SAMPLER``; a ratio decides by the trace id, the same for every run), so a
    sampler keeps or drops a task's trace whole, never its runs without their root."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    root = _provider().sampler.should_sample(None, trace_id, "invoke_agent")
    flags = TraceFlags(TraceFlags.SAMPLED if root.decision.is_sampled() else TraceFlags.DEFAULT)
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _task_parent(task: Task) -> Any:
    """The context a task's runs hang from: its invocation's span, in its root's trace."""
    return _remote_parent(trace_id_of(task.root_id), invocation_span_id(task.task_id, task.invocation))


@contextlib.contextmanager
def _started(name: str, context: Any, span_id: int | None = None, **kwargs: Any) -> Iterator[Span]:
    found = tracer()
    assert found is not None
    token = _forced_span_id.set(span_id)
    try:
        span = found.start_span(name, context=context, **kwargs)
    finally:
        _forced_span_id.reset(token)
    yield span


def record_exception(made: Span, exc: BaseException) -> None:
    """The ``exception`` event of an error leaving a span, and its error status: the exception's
    own type, text and frames, not the chain the SDK would print. A provider error's text is
    agentq's excerpt of the server's answer; the SDK exception it was raised from carries the
    server's whole body, which may echo what was sent (the prompt, a tool's output), so that
    cause stays off the trace. The status's description is no attribute (the span limits do not
    cut it): cut here."""
    from opentelemetry.trace import Status, StatusCode

    own = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    made.record_exception(exc, attributes={"exception.stacktrace": own}, escaped=True)
    made.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:STATUS_LENGTH]))


@contextlib.contextmanager
def _current(made: Span, *, end: bool = True) -> Iterator[None]:
    """``made`` is the current span for the block, ended after it (unless not ``end``); an
    exception leaving the block is recorded (``record_exception``) and makes its status an error."""
    from opentelemetry import trace

    with trace.use_span(made, end_on_exit=end, record_exception=False, set_status_on_exception=False):
        try:
            yield
        except Exception as exc:
            record_exception(made, exc)
            raise


def run_span_id(task_id: str, epoch: int) -> int:
    """The ``run`` span of the claim of ``task_id`` under lease ``epoch``: derived, so the claim
    that takes the task over from a dead worker can send the span that worker never did."""
    return span_id_of("run", task_id, f"epoch-{epoch}")


@contextlib.contextmanager
def task_run(task: Task, worker_id: str, resumed_from: int) -> Iterator[None]:
    """One claim of ``task`` (as claimed: its ``lease_epoch`` is the claim's): the run's span is
    current for everything the run does. A worker sends each span as it ends, so a worker
    killed mid-run sent its finished steps and never its ``run`` span (open until the run
    ends): the claim that takes the task over sends it for it first (``lost_run``), closed, an
    error. A run whose claim was taken over while it went on (a stalled worker: ``superseded``)
    sends none, as that claim sent it.

    A run that returns leaves its spans to the caller's one flush (``flush``, or ``task_ended``'s
    when the run ended its invocation): each flush waits on the collector, at most its timeout
    when it is down or hung; a run that raises flushes them here."""
    if tracer() is None:
        yield
        return

    if task.lost_claim is not None:
        lost_run(task, task.lost_claim)
        # Out now: the next takeover makes only this claim's span, so this one, killed before
        # its batch went out, would leave the dead claim's steps hanging from nothing.
        flush(metrics=False)
    attributes = {
        "agentq.task_id": task.task_id,
        "agentq.worker_id": worker_id,
        "agentq.lease_epoch": task.lease_epoch,
        "agentq.resumed_from_step": resumed_from,
        **user_attributes(task),
    }
    run_id = run_span_id(task.task_id, task.lease_epoch)
    state = {"superseded": False}
    token = _run_state.set(state)
    # Named "run": a span's name is a class of operation (the API's rule), the task's id an attribute.
    with _started("run", _task_parent(task), run_id, attributes=attributes) as span:
        try:
            with _current(span, end=False):
                yield
        except BaseException:
            _end_run(span, state, token)
            flush(metrics=False)  # the caller, raising, flushes none
            raise
        _end_run(span, state, token)


def _end_run(span: Span, state: dict[str, bool], token: Any) -> None:
    _run_state.reset(token)
    if not state["superseded"]:
        span.end()


def lost_run(task: Task, lost: LostClaim) -> None:
    """The ``run`` span of the claim ``task`` was taken over from (its worker never gave the
    lease back: killed, or stalled), with the id that worker's steps hang from: from its claim
    to this takeover, status an error, ``error.type`` ``worker_lost``."""
    from opentelemetry.trace import Status, StatusCode

    attributes: dict[str, str | int | float] = {
        "agentq.task_id": task.task_id,
        "agentq.worker_id": lost.worker,
        "agentq.lease_epoch": lost.epoch,
        "error.type": "worker_lost",
        **user_attributes(task),
    }
    if lost.heartbeat_at is not None:
        attributes["agentq.last_heartbeat_at"] = lost.heartbeat_at
    with _started("run", _task_parent(task), run_span_id(task.task_id, lost.epoch),
                  attributes=attributes, start_time=int(lost.claimed_at * 1e9)) as made:  # fmt: skip
        made.set_status(Status(StatusCode.ERROR, "worker_lost"))
        made.end()


def superseded() -> None:
    """The run in progress learnt that a claim took its task over: that claim sent this run's
    span (``lost_run``), so this run sends none (one span per id); its steps hang from that one."""
    state = _run_state.get()
    if state is not None:
        state["superseded"] = True


def budget_after_run(state: BudgetState) -> None:
    """The task tree's budget as the run left it, on the run's span: what the cap counts
    (``used``), and of it what the provider reported (``known``) and what is unknown (holds of
    calls whose outcome no worker learned; ARCHITECTURE 4), in tokens and dollars."""
    if tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({
        "agentq.budget.cap_tokens": state.cap, "agentq.budget.used_tokens": state.used,
        "agentq.budget.known_tokens": state.known, "agentq.budget.unknown_tokens": state.unknown,
        "agentq.budget.known_usd": state.known_micros / 1_000_000,
        "agentq.budget.unknown_usd": state.unknown_micros / 1_000_000,
    })  # fmt: skip


@contextlib.contextmanager
def step(number: int, kind: str) -> Iterator[None]:
    """One step of the run in progress (an LLM turn or a tools turn)."""
    found = tracer()
    if found is None:
        yield
        return
    from opentelemetry import context as otel_context

    attributes = {"agentq.step": number, "agentq.step_kind": kind}
    with _started(f"step {number}", otel_context.get_current(), attributes=attributes) as made, _current(made):
        yield


@contextlib.contextmanager
def span(
    name: str, attributes: Attributes, *, client: bool = False, start_time: float | None = None
) -> Iterator[Span | None]:
    """A span under the current one: a model call (``client``: a call to another process, CLIENT
    kind), a tool call (INTERNAL, as the conventions want of ``execute_tool``). An exception
    leaving the block is recorded on it as an ``exception`` event, its status an error.
    ``start_time``: when the operation began, if before the block (a batch's submission)."""
    if tracer() is None:
        yield None
        return
    from opentelemetry import context as otel_context
    from opentelemetry.trace import SpanKind

    context = otel_context.get_current()
    kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
    began = {"start_time": int(start_time * 1e9)} if start_time is not None else {}
    with _started(name, context, kind=kind, attributes=attributes, **began) as made, _current(made):
        yield made


def failed(made: Span, kind: str) -> None:
    """A span whose operation ended in an error it did not raise: ``error.type`` and status."""
    from opentelemetry.trace import Status, StatusCode

    made.set_attribute("error.type", kind)
    made.set_status(Status(StatusCode.ERROR, kind))


def event(name: str, attributes: Attributes) -> None:
    """An event on the current span (a retry, a fallback)."""
    if tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, attributes=dict(attributes))


def tool_attributes(name: str, call_id: str, description: str | None) -> dict[str, str]:
    """An ``execute_tool`` span's attributes. Every tool is a ``function`` in the conventions'
    terms: the model writes its arguments, and agentq, the model's client, runs it."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name[:200],
                  "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function"}  # fmt: skip
    if description:
        attributes["gen_ai.tool.description"] = description[:1000]
    return attributes


def spawned(
    task_id: str, use_id: str, *, started: float, ended: float, error: str | None, description: str | None = None
) -> None:
    """A spawn_subagents call of a tools step that committed: its span, whose id every sub-agent
    of it derives as its parent's (``task_ended``), from when the call began (the first run's
    spawn, when a later run ends it) to when its result was made; a refused spawn's ``error``
    (its status) is the span's ``error.type``."""
    if tracer() is None:
        return
    from opentelemetry import context as otel_context

    attributes = tool_attributes("spawn_subagents", use_id, description)
    with _started("execute_tool spawn_subagents", otel_context.get_current(), span_id_of("tool", task_id, use_id),
                  attributes=attributes, start_time=int(started * 1e9)) as made:  # fmt: skip
        if error is not None:
            failed(made, error)
        made.end(end_time=int(max(started, ended) * 1e9))


def user_attributes(task: Task) -> dict[str, str]:
    """Whom the task acts for (``core.endusers``), by the semantic conventions' ``enduser.id``
    (the end user of the system; ``user.id`` describes a user of the host or browser): on the
    ``invoke_agent`` span of each invocation and the ``run`` span of each claim."""
    return {ENDUSER_ID: task.user} if task.user else {}


def agent_attributes(task: Task, provider: str) -> dict[str, str]:
    """Who the agent is: an agent definition's name, version and id (``<tenant>/<name>``); a task
    submitted without one is its own agent, named ``agentq``, whose id is the task's."""
    ref = task.submission.agent
    if not ref:
        return {"gen_ai.agent.name": SERVICE_NAME, "gen_ai.agent.id": task.task_id, "gen_ai.provider.name": provider}
    name, _, version = ref.partition("@")
    attributes = {
        "gen_ai.agent.name": name,
        "gen_ai.agent.id": f"{task.tenant}/{name}",
        "gen_ai.provider.name": provider,
    }
    if version:
        attributes["gen_ai.agent.version"] = version
    return attributes


def task_ended(
    task: Task,
    status: str,
    error: Mapping[str, Any] | None = None,
    *,
    tokens: tuple[int, int] | None = None,
) -> None:
    """The span of the task's invocation that just ended (an answer, a failure, ``idle``), from
    its start (the submission, or the write that reopened the task) to now, emitted once, by the
    run that ended it: the root of its trace, or a child of the spawn_subagents call that made it.

    ``task``: as claimed (its ``invocation`` is the one that ended); ``tokens``: the task's input
    and output totals now, of which the invocation's are what it added to those it started with."""
    if tracer() is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if task.parent_id and task.spawn_id:
        parent = _remote_parent(trace_id_of(task.root_id), span_id_of("tool", task.parent_id, task.spawn_id))
    else:
        from opentelemetry import context as otel_context

        parent = otel_context.Context()  # a root: no parent; its trace id is derived
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "invoke_agent",
        **agent_attributes(task, genai_provider(task.submission.provider)),
        "gen_ai.conversation.id": task.task_id,
        "gen_ai.request.model": task.submission.model,
        "agentq.task_id": task.task_id,
        "agentq.root_id": task.root_id,
        "agentq.status": status,
        "agentq.invocation": task.invocation,
        **user_attributes(task),
    }
    if task.submission.output_schema is not None:
        attributes["gen_ai.output.type"] = "json"
    if tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = max(0, tokens[0] - task.invocation_tokens_in)
        attributes["gen_ai.usage.output_tokens"] = max(0, tokens[1] - task.invocation_tokens_out)
    failed = status not in ("succeeded", "idle")  # idle: interrupted by a person, not an error
    if failed:
        attributes["error.type"] = str((error or {}).get("code") or status)
    started = task.invoked_at if task.invocation and task.invoked_at else task.created_at
    name = f"invoke_agent {attributes['gen_ai.agent.name']}"
    token = _forced_trace_id.set(trace_id_of(task.root_id))
    try:
        with _started(name, parent, invocation_span_id(task.task_id, task.invocation), attributes=attributes,
                      start_time=int(started * 1e9)) as made:  # fmt: skip
            if failed:
                made.set_status(Status(StatusCode.ERROR, str(attributes["error.type"])))
            made.end(int(time.time() * 1e9))
    finally:
        _forced_trace_id.reset(token)
    flush(metrics=False)  # with the run's: the run that ended the invocation flushes once
