"""Provider ``bedrock-converse``: any Bedrock model with tool use (Amazon Nova, Llama, Mistral,
DeepSeek, gpt-oss, Claude, ...) through boto3's ``bedrock-runtime`` ``converse``.

As the OpenAI provider, this module only translates between the engine's Messages API blocks
and Converse's (``toolUse``/``toolResult``/``reasoningContent`` members of a content block), so
stored steps keep one shape whichever provider answered. Its endpoint is Bedrock's own, or
``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` (which the tests point at a local Converse server), never
the ``AWS_ENDPOINT_URL`` that points agentq's own services elsewhere (``converse_endpoint``); its
credentials come from the worker's role; botocore's own retries are off (one attempt), the shared
retry loop (``providers/retry.py``) counts and reports every attempt as for the other providers.

Prompt caching: a ``cachePoint`` goes after the tools, the system prompt and the latest message
for the models whose Bedrock documentation lists prompt caching (``caches_prompts``); other models
would refuse the request with a ValidationException, so theirs never carry one. Reasoning
(extended thinking) is Claude's on Bedrock, sent in ``additionalModelRequestFields``; its
``reasoningContent`` is kept and sent back unchanged like an Anthropic thinking block.

A call allowed more than ``AGENTQ_STREAM_ABOVE_TOKENS`` of output goes through
``converse_stream`` (ConverseStream: AWS event-stream frames that botocore decodes into
events): the text so far goes to ``report_text`` (the task's live text), and the content
blocks, stop reason and usage of the events are assembled into the reply ``converse`` would
have returned, then read by the same checks. An exception event in the stream (a throttle,
a model error) is botocore's ``EventStreamError`` and is retried by its code like a status.

A tool use whose input is not a JSON object (a stream's JSON text cut at ``max_tokens``, or
text the model got wrong) is left out of a reply read whole, usage and all: the turn is no
answer (``base.unreadable_calls_stop``), committed with its usage as Converse's own
``malformed_tool_use`` is, never retried as a reply that might not have been billed.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import random
from collections.abc import Callable
from typing import Any

import botocore.config
import botocore.exceptions
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentq.core.errors import ProviderError
from agentq.core.model_ids import model_family
from agentq.core.models import Usage
from agentq.core.providers import botocore_replies, caching
from agentq.core.providers.base import (
    DEFAULT_MAX_CALL_SECONDS,
    LLMRequest,
    LLMResponse,
    check_cut,
    checked_base_url,
    pause,
    report_text,
    stream_above,
    unreadable_calls_stop,
)
from agentq.core.providers.keys import keep_out_of_text
from agentq.core.providers.retry import (
    MalformedReply,
    RetryPolicy,
    call_with_retries,
    distinct_tool_uses,
)

# Converse's stopReason -> the Messages API's stop_reason the engine reads (one of its own for a
# turn Bedrock says the model made malformed, as text or as a tool call: no answer either).
STOP_REASONS = {
    "guardrail_intervened": "refusal",
    "content_filtered": "refusal",
    "malformed_model_output": "malformed_output",
    "malformed_tool_use": "malformed_output",
}
# Model families (by the id past any region prefix) whose Converse requests may carry cachePoint.
CACHING_FAMILIES = ("anthropic.claude", "amazon.nova")
CACHE_POINT = {"cachePoint": {"type": "default"}}


ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_BEDROCK_RUNTIME"
EVERY_SERVICE_VARIABLE = "AWS_ENDPOINT_URL"


def converse_endpoint(region: str | None = None) -> str | None:
    """Where Converse calls go: ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME``, else Bedrock's regional
    endpoint (None). Never ``AWS_ENDPOINT_URL``, which botocore would apply to every service:
    it is where agentq's own table, bucket and queues are (the local stack's moto, which serves
    no Bedrock: a Converse call sent there got an HTML 500 and was retried 25 times). With it
    set and no Bedrock endpoint named, the call is refused, naming the variable to set: such a
    process signs with the local stack's placeholder credentials, which Bedrock itself refuses."""
    named = os.environ.get(ENDPOINT_VARIABLE, "").strip()
    if named:
        return checked_base_url(named, ENDPOINT_VARIABLE, "bedrock-converse")  # botocore: a bare ValueError
    everything = os.environ.get(EVERY_SERVICE_VARIABLE, "").strip()
    if everything:
        raise ProviderError(
            f"bedrock-converse: {EVERY_SERVICE_VARIABLE} ({everything}) points every AWS service elsewhere "
            f"(the local stack's moto serves no Bedrock) and {ENDPOINT_VARIABLE} is not set: set it in the "
            "workers' environment to the Converse endpoint to call: a Converse-compatible server, or Bedrock's "
            f"own (https://bedrock-runtime.{region or _region()}.amazonaws.com), which takes real AWS credentials, "
            "not the local stack's placeholders",
            retryable=False,
            code="bedrock_endpoint_unset",
        )
    return None


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


@functools.cache
def shared_client(region: str | None, timeout: float, endpoint: str | None) -> Any:
    """One ``bedrock-runtime`` client per process and setting (boto3 clients are thread-safe;
    building one parses botocore's service model, ~100 ms, too much to pay on every turn).
    ``endpoint`` (``converse_endpoint``) is in the key so a changed one is honoured; the
    endpoints botocore would find on its own (``AWS_ENDPOINT_URL``, the shared config file's)
    are ignored."""
    import boto3

    settings: dict[str, Any] = {  # botocore's type stubs predate ignore_configured_endpoint_urls
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "read_timeout": timeout,
        "connect_timeout": 10,
        "ignore_configured_endpoint_urls": True,
    }
    config = botocore.config.Config(**settings)
    return boto3.session.Session().client("bedrock-runtime", region_name=region, endpoint_url=endpoint, config=config)


def caches_prompts(model: str) -> bool:
    return model_family(model).startswith(CACHING_FAMILIES)


def reasons(model: str) -> bool:
    """Whether extended thinking (``thinking_budget_tokens``) applies: Claude's, on Bedrock."""
    return model_family(model).startswith("anthropic.claude")


BEARER_TOKEN_VARIABLE = "AWS_BEARER_TOKEN_BEDROCK"  # a Bedrock API key, which botocore sends in place of SigV4


class BedrockConverseProvider:
    name = "bedrock-converse"

    def __init__(
        self,
        client: Any = None,
        *,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_MAX_CALL_SECONDS,
        sleep: Callable[[float], None] = pause,
        rng: random.Random | None = None,
    ) -> None:
        if client is None:
            client = shared_client(region, timeout, converse_endpoint(region))
        # unique_id: the shared client gets the check once, however many providers use it.
        client.meta.events.register(
            "before-parse.bedrock-runtime.Converse",
            botocore_replies.whole_or_cut,
            unique_id=botocore_replies.WHOLE_OR_CUT,
        )
        keep_out_of_text(os.environ.get(BEARER_TOKEN_VARIABLE))  # a Bedrock API key botocore sends: echoes redacted
        self._client = client
        self.retry = retry or RetryPolicy.from_env()
        self._sleep = sleep
        self._rng = rng

    def complete(self, request: LLMRequest) -> LLMResponse:
        params = converse_params(request)
        streamed = self.streams(request)
        try:
            response, attempts = call_with_retries(
                lambda: (
                    self._streamed(params)
                    if streamed
                    else to_llm_response(self._client.converse(**params), request.model)
                ),
                self.retry,
                self._sleep,
                rng=self._rng,
                label=self.name,
                classify=botocore_replies.botocore_failure,
            )
        except botocore.exceptions.NoCredentialsError as exc:
            raise ProviderError(
                f"{self.name}: {exc} (give the worker an IAM role, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
                retryable=False,
                code="missing_aws_credentials",
            ) from None
        return response.model_copy(update={"attempts": attempts, "streamed": streamed})

    def streams(self, request: LLMRequest) -> bool:
        return request.max_tokens > stream_above()

    @property
    def endpoint(self) -> str | None:
        meta = getattr(self._client, "meta", None)
        return str(meta.endpoint_url) if meta is not None else None

    def _streamed(self, params: dict[str, Any]) -> LLMResponse:
        reply = StreamedReply()
        stream = self._client.converse_stream(**params)["stream"]
        try:
            for event in stream:
                check_cut()  # the task's deadline: the stream is closed below
                if reply.add(event):
                    report_text(reply.text)
        finally:
            stream.close()
        return to_llm_response(reply.whole(), params["modelId"])


class StreamedReply:
    """ConverseStream's events put back together as a Converse reply: content blocks by
    ``contentBlockIndex`` (a tool use's id and name in its start, its input as JSON text in
    pieces; reasoning text and signature in pieces), ``messageStop``'s stop reason and
    ``metadata``'s usage."""

    def __init__(self) -> None:
        self.text = ""
        self._blocks: dict[int, dict[str, Any]] = {}
        self._stop: str | None = None
        self._usage: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> bool:
        """Take one event; True when it added text."""
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if use:
                self._block(start)["toolUse"] = {"toolUseId": use.get("toolUseId"), "name": use.get("name"), "json": ""}
        elif "contentBlockDelta" in event:
            change = event["contentBlockDelta"]
            delta, block = change.get("delta") or {}, self._block(change)
            if "text" in delta:
                block["text"] = block.get("text", "") + delta["text"]
                self.text += delta["text"]
                return True
            if "toolUse" in delta:
                block.setdefault("toolUse", {"json": ""})["json"] += delta["toolUse"].get("input", "")
            if "reasoningContent" in delta:
                said = delta["reasoningContent"]
                thought = block.setdefault("reasoning", {"text": "", "signature": ""})
                thought["text"] += said.get("text", "")
                thought["signature"] += said.get("signature", "")
                if "redactedContent" in said:
                    thought["redacted"] = thought.get("redacted", b"") + said["redactedContent"]
        elif "messageStop" in event:
            self._stop = event["messageStop"].get("stopReason")
        elif "metadata" in event:
            self._usage = event["metadata"].get("usage")
        return False

    def _block(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._blocks.setdefault(int(event.get("contentBlockIndex", 0)), {})

    def whole(self) -> dict[str, Any]:
        """The reply ``converse`` would have returned. A tool use's input that is not JSON (cut
        where ``max_tokens`` fell) is kept as its text, which ``to_llm_response`` reads as a
        call that cannot be made, as it would a parsed input that is not an object."""
        content: list[dict[str, Any]] = []
        for _, block in sorted(self._blocks.items()):
            if "toolUse" in block:
                use = block["toolUse"]
                try:
                    tool_input = json.loads(use["json"] or "{}")
                except json.JSONDecodeError:
                    tool_input = use["json"]
                content.append(
                    {"toolUse": {"toolUseId": use.get("toolUseId"), "name": use.get("name"), "input": tool_input}}
                )
            elif "reasoning" in block:
                thought = block["reasoning"]
                if "redacted" in thought:
                    content.append({"reasoningContent": {"redactedContent": thought["redacted"]}})
                else:
                    content.append(
                        {
                            "reasoningContent": {
                                "reasoningText": {"text": thought["text"], "signature": thought["signature"]}
                            }
                        }
                    )
            elif "text" in block:
                content.append({"text": block["text"]})
        reply: dict[str, Any] = {"output": {"message": {"role": "assistant", "content": content}}}
        if self._stop is not None:
            reply["stopReason"] = self._stop
        if self._usage is not None:
            reply["usage"] = self._usage
        return reply


# --- the request ------------------------------------------------------------------------------


def converse_params(request: LLMRequest) -> dict[str, Any]:
    """``converse``'s keyword arguments for ``request`` (a copy: the conversation is the
    engine's checkpoint and is never changed in place)."""
    cache = caching.enabled() and caches_prompts(request.model)
    messages = [_converse_message(m, reasons(request.model)) for m in request.messages]
    messages = [m for m in messages if m["content"]]
    if cache and messages:
        messages[-1] = {**messages[-1], "content": [*messages[-1]["content"], dict(CACHE_POINT)]}
    params: dict[str, Any] = {
        "modelId": request.model,
        "messages": messages,
        "inferenceConfig": {"maxTokens": request.max_tokens},
    }
    if request.system:
        params["system"] = [{"text": request.system}, *([dict(CACHE_POINT)] if cache else [])]
    if request.tools:
        tools: list[dict[str, Any]] = [
            {
                "toolSpec": {
                    "name": tool["name"],
                    "description": tool.get("description") or tool["name"],
                    "inputSchema": {"json": tool.get("input_schema") or {"type": "object", "properties": {}}},
                }
            }
            for tool in request.tools
        ]
        if cache:
            tools.append(dict(CACHE_POINT))
        params["toolConfig"] = {"tools": tools}
    if request.thinking_budget and reasons(request.model):
        params["additionalModelRequestFields"] = {
            "thinking": {"type": "enabled", "budget_tokens": request.thinking_budget}
        }
    return params


def _converse_message(message: dict[str, Any], reasoning: bool) -> dict[str, Any]:
    """One message in Converse's blocks. Thinking is sent back to a model that reasons (Claude
    requires its own blocks back); another model (a fallback taking over from Claude) refuses
    reasoning content it did not write, so it gets none."""
    content = message["content"]
    if isinstance(content, str):
        return {"role": message["role"], "content": [{"text": content}] if content else []}
    blocks: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            blocks.append({"text": block["text"]})
        elif kind == "tool_use":
            blocks.append(
                {"toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block.get("input") or {}}}
            )
        elif kind == "tool_result":
            result: dict[str, Any] = {"toolUseId": block["tool_use_id"], "content": [{"text": _result_text(block)}]}
            if block.get("is_error"):
                result["status"] = "error"
            blocks.append({"toolResult": result})
        elif kind == "thinking" and reasoning:
            blocks.append({"reasoningContent": {"reasoningText": {"text": block["thinking"],
                                                                  "signature": block["signature"]}}})  # fmt: skip
        elif kind == "redacted_thinking" and reasoning:
            blocks.append({"reasoningContent": {"redactedContent": base64.b64decode(block["data"])}})
    return {"role": message["role"], "content": blocks}


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content or "(empty)"
    text = "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))
    return text or "(empty)"  # Converse refuses an empty text block


# --- the reply --------------------------------------------------------------------------------


class _ToolUse(BaseModel):
    toolUseId: str
    name: str
    input: Any  # a JSON object, or the call cannot be made (``to_llm_response``)


class _ReasoningText(BaseModel):
    text: str
    signature: str = ""


class _Reasoning(BaseModel):
    reasoningText: _ReasoningText | None = None
    redactedContent: bytes | None = None


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str | None = None
    toolUse: _ToolUse | None = None
    reasoningContent: _Reasoning | None = None


class _Message(BaseModel):
    content: list[_Block]


class _Output(BaseModel):
    message: _Message


class _Usage(BaseModel):
    inputTokens: int = Field(ge=0)
    outputTokens: int = Field(ge=0)
    cacheReadInputTokens: int = Field(default=0, ge=0)
    cacheWriteInputTokens: int = Field(default=0, ge=0)


class _Reply(BaseModel):
    output: _Output
    stopReason: str
    usage: _Usage


def to_llm_response(reply: Any, model: str) -> LLMResponse:
    """The Converse reply in the engine's shape; ``MalformedReply`` when it is not one (two
    tool uses sharing an id included: ``distinct_tool_uses``). A tool use whose input is not a
    JSON object is left out and the turn is no answer (``base.unreadable_calls_stop``).
    Converse's ``inputTokens`` excludes the cache reads and writes, as the Messages API's does."""
    try:
        parsed = _Reply.model_validate(reply)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise MalformedReply(f"{where}: {first['msg']}") from None
    content: list[dict[str, Any]] = []
    unreadable = False
    for block in parsed.output.message.content:
        if block.text:
            content.append({"type": "text", "text": block.text})
        elif block.toolUse is not None and not isinstance(block.toolUse.input, dict):
            unreadable = True
        elif block.toolUse is not None:
            use = block.toolUse
            content.append({"type": "tool_use", "id": use.toolUseId, "name": use.name, "input": use.input})
        elif block.reasoningContent is not None and block.reasoningContent.reasoningText is not None:
            said = block.reasoningContent.reasoningText
            content.append({"type": "thinking", "thinking": said.text, "signature": said.signature})
        elif block.reasoningContent is not None and block.reasoningContent.redactedContent is not None:
            data = base64.b64encode(block.reasoningContent.redactedContent).decode()
            content.append({"type": "redacted_thinking", "data": data})
    usage = parsed.usage
    stop = STOP_REASONS.get(parsed.stopReason, parsed.stopReason)
    return LLMResponse(
        content=distinct_tool_uses(content),
        stop_reason=unreadable_calls_stop(stop) if unreadable else stop,
        model=model,
        finish_reason=parsed.stopReason,
        usage=Usage(
            input_tokens=usage.inputTokens,
            output_tokens=usage.outputTokens,
            cache_read_input_tokens=usage.cacheReadInputTokens,
            cache_creation_input_tokens=usage.cacheWriteInputTokens,
        ),
    )
