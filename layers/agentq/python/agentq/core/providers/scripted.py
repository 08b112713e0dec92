"""A provider that plays a declared script: deterministic agents with no API key.

Turn k of the script answers the k-th assistant turn of the conversation, so a resumed
task gets exactly the reply the crashed one would have got. A compaction request (the
instruction of ``core.context``) is answered with a summary that says how many turns it
stands for, and a conversation that starts from such a summary counts them: turn k stays
turn k across compactions, and the script is never consumed by one. tool_use ids derive from the
task id and turn, and usage is computed from the bytes in and out (about 4 characters a
token, like English text on Claude's tokenizer) so budgets and ledgers behave as they would
with a real model.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from agentq.core.context import COMPACT_INSTRUCTION
from agentq.core.models import Script, ScriptTurn, Usage
from agentq.core.providers.base import LLMRequest, LLMResponse, check_cut, pause

CHARS_PER_TOKEN = 4
SCRIPTS_DIR = Path(__file__).resolve().parent.parent.parent / "scripts"


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def load_script(spec: Script | str | dict[str, Any]) -> Script:
    """An inline Script, a dict, a built-in script name, or a path to a JSON/YAML file."""
    if isinstance(spec, Script):
        return spec
    if isinstance(spec, dict):
        return Script.model_validate(spec)
    path = Path(spec)
    if path.is_dir():
        raise ValueError(f"script {spec!r} is a directory, not a script file")
    if not path.exists() and _looks_like_a_path(spec):
        raise ValueError(f"no such script file: {spec!r}")
    if not path.exists():
        path = SCRIPTS_DIR / f"{spec}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in SCRIPTS_DIR.glob("*.yaml"))
        raise ValueError(f"unknown script {spec!r}; built-in scripts: {', '.join(known)}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:  # JSON is YAML: one parser for both
        raise ValueError(f"script {spec!r} is neither JSON nor YAML: {exc}") from None
    return Script.model_validate(data)


def _looks_like_a_path(spec: str) -> bool:
    """A file was meant (a folder in it, or a script's suffix), not a built-in script's name."""
    return "/" in spec or spec.endswith((".yaml", ".yml", ".json"))


def builtin_script_names() -> list[str]:
    return sorted(p.stem for p in SCRIPTS_DIR.glob("*.yaml"))


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: Script, *, sleep: Any = pause) -> None:
        self.script = script
        self.sleep = sleep

    def complete(self, request: LLMRequest) -> LLMResponse:
        turn_index = _turns_summarised(request.messages) + sum(1 for m in request.messages if m["role"] == "assistant")
        if _asks_for_compaction(request.messages):
            return self._summary(request, turn_index)
        turn = self._turn(turn_index)
        if turn.latency_seconds:
            self.sleep(turn.latency_seconds)  # a task's timeout ends the wait (``base.pause``) and cuts the call
            check_cut()
        content: list[dict[str, Any]] = []
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        for i, call in enumerate(turn.tool_calls):
            digest = hashlib.sha256(f"{request.task_id}:{turn_index}:{i}".encode()).hexdigest()[:24]
            content.append({"type": "tool_use", "id": f"toolu_{digest}", "name": call.name, "input": call.input})
        prompt = json.dumps([request.system, request.messages, request.tools], separators=(",", ":"))
        output_tokens = count_tokens(json.dumps(content, separators=(",", ":")))
        if output_tokens > request.max_tokens:
            # A real model stops at max_tokens; keep the text that fits and drop tool calls.
            text = (turn.text or "")[: request.max_tokens * CHARS_PER_TOKEN]
            return LLMResponse(
                content=[{"type": "text", "text": text}],
                stop_reason="max_tokens",
                model=request.model,
                usage=Usage(input_tokens=count_tokens(prompt), output_tokens=request.max_tokens),
            )
        return LLMResponse(
            content=content,
            stop_reason="tool_use" if turn.tool_calls else "end_turn",
            model=request.model,
            usage=Usage(input_tokens=count_tokens(prompt), output_tokens=output_tokens),
        )

    def _summary(self, request: LLMRequest, turns: int) -> LLMResponse:
        text = f"{SUMMARY_PREFIX} {turns} turns: the script goes on at turn {turns + 1}."
        prompt = json.dumps([request.system, request.messages, request.tools], separators=(",", ":"))
        return LLMResponse(
            content=[{"type": "text", "text": text}],
            stop_reason="end_turn",
            model=request.model,
            usage=Usage(input_tokens=count_tokens(prompt), output_tokens=count_tokens(text)),
        )

    def _turn(self, index: int) -> ScriptTurn:
        if index < len(self.script.turns):
            return self.script.turns[index]
        return ScriptTurn(text=f"(script exhausted after {len(self.script.turns)} turns)")


SUMMARY_PREFIX = "Scripted summary of"
_SUMMARISED = re.compile(re.escape(SUMMARY_PREFIX) + r" (\d+) turns")


def _asks_for_compaction(messages: list[dict[str, Any]]) -> bool:
    content = messages[-1]["content"] if messages else None
    return isinstance(content, list) and bool(content) and content[-1].get("text") == COMPACT_INSTRUCTION


def _turns_summarised(messages: list[dict[str, Any]]) -> int:
    """The turns a compaction summary at the start of the conversation stands for (0: none)."""
    first = messages[0]["content"] if messages else ""
    text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
    found = _SUMMARISED.search(text)
    return int(found.group(1)) if found else 0
