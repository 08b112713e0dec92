"""What a rule sees of one call: the call, the principal and the task's history, as the Cedar
request ``schema`` describes. Pure: the engine gathers the facts (``core.engine._policy``), this
module only shapes them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from agentq.core.policies.evaluate import cedar_value

CallKind = Literal["tool", "mcp", "spawn", "model"]


@dataclass(frozen=True)
class PolicyCall:
    kind: CallKind
    tool: str = ""  # "" for a model call
    args: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    mcp_server: str = ""
    estimated_tokens: int = 0
    estimated_usd_micros: int = 0


@dataclass(frozen=True)
class Principal:
    tenant: str
    agent: str = ""  # "" for a task without an agent
    agent_version: int = 0
    user: str | None = None  # the end user (issue 43): None until tasks carry one
    api_key: str | None = None  # the submitting key's id: None until tasks carry it


@dataclass(frozen=True)
class TaskFacts:
    task_id: str
    root_id: str
    depth: int
    step: int
    tools: tuple[tuple[str, str], ...] = ()  # (name, status) of the committed tool calls (a Set: each once is enough)
    task_tokens: int = 0
    task_spend_micros: int = 0
    tree_tokens: int = 0
    tree_spend_micros: int = 0
    user_spend_today_micros: int | None = None  # None: not known (no end user, or not read)
    tool_calls: int | None = None  # how many tool calls there were (None: one for each of ``tools``)

    def with_made(self, names: tuple[str, ...], status: str) -> TaskFacts:
        """These facts with the calls of ``names`` counted as made, each ending ``status``: the
        calls of the turn that run before the one checked (``core.engine._policy``)."""
        if not names:
            return self
        made = tuple(dict.fromkeys([*self.tools, *((n, status) for n in names)]))
        return replace(self, tools=made, tool_calls=self.calls + len(names))

    @property
    def calls(self) -> int:
        return self.tool_calls if self.tool_calls is not None else len(self.tools)


def request(call: PolicyCall, who: Principal, facts: TaskFacts) -> dict[str, Any]:
    """The Cedar request for ``call``: principal, action, resource and context."""
    history: dict[str, Any] = {
        "tools": [{"name": n, "status": s} for n, s in facts.tools],
        "ok_tools": sorted({n for n, s in facts.tools if s == "ok"}),
        "tool_calls": facts.calls,
        "task_tokens": facts.task_tokens,
        "task_spend_micros": facts.task_spend_micros,
        "tree_tokens": facts.tree_tokens,
        "tree_spend_micros": facts.tree_spend_micros,
    }
    if facts.user_spend_today_micros is not None:
        history["user_spend_today_micros"] = facts.user_spend_today_micros
    context: dict[str, Any] = {
        "tenant": who.tenant,
        "agent": who.agent,
        "agent_version": who.agent_version,
        "task": {"id": facts.task_id, "root_id": facts.root_id, "depth": facts.depth, "step": facts.step},
        "call": {
            "kind": call.kind,
            "tool": call.tool,
            "mcp_server": call.mcp_server,
            "model": call.model,
            "estimated_tokens": call.estimated_tokens,
            "estimated_usd_micros": call.estimated_usd_micros,
        },
        "args": cedar_value(call.args),
        "history": history,
    }
    if who.user is not None:
        context["user"] = who.user
    if who.api_key is not None:
        context["api_key"] = who.api_key
    resource = {"type": "Model", "id": call.model} if call.kind == "model" else {"type": "Tool", "id": call.tool}
    return {
        "principal": {"type": "Agent", "id": who.agent},
        "action": {"type": "Action", "id": call.kind},
        "resource": resource,
        "context": context,
    }
