"""The one interface every LLM provider implements, in Anthropic Messages API shapes.

The engine speaks Messages API content blocks (text, tool_use, tool_result) whatever the
provider, because that is what both Anthropic and Bedrock (through the same SDK) take and
return; the scripted provider answers in the same shapes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from agentq.core.errors import CallCut, ProviderError
from agentq.core.models import Usage
from agentq.core.models.steps import CUT_OFF, MALFORMED, REFUSED


class LLMRequest(BaseModel):
    model: str
    system: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)  # {name, description, input_schema}
    max_tokens: int
    task_id: str = ""  # lets deterministic providers derive stable ids
    # The prompt-cache TTL this call's breakpoints ask for (providers/caching.py): "1h" when the
    # task may wait longer than five minutes before its next call.
    cache_ttl: Literal["5m", "1h"] = "5m"
    thinking_budget: int | None = None  # extended thinking: tokens of max_tokens the model may think with
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # the API's output_config.effort
    # Native compaction (Anthropic's compact_20260112, a beta): the server summarises the
    # conversation once its input passes this many tokens.
    compact_at: int | None = None


class LLMResponse(BaseModel):
    content: list[dict[str, Any]]  # text / tool_use blocks as plain dicts
    stop_reason: str | None  # in the Messages API's terms, whoever answered: what the engine reads
    model: str
    usage: Usage
    attempts: int = 1  # provider calls made, retries included
    # What the telemetry reports (OpenTelemetry's gen_ai.response.*), never what the engine reads:
    # the provider's own id of the reply and its own word for why it stopped (OpenAI's "stop",
    # Converse's "end_turn"), which ``stop_reason`` has translated.
    response_id: str | None = None
    finish_reason: str | None = None
    streamed: bool = False  # the reply came as a stream (``stream_above``)


class LLMProvider(Protocol):
    name: str

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Return the assistant turn, or raise ``agentq.core.errors.ProviderError``."""
        ...


@runtime_checkable
class BatchProvider(Protocol):
    """A provider that can also answer a turn through a batch (economy mode: half price, the
    answer minutes to hours later)."""

    def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
        """Send ``request`` as a batch of one; returns the batch id."""
        ...

    def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
        """The answer once the batch has ended (None before); ``ProviderError`` when the
        request errored, expired or was canceled (``maybe_billed`` False: none of these is
        billed), or the batch can no longer be read (``maybe_billed`` True: it may have run)."""
        ...


@runtime_checkable
class RemoteProvider(Protocol):
    """A provider that calls a server: ``endpoint`` is its base URL (what the telemetry names as
    ``server.address`` and ``server.port``). The scripted provider calls none."""

    @property
    def endpoint(self) -> str | None: ...


@runtime_checkable
class InputCounter(Protocol):
    """A provider that can count a request's input before it is sent, as the call would be
    billed for it (the Anthropic API's free ``count_tokens``: ``anthropic_count``). The engine
    asks only for a call whose hold the cap shrank, where an estimate short of the bill would
    pass the cap (``core.engine._input_count``, ARCHITECTURE 4); a provider without it is sized
    on the estimate alone."""

    def count_input_tokens(self, request: LLMRequest) -> int:
        """The input tokens a call of ``request`` is billed (hidden prompts included), or
        ``ProviderError`` once the retry policy gives up, as a call's failure."""
        ...


def checked_base_url(url: str | None, variable: str, provider: str) -> str | None:
    """``url`` (None: none given, the SDK's default), once it is a URL a client can call: an
    ``http://`` or ``https://`` one with a host. Without its scheme (``127.0.0.1:9/v1``,
    ``localhost:8000``) the SDK took it for a path, or its host for a scheme, and every call
    failed as a connection error: an outage, retried, counted on the model's circuit and fallen
    over from, for a setting no retry fixes. Refused when the provider is built, naming
    ``variable``, as a failure no retry can fix (``invalid_base_url``)."""
    if url is None:
        return None
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme.lower() in ("http", "https") and parsed.hostname:
        return url
    raise ProviderError(
        f"{provider}: {variable} is {url[:200]!r}, not a URL a client can call: give its scheme and host "
        "(https://host/path, or http:// for a local server), or unset it for the provider's own",
        retryable=False,
        code="invalid_base_url",
    )


@runtime_checkable
class StreamingProvider(Protocol):
    """A provider that streams some calls (``stream_above``): ``streams`` tells, before the call,
    whether ``request`` goes as a stream, as the telemetry's ``gen_ai.request.stream`` says of a
    call whatever its end (a call that fails mid-stream streamed too)."""

    def streams(self, request: LLMRequest) -> bool: ...


def unreadable_calls_stop(stop_reason: str | None) -> str:
    """The stop reason of a reply read whole, its usage with it, that held a tool call whose input
    is not a JSON object (the provider leaves the call out: it can never be made). Cut off (at the
    output limit, OpenAI's ``length`` and Converse's ``max_tokens``: the call was cut mid-JSON; or
    at the context window) or refused, it keeps its own; any other is ``malformed_output``, as
    Bedrock's own ``malformed_tool_use`` is (the model wrote JSON that does not parse). Either way
    the turn is no answer (``LLMStep.no_answer``): committed with its usage, so the ledger knows
    what the provider billed, it ends the task as Anthropic's cut or malformed turn does, and none
    of its calls is made. Raised as a ``MalformedReply``, such a reply was retried, each attempt
    billed and its hold counted unknown, and a cut at the output limit, the same every time, failed
    every attempt alike."""
    if stop_reason is not None and (stop_reason in CUT_OFF or stop_reason in (REFUSED, MALFORMED)):
        return stop_reason
    return MALFORMED


BATCH_PRICE_RATIO = Decimal("0.5")  # a batched call costs half the list price
BATCH_WINDOW_SECONDS = 24 * 3600.0  # a batch ends (or expires) within this of its creation


MAX_CALL_VARIABLE = "AGENTQ_MAX_CALL_SECONDS"
DEFAULT_MAX_CALL_SECONDS = 600.0  # the Anthropic SDK's own default timeout


def max_call_seconds() -> float:
    """The longest one attempt of a provider call may take (``AGENTQ_MAX_CALL_SECONDS``).

    Two things are set from it, so that together they hold: the SDK's timeout (the attempt
    cannot complete later) and the deadline of the budget hold the attempt spends (kept counted
    that long even if its worker loses the lease; ``storage/budgets.py``). Raises ValueError
    for a value that is not a number of seconds in (0, 86400).
    """
    raw = os.environ.get(MAX_CALL_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_MAX_CALL_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < 86400:
        raise ValueError(f"{MAX_CALL_VARIABLE}: must be a number of seconds > 0 and < 86400 (got {raw!r})")
    return seconds


@dataclass(frozen=True)
class RetryNotice:
    """One failed attempt of a provider call that will be retried after ``delay`` seconds."""

    attempt: int
    max_attempts: int
    code: str
    message: str
    status_code: int | None
    delay: float
    # The failed attempt was certainly not billed: an HTTP error status before any reply, no
    # connection at all, or one closed before any byte of a reply. False: it may have been (a reply cut midway, a timeout after sending, a
    # 2xx that is not a reply, an error event inside a stream). The engine gives the hold of a
    # call whose every attempt was unbilled back when it learns mid-call that its lease is lost.
    unbilled: bool = False


_listener: ContextVar[Callable[[RetryNotice], None] | None] = ContextVar("agentq_retry_listener", default=None)


@contextlib.contextmanager
def reporting_retries(listener: Callable[[RetryNotice], None]) -> Iterator[None]:
    """Calls ``listener`` before each retry's wait, for provider calls made in this context.

    A context variable rather than a parameter, so the providers' ``complete`` keeps one
    signature whoever listens (the engine records each retry on its task)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def report_retry(notice: RetryNotice) -> None:
    """What a provider calls before waiting to retry."""
    listener = _listener.get()
    if listener is not None:
        listener(notice)


_text_listener: ContextVar[Callable[[str], None] | None] = ContextVar("agentq_text_listener", default=None)


@contextlib.contextmanager
def reporting_text(listener: Callable[[str], None]) -> Iterator[None]:
    """Calls ``listener`` with the text so far of a streamed call made in this context (best
    effort: what a person watching sees; only the committed step is durable)."""
    token = _text_listener.set(listener)
    try:
        yield
    finally:
        _text_listener.reset(token)


def report_text(text: str) -> None:
    """What a streaming provider calls as text arrives."""
    listener = _text_listener.get()
    if listener is not None:
        listener(text)


_usage_listener: ContextVar[Callable[[Usage], None] | None] = ContextVar("agentq_usage_listener", default=None)


@contextlib.contextmanager
def reporting_usage(listener: Callable[[Usage], None]) -> Iterator[None]:
    """Calls ``listener`` with what a streamed call made in this context has billed so far, as
    its stream says: the input at its start (cache reads and writes apart), the output when the
    provider reports it. Known usage even if the call never ends whole (ARCHITECTURE 4: it
    narrows the unknown a lost call leaves)."""
    token = _usage_listener.set(listener)
    try:
        yield
    finally:
        _usage_listener.reset(token)


def report_usage(usage: Usage) -> None:
    """What a streaming provider calls when its stream tells the usage so far."""
    listener = _usage_listener.get()
    if listener is not None:
        listener(usage)


@dataclass(frozen=True)
class Cut:
    """When the call in progress must stop: at ``deadline`` (wall-clock seconds, the task's
    timeout), or as soon as ``now`` is set (the engine gave up waiting for it)."""

    deadline: float
    now: threading.Event


_cut: ContextVar[Cut | None] = ContextVar("agentq_call_cut", default=None)


@contextlib.contextmanager
def cutting_at(cut: Cut) -> Iterator[None]:
    """Provider calls made in this context stop at ``cut``: no attempt starts after it, a retry's
    wait ends with it (``pause``), a stream is closed at its next event (``check_cut``), and an
    HTTP attempt's timeout is no longer than the time left (``time_left``), so its connection is
    closed by the SDK at the deadline. A context variable, as ``reporting_retries``, so every
    provider's ``complete`` keeps one signature. The engine also waits for the call on a thread
    of its own and stops waiting at the deadline (``core.engine._cut``): a provider whose SDK
    cannot be cut mid-read is abandoned, not waited for."""
    token = _cut.set(cut)
    try:
        yield
    finally:
        _cut.reset(token)


def time_left() -> float | None:
    """Seconds until the call in progress must stop (None: no deadline in this context)."""
    cut = _cut.get()
    if cut is None:
        return None
    return 0.0 if cut.now.is_set() else max(0.0, cut.deadline - time.time())


def check_cut() -> None:
    """Raise ``CallCut`` when the call in progress must stop: what a provider calls before each
    attempt and between a stream's events."""
    left = time_left()
    if left is not None and left <= 0:
        raise CallCut("the task's timeout passed before the model answered")


def attempt_timeout(configured: float) -> float | None:
    """The timeout of an HTTP attempt that must end by the cut: the time left, when that is
    shorter than the SDK's ``configured`` one (None: keep the SDK's own)."""
    left = time_left()
    return None if left is None or left >= configured else max(left, 0.001)


def pause(seconds: float) -> None:
    """Wait ``seconds`` (a retry's back-off, the scripted provider's latency), or less when the
    call must stop first: the providers' default ``sleep``."""
    cut = _cut.get()
    if cut is None:
        time.sleep(seconds)
    else:
        cut.now.wait(min(seconds, max(0.0, cut.deadline - time.time())))


STREAM_ABOVE_VARIABLE = "AGENTQ_STREAM_ABOVE_TOKENS"
STREAM_ABOVE_DEFAULT = 8192  # a provider whose stream tells its usage only at the end
STREAM_EVERY_CALL = 0  # a provider whose stream tells the input billed at its start


def stream_above(default: int = STREAM_ABOVE_DEFAULT) -> int:
    """Calls allowed more output tokens than this are streamed (``AGENTQ_STREAM_ABOVE_TOKENS``;
    when unset, ``default``): the connection carries data all along, so no proxy or idle
    timeout cuts a call that writes for minutes, and the text so far reaches ``report_text``.

    A provider whose stream says what is billed as it goes (the Messages API's
    ``message_start`` gives the input, ``message_delta`` the output so far) passes
    ``STREAM_EVERY_CALL``: a worker killed mid-call then leaves only the output since its last
    heartbeat unknown, not the whole hold (ARCHITECTURE 4). OpenAI's and Converse's streams tell
    the usage only at their end, so streaming their short calls would narrow nothing. Raises
    ValueError for a value that is not a whole number >= 0.
    """
    raw = os.environ.get(STREAM_ABOVE_VARIABLE, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{STREAM_ABOVE_VARIABLE}: must be a whole number of tokens >= 0 (got {raw!r})")
    return int(raw)
