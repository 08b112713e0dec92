"""The shapes of the HTTP API, shared by the server (``http_api``), the Python client and the CLI.

Request bodies are strict (an unknown field is an error naming it); responses are read
leniently by the client (``extra="ignore"``), so a newer server may add fields without
breaking older clients. The OpenAPI document at ``/openapi.json`` is generated from these.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentq.core.agents import AgentSpec as AgentSpec  # the body of POST /agents, re-exported
from agentq.core.agents import AgentSummary as AgentSummary
from agentq.core.agents import AgentVersion as AgentVersion
from agentq.core.models import (
    MAX_GOAL_CHARS,
    MAX_MESSAGE_CHARS,
    FallbackNote,
    ModelChoice,
    Priority,
    Provider,
    Script,
    StrictModel,
    TaskStatus,
)
from agentq.core.models import TaskSubmission as TaskSubmission  # the body of POST /tasks, re-exported

# Limits a caller can rely on (also in the OpenAPI document as schema bounds).
MAX_BODY_BYTES = 256 * 1024  # larger request bodies answer 413
MAX_PAGE_SIZE = 100  # GET /tasks ?limit=
DEFAULT_PAGE_SIZE = 20
MAX_TRACE_PAGE = 200  # GET /tasks/{id}/trace ?limit=
MAX_EVENT_PAGE = 200  # GET /tasks/{id}/events ?limit=
DEFAULT_EVENT_PAGE = 100
DEFAULT_TRACE_PAGE = 100
TRACE_TEXT_CHARS = 16_000  # longer LLM texts and tool outputs in a trace page are cut (``truncated``)
MAX_NOTE_CHARS = 4_000
TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
MAX_CURSOR_CHARS = 1024  # a page cursor (?cursor= of GET /tasks and /trace); longer is 400 invalid_cursor
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"  # unpadded base64url: what the API writes
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]{1,255}$"  # visible ASCII
GOAL_PREVIEW_CHARS = 200


class ApiModel(BaseModel):
    """A response shape: unknown fields are ignored when a client reads one."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# ------------------------------------------------------------------ errors


class ErrorDetail(ApiModel):
    code: str = Field(description="stable, for scripts: validation_error, invalid_json, task_not_found, ...")
    message: str
    field: str | None = Field(default=None, description="the request field at fault, dotted (constraints.max_tokens)")


class ErrorResponse(ApiModel):
    error: ErrorDetail


# ----------------------------------------------------------- request bodies


class DecisionRequest(StrictModel):
    note: str = Field(default="", max_length=MAX_NOTE_CHARS, description="read by the agent with the decision")


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
        "one), else 422 naming at_step; the source must be a root task",
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
    """The task's token budget: for a root, the whole tree's (sub-agents included)."""

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

    tool_use_id: str
    name: str
    input: dict[str, Any]


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


class TaskView(ApiModel):
    task_id: str
    status: TaskStatus
    goal: str
    agent: str | None = Field(default=None, description="the agent version the task runs (name@version)")
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
    pending_calls: list[PendingCall] = Field(
        default_factory=list,
        description="while paused for approval: the turn's tool calls (request_approval and any requested "
        "alongside it, which run only after the decision), with their exact input",
    )
    parent_id: str | None
    root_id: str
    depth: int
    forked_from: dict[str, Any] | None
    depends_on: list[str] = Field(default_factory=list, description="tasks this one runs after (blocked until then)")
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


class MessageRequest(StrictModel):
    """A person's message to a task, and optionally more budget for the turns it starts."""

    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="what the agent reads as your turn")
    add_tokens: int = Field(
        strict=True, default=0, ge=0, le=1_000_000_000, description="raise the task's token cap first"
    )
    add_steps: int = Field(strict=True, default=0, ge=0, le=10_000, description="raise max_steps first")
    add_usd: Decimal = Field(
        default=Decimal(0), ge=0, le=1_000_000, decimal_places=6, description="raise the money cap first"
    )


class MessageAccepted(ApiModel):
    task_id: str
    message_id: str
    seq: int = Field(description="the message's place among the task's messages: the order the agent reads them in")
    status: TaskStatus = Field(description="the task's status once it took the message")
    reopened: bool = Field(description="the message continued an answered or interrupted task (queued to run again)")
    interrupting: bool = Field(description="the task's double_texting policy is interrupt: the turn in flight stops")
    replayed: bool = Field(description="the same Idempotency-Key had already sent this message: nothing new was sent")


class MessageView(ApiModel):
    message_id: str
    seq: int
    text: str
    sent_at: float
    delivered: bool = Field(description="the agent has it in its conversation (a step committed it)")


class MessageList(ApiModel):
    task_id: str
    messages: list[MessageView]


class InterruptResult(ApiModel):
    task_id: str
    status: TaskStatus = Field(description="the task's status when the interrupt was recorded (idle: already stopped)")


class CloseResult(ApiModel):
    task_id: str
    closed: bool


class CancelResult(ApiModel):
    task_id: str
    cancelled: list[str] = Field(description="the task and the sub-agents this request cancelled")


class TenantUsage(ApiModel):
    tenant: str
    running: int = Field(description="tasks holding one of the tenant's running slots")
    waiting: int = Field(
        description="tasks waiting queued for a slot of the tenant's or of the fleet (counted up to 1,000; a "
        "waiter cancelled meanwhile is not counted)"
    )
    max_running: int | None = Field(description="the tenant's running limit; null: unlimited")
    weight: int = Field(
        1, description="the tenant's weight in a full fleet's share (agentq tenants limit TENANT --weight N; default 1)"
    )


class CallerUsage(TenantUsage):
    operator: bool = Field(
        description="whether the caller's key is an operator's: it may read GET /usage/tenants (the console asks "
        "only then)"
    )


class SpendView(ApiModel):
    """What the caller's task trees spent over a window, by their ledgers (ARCHITECTURE 4)."""

    since: float = Field(description="the window's start: trees whose root task was created since then")
    trees: int = Field(description="root tasks counted, each with its sub-agents")
    known_tokens: int = Field(description="usage the provider reported for the trees' calls")
    unknown_tokens: int = Field(
        description="tokens counted at the holds of calls whose outcome no worker learned (a worker killed mid-call, "
        "a reply cut in the middle): at most what they were allowed; whether to bill them is the deployment's choice"
    )
    known_usd: str
    unknown_usd: str
    complete: bool = Field(description="false: the window held more trees than one read counts (the newest are)")


class TenantsUsage(ApiModel):
    tenants: list[TenantUsage] = Field(
        description="every tenant that holds running slots or has a limit of its own, by name"
    )


class BreakerView(ApiModel):
    provider: str
    model: str
    state: Literal["closed", "open", "half_open"] = Field(
        description="closed: calls go; open: calls are deferred (tasks wait, not fail) until probe_after; "
        "half_open: a probe call is out, and its outcome closes or reopens it"
    )
    failures: int = Field(description="failed calls (each after its retries) counted in the current window")
    window_started_at: float | None = Field(description="when the current window of failures started")
    opened_at: float | None = Field(description="when the circuit last opened (null: closed since)")
    probe_after: float | None = Field(description="open: when a probe call may go (opened_at + the cooldown)")
    slowed_until: float | None = Field(
        description="a 429's retry-after: the fleet makes no call to this model before then"
    )


class BreakersView(ApiModel):
    breakers: list[BreakerView] = Field(
        description="each provider/model the fleet has recorded a failure or a slow-down for, by name; a model "
        "never listed has a closed circuit"
    )
    failures_to_open: int = Field(description="failed calls within window_seconds that open a circuit")
    window_seconds: float
    cooldown_seconds: float = Field(description="how long a circuit stays open before a probe")


class Health(ApiModel):
    status: Literal["ok"]
    version: str


# ------------------------------------------------------------- dead letters


class DeadLetterView(ApiModel):
    tier: Priority
    message_id: str
    task_id: str
    task_status: TaskStatus
    reason: str = Field(description="why agentq dead-lettered it (or that SQS moved it after maxReceiveCount)")
    sent_at: float = Field(description="when the message was first sent (epoch seconds)")


class DeadLetterPage(ApiModel):
    dead_letters: list[DeadLetterView] = Field(
        description="this tenant's dead letters, by tier then age; messages that name no task of this tenant "
        "(another tenant's, or unreadable ones) are not listed"
    )


class RedriveResult(ApiModel):
    tier: Priority
    moved: int = Field(description="messages moved back to the tier's queue")
    task_ids: list[str] = Field(description="the tasks they name, which resume at their checkpoint")


# -------------------------------------------------------------------- trace


class TransitionEvent(ApiModel):
    type: Literal["transition"] = "transition"
    at: float
    event: Literal[
        "created",
        "forked",
        "blocked",
        "claimed",
        "approval_requested",
        "approval_decided",
        "spawned",
        "retry_scheduled",
        "follow_up",
        "interrupt_requested",
        "interrupted",
        "fallback",
        "finished",
    ]
    status: TaskStatus | None = Field(default=None, description="the status the task entered")
    worker: str | None = None
    epoch: int | None = None
    detail: dict[str, Any] = Field(
        default_factory=dict,
        description="claimed: `takeover` (it took over a run in progress: a resume; false: a new run of a task "
        "queued again); follow_up (a message reopened the answered or interrupted task), interrupt_requested "
        "and interrupted (the task stopped, idle): `after_step`, and the message's number `message`; fallback (a "
        "fallback took over at `step`): `from` and `to` (provider, model) and `reason`",
    )


class LLMTokens(ApiModel):
    input: int
    output: int
    cache_creation: int
    cache_read: int
    total: int


class LLMCallEvent(ApiModel):
    type: Literal["llm_call"] = "llm_call"
    at: float = Field(description="commit time (an orphan call: its end)")
    step: int
    epoch: int
    model: str
    started_at: float
    duration_ms: int
    tokens: LLMTokens
    reserved_tokens: int
    cost_usd: str
    stop_reason: str | None
    attempts: int
    text: str = Field(description="the assistant text of the turn")
    tool_calls: list[str] = Field(description="names of the tools it asked for")
    batched: bool = Field(default=False, description="answered through the Message Batches API (economy, half price)")
    purpose: Literal["turn", "compaction"] = Field(
        default="turn",
        description="turn: the agent's own turn; compaction: a summary of the conversation so far, which the "
        "conversation goes on from (its text is the summary)",
    )
    orphan: bool = Field(
        description="a call whose step was never committed (its worker lost the lease, or the task was "
        "interrupted while it answered); paid for all the same"
    )
    provider: str | None = Field(default=None, description="the provider that answered (null: recorded before it was)")
    fallback_from: FallbackNote | None = Field(
        default=None,
        description="a fallback took over at this call: the model the turn wanted first (provider, model) and why "
        "it did not answer (reason: circuit_open, or its call's error code after the retries)",
    )
    orphan_reason: Literal["lease_lost", "interrupted", "timed_out"] | None = Field(
        default=None,
        description="an orphan's why: lease_lost (its worker lost the task to another), interrupted (a person "
        "interrupted the task while the model answered: the answer was discarded), timed_out (the task's timeout "
        "cut the call, whose answer came after all); null for a committed call",
    )
    truncated: bool


class ToolCallEvent(ApiModel):
    type: Literal["tool_call"] = "tool_call"
    at: float = Field(description="commit time of the tool results step")
    step: int
    epoch: int
    tool_use_id: str
    name: str
    input: dict[str, Any] | None
    output: str
    is_error: bool
    status: str = Field(description="ok, error, timeout, unknown_outcome (side effect of a dead worker), replayed")
    side_effects: bool
    started_at: float
    duration_ms: int
    truncated: bool


class MessageEvent(ApiModel):
    type: Literal["message"] = "message"
    at: float = Field(description="commit time of the step that delivered the message into the conversation")
    step: int
    epoch: int
    message_id: str
    seq: int
    text: str
    sent_at: float
    truncated: bool


TraceEvent = Annotated[TransitionEvent | LLMCallEvent | ToolCallEvent | MessageEvent, Field(discriminator="type")]


class TracePage(ApiModel):
    task_id: str
    events: list[TraceEvent]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class TaskEvent(ApiModel):
    """One event of a task's stream (``api/events.py`` lists the types)."""

    id: str | None = Field(description="the cursor after this event (send as Last-Event-ID or ?after=); null: "
                           "uncommitted (a live text delta), which moves no cursor")  # fmt: skip
    type: str = Field(description="task.created, task.status, agent.message, agent.tool_results, task.retry, "
                      "approval.requested, approval.decided, task.spawned, budget.raised, message.received, "
                      "user.message, task.interrupt_requested, conversation.closed, agent.message_delta")  # fmt: skip
    task_id: str
    tree_path: str | None = Field(default=None, description="in a tree's stream, the task's place in the tree: "
                                  "'' the root, '2' its second sub-agent, '2.1' that one's first; null otherwise")  # fmt: skip
    at: float
    committed: bool
    data: dict[str, Any]


class EventPage(ApiModel):
    task_id: str
    events: list[TaskEvent] = Field(description="in commit order (a tree: each task's in its commit order, merged "
                                    "by time, a sub-agent's after the spawn that made it)")  # fmt: skip
    next_cursor: str | None = Field(description="pass as ?after= for what follows; null before any event")
    done: bool = Field(description="every watched task has ended and no event follows")


class AgentCreated(ApiModel):
    created: bool = Field(description="false: the latest version already was this definition")
    agent: AgentVersion


class AgentList(ApiModel):
    agents: list[AgentSummary]


class AgentVersions(ApiModel):
    name: str
    versions: list[AgentVersion] = Field(description="newest first")


class WebhookSecret(ApiModel):
    secret: str = Field(description="the HMAC-SHA256 key of this tenant's callbacks")


class ScheduleView(ApiModel):
    name: str
    expression: str
    overlap: Literal["skip", "allow"]
    submission: dict[str, Any]
    created_at: float
    next_fire_at: float = Field(
        description="when it fires next (UTC seconds; the local scheduler's, in AWS the Scheduler's)"
    )
    last_task_id: str | None
    fired: int = Field(description="fires that submitted a task")
    skipped: int = Field(description="fires skipped by the overlap policy")


class ScheduleList(ApiModel):
    schedules: list[ScheduleView]
