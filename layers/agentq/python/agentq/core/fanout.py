"""Sub-agents: the ``spawn_subagents`` tool, its limits, and what the parent sees afterwards.

The model calls ``spawn_subagents`` with sub-goals; the engine turns them into child tasks
(ids derived from the tool_use id, so a retried spawn creates nothing twice), funds each child
from the parent's budget at spawn time (so the children can never spend more than the parent
had left: no token amplification), starts one Step Functions execution that runs them, and
parks the parent in ``waiting`` with no worker held. When the execution wakes it, the parent
commits one tools step holding every child's status and result.

Refusals (too deep, too wide, shares over budget, tools the parent may not use) are tool
errors the model reads and can react to, never a silent cap.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, Protocol, TypeAlias

import pydantic
from pydantic import Field

from agentq.core.models import (
    MAX_COST_USD,
    MAX_TOKENS,
    Constraints,
    Script,
    StrictModel,
    Task,
    TaskStatus,
    TaskSubmission,
)
from agentq.core.pricing import MILLION, micros
from agentq.core.providers.scripted import builtin_script_names
from agentq.core.tools import ToolSpec, tool
from agentq.core.workspace import WorkspaceBase, WorkspaceSpec, has_workspace, lookup_of

SPAWN_TOOL = "spawn_subagents"
MIN_CHILD_SHARE = 64  # tokens: below this a child cannot make a single useful call
RESULT_PREVIEW_CHARS = 4000
SUBAGENT_DEADLINE = "sub-agent deadline passed"  # a child's error when its parent's fan-out gave up on it


class SubagentSpec(StrictModel):
    goal: str = Field(min_length=1, max_length=20_000, description="what this sub-agent must achieve")
    tools: list[str] | None = Field(default=None, description="its tool allowlist (a subset of yours); default: yours")
    token_share: int | None = Field(
        default=None, ge=1, description="tokens it may spend; default: an even split of what is left"
    )
    system: str | None = Field(default=None, max_length=20_000)
    deadline_seconds: int | None = Field(default=None, ge=1, le=86_400, description="its time limit")
    script: Script | str | None = Field(
        default=None, description="scripted provider only: an inline script or a built-in script name"
    )
    workspace: Literal["parent"] | None = Field(
        default=None,
        description="'parent': it starts with your workspace's files as they are now (shared, not copied). Its "
        "changes never reach your workspace by themselves: you get them as a diff in its result, to apply if you "
        "want them",
    )


class SpawnInput(StrictModel):
    subagents: list[SubagentSpec] = Field(min_length=1, description="one entry per sub-agent")
    max_concurrency: int | None = Field(default=None, ge=1, le=100, description="children running at once")


class SpawnRejected(Exception):
    """A spawn the limits forbid: the message goes back to the model as a tool error."""


@dataclass(frozen=True)
class ChildPlan:
    """A child as the spawn creates it (also rebuilt from a ``creating`` spawn record)."""

    task_id: str
    submission: TaskSubmission
    share: int
    deadline_seconds: int

    @property
    def share_micros(self) -> int:
        """The dollars (millionths) moved to the child: its ``max_cost_usd``, 0 without one."""
        money = self.submission.constraints.max_cost_usd
        return micros(money) if money is not None else 0


# A child as the execution runs it: (task_id, timeout_seconds). Only ids and deadlines cross into the
# execution's input; the children themselves are already written (ChildPlan) when it starts.
ChildRun: TypeAlias = tuple[str, int]


class FanoutLauncher(Protocol):
    """Starts the execution that runs the children and wakes the parent (Step Functions)."""

    def start(self, *, parent: Task, spawn_id: str, children: list[ChildRun], max_concurrency: int) -> str: ...

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None: ...


@tool(name=SPAWN_TOOL, side_effects=False, timeout_seconds=60)
def spawn_subagents(
    subagents: Annotated[list[SubagentSpec], Field(min_length=1, description="one entry per sub-agent")],
    max_concurrency: Annotated[int | None, Field(ge=1, le=100, description="children running at once")] = None,
) -> str:
    """Run sub-agents in parallel, each on its own sub-goal with its own tools and token
    share; you get every sub-agent's status and result back in one tool result when all
    have finished (or hit their deadline)."""
    # The engine carries a spawn out itself; reaching this means no fan-out is configured.
    raise RuntimeError("sub-agents are unavailable: this worker has no Step Functions fan-out configured")


def spawn_tool_spec() -> ToolSpec:
    return spawn_subagents


def child_id_for(parent_id: str, tool_use_id: str, index: int) -> str:
    digest = hashlib.sha256(f"{parent_id}:{tool_use_id}:{index}".encode()).hexdigest()[:20]
    return f"{parent_id[:12]}-{digest}"


def parse_spawn_input(raw: dict[str, Any]) -> SpawnInput:
    try:
        return SpawnInput.model_validate(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SpawnRejected(f"invalid input for {SPAWN_TOOL}: {where}: {first['msg']}") from None


def plan_children(
    parent: Task,
    tool_use_id: str,
    spec: SpawnInput,
    available: int,
    now: float | None = None,
    *,
    available_micros: int | None = None,
) -> list[ChildPlan]:
    """Check every limit and turn the sub-goals into child tasks; raises SpawnRejected.
    ``available_micros``: what is left of a money budget (None: the parent has none)."""
    c = parent.submission.constraints
    if parent.depth + 1 > c.max_depth:
        raise SpawnRejected(
            f"{SPAWN_TOOL} refused: this task is at depth {parent.depth} and max_depth is {c.max_depth}; "
            "do the work yourself instead"
        )
    if len(spec.subagents) > c.max_fanout:
        raise SpawnRejected(
            f"{SPAWN_TOOL} refused: {len(spec.subagents)} sub-agents requested, max_fanout is {c.max_fanout}"
        )
    for i, sub in enumerate(spec.subagents):
        for name in sub.tools or []:
            if name not in c.tools:
                raise SpawnRejected(
                    f"{SPAWN_TOOL} refused: subagents[{i}] asks for tool {name!r}, which this task may not use"
                )
        if parent.submission.provider == "scripted" and sub.script is None:
            raise SpawnRejected(
                f"{SPAWN_TOOL} refused: subagents[{i}] needs a script (the scripted provider plays scripts)"
            )
        if parent.submission.provider != "scripted" and sub.script is not None:
            raise SpawnRejected(f"{SPAWN_TOOL} refused: subagents[{i}].script is only valid with the scripted provider")
        if sub.workspace == "parent" and not has_workspace(parent.submission.workspace, c.tools):
            raise SpawnRejected(f"{SPAWN_TOOL} refused: subagents[{i}].workspace: this task has no workspace to share")
        if isinstance(sub.script, str) and sub.script not in builtin_script_names():
            # The model wrote this name: like a script over HTTP, it may name a built-in script,
            # never a file on the worker (the loader would read any path it is given).
            raise SpawnRejected(
                f"{SPAWN_TOOL} refused: subagents[{i}].script: unknown script {sub.script[:200]!r}; "
                f"built-in scripts: {', '.join(builtin_script_names())} (or give the script inline)"
            )
    shares = _shares(spec, available)
    if available_micros is not None and min(available_micros * share // available for share in shares) < 1:
        raise SpawnRejected(f"{SPAWN_TOOL} refused: the money budget has ${Decimal(available_micros) / MILLION} left")
    now = now or time.time()
    remaining = int((parent.started_at or now) + c.timeout_seconds - now)
    if remaining < 1:
        raise SpawnRejected(f"{SPAWN_TOOL} refused: this task has no time left for sub-agents")
    plans = []
    for i, (sub, share) in enumerate(zip(spec.subagents, shares, strict=True)):
        deadline = min(sub.deadline_seconds or remaining, remaining)
        submission = TaskSubmission(
            goal=sub.goal,
            user=parent.submission.user,  # the tree acts for one user: a child names none of its own
            system=sub.system if sub.system is not None else parent.submission.system,
            provider=parent.submission.provider,
            model=parent.submission.model,
            # and the parent's fallbacks: a child with only the first model failed (or waited on
            # its open circuit) in the outage its parent's fallback answers; its holds are sized
            # on the dearest of them all, as its parent's are (``_holds._price``)
            fallbacks=list(parent.submission.fallbacks),
            script=sub.script,
            constraints=Constraints(
                max_tokens=share,
                # With a money budget, each child gets the part of what is left that its token
                # share is of the tokens left, at most a task's money cap (the rest stays).
                max_cost_usd=None
                if available_micros is None
                else Decimal(min(available_micros * share // available, micros(MAX_COST_USD))) / MILLION,
                max_steps=c.max_steps,
                timeout_seconds=deadline,
                tools=list(sub.tools if sub.tools is not None else c.tools),
                # A sub-agent asks and is denied as its parent is: a model cannot spawn its way
                # around a policy.
                tool_policies={
                    name: policy
                    for name, policy in c.tool_policies.items()
                    if name in (sub.tools if sub.tools is not None else c.tools)
                },
                max_output_tokens=c.max_output_tokens,
                max_depth=c.max_depth,
                max_fanout=c.max_fanout,
            ),
            priority=parent.submission.priority,
            metadata={"parent_id": parent.task_id, "spawn_id": tool_use_id},
            # the parent's pinned MCP tools the child may use: the same schemas, the same servers
            agent=parent.submission.agent,
            mcp_tools=[
                p
                for p in parent.submission.mcp_tools
                if p.qualified in (sub.tools if sub.tools is not None else c.tools)
            ],
            # the parent's memory stores, read-only: children run at once, and the parent, which
            # reads their results, is the one to write what the tree learnt
            memory=[a.model_copy(update={"access": "read_only"}) for a in parent.submission.memory],
            workspace=parent_workspace(parent) if sub.workspace == "parent" else None,
        )
        plans.append(ChildPlan(child_id_for(parent.task_id, tool_use_id, i), submission, share, deadline))
    return plans


def parent_workspace(parent: Task) -> WorkspaceSpec:
    """A child's workspace that starts as the parent's stands at the spawn (a spawn turn runs no
    workspace call, so that is the last committed step's): the same stored manifest, its
    content looked up under the parent (and wherever the parent looks), never copied; or the
    parent's own start while no step changed it (no base then: ``Workspaces.child_changes``
    measures the child's changes from that start). The parent's hosts, no more."""
    own = parent.submission.workspace
    hosts = list(own.allow_hosts) if own is not None else []
    if parent.workspace is not None:
        lookup = [f"task:{parent.task_id}", *lookup_of(own, parent.tenant)]
        return WorkspaceSpec(allow_hosts=hosts, base=WorkspaceBase(manifest=parent.workspace.manifest, lookup=lookup))
    if own is None:
        return WorkspaceSpec()
    if own.upload is not None:  # named as a base: the child's tenant is the parent's, but say where
        return WorkspaceSpec(
            allow_hosts=hosts, base=WorkspaceBase(manifest=own.upload, lookup=lookup_of(own, parent.tenant))
        )
    return own.model_copy(deep=True)


def _shares(spec: SpawnInput, available: int) -> list[int]:
    """Each child's share: the one it was given, or an even split of what is left. A share is
    the child's own budget, a task's, which holds at most ``MAX_TOKENS``: one asked for past it
    is refused naming the bound; an even split past it (a root raised beyond it: a raise adds
    without bound) is cut to it, the rest staying with the parent, as its money share is cut to
    ``MAX_COST_USD`` (``plan_children``). A child given more failed its own Constraints, and the
    spawn turn with them, for good."""
    asked = [s.token_share for s in spec.subagents]
    for i, share in enumerate(asked):
        if share is not None and share > MAX_TOKENS:
            raise SpawnRejected(
                f"{SPAWN_TOOL} refused: subagents[{i}].token_share is {share}; a sub-agent may have at most "
                f"{MAX_TOKENS} tokens"
            )
    fixed = sum(a for a in asked if a is not None)
    open_count = sum(1 for a in asked if a is None)
    if fixed > available:
        raise SpawnRejected(
            f"{SPAWN_TOOL} refused: token shares total {fixed}, but the budget has {available} tokens left"
        )
    each = min((available - fixed) // open_count, MAX_TOKENS) if open_count else 0
    shares = [a if a is not None else each for a in asked]
    if min(shares) < MIN_CHILD_SHARE:
        raise SpawnRejected(
            f"{SPAWN_TOOL} refused: a sub-agent would get {min(shares)} tokens (minimum {MIN_CHILD_SHARE}); "
            f"the budget has {available} tokens left"
        )
    return shares


def child_outcome(child: Task, *, timed_out: bool, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """One child's entry in the spawn result the parent's model reads; ``changes``: what a child
    that started from the parent's workspace changed in it (``Workspaces.child_changes``)."""
    result = child.result
    timed_out = timed_out or child.status is TaskStatus.TIMED_OUT  # the parent's or its own deadline
    if timed_out:
        result = "[timeout]" + (f" partial result: {result}" if result else "")
    elif result and len(result) > RESULT_PREVIEW_CHARS:
        result = (
            result[:RESULT_PREVIEW_CHARS] + f"... [{len(result)} chars; full result: GET /tasks/{child.task_id}/result]"
        )
    entry: dict[str, Any] = {
        "task_id": child.task_id,
        "goal": child.submission.goal[:200],
        "status": TaskStatus.TIMED_OUT.value if timed_out else child.status.value,
        "result": result,
        "tokens_used": child.tokens_in + child.tokens_out,
    }
    if child.error and not timed_out:
        entry["error"] = child.error.get("message")
    if changes is not None:
        entry["workspace_changes"] = changes
    return entry


def render_spawn_result(entries: list[dict[str, Any]]) -> str:
    done = sum(1 for e in entries if e["status"] == TaskStatus.SUCCEEDED.value)
    return json.dumps({"summary": f"{done} of {len(entries)} sub-agents succeeded", "subagents": entries}, indent=1)
