"""The conversation as the committed steps define it: pure functions of the steps and the task.

Rebuilt, never stored: the steps are the truth, so a resumed worker, a fork (``control``) and
the trace all derive the same messages from the same steps.
"""

from __future__ import annotations

import json
import math
from typing import Any

from agentq.core.context import resumed_goal
from agentq.core.grading import feedback_message
from agentq.core.models import CompactStep, Constraints, GradeStep, LLMStep, MessageStep, StepRecord, TaskSubmission
from agentq.core.output import FINAL_ANSWER_TOOL, answer_of, feedback
from agentq.core.providers import LLMRequest
from agentq.core.providers.hidden_input import hidden_input_tokens
from agentq.core.tools.memory import offered_memory_tools

# Input estimate: 3 characters a token over the JSON of the request. Claude averages about
# 3.5-4 on English and JSON, so this over-reserves slightly and the budget cap holds.
ESTIMATE_CHARS_PER_TOKEN = 3
ESTIMATE_BASE_TOKENS = 16


def conversation(
    goal: str, steps: list[StepRecord], output_schema: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Messages API history rebuilt from committed steps: the goal, then each step's turn
    (with an ``output_schema``, a text answer that was not valid is followed by the feedback
    the model was given, derived again from the step: ``core.output``; a grade below the bar
    is followed by its feedback: ``core.grading``). A compaction starts
    it again from the goal and its summary (``core.context``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": goal}]
    for record in steps:
        body = record.body
        if isinstance(body, CompactStep):
            summary = body.text()
            if summary:  # a compaction that wrote nothing leaves the conversation as it was
                messages = [{"role": "user", "content": resumed_goal(goal, summary)}]
        elif isinstance(body, LLMStep):
            messages.append(assistant_turn(body))
            if output_schema is None or body.tool_uses() or body.no_answer():
                continue
            if not answer_of(output_schema, body.content)[0]:
                messages.append({"role": "user", "content": feedback(output_schema, body.content)})
        elif isinstance(body, MessageStep):
            _say(messages, [{"type": "text", "text": m.text} for m in body.messages])
        elif isinstance(body, GradeStep):
            if body.retries:  # below the bar: the grader's feedback is the agent's next message
                messages.append(feedback_message(messages, body))
        else:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": r.tool_use_id,
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in body.results
                    ],
                }
            )
    return messages


def assistant_turn(step: LLMStep) -> dict[str, Any]:
    """The assistant turn ``step`` makes in the conversation: its content as the provider returned
    it. A turn that is no answer (``LLMStep.no_answer``: refused, cut off, malformed) ends its
    task, unless a message came in while it was made: then it stays in the conversation, before
    that message (``_llm_answer``), without its tool calls, which are never carried out (every
    provider wants a call followed by its result, and none comes), and without its empty text
    blocks; left with no text, it says what it was (every provider refuses an empty turn, and
    left out, the conversation would hold one turn fewer than the task's LLM steps)."""
    if not step.no_answer():
        return {"role": "assistant", "content": step.content}
    kept = [b for b in step.content if b.get("type") != "tool_use" and (b.get("type") != "text" or b.get("text"))]
    if not any(b.get("type") == "text" for b in kept):
        kept.append({"type": "text", "text": NO_ANSWER_SAID.get(step.stop_reason or "", "(no answer)")})
    return {"role": "assistant", "content": kept}


# What a turn that was no answer, and said nothing, says in the conversation (``assistant_turn``).
NO_ANSWER_SAID = {
    "refusal": "(no answer: this turn was stopped as a refusal)",
    "max_tokens": "(no answer: this turn was cut off at the output limit)",
    "model_context_window_exceeded": "(no answer: this turn was cut off where the context window ran out)",
    "malformed_output": "(no answer: this turn was malformed)",
}


def said(messages: list[dict[str, Any]], body: MessageStep) -> list[dict[str, Any]]:
    """The conversation after ``body``'s messages were delivered into it."""
    out = list(messages)
    _say(out, [{"type": "text", "text": m.text} for m in body.messages])
    return out


def _say(messages: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
    """A person's words as the next user turn: joined to the user turn already last (the goal,
    tool results: roles must alternate, and tool results must lead their turn), or a new one."""
    last = messages[-1]
    if last["role"] != "user":
        messages.append({"role": "user", "content": blocks})
        return
    content = last["content"]
    before = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    messages[-1] = {"role": "user", "content": [*before, *blocks]}


def final_text(messages: list[dict[str, Any]]) -> str | None:
    """The last thing the assistant said in words: the result, or the partial result."""
    for message in reversed(messages):
        if message["role"] != "assistant":
            continue
        texts = [b["text"] for b in message["content"] if b.get("type") == "text" and b.get("text")]
        if texts:
            return "\n".join(texts)
    return None


def estimate_input_tokens(request: LLMRequest) -> int:
    """The most input tokens ``request`` is taken to be billed: every budget hold is sized on it
    (an agent's turn, a compaction, a grading call) and a hold's output allowance near the cap
    is what is left past it, so an estimate short of the bill puts ``used`` past ``cap`` by the
    difference when the model writes all of that allowance (ARCHITECTURE 4). It is the JSON of
    the request at ``ESTIMATE_CHARS_PER_TOKEN``, and the input the provider adds unseen, the
    tool-use system prompt of a request with tools (``providers.hidden_input``: 346 tokens for
    Claude 4, which a request of 1,500 characters, estimated at 516, passed by 300 and more)."""
    text = json.dumps([request.system, request.messages, request.tools], separators=(",", ":"))
    return math.ceil(len(text) / ESTIMATE_CHARS_PER_TOKEN) + ESTIMATE_BASE_TOKENS + hidden_input_tokens(request)


def task_tools(submission: TaskSubmission) -> list[str]:
    """The tools a task's model is offered: its allowed ones, the memory tools of its attached
    stores (``core.tools.memory``; a ``deny`` policy still removes one), and final_answer with an
    output schema."""
    policies = submission.constraints.tool_policies
    memory = [n for n in offered_memory_tools(submission.memory) if policies.get(n) != "deny"]
    offered = [*offered_tools(submission.constraints), *(n for n in memory if n not in submission.constraints.tools)]
    return [*offered, FINAL_ANSWER_TOOL] if submission.output_schema is not None else offered


def offered_tools(constraints: Constraints) -> list[str]:
    """The tools a task's model is shown and may run: its allowlist without the denied ones."""
    return [name for name in constraints.tools if constraints.tool_policies.get(name) != "deny"]
