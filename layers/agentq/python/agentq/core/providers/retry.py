"""Bounded, counted retries for every provider's calls (Anthropic, Bedrock, OpenAI-compatible).

Each SDK's own retry loop is switched off (``max_retries=0``; botocore: one attempt) and replaced by this one so that
every provider retries the same way, the number of calls a step cost is known and stored on
the step, and the failure that finally escapes says whether the queue should try again later
(overload, rate limit, network) or give up on the task (a request the API will never accept),
under a code that names it (``FAILURE_CODES``). A reply that is not a Message (not JSON, or
JSON of another shape, or one giving two calls one tool_use id: ``distinct_tool_uses``) is retried
like an overload, but once the attempts are spent the task fails: a server that keeps answering
garbage will not be fixed by the queue's retries.

Each retry is reported before its wait (``base.report_retry``): the engine records it on the
task, so status, watch and the trace show the attempt, the error and the next try. Their words
are an ``excerpt`` of what the server said, never a whole body (an HTML page is its title).
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentq.core.errors import ProviderError
from agentq.core.models import repeated_tool_use_id
from agentq.core.providers.base import RetryNotice, check_cut, pause, report_retry
from agentq.observe.redaction import redact

T = TypeVar("T")

RETRY_VARIABLE = "AGENTQ_PROVIDER_RETRY"

# 408 and 409 go beyond the usual 429/529/5xx, but the API uses them for request and lock
# timeouts, which clear up by themselves; the SDK's own policy retries them too.
RETRYABLE_4XX = frozenset({408, 409, 429})

# error.code of a provider failure, by HTTP status: what a caller reads on the failed task.
FAILURE_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "model_not_found",  # the Messages endpoint exists: the model named is what is not found
    408: "provider_timeout",  # a request timeout (a LiteLLM proxy's: the upstream call it forwarded)
    413: "request_too_large",
    429: "rate_limited",
    529: "overloaded",
}
MALFORMED = "malformed_response"
EXCERPT_CHARS = 200  # the most of a server's own words an error message carries
_PAGE = re.compile(r"<\s*(?:!doctype|html|head|body|title)\b", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>|<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


class MalformedReply(Exception):
    """The provider answered 2xx with something that is not a Message.

    ``whole``: it is a page read whole (``providers/pages.py``: markup, read to the end its
    framing declared), everything the server sent, and no reply began: nothing billed can be
    charged to it and the call's hold goes back (ARCHITECTURE 4). Anything else that is not a
    reply may be part of one (a body cut short, JSON of another shape): not ``whole``."""

    def __init__(self, message: str, *, whole: bool = False) -> None:
        super().__init__(message)
        self.whole = whole


def distinct_tool_uses(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``content``, whose tool_use ids are each a call's own; ``MalformedReply`` when two calls
    share one (``models.repeated_tool_use_id``: they would share one policy verdict). The
    Anthropic, OpenAI and Bedrock APIs make the ids themselves; a gateway or an OpenAI-compatible
    server that passes the model's own through may repeat one, and is answered as any reply of
    the wrong shape is."""
    repeated = repeated_tool_use_id(content)
    if repeated is not None:
        raise MalformedReply(f"tool_use id {repeated[:64]!r} is given to more than one call of the reply")
    return content


def failure_code(status_code: int | None) -> str:
    if status_code is None:
        return "provider_unreachable"
    if status_code in FAILURE_CODES:
        return FAILURE_CODES[status_code]
    return "provider_server_error" if status_code >= 500 else "provider_rejected"


class RetryPolicy(BaseModel):
    """How long a provider call may keep trying before the failure is handed to the queue.

    Five attempts with full jitter spreads a fleet of workers that all hit the same 529 burst
    instead of letting them retry in lock-step; ``max_delay`` also caps a server's
    ``retry-after`` so one answer cannot park a Lambda for most of its time limit.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=5, ge=1, le=100)
    base_delay: float = Field(default=0.5, ge=0)
    max_delay: float = Field(default=30.0, ge=0)
    jitter: Literal["full", "none"] = "full"

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """``AGENTQ_PROVIDER_RETRY`` (JSON of these fields) or the defaults; ValueError naming the
        variable and what is wrong with it (``runtime.check_provider_retry`` refuses it at startup,
        before every task fails at its first model call with pydantic's words for it)."""
        raw = os.environ.get(RETRY_VARIABLE, "").strip()
        if not raw:
            return cls()
        fields = ", ".join(cls.model_fields)
        try:
            return cls.model_validate(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{RETRY_VARIABLE}: not JSON ({exc.msg} at char {exc.pos}); a JSON object of "
                             f"{fields}") from None  # fmt: skip
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the value"
            raise ValueError(f"{RETRY_VARIABLE}: {where}: {first['msg']} (a JSON object of {fields})") from None

    @model_validator(mode="after")
    def _base_within_max(self) -> RetryPolicy:
        if self.base_delay > self.max_delay:
            raise ValueError("base_delay must not exceed max_delay")
        return self


def backoff_delay(policy: RetryPolicy, retry_number: int, rng: random.Random | None = None) -> float:
    """Delay before retry ``retry_number`` (0 for the first retry) when the server gave no hint.

    Full jitter (uniform over the whole window) rather than "base plus a little" because the
    point is to de-correlate many clients, and AWS's measurements show it does that best.
    """
    ceiling = min(policy.max_delay, policy.base_delay * (2.0 ** min(retry_number, 64)))
    if policy.jitter == "none":
        return ceiling
    return (rng or _default_rng).uniform(0.0, ceiling)


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: Callable[[], float] = time.time) -> float | None:
    """The server's own wait hint, or ``None`` when it gave none we can read.

    The server knows when capacity comes back better than any backoff formula, so its hint
    wins. ``retry-after-ms`` is the API's more precise variant and is preferred; ``retry-after``
    may be seconds (integer or, tolerated, float) or an HTTP date.
    """
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return max(0.0, email.utils.mktime_tz(parsed) - now())


def is_retryable_status(status_code: int) -> bool:
    """Whether the same request may succeed later; 4xx other than timeouts and rate limits
    mean the request itself is wrong (or unauthorised) and repeating it only burns quota."""
    return status_code >= 500 or status_code in RETRYABLE_4XX


@dataclass(frozen=True)
class CallFailure:
    """One failed attempt as any SDK reports it, in the terms the retry loop decides on.

    ``kind``: ``status`` (the server answered with an error status), ``timeout``,
    ``connection`` (no answer at all), or ``malformed`` (a 2xx that is not a reply). Each
    provider module supplies a ``Classifier`` that turns its SDK's exceptions into one, so the
    Anthropic SDK, the OpenAI SDK and botocore are retried, coded and worded alike."""

    kind: Literal["status", "timeout", "connection", "malformed"]
    status_code: int | None = None
    error_type: str | None = None  # the server's own name for the error (rate_limit_error, ThrottlingException)
    detail: str = ""  # the server's own words
    headers: Mapping[str, str] | None = None  # for retry-after
    # Certainly not billed (see ``RetryNotice.unbilled``): the classifier says so only when it
    # knows, an error status of the HTTP response itself or a connection never made (or closed
    # before any byte of a reply); the loop, for a page read whole (``MalformedReply.whole``).
    unbilled: bool = False


Classifier = Callable[[Exception], "CallFailure | None"]


# A front's answers about a call it had sent on (a proxy, a load balancer, Cloudflare, a LiteLLM
# proxy, in front of the API or an OpenAI-compatible server): the model behind it may have run, and
# billed, before the front gave up on it. 502 and 504, a gateway's bad or late answer from its
# upstream; Cloudflare's 520 (the origin's answer was empty or unreadable) and 524 (the origin took
# the request and did not answer within Cloudflare's timeout, 100 s by default); 408, LiteLLM's for
# the upstream call it forwarded that timed out (a server's own 408 says it did not get the whole
# request in time: nothing ran, but a status cannot tell the two apart, so it counts as possibly
# billed). Cloudflare's 521, 522, 523, 525 and 526 (refused, no connection, no route, TLS failed)
# say the origin was never reached: those stay unbilled.
POSSIBLY_BILLED_STATUSES = frozenset({408, 502, 504, 520, 524})


def error_status_answered(http_status: object) -> bool:
    """The HTTP response itself carried an error status, so no reply was generated and nothing
    billed (an error event inside a 200's stream is not this: its response says 200; nor is a
    front's answer about a call it had sent on, ``POSSIBLY_BILLED_STATUSES``, behind which the
    model may have run)."""
    return isinstance(http_status, int) and http_status >= 400 and http_status not in POSSIBLY_BILLED_STATUSES


NO_REPLY = "Server disconnected without sending a response"  # httpcore's words for a reset before any byte


def no_reply_began(exc: BaseException) -> bool:
    """An SDK's connection error from which no reply can have been billed: no connection made
    (refused, unresolvable, or timed out connecting: the request never left), or a connection
    closed before any byte of a reply (ARCHITECTURE 4: an answer starts with its status line;
    none came). Read off the cause chain by the HTTP library's own class names and words
    (``ConnectError``/``ConnectTimeout``, and ``RemoteProtocolError`` saying the server sent
    no response, of httpx or of ``httpx2``, the package the pinned anthropic and openai SDKs
    use), so whichever the SDK imports is recognised. Any other cause (a reset after the
    headers, a read timeout: a reply may have been under way) is not known unbilled."""
    cause: BaseException | None = exc.__cause__
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        kind = type(cause)
        ours = kind.__module__.split(".")[0].startswith(("httpx", "httpcore"))
        if ours and kind.__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        if ours and kind.__name__ == "RemoteProtocolError" and str(cause).startswith(NO_REPLY):
            return True
        cause = cause.__cause__
    return False


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = pause,
    *,
    rng: random.Random | None = None,
    label: str = "anthropic",
    classify: Classifier | None = None,
) -> tuple[T, int]:
    """Run ``fn`` until it succeeds or the policy's attempts are spent; return (result, attempts).

    Every failure leaves as ``ProviderError`` so callers handle one type: ``retryable=True``
    when the queue should redeliver later, ``False`` when the task should fail now. ``fn`` raises
    ``MalformedReply`` (or a JSON error) for a reply that is not a Message; ``classify`` reads
    the SDK's own exceptions (an exception it does not know goes through unchanged). ``sleep``
    and ``rng`` are injectable so tests can prove the waits without waiting.

    Under a cut (``base.cutting_at``: the task's timeout) no attempt starts after it and a failure
    that comes with it is no retry: ``CallCut`` leaves instead, unreported.
    """
    last: CallFailure | None = None
    last_exc: Exception | None = None
    for attempt in range(1, policy.max_attempts + 1):
        hint: float | None = None
        check_cut()
        try:
            return fn(), attempt
        except MalformedReply as exc:  # a 2xx that is not a Message: maybe a proxy's hiccup; bounded below
            said = redact(str(exc))[:200] or type(exc).__name__
            last, last_exc = CallFailure("malformed", detail=said, unbilled=exc.whole), exc
        except json.JSONDecodeError as exc:
            last, last_exc = CallFailure("malformed", detail=f"not JSON ({exc.msg} at char {exc.pos})"), exc
        except Exception as exc:
            failure = classify(exc) if classify is not None else None
            if failure is None:
                raise
            if failure.kind == "status" and failure.status_code is not None:
                if not is_retryable_status(failure.status_code):
                    raise ProviderError(
                        f"{label} rejected the request ({_status_label(failure)}): {excerpt(failure.detail)}",
                        retryable=False,
                        status_code=failure.status_code,
                        attempts=attempt,
                        code=failure_code(failure.status_code),
                        maybe_billed=not failure.unbilled,  # an error inside a stream that had begun
                    ) from exc
                hint = retry_after_seconds(failure.headers)
            last, last_exc = failure, exc
        check_cut()  # the attempt failed because it was cut (an SDK timeout at the deadline): no retry
        if attempt == policy.max_attempts:
            break
        delay = min(hint, policy.max_delay) if hint is not None else backoff_delay(policy, attempt - 1, rng)
        report_retry(
            RetryNotice(
                attempt,
                policy.max_attempts,
                _code_of(last),
                _said(*_what(label, last)),
                last.status_code,
                delay,
                unbilled=last.unbilled,
            )
        )
        sleep(delay)

    assert last is not None  # the loop only falls through after a caught failure
    kind, detail = _what(label, last)
    raise ProviderError(
        _said(f"{kind} after {policy.max_attempts} attempts", detail),
        retryable=_code_of(last) != MALFORMED,
        status_code=last.status_code,
        attempts=policy.max_attempts,
        code=_code_of(last),
        retry_after=hint,
        maybe_billed=not last.unbilled,
    ) from last_exc


def excerpt(detail: str) -> str:
    """The server's words as an error message carries them, never a whole body: an HTML page (a
    proxy's, a load balancer's, the local stack's moto answering for a service it lacks) by its
    size and title, any text cut to ``EXCERPT_CHARS``, whitespace collapsed. A body that is not
    the API's error is no explanation, and a page of it printed at every retry hid the one that
    was (issue 39: a Converse call to moto printed its 500 page 25 times). Redacted first, whole
    (``observe.redaction.redact``: a cut could leave part of a value the redactor no longer
    finds): a server that echoes the provider's key (``keys.keep_out_of_text``) or a credential
    a run opened has it redacted from the task's error, its events and its trace."""
    detail = redact(detail)
    page = _PAGE.search(detail)
    if page is not None:
        html = detail[page.start() :]
        found = _TITLE.search(html)
        title = " ".join(_TAG.sub(" ", (found.group(1) or found.group(2) or "") if found else html).split())
        said = f"an HTML page of {len(html.encode())} bytes, not the API's error"
        before = detail[: page.start()].strip()  # an SDK's own words first ("Error code: 500 - ")
        detail = f"{before} {said}" if before else said
        detail += f": {title[:120]}" if title else ""
    text = " ".join(detail.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _code_of(failure: CallFailure) -> str:
    if failure.kind == "status":
        return failure_code(failure.status_code)
    if failure.kind == "timeout":
        return "provider_timeout"
    if failure.kind == "connection":
        return "provider_unreachable"
    return MALFORMED


def _what(label: str, failure: CallFailure) -> tuple[str, str | None]:
    """(``<label> <what happened>``, an excerpt of the server's own words if it gave any)."""
    if failure.kind == "timeout":
        return f"{label} request timed out", excerpt(failure.detail) or None
    if failure.kind == "connection":
        return f"{label} connection failed", excerpt(failure.detail) or None
    if failure.kind == "status":
        return f"{label} {_status_words(failure.status_code)}", excerpt(failure.detail) or None
    if failure.detail.startswith("not JSON ("):
        return f"{label} returned a reply that is {failure.detail}", None
    return f"{label} returned a reply that is not a Message ({redact(failure.detail)})", None


def _status_words(code: int | None) -> str:
    """What a retried status says, in the words of its code (``failure_code``)."""
    words = {408: "request timed out", 429: "rate limited", 529: "overloaded"}
    if code in words:
        return f"{words[code]} ({code})"
    return f"server error ({code})" if code is None or code >= 500 else f"rejected the request ({code})"


def _said(kind: str, detail: str | None) -> str:
    return f"{kind}: {detail}" if detail else kind


_default_rng = random.Random()


def _status_label(failure: CallFailure) -> str:
    return f"{failure.status_code} {failure.error_type}" if failure.error_type else str(failure.status_code)
