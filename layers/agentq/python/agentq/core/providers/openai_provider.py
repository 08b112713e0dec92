"""Provider ``openai``: the Chat Completions API through the real ``openai`` SDK, at any
``base_url`` (OpenAI itself, or a vLLM, Ollama or LiteLLM server that speaks the same wire).

The engine speaks Messages API blocks whatever the provider (``providers/base.py``), so this
module translates both ways and nothing else: the conversation out (a ``tool_result`` block
becomes a ``role: tool`` message, a ``tool_use`` block a ``tool_calls`` entry whose arguments
are JSON text), and the reply back (``tool_calls`` become ``tool_use`` blocks, the
``finish_reason`` a Messages ``stop_reason``, a ``message.refusal`` a text block whose stop reason
is ``refusal``, as ``content_filter``'s is). The stored steps stay in one shape, so a task's
trace, its resume and a fork read the same whoever answered.

Usage: ``prompt_tokens`` counts cached tokens too (``prompt_tokens_details.cached_tokens``);
they are split out as cache reads, so the ledger prices them as such and the total is what the
server billed. The output is what ``total_tokens`` holds past the prompt, at least
``completion_tokens``: reasoning a server counts apart from ``completion_tokens`` (xAI, Gemini)
is billed output too (``_Usage.output_tokens``). A reply is checked before anything reads it,
as the Anthropic provider does: a 200 that is not a completion is retried like an overload and
fails the task once the attempts are spent. A completion whose tool call's arguments are not a
JSON object is one all the same, its usage billed: the call is left out and the turn is no
answer (``base.unreadable_calls_stop``: ``max_tokens`` when ``length`` cut the call mid-JSON,
else ``malformed_output``), committed with its usage and never retried.

A call allowed more than ``AGENTQ_STREAM_ABOVE_TOKENS`` of output is streamed (``stream=True``,
server-sent chunks, with ``stream_options.include_usage`` so the last chunk carries the usage a
budget is settled from): the text so far goes to ``report_text`` (the task's live text), and
the chunks are assembled into the completion ``create`` would have returned, then read by the
same checks. A stream that ends without its usage is a malformed reply.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any

import openai
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentq.core.errors import ProviderError
from agentq.core.models import Usage
from agentq.core.providers.base import (
    DEFAULT_MAX_CALL_SECONDS,
    LLMRequest,
    LLMResponse,
    attempt_timeout,
    check_cut,
    checked_base_url,
    pause,
    report_text,
    stream_above,
    unreadable_calls_stop,
)
from agentq.core.providers.keys import keep_out_of_text
from agentq.core.providers.pages import parsed_or_page, streamed_page
from agentq.core.providers.retry import (
    CallFailure,
    MalformedReply,
    RetryPolicy,
    call_with_retries,
    distinct_tool_uses,
    error_status_answered,
    no_reply_began,
)
from agentq.core.providers.shared_clients import openai_client

API_KEY_VARIABLE = "OPENAI_API_KEY"
NO_KEY = "not-needed"  # what a local server that wants no key is sent, as their documentation says
BASE_URL_VARIABLE = "OPENAI_BASE_URL"

# finish_reason -> the Messages API's stop_reason, which the engine reads (core/engine/_llm_answer.turn_end).
STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


class OpenAIProvider:
    """Chat Completions; ``api_key=None`` lets the SDK read ``OPENAI_API_KEY``. A local server
    that wants no key (Ollama, vLLM without ``--api-key``) is given a placeholder, as their own
    documentation tells OpenAI clients to do."""

    name = "openai"

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_MAX_CALL_SECONDS,
        client: openai.OpenAI | None = None,
        *,
        sleep: Callable[[float], None] = pause,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            key = api_key or os.environ.get(API_KEY_VARIABLE)
            if not key and not base_url:
                raise ProviderError(
                    f"no OpenAI API key: set {API_KEY_VARIABLE}, or OPENAI_BASE_URL for a local server that needs "
                    "none, where the workers run (locally: in the shell that starts `agentq dev`, not the one that "
                    "submits; in AWS, the secret named by AGENTQ_OPENAI_API_KEY_SECRET)",
                    retryable=False,
                    code="missing_api_key",
                )
            given = base_url if base_url is not None else os.environ.get(BASE_URL_VARIABLE)
            checked_base_url(given, BASE_URL_VARIABLE, self.name)
            client = openai_client(key or NO_KEY, base_url, timeout)
        elif client.max_retries != 0:
            client = client.with_options(max_retries=0)
        keep_out_of_text(client.api_key if client.api_key != NO_KEY else None)  # an echo of it is redacted
        self._client = client
        # OpenAI's own API takes max_completion_tokens (its reasoning models refuse max_tokens);
        # vLLM, Ollama and LiteLLM servers take the older max_tokens.
        self._limit = "max_completion_tokens" if "api.openai.com" in str(client.base_url) else "max_tokens"
        self.retry = retry or RetryPolicy.from_env()
        self._sleep = sleep
        self._rng = rng
        self._timeout = timeout

    def complete(self, request: LLMRequest) -> LLMResponse:
        params = chat_params(request, self._limit)
        streamed = self.streams(request)
        response, attempts = call_with_retries(
            lambda: (
                self._streamed({**params, **self._cut_timeout()})
                if streamed
                else to_llm_response(
                    parsed_or_page(
                        self._client.chat.completions.with_raw_response.create(**params, **self._cut_timeout())
                    )
                )
            ),
            self.retry,
            self._sleep,
            rng=self._rng,
            label=self.name,
            classify=openai_failure,
        )
        return response.model_copy(update={"attempts": attempts, "streamed": streamed})

    def streams(self, request: LLMRequest) -> bool:
        return request.max_tokens > stream_above()

    @property
    def endpoint(self) -> str:
        return str(self._client.base_url)

    def _cut_timeout(self) -> dict[str, Any]:
        """An attempt under a task's deadline (``base.cutting_at``) times out at it: httpx then
        closes the connection, so the call is cut, not left running."""
        timeout = attempt_timeout(self._timeout)
        return {} if timeout is None else {"timeout": timeout}

    def _streamed(self, params: dict[str, Any]) -> LLMResponse:
        chunks = self._client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
        completion = StreamedCompletion()
        with chunks:
            page = streamed_page(chunks.response, openai.APITimeoutError, openai.APIConnectionError)
            if page is not None:  # a gateway's page where the stream should be
                raise page
            for chunk in chunks:
                check_cut()  # the task's deadline: leaving the block closes the stream
                if completion.add(chunk):
                    report_text(completion.text)
        return completion.response()


class StreamedCompletion:
    """Chat Completions chunks put back together: the text (and a refusal's), each tool call by its ``index``
    (its id and name come in its first delta, its arguments in pieces), the finish reason, and
    the usage of the last chunk."""

    def __init__(self) -> None:
        self.text = ""
        self.model = ""
        self.id: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.refusal = ""
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: Any) -> bool:
        """Take one chunk; True when it added text."""
        if not isinstance(chunk, BaseModel):
            raise MalformedReply(f"a stream chunk that is a JSON {type(chunk).__name__}, not an object")
        data = chunk.model_dump(exclude_none=True, warnings=False)
        self.model = data.get("model") or self.model
        self.id = data.get("id") or self.id
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        added = False
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                self.text += delta["content"]
                added = True
            if isinstance(delta.get("refusal"), str):
                self.refusal += delta["refusal"]
            for call in delta.get("tool_calls") or []:
                into = self._calls.setdefault(int(call.get("index", len(self._calls))), {"arguments": ""})
                function = call.get("function") or {}
                into["id"] = call.get("id") or into.get("id")
                into["name"] = function.get("name") or into.get("name")
                into["arguments"] += function.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return added

    def response(self) -> LLMResponse:
        """The assembled completion, checked like a whole one (``to_llm_response``)."""
        calls = [
            {"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c["arguments"]}}
            for _, c in sorted(self._calls.items())
        ]
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None, "refusal": self.refusal or None}
        if calls:
            message["tool_calls"] = calls
        whole: dict[str, Any] = {
            **({"id": self.id} if self.id else {}),
            "model": self.model,
            "choices": [{"message": message, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            whole["usage"] = self.usage
        return completion_response(whole)


def openai_failure(exc: Exception) -> CallFailure | None:
    """The OpenAI SDK's exceptions in the retry loop's terms (``providers/retry.py``)."""
    if isinstance(exc, openai.APIStatusError):
        body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
        nested = body.get("error")
        error: dict[str, Any] = nested if isinstance(nested, dict) else body
        kind = error.get("type") or error.get("code")
        detail = error.get("message") if isinstance(error.get("message"), str) else exc.message
        if isinstance(exc.body, str) and exc.body:  # not JSON (a proxy's page): shown as an excerpt of it
            detail = exc.body
        return CallFailure(
            "status", exc.status_code, kind if isinstance(kind, str) else None, str(detail), exc.response.headers,
            unbilled=error_status_answered(exc.response.status_code),
        )  # fmt: skip
    if isinstance(exc, openai.APITimeoutError):
        return CallFailure("timeout", detail=exc.message, unbilled=no_reply_began(exc))
    if isinstance(exc, openai.APIConnectionError):
        return CallFailure("connection", detail=exc.message, unbilled=no_reply_began(exc))
    if type(exc) is openai.APIError:  # what the SDK raises for an error inside a 200's stream
        # Never unbilled: the stream had begun, and the server may bill what it wrote.
        body = exc.body if isinstance(exc.body, dict) else {}
        kind = next((k for k in (body.get("type"), body.get("code")) if k in STREAM_ERROR_STATUS), None)
        status = STREAM_ERROR_STATUS.get(kind or "", 500)
        return CallFailure("status", status, kind or _text(body.get("type")), exc.message)
    if isinstance(exc, openai.APIError):  # the SDK could not read a 200 (APIResponseValidationError)
        return CallFailure("malformed", detail=str(exc)[:200] or type(exc).__name__)
    return None


# An error a server put inside a stream it had begun (``data: {"error": {...}}``), by its type
# or code, as the HTTP status it would have come with: a server error or a rate limit is retried
# (and falls over to a task's fallback) like the 500 or 429 it is, not failed as a reply that is
# no completion; any other is the server's error (500).
STREAM_ERROR_STATUS = {
    "server_error": 500,
    "rate_limit_exceeded": 429,
    "invalid_request_error": 400,
}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --- the request ------------------------------------------------------------------------------


def chat_params(request: LLMRequest, limit: str = "max_tokens") -> dict[str, Any]:
    """The Chat Completions body of ``request``. Thinking blocks of a fallback's earlier
    Claude turns are not sent (another model cannot read them); nothing else is dropped."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in request.messages:
        messages.extend(_chat_messages(message))
    params: dict[str, Any] = {"model": request.model, "messages": messages, limit: request.max_tokens}
    if request.tools:
        params["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for tool in request.tools
        ]
    return params


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        text = "".join(b["text"] for b in content if b.get("type") == "text")
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)},
            }
            for b in content
            if b.get("type") == "tool_use"
        ]
        out: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    # A user turn: tool results first (each its own ``tool`` message, answering its call), then the text.
    out_messages: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "tool_result":
            out_messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block)})
        elif kind == "text":
            texts.append(block["text"])
    if texts:
        out_messages.append({"role": "user", "content": "\n\n".join(texts)})
    return out_messages


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    text = (
        content
        if isinstance(content, str)
        else "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))
    )
    return f"Error: {text}" if block.get("is_error") else text


# --- the reply --------------------------------------------------------------------------------


class _Function(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    id: str
    function: _Function


class _Message(BaseModel):
    content: str | None = None
    refusal: str | None = None  # the model declined: its words are here, ``content`` null, finish "stop"
    tool_calls: list[_ToolCall] | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _PromptDetails(BaseModel):
    cached_tokens: int | None = Field(default=None, ge=0)


class _Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int | None = Field(default=None, ge=0)
    prompt_tokens_details: _PromptDetails | None = None

    @property
    def output_tokens(self) -> int:
        """Every token the server billed as output: what ``total_tokens`` holds past the prompt
        (cached prompt tokens are inside ``prompt_tokens``), never less than ``completion_tokens``.
        OpenAI counts a reasoning model's thinking inside ``completion_tokens``; xAI, and Gemini's
        OpenAI-compatible endpoint, count it apart and bill it as output all the same, so only
        the total has it (total = prompt + completion + reasoning)."""
        if self.total_tokens is None:
            return self.completion_tokens
        return max(self.completion_tokens, self.total_tokens - self.prompt_tokens)


class _Completion(BaseModel):
    """What the engine reads of a chat completion; anything else it holds is ignored."""

    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    model: str
    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage


def to_llm_response(completion: Any) -> LLMResponse:
    """The completion in the engine's shape; ``MalformedReply`` when it is not one (the SDK
    does not check a 200's shape), or when two tool calls share an id (``distinct_tool_uses``).
    A tool call whose arguments are not a JSON object is left out (``completion_response``)."""
    if not isinstance(completion, BaseModel):
        raise MalformedReply(f"a JSON {type(completion).__name__}, not an object")
    return completion_response(completion.model_dump(exclude_none=True, warnings=False))


def completion_response(data: dict[str, Any]) -> LLMResponse:
    """A completion as plain data (a whole one dumped, or a stream's assembled) in the engine's
    shape. A tool call whose arguments are not a JSON object (cut at the output limit, or JSON
    the model got wrong) is left out, never made, and the turn is no answer
    (``base.unreadable_calls_stop``): the reply was read whole, so it is committed with the
    usage the server billed, not retried as if it might not have been."""
    try:
        reply = _Completion.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise MalformedReply(f"{where}: {first['msg']}") from None
    choice = reply.choices[0]
    content: list[dict[str, Any]] = []
    if choice.message.content:
        content.append({"type": "text", "text": choice.message.content})
    unreadable = False
    for call in choice.message.tool_calls or []:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            unreadable = True
            continue
        content.append({"type": "tool_use", "id": call.id, "name": call.function.name, "input": arguments})
    stop = STOP_REASONS.get(choice.finish_reason or "", choice.finish_reason)
    if choice.message.refusal:  # read as an answer, its text dropped, it ended the task succeeded with nothing
        content.insert(0, {"type": "text", "text": choice.message.refusal})
        stop = "refusal"
    if stop == "end_turn" and any(b["type"] == "tool_use" for b in content):
        stop = "tool_use"  # some servers (Ollama) say "stop" for a turn that calls tools
    if unreadable:
        stop = unreadable_calls_stop(stop)
    usage = reply.usage
    cached = min((usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0,
                 usage.prompt_tokens)  # fmt: skip
    return LLMResponse(
        content=distinct_tool_uses(content),
        stop_reason=stop,
        model=reply.model,
        response_id=reply.id,
        finish_reason=choice.finish_reason,
        usage=Usage(
            input_tokens=usage.prompt_tokens - cached,
            output_tokens=usage.output_tokens,
            cache_read_input_tokens=cached,
        ),
    )
