"""What a caller sends to start a task (``TaskSubmission``) and the parts it is made of: the
script of the scripted provider, the models to fall back to, the MCP tools pinned from an
agent, the callback, the concurrency key.

The fields an agent defines and a submission may spell out itself (``core.agents.AgentSpec``:
model, system prompt, fallbacks, output schema, memory stores) have their types, bounds and
checks here once, as ``Annotated`` types both models declare, and one ``check_model_choice``
for the rules between provider, script and fallbacks. Not a shared base class: a base's fields
come first, and an agent version's digest is its JSON in field order (``AgentSpec.digest``).
The descriptions stay with each model: they say what the field means there."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from agentq.core.endusers import MAX_USER_CHARS, USER_PATTERN, USER_RULE
from agentq.core.memory import MAX_MEMORY_ATTACHMENTS, MemoryAttachment, unique_stores
from agentq.core.models.constraints import Constraints
from agentq.core.models.remote import RemoteAgentRef
from agentq.core.models.strict import StrictModel
from agentq.core.workspace import WorkspaceSpec

MAX_GOAL_CHARS = 20_000
DoubleTexting = Literal["queue", "interrupt", "reject"]
MAX_MESSAGE_CHARS = 32_000  # a person's message to a task (POST /tasks/{id}/messages)
# name, name@version, or name@alias (an alias starts with a letter: core.aliases)
AGENT_REF_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}(@([1-9][0-9]{0,8}|[a-z][a-z0-9_-]{0,31}))?$"
DEFAULT_MODEL = "claude-sonnet-4-6"  # a submission that names none; `agentq run` uses it too


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


def check_model_choice(provider: str, model: str, script: Script | str | None, fallbacks: list[ModelChoice]) -> None:
    """The scripted provider and only it plays a script, and has no model to fall back from; a
    fallback names a model once (pydantic validator helper: submissions and agents)."""
    if provider == "scripted" and script is None:
        raise ValueError("script: required when provider is 'scripted'")
    if provider != "scripted" and script is not None:
        raise ValueError("script: only valid when provider is 'scripted'")
    if fallbacks and provider == "scripted":
        raise ValueError("fallbacks: the scripted provider plays its script; it has no model to fall back from")
    distinct_fallbacks(provider, model, fallbacks)


def _usable_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    from agentq.core.output import usable_schema

    return usable_schema(schema)


# The fields a submission shares with an agent (core.agents.AgentSpec): declared once for both.
ModelName = Annotated[str, Field(min_length=1, max_length=200)]
SystemPrompt = Annotated[str | None, Field(max_length=MAX_GOAL_CHARS)]
Fallbacks = Annotated[list[ModelChoice], Field(max_length=MAX_FALLBACKS)]
OutputSchema = Annotated[dict[str, Any] | None, AfterValidator(_usable_schema)]
MemoryAttachments = Annotated[
    list[MemoryAttachment], Field(max_length=MAX_MEMORY_ATTACHMENTS), AfterValidator(unique_stores)
]


# An MCP server's name as stored (an agent version's ``mcp_servers`` and pins): the form read
# back. A name given now must also be usable (``usable_mcp_server_name``); versions stored
# before that rule stay readable.
MCP_SERVER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,23}$"
MCP_SERVER_RULE = (
    "lowercase letters, digits, '-' and '_', up to 24; no '__' and no '_' at the end "
    "(a tool is called mcp__<server>__<tool>)"
)


def usable_mcp_server_name(name: str) -> bool:
    """Whether ``name`` may be registered (``AGENTQ_MCP_SERVERS``) and named by a new agent
    version: ``MCP_SERVER_PATTERN`` with no "__" and no '_' at its end, so the name a model calls
    a tool by, mcp__<server>__<tool>, names one server and one tool (server "a" with tool "b__c"
    and server "a__b" with tool "c" were both mcp__a__b__c; "a_" with "b" and "a" with "_b" both
    mcp__a___b)."""
    import re

    return re.fullmatch(MCP_SERVER_PATTERN, name) is not None and "__" not in name and not name.endswith("_")


EndUser = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_USER_CHARS,
        pattern=USER_PATTERN,
        description=f"the end user the task acts for ({USER_RULE}); its children act for the same user",
    ),
]


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


MAX_RUBRIC_CHARS = 20_000
GRADER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class OutcomeSpec(StrictModel):
    """What a task must achieve, and how it is judged when the agent answers (``core.grading``):
    a ``rubric`` a model grades the answer against, a ``grader`` (a ``@grader`` function of the
    deployment's tool modules) that checks it in code, or both (the code check first; the model
    is asked only if the code passes). Below ``bar``, the feedback goes back to the agent as its
    next message, up to ``max_attempts`` answers; the task then ends ``failed_outcome``."""

    rubric: str | None = Field(
        default=None, min_length=1, max_length=MAX_RUBRIC_CHARS,
        description="what a good answer is, for a model to grade the answer against (a score from 0 to 1)",
    )  # fmt: skip
    grader: str | None = Field(
        default=None, pattern=GRADER_NAME_PATTERN,
        description="a @grader function of the deployment's tool modules: it gets the answer (and the workspace's "
        "files, read-only) and returns a score, a pass/fail or a score with feedback",
    )  # fmt: skip
    bar: float = Field(strict=True, default=0.8, ge=0, le=1, description="the lowest score that passes (0 to 1)")
    max_attempts: int = Field(
        strict=True, default=3, ge=1, le=10, description="answers graded before the task ends failed_outcome"
    )
    provider: Provider | None = Field(default=None, description="the grading model's provider (default: the task's)")
    model: ModelName | None = Field(default=None, description="the grading model (default: the task's)")
    script: Script | str | None = Field(
        default=None, description="the scripted provider's grades, one turn an attempt (tests and local runs)"
    )
    max_output_tokens: int = Field(
        strict=True, default=1024, ge=16, le=8192, description="the grading model's output tokens, a call"
    )
    timeout_seconds: int = Field(
        strict=True, default=120, ge=1, le=900, description="a grade (the model's call, the grader's run) gives up"
    )

    @model_validator(mode="after")
    def _judged_somehow(self) -> OutcomeSpec:
        if self.rubric is None and self.grader is None:
            raise ValueError("rubric: an outcome needs a rubric, a grader, or both")
        if self.rubric is None and (self.provider or self.model or self.script) is not None:
            raise ValueError("rubric: provider, model and script are the grading model's; they need a rubric")
        return self

    def grading_model(self, provider: str, model: str) -> tuple[str, str]:
        """The provider and model that grade the rubric: the outcome's own, else the task's."""
        return self.provider or provider, self.model or model


class OnlineGrade(StrictModel):
    """The online evaluation a task was sampled for by the alias it was submitted through
    (``core.aliases.OnlineEval``): its answer is graded against ``grade`` once, and the grade
    is counted for the task's agent version (``storage.quality``); it never changes how the task
    ends, and the task never answers again for it. Set at submission by the alias, never sent."""

    alias: str = Field(description="the alias that sampled the task")
    grade: OutcomeSpec = Field(description="the rubric and/or grader the answer is graded with (max_attempts unused)")


NotifyEvent = Literal[
    "succeeded", "failed", "cancelled", "cost_exceeded", "timed_out", "failed_outcome", "idle", "message_received"
]
TASK_ENDS: tuple[NotifyEvent, ...] = (
    "succeeded",
    "failed",
    "cancelled",
    "cost_exceeded",
    "timed_out",
    "failed_outcome",
)


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
# Fields of a submission agentq sets as it resolves one, never a caller (``control.submit``
# refuses a request carrying one, naming it), each with why.
SET_BY_AGENTQ = {
    "online": "set by an alias with online evaluation when it samples the task",
    "own_fields": "recorded when the submission's agent version is resolved",
    "overridden": "recorded when a fork replaces what its agent's version defines",
}
OwnField = Annotated[str, Field(max_length=160)]  # "outcome", "constraints.max_steps", "memory.<store>"


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
        description="an agent definition, `name` (its latest version), `name@version`, or `name@alias` (the "
        "version the alias gives this task: see PUT /agents/{name}/aliases/{alias}); the task pins the version. The "
        "agent sets provider, model, system, script, tools and tool policies; the submission may not",
    )
    user: EndUser | None = None
    system: SystemPrompt = None
    provider: Provider = "scripted"
    model: ModelName = DEFAULT_MODEL
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
    remote_agents: list[RemoteAgentRef] = Field(
        default_factory=list,
        max_length=16,
        description="set from the agent version's remote_agents when the submission names an agent; not sent",
    )
    output_schema: OutputSchema = Field(
        default=None,
        description="a JSON Schema the final answer must validate against; the model answers through a "
        "final_answer tool, and the result is the answer as JSON",
    )
    memory: MemoryAttachments = Field(
        default_factory=list,
        description="memory stores the task may use (memory_list, memory_read, memory_search; memory_write when "
        "read_write), added to the agent version's; a store the agent attaches too takes this attachment",
    )

    workspace: WorkspaceSpec | None = Field(
        default=None,
        description="a workspace of files for the task (docs/SANDBOX.md): its starting files and the hosts its "
        "shell may reach; a task allowed a workspace tool (shell, read_file, ...) has an empty one without it",
    )
    outcome: OutcomeSpec | None = Field(
        default=None,
        description="what the task must achieve: a rubric a model grades and/or a @grader check; below the bar the "
        "feedback goes back to the agent, up to max_attempts, then the task ends failed_outcome (an agent's outcome "
        "applies when the submission names none)",
    )
    online: OnlineGrade | None = Field(
        default=None,
        description="set by an alias with online evaluation when it samples the task (never sent: a submission "
        "carrying it is refused): the answer is graded once, for the version's pass rate, without gating the task",
    )
    fallbacks: Fallbacks = Field(
        default_factory=list,
        description="models to use, in order, when the model's circuit is open or a call still fails with an "
        "overload after its retries; each step records the provider and model that answered, and the task "
        "goes on with it (a resume and a fork too)",
    )
    # None: no agent resolved, or a task resolved before this record was kept (control.aliases.move_task
    # then infers it from the version the task ran).
    own_fields: list[OwnField] | None = Field(
        default=None,
        max_length=256,
        description="recorded when the agent version is resolved (never sent: a submission carrying it is refused): "
        "what of the fields a version also gives its tasks the submission set itself (`outcome`, `notify`, "
        "`concurrency`, `output_schema`, `workspace`, `constraints.<name>`, `memory.<store>`); a move to another "
        "version keeps these and takes the rest from that version",
    )

    # What a fork's overrides replaced of what the pinned version defines (control.operations.fork):
    # the task still answers to the agent (its rules, caps and stops), but it no longer runs the
    # version's definition whole, and ``agent: name@N`` alone would claim it did.
    overridden: list[OwnField] | None = Field(
        default=None,
        max_length=16,
        description="recorded when a fork replaces fields its agent's version defines (never sent: a submission "
        "carrying it is refused): `provider`, `model`, `system`, `script`, `constraints.tools`, ...; the task runs "
        "`agent` (name@N) but for these. A move to another version takes them from that version, and clears it",
    )

    def candidates(self) -> list[ModelChoice]:
        """The models this task may call, in order of preference: its own, then its fallbacks."""
        if self.provider == "scripted":
            return []
        return [ModelChoice(provider=self.provider, model=self.model), *self.fallbacks]

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
        if self.script is None and "provider" not in self.model_fields_set:  # say where "scripted" came from
            raise ValueError(
                "script: required when provider is 'scripted', the provider of a submission that names none: "
                "name a script, a provider (such as 'anthropic') or an agent"
            )
        check_model_choice(self.provider, self.model, self.script, self.fallbacks)
        return self
