"""The committed steps of a task's conversation: an LLM call's answer and usage, a compaction's
summary, the results of a turn's tool calls, a person's messages delivered; and the records
they are stored as. Immutable once committed."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from agentq.core.models.strict import StrictModel
from agentq.core.workspace import WorkspaceRef
from agentq.observe.redaction import redact


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


# The stop reasons, in the Messages API's terms every provider's are translated to, of a turn
# that is no answer: cut off (at the output limit, or where the model's context window ran out)
# or refused (the model declined; OpenAI's content filter, a Bedrock guardrail stopped it), or
# made malformed (Bedrock's malformed_model_output and malformed_tool_use: a tool call that cannot
# be carried out, text that is not the answer).
CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded"})
REFUSED = "refusal"
MALFORMED = "malformed_output"


class LLMStep(CallStep):
    """An assistant turn as the provider returned it, plus what it cost."""

    kind: Literal["llm"] = "llm"
    cleared_before: int = Field(default=0, description="tool results cleared from this call's request (core.context)")

    def no_answer(self) -> bool:
        """The turn is no answer, whatever it says: it must not end the task ``succeeded``, nor be
        graded, nor be read by an output schema, nor have its tool calls carried out."""
        return self.stop_reason in CUT_OFF or self.stop_reason in (REFUSED, MALFORMED)

    def tool_uses(self) -> list[dict[str, Any]]:
        """The tool calls the turn asks to be carried out: none of a turn that is no answer
        (``no_answer``; its blocks stay in ``content``, as the provider returned them). Such a
        turn ends its task, unless a message came in while it was made: then it stays in the
        conversation and the message follows it (``core.engine._llm_answer``), and this is what
        keeps every reader (the loop, the message boundary, a fork, the views) from taking its
        calls for ones to make."""
        if self.no_answer():
            return []
        return [b for b in self.content if b.get("type") == "tool_use"]


def asks_for_calls(body: object) -> bool:
    """Whether a step is the model's turn asking for tool calls: no fork ends on one, since the
    fork's first turn would make those calls again under its own task id, where the source's
    effect records and keys stop nothing (``control.operations._fork_point``, ``Tasks.fork``).
    Such a turn is always followed by the step that ran its calls, if by any, so the step
    before it is one a fork may end on (``fork_at_step`` of the task's view)."""
    return isinstance(body, LLMStep) and bool(body.tool_uses())


def repeated_tool_use_id(content: list[dict[str, Any]]) -> str | None:
    """The first tool_use id two calls of one turn share, if any. A call's policy verdict, its
    approval and its effect record are all found by its id, so two calls under one id would
    share them: a call a rule denies would run under the verdict of one it allows. No provider
    reply or turn that has one is ever acted on (``providers.retry.distinct_tool_uses``,
    ``core.engine._tool_turn``)."""
    seen: set[str] = set()
    for block in content:
        if block.get("type") != "tool_use":
            continue
        tool_use_id = str(block.get("id"))
        if tool_use_id in seen:
            return tool_use_id
        seen.add(tool_use_id)
    return None


class ToolHistory(StrictModel):
    """The task's tool calls as the policy rules read them (``context.history``: ``tools``,
    ``ok_tools``, ``tool_calls``; ``core.engine._history``): each tool and status a call of it
    ended with, once, and how many calls there were. Bounded by the tools and statuses, not by
    the calls."""

    calls: int = 0
    made: list[tuple[str, str]] = Field(default_factory=list, description="(tool, status), each once, sorted")

    def adding(self, made: list[tuple[str, str]]) -> ToolHistory:
        """This history with the calls ``made`` (each ``(tool, status)``) after it."""
        if not made:
            return self
        return ToolHistory(calls=self.calls + len(made), made=sorted({*self.made, *made}))


class CompactStep(CallStep):
    """A summary of the conversation so far, written by a compaction call (``core.context``):
    the conversation goes on from it, so the steps before it are never read again to resume.
    What the policy rules read of the tool calls before it is carried on it (``tools``): a run
    that resumes from it loads no step before it, and a rule over the task's history ("one
    charge per task") must still see them."""

    kind: Literal["compact"] = "compact"
    summarised_through: int = Field(description="the last step the summary stands for")
    tools: ToolHistory | None = Field(
        default=None,
        description="every tool call of the task before this step, as the policy rules read them (None: a "
        "compaction written before it was carried: the steps before it are read once instead)",
    )

    @model_serializer(mode="wrap")
    def _without_tools(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A compaction carrying no history is stored exactly as before it was carried."""
        out: dict[str, Any] = handler(self)
        if out.get("tools") is None:
            out.pop("tools", None)
        return out


class ToolOutcome(StrictModel):
    """One tool call's result as the model reads it and its step, effect record and events hold
    it. Its content is redacted (``observe.redaction``) whenever one is made, whatever made it (the
    registry, a remote agent's answer or error, a replay, a denial): no credential's value is ever
    in one (ARCHITECTURE 15)."""

    tool_use_id: str
    name: str  # the input lives in the LLM step's tool_use block; not stored twice
    content: str
    is_error: bool = False
    status: Literal["ok", "error", "timeout", "unknown_outcome", "replayed"] = "ok"
    side_effects: bool = False
    started_at: float
    duration_ms: int
    policy: dict[str, Any] | None = Field(
        default=None,
        description="the policy rules that took part in this call (core.policies): the rule that denied it or "
        "asked for it, and what log_only rules would have decided",
    )

    @field_validator("content")
    @classmethod
    def _redacted(cls, content: str) -> str:
        return redact(content)

    @model_serializer(mode="wrap")
    def _without_policy(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A call no rule took part in is stored exactly as before policies existed."""
        out: dict[str, Any] = handler(self)
        if out.get("policy") is None:
            out.pop("policy", None)
        return out


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


class GradeCheck(StrictModel):
    """One judge of a grade: the task's ``@grader`` function (``code``) or its rubric's model."""

    kind: Literal["code", "rubric"]
    name: str = Field(description="the grader function, or provider/model of the rubric's grading model")
    score: float | None = Field(default=None, description="0 to 1; None: this judge failed (the grade's error)")
    feedback: str = ""
    usage: Usage | None = Field(default=None, description="the grading model's tokens (rubric)")
    cost_usd: Decimal = Decimal(0)
    duration_ms: int = 0


class GradeStep(StrictModel):
    """The grade of the answer before it (``core.engine._grade``): a durable step like any other,
    computed at most once (its result recorded in the effect log before this commit). Below the
    bar with attempts left, its feedback is the agent's next user message (``retries``); a grade
    that failed (``error``) ends the task ``failed_outcome`` with the answer kept."""

    kind: Literal["grade"] = "grade"
    attempt: int = Field(ge=1, description="which answer of this round of the conversation was graded")
    max_attempts: int = Field(ge=1)
    bar: float
    score: float | None = Field(description="the lowest score of its checks; None when the grade failed")
    passed: bool
    feedback: str = ""
    checks: list[GradeCheck] = Field(default_factory=list)
    error: dict[str, Any] | None = Field(default=None, description="{code, message}: the grader failed")
    usage: Usage = Field(default_factory=Usage, description="the grading model's tokens, counted in the budget")
    cost_usd: Decimal = Decimal(0)
    reserved_tokens: int = Field(default=0, description="the budget hold the grading model's call was made under")
    reserved_micros: int = Field(default=0, description="that hold's dollars, in millionths")
    started_at: float
    duration_ms: int
    replayed: bool = Field(default=False, description="graded by a worker that stopped before this commit")
    may_be_billed: bool = Field(
        default=False, description="its grading call failed or was abandoned once sent: it may have been billed"
    )

    @property
    def retries(self) -> bool:
        """The agent is told the feedback and answers again."""
        return not self.passed and self.error is None and self.attempt < self.max_attempts


Step = Annotated[LLMStep | ToolsStep | CompactStep | MessageStep | GradeStep, Field(discriminator="kind")]


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
