"""Pydantic models that cross a boundary: submissions, task state, steps, conversation blocks.

Everything a worker persists or a caller sends is one of these, so validation errors name
the offending field and the same shapes serve the store, the engine and (later) the API.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from agentq.core.memory import MAX_MEMORY_ATTACHMENTS, MemoryAttachment, unique_stores
from agentq.core.reservation import Reservation, Seen
from agentq.core.status import TERMINAL_STATUSES as TERMINAL_STATUSES
from agentq.core.status import TaskStatus as TaskStatus
from agentq.core.workspace import WorkspaceRef, WorkspaceSpec

MAX_TIMEOUT_SECONDS = 24 * 3600
MAX_GOAL_CHARS = 20_000


# The one table of legal transitions. The store turns the "from" side into a DynamoDB
# condition, so an illegal transition is refused by the database, not by caller discipline.
# cost_exceeded -> queued is the budget-raise resume; failed -> queued is a DLQ redrive.
ALLOWED_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.BLOCKED: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED}),
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    TaskStatus.RUNNING: frozenset(
        {
            TaskStatus.WAITING,
            TaskStatus.PAUSED,
            TaskStatus.QUEUED,
            TaskStatus.IDLE,
            *TERMINAL_STATUSES,
        }
    ),
    TaskStatus.WAITING: frozenset(
        {TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED, TaskStatus.TIMED_OUT}
    ),
    TaskStatus.PAUSED: frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.TIMED_OUT}),
    TaskStatus.IDLE: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.TIMED_OUT}),
    TaskStatus.SUCCEEDED: frozenset({TaskStatus.QUEUED}),  # a follow-up message continues the conversation
    TaskStatus.CANCELLED: frozenset(),
    TaskStatus.TIMED_OUT: frozenset(),
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED}),
    TaskStatus.COST_EXCEEDED: frozenset({TaskStatus.QUEUED}),
}


# What only a person's message leaves (``storage.messages``): an answered or interrupted
# conversation goes on. A generic ``transition`` never takes these edges.
REOPENED_BY_MESSAGE = frozenset({TaskStatus.SUCCEEDED, TaskStatus.IDLE})


def sources_of(target: TaskStatus) -> list[TaskStatus]:
    """Statuses from which ``target`` may be entered."""
    return [src for src, dsts in ALLOWED_TRANSITIONS.items() if target in dsts]


def unique_tool_names(tools: list[str]) -> list[str]:
    """A pydantic validator for a tool allowlist (submissions and agents)."""
    if len(set(tools)) != len(tools):
        raise ValueError("tool names must be unique")
    return tools


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


ToolPolicy = Literal["allow", "ask", "deny"]
DoubleTexting = Literal["queue", "interrupt", "reject"]
MAX_MESSAGE_CHARS = 32_000  # a person's message to a task (POST /tasks/{id}/messages)
ApprovalDefault = Literal["reject", "approve"]
Effort = Literal["low", "medium", "high", "xhigh", "max"]
AGENT_REF_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}(@[1-9][0-9]{0,8})?$"  # name, or name@version
DEFAULT_MODEL = "claude-sonnet-4-6"  # a submission that names none; `agentq run` uses it too


class Constraints(StrictModel):
    """Hard limits of one task. ``max_tokens`` is the root budget when the task is a root.

    Numbers are strict (``strict=True``), as in every request body's model: pydantic's lax mode
    took a JSON ``true`` for 1 (``max_steps: true`` ran one turn) and ``"5"`` for 5."""

    max_tokens: int = Field(strict=True, default=200_000, ge=1, le=1_000_000_000)
    max_cost_usd: Decimal | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        decimal_places=6,
        description="the most the task (its sub-agents included) may spend, in US dollars, priced by the "
        "deployment's price table: reserved before each call at the most it can cost, settled at what it did",
    )
    max_steps: int = Field(strict=True, default=50, ge=1, le=10_000, description="LLM turns allowed")
    timeout_seconds: int = Field(strict=True, default=3600, ge=1, le=MAX_TIMEOUT_SECONDS)
    tools: list[str] = Field(default_factory=list, max_length=64, description="tool allowlist")
    max_output_tokens: int = Field(strict=True, default=4096, ge=1, le=128_000, description="per LLM call")
    max_depth: int = Field(strict=True, default=3, ge=0, le=10, description="sub-agent nesting allowed below the root")
    max_fanout: int = Field(strict=True, default=10, ge=1, le=100, description="children per spawn_subagents call")
    tool_policies: dict[str, ToolPolicy] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "per tool of `tools`: allow (the default), ask (each call waits for a person's approve or "
            "reject before it runs; a rejected call never runs) or deny (never offered, never run)"
        ),
    )
    approval_timeout_seconds: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="an approval (an `ask` tool's or request_approval's) undecided this long takes "
        "`approval_default`; unset: it waits for a person (or the task's timeout)",
    )
    approval_default: ApprovalDefault = Field(
        default="reject", description="the decision a timed-out approval takes (reject: the call never runs)"
    )
    context_threshold: float = Field(
        strict=True,
        default=0.7,
        ge=0.1,
        le=0.95,
        description="share of the model's context window past which old tool results are cleared from what is "
        "sent (they stay in the steps; the model can recall them)",
    )
    keep_tool_results: int = Field(
        strict=True, default=5, ge=0, le=1000, description="tool results never cleared: the latest"
    )
    economy: bool = Field(
        default=False,
        description="send each LLM turn through the provider's Message Batches API at half price: the task waits, "
        "holding no compute, until the turn's result is in (minutes, at most 24 hours); Anthropic only",
    )
    compaction: Literal["summary", "native", "off"] = Field(
        default="summary",
        description="when clearing old tool results is not enough: summary (a compaction call writes a summary "
        "the conversation goes on from, committed as its own step), native (Anthropic's server-side compaction, "
        "compact_20260112: its compaction block is kept in the step and sent back) or off (sent as it is)",
    )
    thinking_budget_tokens: int | None = Field(
        strict=True,
        default=None,
        ge=1024,
        le=128_000,
        description="extended thinking: output tokens per call the model may think with (below max_output_tokens)",
    )
    effort: Effort | None = Field(
        default=None, description="how much effort the model puts into each response (the API's output_config.effort)"
    )

    @model_validator(mode="after")
    def _thinking_fits(self) -> Constraints:
        if self.thinking_budget_tokens is not None and self.thinking_budget_tokens >= self.max_output_tokens:
            raise ValueError(
                f"thinking_budget_tokens: {self.thinking_budget_tokens} must be below max_output_tokens "
                f"({self.max_output_tokens}), which it is part of"
            )
        return self

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, tools: list[str]) -> list[str]:
        return unique_tool_names(tools)


class ScriptToolCall(StrictModel):
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ScriptTurn(StrictModel):
    """One assistant turn of a scripted conversation: some text, then tool calls or nothing."""

    text: str = ""
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    latency_seconds: float = Field(strict=True, default=0.0, ge=0, le=60)

    @model_validator(mode="after")
    def _not_empty(self) -> ScriptTurn:
        if not self.text and not self.tool_calls:
            raise ValueError("a turn needs text or tool_calls")
        return self


class Script(StrictModel):
    """A declared conversation for the scripted provider; the last turn is the answer."""

    turns: list[ScriptTurn] = Field(min_length=1, max_length=10_000)


Provider = Literal["anthropic", "bedrock", "bedrock-converse", "openai", "scripted"]
Priority = Literal["high", "normal", "low"]
MAX_FALLBACKS = 4


class ModelChoice(StrictModel):
    """A model to fall back to: another provider, or another model of the same one."""

    provider: Literal["anthropic", "bedrock", "bedrock-converse", "openai"]
    model: str = Field(min_length=1, max_length=200)


def distinct_fallbacks(provider: str, model: str, fallbacks: list[ModelChoice]) -> None:
    """A fallback names neither the primary model nor an earlier fallback (pydantic validator helper)."""
    seen = {(provider, model)}
    for i, choice in enumerate(fallbacks):
        if (choice.provider, choice.model) in seen:
            raise ValueError(f"fallbacks: [{i}] {choice.provider}/{choice.model} is named twice (the model, or before)")
        seen.add((choice.provider, choice.model))


MCP_SERVER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,23}$"


class McpToolPin(StrictModel):
    """One tool of an MCP server as listed when an agent version was created: the schema the
    model is shown and the server's read-only hint, pinned so every run of the version sees
    the same tool whatever the server lists later."""

    server: str = Field(pattern=MCP_SERVER_PATTERN)
    name: str = Field(min_length=1, max_length=128)
    description: str = Field(default="", max_length=8000)
    input_schema: dict[str, Any]
    read_only: bool = Field(default=False, description="readOnlyHint: may run again on resume; else at most once")

    @property
    def qualified(self) -> str:
        """The name the model calls it by (server and tool, so two servers never collide)."""
        return f"mcp__{self.server}__{self.name}"


NotifyEvent = Literal["succeeded", "failed", "cancelled", "cost_exceeded", "timed_out", "idle", "message_received"]
TASK_ENDS: tuple[NotifyEvent, ...] = ("succeeded", "failed", "cancelled", "cost_exceeded", "timed_out")


class Notify(StrictModel):
    """Where and when to call back: an HTTPS POST signed for the tenant (``core.webhooks``)."""

    url: str = Field(min_length=8, max_length=2048, description="https:// URL to POST the task's end to")
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(TASK_ENDS),
        min_length=1,
        description="what to call back for (default: every end): the ends, and for a conversation `idle` (the "
        "agent stopped after an interrupt and waits for a message) and `message_received`",
    )


ConcurrencyConflict = Literal["queue", "cancel_running", "skip"]
MAX_CONCURRENCY_KEY_CHARS = 128


class Concurrency(StrictModel):
    """At most ``limit`` running tasks of the tenant per ``key`` (``storage.running_slots``):
    for agents that webhooks and schedules start, which must not run twice at once for the
    same customer. ``on_conflict`` says what a task that finds the key full does: ``queue``
    (wait ``queued`` for a slot), ``skip`` (end ``cancelled`` at once, code
    ``concurrency_skipped``), ``cancel_running`` (cancel the tasks running under the key, then
    take a slot as they stop)."""

    key: str = Field(min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS)
    limit: int = Field(strict=True, default=1, ge=1, le=10_000)
    on_conflict: ConcurrencyConflict = "queue"


class TaskSubmission(StrictModel):
    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS)
    agent: str | None = Field(
        default=None,
        pattern=AGENT_REF_PATTERN,
        description="an agent definition, `name` (its latest version) or `name@version`; the task pins the "
        "version. The agent sets provider, model, system, script, tools and tool policies; the submission may not",
    )
    system: str | None = Field(default=None, max_length=MAX_GOAL_CHARS)
    provider: Provider = "scripted"
    model: str = Field(default=DEFAULT_MODEL, min_length=1, max_length=200)
    script: Script | str | None = Field(
        default=None,
        description="an inline script or a built-in script name: required with provider `scripted`, refused "
        "with any other provider (422 naming script)",
    )
    constraints: Constraints = Field(default_factory=Constraints)
    priority: Priority = "normal"
    notify: Notify | None = Field(default=None, description="a signed HTTPS callback when the task ends")
    double_texting: DoubleTexting = Field(
        default="queue",
        description="what a message sent while the agent is busy (running, queued, waiting, paused) does: queue "
        "(delivered at the next turn boundary), interrupt (the turn in flight stops and the agent goes on with the "
        "message) or reject (409 until the agent answers)",
    )
    depends_on: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]] = Field(
        default_factory=list,
        max_length=50,
        description="tasks of the same tenant this one runs after: it waits in `blocked` until all succeed (their "
        "results open its conversation); one that fails, is cancelled or times out cancels it (dependency_failed)",
    )
    metadata: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=32
    )
    concurrency: Concurrency | None = Field(
        default=None,
        description="a concurrency key: at most `limit` running tasks of the tenant with this `key`; "
        "on_conflict queue|cancel_running|skip",
    )
    mcp_tools: list[McpToolPin] = Field(
        default_factory=list,
        max_length=128,
        description="set from the agent version's MCP servers when the submission names an agent; not sent",
    )
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="a JSON Schema the final answer must validate against; the model answers through a "
        "final_answer tool, and the result is the answer as JSON",
    )
    memory: list[MemoryAttachment] = Field(
        default_factory=list,
        max_length=MAX_MEMORY_ATTACHMENTS,
        description="memory stores the task may use (memory_list, memory_read, memory_search; memory_write when "
        "read_write), added to the agent version's; a store the agent attaches too takes this attachment",
    )

    @field_validator("memory")
    @classmethod
    def _unique_memory(cls, attachments: list[MemoryAttachment]) -> list[MemoryAttachment]:
        return unique_stores(attachments)

    workspace: WorkspaceSpec | None = Field(
        default=None,
        description="a workspace of files for the task (docs/SANDBOX.md): its starting files and the hosts its "
        "shell may reach; a task allowed a workspace tool (shell, read_file, ...) has an empty one without it",
    )
    fallbacks: list[ModelChoice] = Field(
        default_factory=list,
        max_length=MAX_FALLBACKS,
        description="models to use, in order, when the model's circuit is open or a call still fails with an "
        "overload after its retries; each step records the provider and model that answered, and the task "
        "goes on with it (a resume and a fork too)",
    )

    def candidates(self) -> list[ModelChoice]:
        """The models this task may call, in order of preference: its own, then its fallbacks."""
        if self.provider == "scripted":
            return []
        return [ModelChoice(provider=self.provider, model=self.model), *self.fallbacks]

    @field_validator("output_schema")
    @classmethod
    def _usable_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        from agentq.core.output import usable_schema

        return usable_schema(schema)

    @field_validator("depends_on")
    @classmethod
    def _unique_dependencies(cls, ids: list[str]) -> list[str]:
        if len(set(ids)) != len(ids):
            raise ValueError("task ids must be unique")
        return ids

    @model_validator(mode="after")
    def _script_matches_provider(self) -> TaskSubmission:
        if self.agent is not None and "provider" not in self.model_fields_set:
            return self  # not resolved yet: the agent's version brings provider and script
        if self.provider == "scripted" and self.script is None:
            raise ValueError("script: required when provider is 'scripted'")
        if self.provider != "scripted" and self.script is not None:
            raise ValueError("script: only valid when provider is 'scripted'")
        if self.fallbacks and self.provider == "scripted":
            raise ValueError("fallbacks: the scripted provider plays its script; it has no model to fall back from")
        distinct_fallbacks(self.provider, self.model, self.fallbacks)
        return self


class Usage(StrictModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0  # of the writes, those with the one-hour TTL (priced higher)

    @property
    def input_total(self) -> int:
        """Every input token the model read, cache writes and reads included: the ledger's
        ``tokens_in`` and OpenTelemetry's ``gen_ai.usage.input_tokens`` both count these."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def total(self) -> int:
        return self.input_total + self.output_tokens


class FallbackNote(StrictModel):
    """On the step whose model took over from another (``core.engine._llm_turn``): the model the
    turn wanted first, and why it did not answer (``circuit_open``, or the error code of its
    call after its retries). Only the step of the switch carries it: the steps after go on
    with the model that answered."""

    provider: str
    model: str
    reason: str


class CallStep(StrictModel):
    """What one LLM call returned and what it cost: the fields every step made by a call shares."""

    content: list[dict[str, Any]]
    stop_reason: str | None
    model: str
    usage: Usage
    cost_usd: Decimal = Decimal(0)
    reserved_tokens: int = 0
    attempts: int = 1
    started_at: float
    duration_ms: int
    batched: bool = Field(default=False, description="answered through the Message Batches API (economy)")
    provider: str | None = Field(
        default=None, description="the provider that answered (with ``model``: a fallback, if the task has them)"
    )
    fallback_from: FallbackNote | None = Field(
        default=None, description="a fallback took over at this step: from which model, and why"
    )

    def text(self) -> str:
        return "\n".join(b["text"] for b in self.content if b.get("type") == "text" and b.get("text"))


class LLMStep(CallStep):
    """An assistant turn as the provider returned it, plus what it cost."""

    kind: Literal["llm"] = "llm"
    cleared_before: int = Field(default=0, description="tool results cleared from this call's request (core.context)")

    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.content if b.get("type") == "tool_use"]


class CompactStep(CallStep):
    """A summary of the conversation so far, written by a compaction call (``core.context``):
    the conversation goes on from it, so the steps before it are never read again to resume."""

    kind: Literal["compact"] = "compact"
    summarised_through: int = Field(description="the last step the summary stands for")


class ToolOutcome(StrictModel):
    tool_use_id: str
    name: str  # the input lives in the LLM step's tool_use block; not stored twice
    content: str
    is_error: bool = False
    status: Literal["ok", "error", "timeout", "unknown_outcome", "replayed"] = "ok"
    side_effects: bool = False
    started_at: float
    duration_ms: int


class ToolsStep(StrictModel):
    """The results of every tool call of the preceding LLM step, committed as one."""

    kind: Literal["tools"] = "tools"
    results: list[ToolOutcome]
    workspace: WorkspaceRef | None = Field(
        default=None, description="the workspace these calls left, when they changed it (core.workspace)"
    )

    @model_serializer(mode="wrap")
    def _without_workspace(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A step that left no workspace is stored exactly as before workspaces existed."""
        out: dict[str, Any] = handler(self)
        if out.get("workspace") is None:
            out.pop("workspace", None)
        return out


class UserMessage(StrictModel):
    """A person's message to a task, as accepted (``POST /tasks/{id}/messages``): ``seq`` is its
    place among the task's messages, fixed when it was accepted."""

    message_id: str
    seq: int
    text: str
    sent_at: float


class MessageStep(StrictModel):
    """Messages delivered into the conversation at a turn boundary, committed as one step: the
    commit that makes them part of the conversation is the delivery, so a worker dying before it
    delivers nothing and one dying after it delivered them once (``storage.messages``)."""

    kind: Literal["message"] = "message"
    messages: list[UserMessage]

    def text(self) -> str:
        return "\n\n".join(m.text for m in self.messages)


Step = Annotated[LLMStep | ToolsStep | CompactStep | MessageStep, Field(discriminator="kind")]


class StepRecord(StrictModel):
    """A committed, immutable step as stored: its number, the epoch that wrote it, the body."""

    task_id: str
    number: int
    epoch: int
    committed_at: float
    body: Step


class CommittedStep(StepRecord):
    """A step as its commit left the task: META's message counters and pending interrupt, read
    back by the commit's own write (``ReturnValues``), so the engine hears of a message
    without reading for it."""

    messages_received: int | None = None  # None: not read back (a sub-agent's commit across two items)
    interrupt_at: float | None = None


class Lease(StrictModel):
    task_id: str
    owner: str
    epoch: int
    expires_at: float


class RetryState(StrictModel):
    """The latest retry of a task: the failure, which attempt it ended, when the next try is.

    ``scope`` says who retries: ``call``, the worker retrying the provider call while it holds
    the task; ``delivery``, the queue bringing the task back after the call's attempts were
    spent (``attempt`` is then the delivery); ``deferral``, the task put off before its call
    by the fleet's flow control (``code``: circuit_open, slowed_down, rate_limited) or by a lost
    lease's call that may still be charged (call_in_flight): nothing failed, it waits. Kept beside META (``META#RETRY``), never in it:
    META is rewritten by every step commit and stays small. Current while ``step`` is not
    committed and the task has not ended; afterwards it is history (the trace shows it).
    """

    step: int = Field(description="the step the failed attempt was for")
    scope: Literal["call", "delivery", "deferral"]
    attempt: int = Field(ge=1)
    max_attempts: int = Field(ge=1)
    code: str = Field(max_length=64)
    message: str = Field(max_length=500)
    status_code: int | None = None
    at: float = Field(description="when the attempt failed")
    next_at: float = Field(description="when the next attempt starts")


class Task(BaseModel):
    """The META item of a task, as the store reads it."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    tenant: str
    status: TaskStatus
    submission: TaskSubmission
    root_id: str
    parent_id: str | None = None
    depth: int = 0
    step: int = 0
    llm_steps: int = 0
    compacted_at: int = 0  # the latest compaction step: a resume reads the steps from it on
    batch: dict[str, Any] | None = None  # economy: the batch the next LLM turn was sent in (id, custom_id, step, epoch)
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires: float = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal(0)
    result: str | None = None
    error: dict[str, Any] | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    # Claim history lives in CLAIM# items (META stays small: every step commit rewrites it);
    # META keeps what the latency figures need.
    claim_count: int = 0
    resume_count: int = 0  # the claims that took over a run in progress (storage.leases)
    claimed_from: TaskStatus | None = None  # the status the latest claim took the task from
    first_claimed_at: float | None = None
    last_claimed_at: float | None = None
    inflight: Reservation | None = None  # the hold for the next LLM call (until: its deadline)
    # Holds of older epochs whose calls may still complete, set aside by a successor: by epoch.
    lapsed_holds: dict[int, Reservation] = Field(default_factory=dict)
    spawn_id: str | None = None  # the parent's spawn_subagents tool_use id, for a child
    task_token: str | None = None  # Step Functions callback token, for a child run by a fan-out
    heartbeat_at: float | None = None  # last sign of life of the lease holder
    prev_heartbeat_at: float | None = None  # ... of the previous holder, as seen by the last claim
    updated_at: float | None = None
    forked_from: dict[str, Any] | None = None  # {"task_id", "step"} of a fork's source
    expires_at: int | None = None  # set while terminal: when DynamoDB TTL deletes it (epoch seconds)
    retry: RetryState | None = None  # META#RETRY, read by Tasks.get (not by claim or get_many)
    live_text: str | None = None  # the tail of the text of a streamed call in flight (best effort)
    seen: Seen | None = None  # what that call billed so far, as its stream said (core.reservation)
    # A person's messages (storage.messages): accepted, delivered into the conversation, and an
    # interrupt asked for and not yet heard; a closed conversation takes no more.
    messages_received: int = 0
    messages_delivered: int = 0
    interrupt_at: float | None = None
    conversation_closed: bool = False
    # Each write that reopens an ended task (a follow-up, a redrive, a raised budget) starts its
    # next invocation: counted here, with when it started and the token totals it started from
    # (the telemetry's ``invoke_agent`` span of each, ``observe/otel.py``). 0: from the submission.
    invocation: int = 0
    invoked_at: float | None = None
    invocation_tokens_in: int = 0
    invocation_tokens_out: int = 0
    slots: list[str] = Field(default_factory=list)  # the running slots it holds (storage.running_slots)
    # The provider and model that answer since a fallback took over (set by the commit of the
    # step that records the switch); None: the task's own model answers.
    answered_by: dict[str, str] | None = None
    # The workspace as of the last committed step that changed it (core.workspace): what a
    # takeover restores. None: the submission's starting files (or an empty workspace).
    workspace: WorkspaceRef | None = None

    @field_validator("inflight", mode="before")
    @classmethod
    def _stored_hold(cls, raw: Any) -> Any:
        """META stores a hold as a map (``storage.budgets.ticket_value``): read it as one."""
        if isinstance(raw, dict):
            return Reservation.from_ticket(raw) if raw else None
        return raw

    @field_validator("seen", mode="before")
    @classmethod
    def _stored_seen(cls, raw: Any) -> Any:
        return Seen.from_item(raw) if isinstance(raw, dict) else raw

    @field_validator("lapsed_holds", mode="before")
    @classmethod
    def _stored_lapsed_holds(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        return {
            int(epoch): Reservation.from_ticket(hold, epoch=int(epoch)) if isinstance(hold, dict) else hold
            for epoch, hold in raw.items()
        }

    @property
    def retrying(self) -> RetryState | None:
        """The retry in progress: its step not committed yet, the task not ended."""
        if self.retry is None or self.status.terminal or self.retry.step <= self.step:
            return None
        return self.retry

    @property
    def budget_id(self) -> str:
        """Every task draws on its own budget, kept on its META: the root's is the tree's cap, a
        child's is the share its parent allocated to it at spawn time."""
        return self.task_id

    @property
    def pickup_latency(self) -> float | None:
        """Submission to first claim."""
        return self.first_claimed_at - self.created_at if self.first_claimed_at is not None else None

    @property
    def last_resume_gap(self) -> float | None:
        """Previous holder's last heartbeat to the latest claim, when that claim resumed a run
        (took it from ``running``): an upper bound on how long the task sat with nobody working
        on it after a worker died. A claim after a follow-up or any other requeue measures the
        time the task was stopped, not a resume: None."""
        if self.claimed_from is not TaskStatus.RUNNING:
            return None
        if self.claim_count < 2 or self.prev_heartbeat_at is None or self.last_claimed_at is None:
            return None
        return self.last_claimed_at - self.prev_heartbeat_at
