"""Real local HTTP servers that speak two more model APIs' wire protocols, for the providers'
tests through the real SDKs over real sockets:

- ``FakeChatCompletions``: OpenAI's ``POST /v1/chat/completions`` as vLLM, Ollama and LiteLLM
  serve it (errors in the ``{"error": {"message", "type", "code"}}`` envelope; streaming not
  needed: the provider never asks for it);
- ``FakeConverse``: Bedrock's ``POST /model/{modelId}/converse`` (restJson1: the model in the
  path, errors named by the ``x-amzn-errortype`` header with ``{"message"}`` bodies, as botocore
  parses them).

Replies are queued in order, or made by a ``responder`` when nothing is queued (a model that
plays a plan); every request is recorded. A request with nothing to answer it gets a 400 and is
listed in ``unexpected``. ``FakeReply``'s ``reset`` drops the connection (a proxy gone).
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any
    model: str | None
    received_at: float


Responder = Callable[[Recorded], FakeReply]


class _ScriptedServer:
    name = "fake-model-server"

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder = responder
        self._lock = threading.Lock()
        self._replies: deque[FakeReply] = deque()
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name=self.name, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

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
            recorded = Recorded(path, headers, body, model or (body or {}).get("model"), time.monotonic())
            reply = api.finish(api.answer(recorded), recorded)
            if reply.reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            self._send(reply)

        def _send(self, reply: FakeReply) -> None:
            payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

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
            reply = FakeReply(reply.status, {**reply.body, "model": recorded.model}, reply.headers)
        return reply


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
) -> FakeReply:
    """A completion as vLLM returns it; ``model`` empty: echo the request's."""
    calls = [
        {"id": _next_id("call_"), "type": "function",
         "function": {"name": name, "arguments": raw_arguments if raw_arguments is not None else json.dumps(args)}}
        for name, args in tool_calls or []
    ]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text}
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


def chat_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> FakeReply:
    return FakeReply(status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, headers or {})


# --- Bedrock Converse -------------------------------------------------------------------------


class FakeConverse(_ScriptedServer):
    """Point boto3 at it with ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME=<base_url>``."""

    name = "fake-converse"

    def route(self, path: str) -> str | None:
        if path.startswith("/model/") and path.endswith("/converse"):
            return urllib.parse.unquote(path[len("/model/") : -len("/converse")])
        return None

    def no_reply(self) -> FakeReply:
        return converse_error(400, "ValidationException", "fake server: no reply queued")


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
