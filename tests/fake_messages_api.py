"""A real local HTTP server that speaks the Anthropic Messages API, for testing providers.

The providers are exercised through the real ``anthropic`` SDK over real sockets, so what is
tested is the wire behaviour (paths, headers, status codes, retry-after) rather than a mock's
idea of it. Replies are scripted in order; every request is recorded for assertions.

Wire formats follow the installed SDK: ``POST /v1/messages`` with the Messages body, and for
Bedrock ``POST /model/{model}/invoke`` whose body is the same minus ``model`` plus
``anthropic_version`` (see ``anthropic/lib/bedrock/_client.py``). Errors use the API's
``{"type": "error", "error": {"type": ..., "message": ...}}`` envelope. Faults a real server or a
proxy in front of it can produce are scripted too: a 200 whose body is not JSON
(``malformed_json``) or JSON of another shape (``wrong_shape``), 401/403/404 answers, and a
connection reset at a chosen point of the reply (``FakeReply.cut_at``): before any byte after a
stall, or after the 200's headers and part of its body (a streamed one: part of its events).
A reply cut in the middle was generated, so a real provider bills it, but the client cannot
know what it used: the server reports it to ``on_cut``, apart from the whole replies
``on_delivered`` hears of. With ``bills_tool_prompt``, a request that offers tools is billed
the hidden tool-use system prompt the API adds to it (``tool_prompt_tokens``), as input.

``POST /v1/messages/count_tokens`` answers what a reply would bill for the request's input:
``count_input(body)`` when given (a test's own billing, a dense one), else the blocks' tokens as
``tests/prompt_cache_server.py`` bills them (``input_tokens``), plus the hidden tool prompt with
``bills_tool_prompt``. Its requests are kept apart (``count_requests``), never take a queued reply,
and the next ``count_failures`` of them answer 500.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import socket
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.model_server import Gate, ModelServer

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}{next(_ids):024d}"


@dataclass
class FakeReply:
    """One scripted HTTP response."""

    status: int
    body: dict[str, Any] | list[Any] | None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as is instead of ``body`` (a body that is not JSON)
    content_type: str = "application/json"  # of a reply sent whole (a stream's is text/event-stream)
    delay_seconds: float = 0.0  # a slow model: the reply is sent this long after the request
    stream_pause_seconds: float = 0.0  # streamed: a pause after each text delta (a model writing slowly)
    # Reset the connection partway: 0 before any byte (after ``delay_seconds``: a stall), a
    # share in (0, 1) after the headers and that share of the body (of a stream: its events,
    # at least the first, which tells the input tokens); None sends the reply whole.
    cut_at: float | None = None
    gate: Gate | None = None  # the reply (streamed: its second half) waits for the test to open it
    # Called just before the first byte is sent (after ``delay_seconds``): a test stops the
    # caller here (SIGSTOP) so its answer is certain to arrive while it is stopped, however
    # slowly the test itself runs.
    before_send: Callable[[], None] | None = None


class StopBeforeAnswer:
    """A reply's ``before_send`` that stops its caller (SIGSTOP) before the answer leaves: the
    answer then waits, unread, in the stopped caller's socket until the test wakes it. Name the
    caller (``caller(pid)``) once it is spawned; ``stopped`` is set when it has been stopped."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._spawned = threading.Event()
        self._pid = 0

    def caller(self, pid: int) -> None:
        self._pid = pid
        self._spawned.set()

    def __call__(self) -> None:
        assert self._spawned.wait(60), "the caller was never named"
        os.kill(self._pid, signal.SIGSTOP)
        self.stopped.set()


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # keys lower-cased
    body: Any  # parsed JSON, or the raw text when it was not JSON
    received_at: float  # time.monotonic()
    model: str | None  # from the body, or from the Bedrock path
    connection: int = 0  # which connection it came on: its server numbers each it accepts, from 1


# --- reply builders -------------------------------------------------------------------------


def usage_dict(
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_creation_input_tokens: int | None = None,
    cache_read_input_tokens: int | None = None,
) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "cache_read_input_tokens": cache_read_input_tokens,
    }


def message_reply(
    content: list[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    model: str | None = None,  # None: echo the model the request named
    usage: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> FakeReply:
    body = {
        "id": _next_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage if usage is not None else usage_dict(),
    }
    return FakeReply(200, body, {"request-id": _next_id("req_"), **(headers or {})})


def text_reply(text: str, **kwargs: Any) -> FakeReply:
    return message_reply([{"type": "text", "text": text}], **kwargs)


def tool_use_reply(
    name: str,
    tool_input: dict[str, Any],
    *,
    tool_use_id: str | None = None,
    text: str | None = None,
    **kwargs: Any,
) -> FakeReply:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    content.append({"type": "tool_use", "id": tool_use_id or _next_id("toolu_"), "name": name, "input": tool_input})
    kwargs.setdefault("stop_reason", "tool_use")
    return message_reply(content, **kwargs)


def error_reply(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> FakeReply:
    body = {"type": "error", "error": {"type": error_type, "message": message}}
    return FakeReply(status, body, {"request-id": _next_id("req_"), **(headers or {})})


def rate_limited(retry_after: float | None = 1, retry_after_ms: float | None = None) -> FakeReply:
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = _num(retry_after)
    if retry_after_ms is not None:
        headers["retry-after-ms"] = _num(retry_after_ms)
    return error_reply(429, "rate_limit_error", "Number of request tokens has exceeded your rate limit.", headers)


def overloaded() -> FakeReply:
    return error_reply(529, "overloaded_error", "Overloaded")


def error_in_stream(error_type: str, message: str, input_tokens: int = 10) -> FakeReply:
    """A 200 event stream that starts a message (``message_start`` tells ``input_tokens`` and one
    output token), then says ``event: error``: how the API reports an error once a stream began,
    an overload most often (every call of the anthropic provider streams)."""
    start = {"type": "message_start", "message": {
        "id": _next_id("msg_"), "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage_dict(input_tokens, 1)}}  # fmt: skip
    error = {"type": "error", "error": {"type": error_type, "message": message}}
    raw = b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        for name, data in (("message_start", start), ("error", error))
    )
    return FakeReply(200, None, raw=raw, content_type="text/event-stream")


def invalid_request(message: str = "messages: at least one message is required") -> FakeReply:
    return error_reply(400, "invalid_request_error", message)


def authentication_error() -> FakeReply:
    return error_reply(401, "authentication_error", "invalid x-api-key")


def permission_denied() -> FakeReply:
    return error_reply(403, "permission_error", "Your API key does not have permission to use the specified resource.")


def model_not_found(model: str) -> FakeReply:
    return error_reply(404, "not_found_error", f"model: {model}")


def malformed_json() -> FakeReply:
    """A 200 whose whole body (its Content-Length) is a prefix of a Message: what a proxy that cut
    a reply and framed what it had would send; it may have been billed."""
    return FakeReply(200, None, {"request-id": _next_id("req_")}, raw=b'{"id": "msg_01", "type": "mess')


def wrong_shape(body: dict[str, Any] | list[Any] | None = None) -> FakeReply:
    """A 200 with valid JSON that is not a Message (an error page a gateway rendered as JSON)."""
    return FakeReply(200, body if body is not None else {"status": "ok", "detail": "upstream busy"})


# The system prompt the API adds, unseen, to every request that offers tools, billed as input
# tokens (docs: "Tool use pricing and tokens", https://docs.anthropic.com/en/docs/tool-use-pricing-and-tokens):
# per model family, for tool_choice auto (or none) and for any/tool. Claude 3.5 Sonnet, 3.7 and
# the Claude 4 family: 346 and 313.
TOOL_PROMPT_TOKENS = {
    "claude-3-opus": (530, 281),
    "claude-3-sonnet": (159, 235),
    "claude-3-haiku": (264, 340),
    "claude-3-5-haiku": (264, 340),
}
TOOL_PROMPT_TOKENS_LATER = (346, 313)


def tool_prompt_tokens(body: Any, model: str | None = None) -> int:
    """The hidden tool-use prompt's tokens the API bills for the request ``body`` to ``model``
    (by default the body's: Bedrock's names it in the path): none without tools, else the
    model's figure for the request's ``tool_choice``."""
    if not (isinstance(body, dict) and body.get("tools")):
        return 0
    model = str(model or body.get("model") or "")
    auto, forced = next((v for k, v in TOOL_PROMPT_TOKENS.items() if k in model), TOOL_PROMPT_TOKENS_LATER)
    choice = (body.get("tool_choice") or {}).get("type", "auto")
    return forced if choice in ("any", "tool") else auto


def tokens(block: Any) -> int:
    """A block's tokens: one per four characters of its JSON (``tests/prompt_cache_server.py``)."""
    return max(1, len(json.dumps(block, sort_keys=True, separators=(",", ":"))) // 4)


def blocks_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's blocks in the order the API renders them (tools, system, messages)."""
    out: list[dict[str, Any]] = [dict(t) for t in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        out.append({"type": "text", "text": system})
    elif isinstance(system, list):
        out += [dict(b) for b in system]
    for message in body.get("messages") or []:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out += [{**b, "_role": message["role"]} for b in content]
    return out


def input_tokens(body: dict[str, Any]) -> int:
    """The input a request's blocks are billed, its cache breakpoints aside: what
    ``CacheAccounting.bill`` splits into read, written and the rest."""
    return sum(tokens({k: v for k, v in b.items() if k != "cache_control"}) for b in blocks_of(body))


def _with_tool_prompt(reply: FakeReply, request: Any, model: str | None) -> FakeReply:
    """``reply`` billed as the API bills ``request``: its input counts the hidden tool prompt."""
    hidden = tool_prompt_tokens(request, model)
    if not (hidden and isinstance(reply.body, dict) and reply.body.get("type") == "message"):
        return reply
    usage = reply.body["usage"]
    body = {**reply.body, "usage": {**usage, "input_tokens": int(usage.get("input_tokens") or 0) + hidden}}
    return dataclasses.replace(reply, body=body)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# --- the server -----------------------------------------------------------------------------


class FakeMessagesAPI:
    """Scripted Messages API on 127.0.0.1; use as a context manager or call start/stop.

    A request that arrives with nothing queued gets a 400 (so the client fails at once rather
    than retrying) and is also listed in ``unexpected`` so a test can tell it apart.
    """

    def __init__(
        self,
        *,
        within_max_tokens: bool = False,
        responder: Callable[[RecordedRequest], FakeReply | None] | None = None,
        on_delivered: Callable[[RecordedRequest, dict[str, Any]], None] | None = None,
        on_cut: Callable[[RecordedRequest, dict[str, Any]], None] | None = None,
        batch_seconds: float = 0.2,
        bills_tool_prompt: bool = False,
        count_input: Callable[[dict[str, Any]], int] | None = None,
    ) -> None:
        # Bill no more output than the request's max_tokens, as the real API; off by default so
        # a test can script any usage it wants the client to see.
        self.within_max_tokens = within_max_tokens
        # Bill a request that offers tools the hidden tool-use system prompt, as the real API
        # does (``tool_prompt_tokens``); off by default, since the tests' scripted usages are
        # the exact figures they assert.
        self.bills_tool_prompt = bills_tool_prompt
        # count_tokens: the input a request's reply would bill (``input_tokens`` by default);
        # its requests, and how many of the next ones fail with a 500.
        self.count_input = count_input or input_tokens
        self.count_requests: list[RecordedRequest] = []
        self.count_failures = 0
        # Answers a request when nothing is queued (a model that plays a plan, bench/chaos.py);
        # None from it resets the connection, as a dropped proxy would.
        self.responder = responder
        self.on_delivered = on_delivered  # told of every message reply sent, with its usage
        self.on_cut = on_cut  # told of every message reply cut after its headers, with its usage
        self._lock = threading.Lock()
        self._replies: deque[FakeReply] = deque()
        self.requests: list[RecordedRequest] = []
        self.delivered_usage: list[dict[str, Any]] = []  # the usage of every message reply sent
        self.unexpected: list[RecordedRequest] = []
        # Message Batches: each batch's requests are answered when it is created (by the queue or
        # the responder, as /v1/messages would be) and reported ended ``batch_seconds`` later.
        self.batch_seconds = batch_seconds
        self.batches: dict[str, dict[str, Any]] = {}
        self.batch_read_failures = 0  # the next so many reads of a batch (its state or results) answer 500
        # The next so many batch creations make their batch (its answer billed), then their reply
        # is cut after the headers and half the body: the client cannot know the batch exists.
        self.batch_create_cuts = 0
        self.batch_create_overloads = 0  # the next so many batch creations answer 529 and make nothing
        self._server = ModelServer(_make_handler(self), "fake-messages-api")

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeMessagesAPI:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakeMessagesAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def enqueue(self, *replies: FakeReply) -> None:
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._replies)

    def _take(self, recorded: RecordedRequest) -> FakeReply | None:
        with self._lock:
            if self.responder is None:
                self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
            if self.responder is None:
                self.unexpected.append(recorded)
                return None
        return self.responder(recorded) or RESET


RESET = FakeReply(0, None)  # not sent: the connection is reset instead


def _within_max_tokens(reply: FakeReply, request: Any) -> FakeReply:
    """Like the real API, never answer (or bill) more output tokens than the request allowed."""
    if not (isinstance(reply.body, dict) and reply.body.get("type") == "message" and isinstance(request, dict)):
        return reply
    limit = request.get("max_tokens")
    usage = reply.body["usage"]
    if not isinstance(limit, int) or usage.get("output_tokens", 0) <= limit:
        return reply
    body = {**reply.body, "usage": {**usage, "output_tokens": limit}, "stop_reason": "max_tokens"}
    return dataclasses.replace(reply, body=body)


def native_compaction(reply: FakeReply, request: Any) -> FakeReply:
    """Anthropic's server-side compaction (``compact_20260112``, beta ``compact-2026-01-12``) as
    the SDK documents it: when the live context (from the latest compaction block on) reaches
    the trigger, the reply opens with a ``compaction`` block summarising it, and the usage of
    that summarising call is reported in ``usage.iterations``, not in the top-level fields."""
    if not (isinstance(request, dict) and isinstance(reply.body, dict) and reply.body.get("type") == "message"):
        return reply
    edits = (request.get("context_management") or {}).get("edits") or []
    edit = next((e for e in edits if e.get("type") == "compact_20260112"), None)
    if edit is None:
        return reply
    trigger = int((edit.get("trigger") or {}).get("value", 150_000))
    messages = request.get("messages") or []
    start = 0
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list) and any(b.get("type") == "compaction" for b in content):
            start = i
    live = len(json.dumps(messages[start:])) // 4
    if live < trigger:
        return reply
    summary = f"Compacted summary of {len(messages) - start} messages."
    usage = dict(reply.body["usage"])
    iterations = [
        {"type": "compaction", "input_tokens": live, "output_tokens": len(summary) // 4 + 1,
         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        {"type": "message", "input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
         "cache_creation_input_tokens": usage.get("cache_creation_input_tokens") or 0,
         "cache_read_input_tokens": usage.get("cache_read_input_tokens") or 0},
    ]  # fmt: skip
    block = {"type": "compaction", "content": summary, "encrypted_content": f"enc:{start}:{len(messages)}"}
    body = {**reply.body, "content": [block, *reply.body["content"]], "usage": {**usage, "iterations": iterations}}
    return dataclasses.replace(reply, body=body)


def _batch_ended(api: FakeMessagesAPI, batch: dict[str, Any]) -> bool:
    return bool(time.time() >= batch["created"] + api.batch_seconds)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _batch_view(api: FakeMessagesAPI, batch: dict[str, Any]) -> dict[str, Any]:
    """A MessageBatch as the API returns it."""
    ended = _batch_ended(api, batch)
    results = batch["results"]
    counts = {"processing": 0 if ended else len(results), "canceled": 0, "expired": 0,
              "succeeded": sum(r["result"]["type"] == "succeeded" for r in results) if ended else 0,
              "errored": sum(r["result"]["type"] == "errored" for r in results) if ended else 0}  # fmt: skip
    return {
        "id": batch["id"], "type": "message_batch",
        "processing_status": "ended" if ended else "in_progress",
        "request_counts": counts,
        "created_at": _iso(batch["created"]), "expires_at": _iso(batch["created"] + 86400),
        "ended_at": _iso(batch["created"] + api.batch_seconds) if ended else None,
        "cancel_initiated_at": None, "archived_at": None,
        "results_url": f"{api.base_url}/v1/messages/batches/{batch['id']}/results" if ended else None,
    }  # fmt: skip


def _make_handler(api: FakeMessagesAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects of a real server
        disable_nagle_algorithm = True  # headers and body go out in two writes: avoid 40 ms stalls

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = urllib.parse.urlsplit(self.path).path
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")

            if path == "/v1/messages/batches":
                self._create_batch(body)
                return
            if path == "/v1/messages/count_tokens":
                self._count(body)
                return
            model: str | None = None
            if path == "/v1/messages":
                model = body.get("model") if isinstance(body, dict) else None
            elif path.startswith("/model/") and path.endswith("/invoke"):
                model = urllib.parse.unquote(path[len("/model/") : -len("/invoke")])
            else:
                self._send(error_reply(404, "not_found_error", f"no route for POST {path}"))
                return

            recorded = RecordedRequest(
                method="POST",
                path=path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                received_at=time.monotonic(),
                model=model,
                connection=api._server.number(self.connection),
            )
            reply = api._take(recorded)
            if reply is RESET:
                self._reset()
                return
            if reply is None:
                reply = invalid_request(f"fake server: no reply queued for POST {path}")
            elif isinstance(reply.body, dict) and reply.body.get("type") == "message" and reply.body["model"] is None:
                reply = dataclasses.replace(reply, body={**reply.body, "model": model})
            if api.within_max_tokens:
                reply = _within_max_tokens(reply, body)
            if api.bills_tool_prompt:
                reply = _with_tool_prompt(reply, body, model)
            reply = native_compaction(reply, body)
            if reply.delay_seconds:
                time.sleep(reply.delay_seconds)
            if reply.before_send is not None:
                reply.before_send()
            if reply.cut_at is not None and reply.cut_at <= 0:
                self._reset()  # a stall, then nothing: not a byte of a reply was sent
                return
            streamed = isinstance(body, dict) and body.get("stream") is True
            message = reply.status == 200 and isinstance(reply.body, dict) and reply.body.get("type") == "message"
            try:
                if streamed and message:
                    if not self._send_stream(reply):
                        return
                elif reply.gate is not None and not reply.gate.hold(self.connection):
                    self.close_connection = True  # its client hung up: nothing sent, nothing delivered
                    return
                else:
                    self._send(reply)
            except (BrokenPipeError, ConnectionResetError):  # its client went (a worker killed mid-reply)
                self.close_connection = True
                return  # not delivered whole: not counted, as a reply cut at a gate
            if reply.cut_at is not None:
                if message and api.on_cut is not None:
                    assert isinstance(reply.body, dict)
                    api.on_cut(recorded, reply.body["usage"])
                return
            if message:
                assert isinstance(reply.body, dict)
                with api._lock:
                    api.delivered_usage.append(reply.body["usage"])
                if api.on_delivered is not None:
                    api.on_delivered(recorded, reply.body["usage"])

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            parts = path.strip("/").split("/")  # v1 messages batches <id> [results]
            batch = (
                api.batches.get(parts[3]) if len(parts) >= 4 and parts[:3] == ["v1", "messages", "batches"] else None
            )
            failing = False
            with api._lock:
                if batch is not None and api.batch_read_failures > 0:
                    api.batch_read_failures -= 1
                    failing = True
            if batch is None:
                self._send(error_reply(404, "not_found_error", f"no route for GET {path}"))
            elif failing:  # an outage while the batch is read
                self._send(error_reply(500, "api_error", "fake server: internal error"))
            elif len(parts) == 4:
                self._send(FakeReply(200, _batch_view(api, batch)))
            elif not _batch_ended(api, batch):
                self._send(error_reply(400, "invalid_request_error", "the batch has not ended yet"))
            else:
                lines = "".join(json.dumps(r) + "\n" for r in batch["results"]).encode()
                self._send(FakeReply(200, None, raw=lines))

        def _count(self, body: Any) -> None:
            """The input the request ``body`` would be billed, as ``/v1/messages`` bills it."""
            recorded = RecordedRequest(
                method="POST", path="/v1/messages/count_tokens", headers={k.lower(): v for k, v in self.headers.items()},
                body=body, received_at=time.monotonic(), model=body.get("model") if isinstance(body, dict) else None,
            )  # fmt: skip
            with api._lock:
                api.count_requests.append(recorded)
                failing = api.count_failures > 0
                api.count_failures -= failing
            if failing:
                self._send(error_reply(500, "api_error", "fake server: internal error"))
            elif not isinstance(body, dict) or not body.get("messages") or "max_tokens" in body:
                self._send(invalid_request("count_tokens: messages are required; max_tokens is not a field"))
            else:
                counted = api.count_input(body) + (tool_prompt_tokens(body) if api.bills_tool_prompt else 0)
                self._send(FakeReply(200, {"input_tokens": counted}))

        def _create_batch(self, body: Any) -> None:
            with api._lock:
                overloaded_now = api.batch_create_overloads > 0
                api.batch_create_overloads -= overloaded_now
            if overloaded_now:
                self._send(overloaded())
                return
            requests = body.get("requests") if isinstance(body, dict) else None
            if not isinstance(requests, list) or not requests:
                self._send(invalid_request("requests: at least one request is required"))
                return
            results = []
            for item in requests:
                params = item.get("params") or {}
                recorded = RecordedRequest(
                    method="POST", path="/v1/messages", headers={k.lower(): v for k, v in self.headers.items()},
                    body=params, received_at=time.monotonic(), model=params.get("model"),
                )  # fmt: skip
                reply = api._take(recorded)
                if reply is not None and reply is not RESET and api.within_max_tokens:
                    reply = _within_max_tokens(reply, params)
                if reply is not None and reply is not RESET and api.bills_tool_prompt:
                    reply = _with_tool_prompt(reply, params, params.get("model"))
                if reply is not None and reply.status == 200 and isinstance(reply.body, dict):
                    message = {**reply.body, "model": reply.body.get("model") or params.get("model")}
                    results.append(
                        {"custom_id": item["custom_id"], "result": {"type": "succeeded", "message": message}}
                    )
                    with api._lock:
                        api.delivered_usage.append(message["usage"])
                    if api.on_delivered is not None:
                        api.on_delivered(recorded, message["usage"])
                else:
                    error = reply.body if reply is not None and isinstance(reply.body, dict) else {
                        "type": "error", "error": {"type": "api_error", "message": "the request failed"}}  # fmt: skip
                    results.append({"custom_id": item["custom_id"], "result": {"type": "errored", "error": error}})
            batch_id = _next_id("msgbatch")
            batch: dict[str, Any] = {"id": batch_id, "created": time.time(), "results": results}
            with api._lock:
                api.batches[batch_id] = batch
                cut = api.batch_create_cuts > 0
                api.batch_create_cuts -= cut
            self._send(FakeReply(200, _batch_view(api, batch), cut_at=0.5 if cut else None))

        def _reset(self) -> None:
            """Drop the connection: SO_LINGER 0 makes the close an RST, what a client sees of a
            proxy or a server gone."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

        def _cut(self) -> None:
            """What was written (the headers and part of the body) reaches the client, then the
            reset: a short pause lets the client read it first, as from a proxy that died."""
            self.wfile.flush()
            time.sleep(0.05)
            self._reset()

        def _send(self, reply: FakeReply) -> None:
            payload = (
                reply.raw if reply.raw is not None else b"" if reply.body is None else json.dumps(reply.body).encode()
            )
            self.send_response(reply.status)
            self.send_header("content-type", reply.content_type)
            self.send_header("content-length", str(len(payload)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            if reply.cut_at is not None:
                part = payload[: max(1, min(len(payload) - 1, int(len(payload) * reply.cut_at)))]
                self.wfile.write(part)
                self._cut()
                return
            self.wfile.write(payload)

        def _send_stream(self, reply: FakeReply) -> bool:
            """The reply as the API streams it (server-sent events), text in a few deltas; False
            when its client hung up at its gate (halfway)."""
            message: dict[str, Any] = dict(reply.body) if isinstance(reply.body, dict) else {}
            usage = message["usage"]
            events: list[tuple[str, dict[str, Any]]] = [
                ("message_start", {"type": "message_start", "message": {
                    **message, "content": [], "stop_reason": None,
                    "usage": {**usage, "output_tokens": 1}}}),
            ]  # fmt: skip
            for i, block in enumerate(message["content"]):
                kind = block.get("type")
                start = {"type": "text", "text": ""} if kind == "text" else (
                    {**block, "input": {}} if kind == "tool_use" else
                    {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else block)  # fmt: skip
                events.append(
                    ("content_block_start", {"type": "content_block_start", "index": i, "content_block": start})
                )
                if kind == "text":
                    text = block["text"]
                    for j in range(0, len(text), max(1, len(text) // 3)):
                        delta = {"type": "text_delta", "text": text[j : j + max(1, len(text) // 3)]}
                        events.append(
                            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
                        )
                elif kind == "tool_use":
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
                elif kind == "thinking":
                    for delta in ({"type": "thinking_delta", "thinking": block["thinking"]},
                                  {"type": "signature_delta", "signature": block["signature"]}):  # fmt: skip
                        events.append(
                            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
                        )
                events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
            events.append(("message_delta", {"type": "message_delta", "usage": {"output_tokens": usage["output_tokens"]},
                                             "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}))  # fmt: skip
            events.append(("message_stop", {"type": "message_stop"}))
            chunks = [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            if reply.stream_pause_seconds:  # written as it goes: no length, the connection ends the body
                self.send_header("connection", "close")
                self.close_connection = True
            else:
                self.send_header("content-length", str(sum(len(c) for c in chunks)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            if reply.cut_at is not None:  # the first events, then the reset
                part = b"".join(chunks[: max(1, min(len(chunks) - 1, int(len(chunks) * reply.cut_at)))])
                self.wfile.write(part)
                self._cut()
                return True
            for n, ((_name, data), chunk) in enumerate(zip(events, chunks, strict=True)):
                if n == len(chunks) // 2 and reply.gate is not None:
                    self.wfile.flush()
                    if not reply.gate.hold(self.connection):
                        self.close_connection = True
                        return False
                self.wfile.write(chunk)
                if reply.stream_pause_seconds and data.get("delta", {}).get("type") == "text_delta":
                    self.wfile.flush()
                    time.sleep(reply.stream_pause_seconds)
            return True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest output clean

    return Handler


def anthropic_env(server: FakeMessagesAPI, key: str = "test-key") -> dict[str, str]:
    """The variables that point the Anthropic SDK, and so agentq's anthropic provider, at
    ``server`` with a key (the fake reads none): for a worker's environment."""
    return {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": key}


def point_anthropic_at(server: FakeMessagesAPI, setenv: Callable[[str, str], None], key: str = "test-key") -> None:
    """``anthropic_env`` in this process (``setenv``: a ``monkeypatch.setenv``, so the test undoes it)."""
    for name, value in anthropic_env(server, key).items():
        setenv(name, value)
