"""Real local HTTP servers that speak two more model APIs' wire protocols, for the providers'
tests through the real SDKs over real sockets:

- ``FakeChatCompletions``: OpenAI's ``POST /v1/chat/completions`` as vLLM, Ollama and LiteLLM
  serve it (errors in the ``{"error": {"message", "type", "code"}}`` envelope); a request with
  ``stream: true`` gets its completion as server-sent ``chat.completion.chunk`` events, the
  usage in a last chunk when ``stream_options.include_usage`` asks, then ``data: [DONE]``;
- ``FakeConverse``: Bedrock's ``POST /model/{modelId}/converse`` (restJson1: the model in the
  path, errors named by the ``x-amzn-errortype`` header with ``{"message"}`` bodies, as botocore
  parses them) and ``/converse-stream``, whose reply goes out as ConverseStream events in AWS's
  event-stream binary framing (``event_stream_frame``: prelude, headers, payload, two CRC32s,
  as ``botocore.eventstream`` decodes them).

Replies are queued in order, or made by a ``responder`` when nothing is queued (a model that
plays a plan); every request is recorded. A request with nothing to answer it gets a 400 and is
listed in ``unexpected``. ``FakeReply``'s ``reset`` drops the connection (a proxy gone).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.model_server import Gate, ModelServer

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}{next(_ids):020d}"


@dataclass
class FakeReply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # sent as is (a body that is not JSON)
    reset: bool = False  # drop the connection instead of answering
    cut_at: float | None = None  # send the headers and this share of the body, then drop the connection
    content_type: str = "application/json"
    delay_seconds: float = 0.0  # wait this long before answering (a slow model)
    events: list[bytes] | None = None  # a stream's events, sent chunked (one chunk each) instead of ``raw``
    stream_pause_seconds: float = 0.0  # a stream waits this long halfway through its events
    gate: Gate | None = None  # the reply (a stream: its second half) waits for the test to open it


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    model: str | None
    received_at: float
    connection: int = 0  # which connection it came on: its server numbers each it accepts, from 1


Responder = Callable[[Recorded], FakeReply]
Delivered = Callable[[Recorded, FakeReply], None]


class _ScriptedServer:
    name = "fake-model-server"

    def __init__(self, responder: Responder | None = None, *, on_delivered: Delivered | None = None) -> None:
        self.responder = responder
        self.on_delivered = on_delivered  # told of each 2xx reply once it is written (what a ledger counts)
        self._lock = threading.Lock()
        self._replies: deque[FakeReply] = deque()
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        self._server = ModelServer(_handler(self), self.name)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Any:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def enqueue(self, *replies: FakeReply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def route(self, path: str) -> str | None:
        """The model a request to ``path`` is for, or None when the path is not this API's."""
        raise NotImplementedError

    def answer(self, recorded: Recorded) -> FakeReply:
        with self._lock:
            self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
            if self.responder is None:
                self.unexpected.append(recorded)
                return self.no_reply()
        return self.responder(recorded)

    def no_reply(self) -> FakeReply:
        raise NotImplementedError

    def finish(self, reply: FakeReply, recorded: Recorded) -> FakeReply:
        """A last touch before sending (fill in the model a reply left out)."""
        return reply

    def streamed(self, reply: FakeReply, recorded: Recorded) -> FakeReply:
        """The reply in the API's streaming wire format when the request asked for a stream."""
        return reply


def _handler(api: _ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = urllib.parse.urlsplit(self.path).path
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            model = api.route(path)
            if model is None and not path.endswith("/chat/completions"):
                self._send(FakeReply(404, {"message": f"no route for POST {path}"}))
                return
            recorded = Recorded(
                path,
                headers,
                body,
                model or (body or {}).get("model"),
                time.monotonic(),
                api._server.number(self.connection),
            )
            reply = api.finish(api.answer(recorded), recorded)
            if reply.reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            if reply.delay_seconds:
                time.sleep(reply.delay_seconds)
            sent = api.streamed(reply, recorded) if 200 <= reply.status < 300 else reply
            if reply.gate is not None and sent.events is None and not reply.gate.hold(self.connection):
                self.close_connection = True
                return
            try:
                delivered = self._send(sent)
            except (BrokenPipeError, ConnectionResetError):  # its client went (a worker killed mid-reply)
                self.close_connection = True
                return  # not delivered whole: not counted, as a reply cut at a gate
            if delivered and api.on_delivered is not None and 200 <= reply.status < 300:
                api.on_delivered(recorded, reply)

        def _send(self, reply: FakeReply) -> bool:
            """Send ``reply``; False when its client hung up at its gate before the end."""
            if reply.events is not None:
                return self._send_chunked(reply, reply.events)
            payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", reply.content_type)
            self.send_header("content-length", str(len(payload)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            if reply.cut_at is not None:  # a reply cut in its body: billed, what it said unknown
                self.wfile.write(payload[: int(len(payload) * reply.cut_at)])
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return False
            self.wfile.write(payload)
            return True

        def _send_chunked(self, reply: FakeReply, events: list[bytes]) -> bool:
            """A stream as it arrives from a model: chunked, one event a chunk, flushed each."""
            self.send_response(reply.status)
            self.send_header("content-type", reply.content_type)
            self.send_header("transfer-encoding", "chunked")
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            for n, event in enumerate(events):
                if n == len(events) // 2 and reply.stream_pause_seconds:
                    time.sleep(reply.stream_pause_seconds)
                if n == len(events) // 2 and reply.gate is not None and not reply.gate.hold(self.connection):
                    self.close_connection = True
                    return False
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


# --- Chat Completions -------------------------------------------------------------------------


class FakeChatCompletions(_ScriptedServer):
    """``base_url`` + ``/v1`` is what an OpenAI client is given (``openai_base_url``)."""

    name = "fake-chat-completions"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    def route(self, path: str) -> str | None:
        return None  # the model is in the body

    def no_reply(self) -> FakeReply:
        return chat_error(400, "invalid_request_error", "fake server: no reply queued")

    def finish(self, reply: FakeReply, recorded: Recorded) -> FakeReply:
        if isinstance(reply.body, dict) and reply.body.get("object") == "chat.completion" and not reply.body["model"]:
            reply = dataclasses.replace(reply, body={**reply.body, "model": recorded.model})
        return reply

    def streamed(self, reply: FakeReply, recorded: Recorded) -> FakeReply:
        request = recorded.body if isinstance(recorded.body, dict) else {}
        if not request.get("stream") or not isinstance(reply.body, dict) or reply.raw is not None:
            return reply
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in completion_chunks(reply.body, usage=usage)]
        return dataclasses.replace(
            reply, body=None, events=[*events, b"data: [DONE]\n\n"], content_type="text/event-stream"
        )


def chat_completion(
    text: str | None = None,
    tool_calls: list[tuple[str, dict[str, Any]]] | None = None,
    *,
    finish_reason: str | None = None,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    cached_tokens: int | None = None,
    model: str = "",
    raw_arguments: str | None = None,
    refusal: str | None = None,
) -> FakeReply:
    """A completion as vLLM returns it; ``model`` empty: echo the request's. ``refusal``: the
    model declined, in these words (OpenAI's ``message.refusal``; ``content`` is then null)."""
    calls = [
        {"id": _next_id("call_"), "type": "function",
         "function": {"name": name, "arguments": raw_arguments if raw_arguments is not None else json.dumps(args)}}
        for name, args in tool_calls or []
    ]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if refusal is not None:
        message["refusal"] = refusal
    if calls:
        message["tool_calls"] = calls
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    body = {
        "id": _next_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}
        ],
        "usage": usage,
    }
    return FakeReply(200, body)


def completion_chunks(completion: dict[str, Any], *, usage: bool) -> list[dict[str, Any]]:
    """A completion as the chunks a server streams: the role, the text in three pieces (a refusal's
    in pieces of eight characters), each
    tool call (id and name first, its arguments in two pieces), the finish reason, the usage."""
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}  # fmt: skip
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    third = max(1, len(text) // 3)
    out += [chunk({"content": text[i : i + third]}) for i in range(0, len(text), third)]
    refusal = message.get("refusal") or ""
    out += [chunk({"refusal": refusal[i : i + 8]}) for i in range(0, len(refusal), 8)]
    for n, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        out.append(chunk({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))  # fmt: skip
        for piece in (arguments[:half], arguments[half:]):
            out.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if usage:
        out.append({**head, "choices": [], "usage": completion["usage"]})
    return out


def chat_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> FakeReply:
    return FakeReply(status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, headers or {})


# --- Bedrock Converse -------------------------------------------------------------------------


class FakeConverse(_ScriptedServer):
    """Point boto3 at it with ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME=<base_url>``."""

    name = "fake-converse"

    def route(self, path: str) -> str | None:
        for operation in ("/converse", "/converse-stream"):
            if path.startswith("/model/") and path.endswith(operation):
                return urllib.parse.unquote(path[len("/model/") : -len(operation)])
        return None

    def no_reply(self) -> FakeReply:
        return converse_error(400, "ValidationException", "fake server: no reply queued")

    def streamed(self, reply: FakeReply, recorded: Recorded) -> FakeReply:
        if not recorded.path.endswith("/converse-stream") or reply.raw is not None or not isinstance(reply.body, dict):
            return reply
        frames = [event_stream_frame(kind, event) for kind, event in converse_events(reply.body)]
        return dataclasses.replace(reply, body=None, events=frames, content_type="application/vnd.amazon.eventstream")


def event_stream_frame(kind: str, payload: dict[str, Any], *, message_type: str = "event") -> bytes:
    """One message of AWS's event-stream encoding: a prelude (total length, headers length, the
    CRC32 of those 8 bytes), string headers (name length byte, name, type 7, 2-byte value
    length, value), the JSON payload, and the CRC32 of everything before it."""
    name = ":event-type" if message_type == "event" else ":exception-type"
    headers = {name: kind, ":content-type": "application/json", ":message-type": message_type}
    encoded = b"".join(
        bytes([len(k)]) + k.encode() + b"\x07" + struct.pack(">H", len(v.encode())) + v.encode()
        for k, v in headers.items()
    )
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(encoded) + len(body) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + body
    return message + struct.pack(">I", zlib.crc32(message))


def converse_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Converse reply as the ConverseStream events that carry it: messageStart, per content
    block its start (a tool use's id and name), its deltas (text in three pieces, tool input as
    JSON text in two, reasoning text then signature) and its stop, messageStop, metadata."""
    events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    for i, block in enumerate(reply["output"]["message"]["content"]):
        deltas: list[dict[str, Any]] = []
        if "toolUse" in block:
            use = block["toolUse"]
            events.append(("contentBlockStart", {"contentBlockIndex": i,
                                                 "start": {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}))  # fmt: skip
            text = json.dumps(use["input"])
            deltas = [{"toolUse": {"input": text[: len(text) // 2]}}, {"toolUse": {"input": text[len(text) // 2 :]}}]
        elif "reasoningContent" in block:
            said = block["reasoningContent"]["reasoningText"]
            deltas = [
                {"reasoningContent": {"text": said["text"]}},
                {"reasoningContent": {"signature": said["signature"]}},
            ]
        elif "text" in block:
            third = max(1, len(block["text"]) // 3)
            deltas = [{"text": block["text"][j : j + third]} for j in range(0, len(block["text"]), third)]
        events += [("contentBlockDelta", {"contentBlockIndex": i, "delta": d}) for d in deltas]
        events.append(("contentBlockStop", {"contentBlockIndex": i}))
    events.append(("messageStop", {"stopReason": reply["stopReason"]}))
    events.append(("metadata", {"usage": reply["usage"], "metrics": reply.get("metrics", {"latencyMs": 1})}))
    return events


def converse_stream_exception(code: str, message: str) -> FakeReply:
    """A ConverseStream that starts (200) and then carries an exception event (``throttlingException``...)."""
    return FakeReply(
        200,
        events=[
            event_stream_frame("messageStart", {"role": "assistant"}),
            event_stream_frame(code, {"message": message}, message_type="exception"),
        ],
        content_type="application/vnd.amazon.eventstream",
    )


def converse_reply(
    text: str | None = None,
    tool_uses: list[tuple[str, dict[str, Any]]] | None = None,
    *,
    stop_reason: str | None = None,
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int | None = None,
    cache_write: int | None = None,
    reasoning: tuple[str, str] | None = None,
) -> FakeReply:
    content: list[dict[str, Any]] = []
    if reasoning is not None:
        content.append({"reasoningContent": {"reasoningText": {"text": reasoning[0], "signature": reasoning[1]}}})
    if text:
        content.append({"text": text})
    for name, args in tool_uses or []:
        content.append({"toolUse": {"toolUseId": _next_id("tooluse_"), "name": name, "input": args}})
    usage: dict[str, Any] = {"inputTokens": input_tokens, "outputTokens": output_tokens,
                             "totalTokens": input_tokens + output_tokens}  # fmt: skip
    if cache_read is not None:
        usage["cacheReadInputTokens"] = cache_read
    if cache_write is not None:
        usage["cacheWriteInputTokens"] = cache_write
    body = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
        "usage": usage,
        "metrics": {"latencyMs": 12},
    }
    return FakeReply(200, body, {"x-amzn-requestid": _next_id("req-")})


def converse_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> FakeReply:
    return FakeReply(
        status,
        {"message": message},
        {"x-amzn-errortype": f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/", **(headers or {})},
    )


# --- what the providers' tests share ------------------------------------------------------------

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


class Sleeps(list[float]):
    """A provider's ``sleep``: records the waits of its retries instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def point_boto3_at(server: FakeConverse, setenv: Callable[[str, str], None]) -> None:
    """boto3's ``bedrock-runtime`` at ``server``, with placeholder credentials it signs with
    (``setenv``: a ``monkeypatch.setenv``, so the test undoes it)."""
    setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", server.base_url)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):  # fmt: skip
        setenv(name, value)
