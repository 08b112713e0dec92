"""A task's shapes: the bodies of its actions (approve, reject, budget, fork) and what the API
answers about it (accepted, its view with budget, latency and retry, list pages, its result,
a cancel)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from agentq.api.models.base import (
    GOAL_PREVIEW_CHARS,
    MAX_NOTE_CHARS,
    MAX_TOOL_USE_ID_CHARS,
    ApiModel,
)
from agentq.core.models import (
    MAX_GOAL_CHARS,
    ModelChoice,
    Priority,
    Provider,
    Script,
    StrictModel,
    TaskStatus,
)

# ----------------------------------------------------------- request bodies


class DecisionRequest(StrictModel):
    """A person's decision of the call a paused task holds. ``tool_use_id`` names the call the
    person was shown (the view's ``pending_tool_use_id``): the task may have moved on to another
    held call since (a second reviewer's click, a double click, a retried request), and a
    decision naming the call decides that call or nothing (409 naming ``tool_use_id``). Without
    it, whatever is pending when the request lands is decided (kept for older clients)."""

    note: str = Field(default="", max_length=MAX_NOTE_CHARS, description="read by the agent with the decision")
    tool_use_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TOOL_USE_ID_CHARS,
        description="the held call this decides (the view's pending_tool_use_id); another call held by then is "
        "409 illegal_transition naming tool_use_id, nothing changed. Omitted: whatever is pending when it lands",
    )


class BudgetRequest(StrictModel):
    """At least one amount above 0 (all 0 is 422 naming add_tokens); ``add_usd`` only for a task
    with ``constraints.max_cost_usd``; a root task only (a sub-agent's share is its parent's)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # the rule "not all 0", for the document (raise_budget refuses with the reason)
            "anyOf": [
                {"properties": {"add_tokens": {"minimum": 1}}, "required": ["add_tokens"]},
                {"properties": {"add_steps": {"minimum": 1}}, "required": ["add_steps"]},
                {"properties": {"add_usd": {"not": {"const": 0}}}, "required": ["add_usd"]},
            ]
        },
    )

    add_tokens: int = Field(
        strict=True, default=0, ge=0, le=1_000_000_000, description="raise the root token cap by this much"
    )
    add_steps: int = Field(strict=True, default=0, ge=0, le=10_000, description="raise max_steps by this much")
    add_usd: Decimal = Field(
        default=Decimal(0), ge=0, le=1_000_000, decimal_places=6, description="raise the root money cap by this much"
    )


class ConstraintsPatch(StrictModel):
    """Constraints to change on a fork; the others are the source task's."""

    max_tokens: int | None = Field(strict=True, default=None, ge=1, le=1_000_000_000)
    max_steps: int | None = Field(strict=True, default=None, ge=1, le=10_000)
    timeout_seconds: int | None = Field(strict=True, default=None, ge=1, le=24 * 3600)
    tools: list[str] | None = Field(default=None, max_length=64)
    max_output_tokens: int | None = Field(strict=True, default=None, ge=1, le=128_000)
    max_depth: int | None = Field(strict=True, default=None, ge=0, le=10)
    max_fanout: int | None = Field(strict=True, default=None, ge=1, le=100)


class ForkRequest(StrictModel):
    at_step: int = Field(
        strict=True,
        ge=0,
        le=1_000_000,
        description="copy the source's committed steps 1..at_step: at most the source's step (its last committed "
        "one), and not the model's turn asking for tool calls (a fork there would make them again: fork at the next "
        "step, which made them, or the one before), else 422 naming at_step; a fork at the model's answer ends "
        "as that answer ended its source (succeeded with it, or failed: output_truncated for one cut off at the "
        "output limit, model_refused for a refusal, context_window_exceeded, model_output_malformed), and a message sent to it goes on "
        "from there; the source must be a root task",
    )
    provider: Provider | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    script: Script | str | None = None
    system: str | None = Field(default=None, max_length=MAX_GOAL_CHARS)
    constraints: ConstraintsPatch | None = None
    priority: Priority | None = None
    metadata: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None, max_length=32
    )

    def overrides(self) -> dict[str, Any]:
        """What the fork changes, in the submission's shape."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"at_step"})


# ---------------------------------------------------------------- responses


class TaskLinks(ApiModel):
    self_: str = Field(alias="self")
    result: str
    trace: str
    cancel: str

    @classmethod
    def for_task(cls, task_id: str) -> TaskLinks:
        base = f"/tasks/{task_id}"
        return cls(self_=base, result=f"{base}/result", trace=f"{base}/trace", cancel=f"{base}/cancel")


class TaskAccepted(ApiModel):
    task_id: str
    status: TaskStatus
    created: bool = Field(description="false when an Idempotency-Key replay returned an earlier task")
    links: TaskLinks


class TokenUsage(ApiModel):
    input: int = Field(description="this task's input tokens (cache reads and writes included)")
    output: int
    total: int
    budget: int = Field(description="the token cap of this task's budget (the whole tree's, for a root)")


class BudgetView(ApiModel):
    """The task's token budget: for a root, the whole tree's (sub-agents included). What a
    sub-agent has spent counts in ``used`` (and ``cost_usd``) as it spends it, out of the share
    its parent reserved for it, not only once the parent folds it in when it next runs (a
    sub-agent's own sub-agents: once it has folded them)."""

    cap: int
    used: int = Field(description="known + unknown: what the cap counts as spent")
    known: int = Field(description="the part of used the provider reported for the calls")
    unknown: int = Field(
        description="the part of used whose calls' outcomes are unknown (a worker killed mid-call, a reply cut "
        "in the middle): each such call's hold, at most; a call reported later moves from here to known"
    )
    reserved: int
    available: int
    cost_usd: str = Field(description="what the known calls cost")
    tokens_in: int = Field(
        default=0, description="the known calls' input tokens (for a root, the whole tree's: its sub-agents' too)"
    )
    tokens_out: int = Field(default=0, description="the known calls' output tokens (likewise)")
    money: MoneyView | None = Field(default=None, description="the money budget, when the task has max_cost_usd")


class MoneyView(ApiModel):
    """The money budget in US dollars (the ledger counts millionths): the same invariant as tokens."""

    cap_usd: str
    used_usd: str = Field(description="what the calls cost, each rounded up to the millionth: known + unknown")
    known_usd: str = Field(description="the part of used_usd the provider reported")
    unknown_usd: str = Field(description="the part of used_usd whose calls' outcomes are unknown (their holds)")
    reserved_usd: str = Field(description="held for calls in flight, at the most each can cost")
    available_usd: str


class LapsedHoldView(ApiModel):
    """Tokens (and dollars) still reserved for a call its worker started before losing the
    lease: that call may yet complete and be charged, so the hold is kept until the latest it
    could, then returned. Why a finished task can show a reservation for a while."""

    tokens: int
    usd: str = Field(description="the money held with it (0 without a money cap)")
    step: int = Field(description="the step the call was for")
    epoch: int = Field(description="the lease epoch of the worker that lost it")
    until: float | None = Field(description="when the call can no longer complete and the hold is returned")


class ChildrenSummary(ApiModel):
    total: int
    by_status: dict[str, int]
    task_ids: list[str] = Field(description="the first 100 children, in spawn order")


class LatencyView(ApiModel):
    pickup_seconds: float | None = Field(description="submission to first claim")
    resumes: int = Field(
        description="claims that took over a run in progress (a worker that died or stalled, a continuation, "
        "a retried attempt); a follow-up, an approval, a budget raise or a redrive starts a new run instead"
    )
    last_resume_gap_seconds: float | None = Field(
        description="previous holder's last heartbeat to the latest claim, when that claim was a resume"
    )
    run_seconds: float | None = Field(
        description="first claim to finish; null until the task ends (measure a running task from started_at)"
    )
    total_seconds: float | None = Field(
        description="submission to finish; null until the task ends (measure a running task from created_at)"
    )


class PendingCall(ApiModel):
    """A tool call of the turn that waits on a person's decision, exactly as the model asked for it."""

    tool_use_id: str = Field(description="the id the model gave the call (the id its result carries)")
    name: str
    input: dict[str, Any]
    held: bool = Field(
        default=False,
        description="the call the decision decides: pending_tool_use_id names it (its tool_use_id, or "
        "agentq-<step>-<tool_use_id> when the model gave it an id an earlier call of the task had)",
    )


class RetryView(ApiModel):
    """A retryable failure being retried: what failed, which attempt that was, when the next is."""

    scope: Literal["call", "delivery", "deferral"] = Field(
        description="call: the worker retries the model call; delivery: the queue brings the task back later; "
        "deferral: the task was put off before its call (error.code: circuit_open, slowed_down, rate_limited, "
        "call_in_flight, unknown_usage: the budget is reached only by calls whose outcome is unknown) and comes "
        "back at next_attempt_at"
    )
    attempt: int = Field(description="the attempt (of the call, or delivery of the task) that failed")
    max_attempts: int
    error: dict[str, Any] = Field(description="code, message, status_code of the last failure")
    failed_at: float
    next_attempt_at: float


class GradeView(ApiModel):
    """The latest grade of a task's answer against its outcome (``core.engine._grade``), and
    what grading cost the task so far (counted in its tokens and cost too, shown apart here)."""

    attempt: int = Field(description="which answer of the round was graded (1: the first)")
    max_attempts: int
    score: float | None = Field(description="0 to 1; null when a grader failed (error)")
    bar: float
    passed: bool
    feedback: str = Field(description="what the graders said; below the bar, the agent's next message")
    error: dict[str, Any] | None = Field(description="code, message: a grader that failed (the answer is kept)")
    step: int = Field(description="the grade's step")
    grades: int = Field(description="answers of the task graded so far")
    tokens_in: int = Field(description="the grading model's input tokens over the task's grades")
    tokens_out: int
    cost_usd: str = Field(description="the grading model's cost over the task's grades")
    online: str | None = Field(
        default=None,
        description="the alias whose online evaluation sampled the task: this grade observed, it did not gate",
    )


class TaskView(ApiModel):
    task_id: str
    status: TaskStatus
    user: str | None = Field(
        default=None, description="the end user the task (and its tree) acts for; null: none named"
    )
    goal: str
    agent: str | None = Field(default=None, description="the agent version the task runs (name@version)")
    overridden: list[str] = Field(
        default_factory=list,
        description="what of the fields its agent's version defines a fork replaced (provider, model, system, "
        "script, constraints.tools, ...): the task runs `agent` but for these; empty: the version whole",
    )
    provider: str = Field(description="the task's own provider (a fallback that took over: answered_by)")
    model: str = Field(description="the task's own model (a fallback that took over: answered_by)")
    fallbacks: list[ModelChoice] = Field(
        default_factory=list, description="the models the task falls back to, in order (submission.fallbacks)"
    )
    answered_by: ModelChoice | None = Field(
        default=None,
        description="set once a fallback took over: the provider and model that answer the task's calls now "
        "(null: its own model answers)",
    )
    priority: str
    step: int = Field(description="last committed step (LLM and tool steps)")
    llm_steps: int
    max_steps: int = Field(description="LLM turns allowed")
    tokens: TokenUsage
    budget: BudgetView | None
    cost_usd: str = Field(description="this task's own LLM cost")
    result: str | None
    error: dict[str, Any] | None
    grade: GradeView | None = Field(
        default=None, description="with an outcome: the latest grade of its answer (null: none yet, or no outcome)"
    )
    activity: str | None = Field(description="what the task is doing now, in words")
    live_text: str | None = Field(
        default=None,
        description="while a long (streamed) call is in flight: the tail of its text as of the last heartbeat; "
        "best effort, only committed steps are durable",
    )
    retry: RetryView | None = Field(default=None, description="set while a retryable failure is being retried")
    lapsed_holds: list[LapsedHoldView] = Field(
        default_factory=list,
        description="reservations kept for calls of workers that lost the lease (part of budget.reserved)",
    )
    pending_approval: str | None = Field(description="the question a paused task waits on")
    pending_approver: Literal["tenant", "user"] | None = Field(
        default=None,
        description="who may decide it: tenant (only the tenant's API keys, its operator; an end user's token is 403 "
        "not_the_approver: a policy rule's ask by default, an ask_tenant tool's, a cap's soft threshold) or user (the task's end user's "
        "token too); null when nothing is pending",
    )
    pending_tool_use_id: str | None = Field(
        default=None,
        description="the name of the held call a paused task waits on: send it as tool_use_id with approve or reject, "
        "so the decision is of this call only. The call's tool_use_id (the pending_calls entry marked held), or "
        "agentq-<step>-<tool_use_id> when the model gave it an id an earlier call of the task had (that id names "
        "both, so a decision naming it decides neither), or agentq-cap-<scope>-<window>-<period> for a cap's soft "
        "threshold; null when nothing is pending",
    )
    pending_calls: list[PendingCall] = Field(
        default_factory=list,
        description="while paused for approval: the turn's tool calls (request_approval and any requested "
        "alongside it, which run only after the decision), with their exact input",
    )
    parent_id: str | None
    root_id: str
    depth: int
    forked_from: dict[str, Any] | None
    fork_at_step: int | None = Field(
        default=None,
        description="the last step a fork may copy up to (POST /tasks/{id}/fork's at_step): the task's step, or the "
        "one before when that is the model's turn asking for tool calls (a paused task's held calls, a waiting "
        "parent's spawn), which a fork refuses; null for a sub-agent, which is not forked",
    )
    depends_on: list[str] = Field(default_factory=list, description="tasks this one runs after (blocked until then)")
    has_workspace: bool = Field(
        default=False, description="it works in files: GET /tasks/{id}/files lists them (a workspace start or tool)"
    )
    children: ChildrenSummary
    metadata: dict[str, str]
    created_at: float
    updated_at: float | None
    started_at: float | None
    finished_at: float | None
    latency: LatencyView
    links: TaskLinks


class TaskSummary(ApiModel):
    task_id: str
    status: TaskStatus
    user: str | None = Field(
        default=None, description="the end user the task (and its tree) acts for; null: none named"
    )
    goal: str = Field(description=f"the first {GOAL_PREVIEW_CHARS} characters")
    priority: str
    step: int
    tokens_total: int
    cost_usd: str
    parent_id: str | None
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: float
    finished_at: float | None
    links: TaskLinks


class TaskPage(ApiModel):
    tasks: list[TaskSummary]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class TaskResult(ApiModel):
    task_id: str
    status: TaskStatus
    complete: bool = Field(description="true when the task succeeded; otherwise result is partial (or null)")
    result: str | None
    output: Any = Field(
        default=None, description="with an output_schema: the answer, as JSON that validated against it"
    )
    error: dict[str, Any] | None
    finished_at: float | None


class CancelResult(ApiModel):
    task_id: str
    cancelled: list[str] = Field(description="the task and the sub-agents this request cancelled")
