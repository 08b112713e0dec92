"""Structured final output: a task with an ``output_schema`` (JSON Schema) ends only with an
answer that validates.

The model gives its answer by calling ``final_answer`` (a tool whose input is
``{"answer": <the schema>}``), alone in its turn. A valid call ends the task, its result the
answer as JSON; an invalid one is an ordinary tool error naming what failed validation, so the
model tries again within its budget and steps. An answer given as text instead is read as JSON
(a fenced block too): valid, it ends the task the same way; invalid, the next request carries
a user message with the validation error. That message is derived from the stored step by the
same function on every rebuild, so a resumed worker sends exactly what the first one did.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentq.core.tools._core import ToolSpec

FINAL_ANSWER_TOOL = "final_answer"
MAX_SCHEMA_BYTES = 64 * 1024
INSTRUCTION = (
    "When you have the final answer, call the final_answer tool with it (alone, in a turn of its "
    "own); it must match the tool's schema. Do not give the final answer as plain text."
)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def check_schema(schema: dict[str, Any]) -> None:
    """Raises ValueError naming what makes ``schema`` unusable."""
    import jsonschema

    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise ValueError(f"at most {MAX_SCHEMA_BYTES:,} bytes of JSON")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None


def usable_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """A pydantic validator for an ``output_schema`` field (submissions and agents)."""
    if schema is not None:
        check_schema(schema)
    return schema


def errors(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` does not validate against ``schema`` (None: it does)."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    found = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if not found:
        return None
    parts = [f"{'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in found[:5]]
    return "; ".join(parts) + (f" (and {len(found) - 5} more)" if len(found) > 5 else "")


def final_answer_tool(schema: dict[str, Any]) -> ToolSpec:
    """The tool the model answers with; running it only checks the answer (a valid call alone
    in its turn ends the task before any tool runs: ``answer_of``)."""
    from pydantic import create_model

    def check(arguments: dict[str, Any]) -> str:
        if "answer" not in arguments:
            raise ValueError('give the answer as {"answer": ...}')
        problem = errors(schema, arguments["answer"])
        if problem:
            raise ValueError(f"the answer does not match the output schema: {problem}")
        return "accepted; call final_answer alone in a turn to finish"

    return ToolSpec(
        name=FINAL_ANSWER_TOOL,
        description="Submit your final answer; it must match the schema. Call it alone, when you are done.",
        side_effects=False,
        timeout_seconds=10,
        fn=check,
        input_model=create_model("final_answer_input"),
        wants_context=None,
        raw_schema={"type": "object", "properties": {"answer": schema}, "required": ["answer"]},
    )


def answer_of(schema: dict[str, Any], content: list[dict[str, Any]]) -> tuple[bool, Any]:
    """(True, the answer) when this assistant turn gives a valid final answer: ``final_answer``
    alone, or text that parses and validates when it calls no tool at all."""
    uses = [b for b in content if b.get("type") == "tool_use"]
    if uses:
        if len(uses) == 1 and uses[0].get("name") == FINAL_ANSWER_TOOL:
            arguments = uses[0].get("input") or {}
            if isinstance(arguments, dict) and "answer" in arguments and errors(schema, arguments["answer"]) is None:
                return True, arguments["answer"]
        return False, None
    value, problem = _parse_text(content)
    if problem is None and errors(schema, value) is None:
        return True, value
    return False, None


def feedback(schema: dict[str, Any], content: list[dict[str, Any]]) -> str:
    """The user message that follows a text answer that is not a valid final answer."""
    value, problem = _parse_text(content)
    if problem is None:
        problem = errors(schema, value)
    return (
        f"Your answer is not a valid final answer ({problem}). Call final_answer with an answer "
        "that matches the schema."
    )


def _parse_text(content: list[dict[str, Any]]) -> tuple[Any, str | None]:
    text = "".join(b.get("text", "") for b in content if b.get("type") == "text").strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"it is not JSON: {exc}"
