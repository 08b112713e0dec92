"""Pydantic models that cross a boundary: submissions, task state, steps, conversation blocks.

Everything a worker persists or a caller sends is one of these, so validation errors name
the offending field and the same shapes serve the store, the engine and the API. Every name
is importable from here (``from agentq.core.models import Task``); each lives in the module
of its concept:

- ``strict``: ``StrictModel``, the base that refuses unknown fields; ``MAX_JSON_DEPTH``, how deep a body nests.
- ``transitions``: ``ALLOWED_TRANSITIONS``, the one table of legal status moves.
- ``constraints``: ``Constraints``, a task's hard limits.
- ``submission``: ``TaskSubmission`` and its parts (script, fallbacks, MCP pins, notify, concurrency).
- ``steps``: the committed steps (LLM, compaction, tools, messages) and their records.
- ``task``: ``Task`` (the META item), ``Lease``, ``RetryState``.
"""

from __future__ import annotations

from agentq.core.models.constraints import (
    ASKS,
    MAX_COST_USD,
    MAX_DEPTH,
    MAX_TIMEOUT_SECONDS,
    MAX_TOKENS,
    ApprovalDefault,
    Constraints,
    Effort,
    ToolPolicy,
    unique_tool_names,
)
from agentq.core.models.remote import REMOTE_TOOL_PREFIX, RemoteAgentRef
from agentq.core.models.steps import (
    CallStep,
    CommittedStep,
    CompactStep,
    FallbackNote,
    GradeCheck,
    GradeStep,
    LLMStep,
    MessageStep,
    Step,
    StepRecord,
    ToolHistory,
    ToolOutcome,
    ToolsStep,
    Usage,
    UserMessage,
    asks_for_calls,
    repeated_tool_use_id,
)
from agentq.core.models.strict import MAX_JSON_DEPTH, StrictModel
from agentq.core.models.submission import (
    AGENT_REF_PATTERN,
    DEFAULT_MODEL,
    MAX_CONCURRENCY_KEY_CHARS,
    MAX_FALLBACKS,
    MAX_GOAL_CHARS,
    MAX_MESSAGE_CHARS,
    MCP_SERVER_PATTERN,
    MCP_SERVER_RULE,
    SET_BY_AGENTQ,
    TASK_ENDS,
    Concurrency,
    ConcurrencyConflict,
    DoubleTexting,
    McpToolPin,
    ModelChoice,
    Notify,
    NotifyEvent,
    OnlineGrade,
    OutcomeSpec,
    Priority,
    Provider,
    Script,
    ScriptToolCall,
    ScriptTurn,
    TaskSubmission,
    distinct_fallbacks,
    usable_mcp_server_name,
)
from agentq.core.models.task import Lease, LostClaim, RetryState, Task
from agentq.core.models.transitions import ALLOWED_TRANSITIONS, REOPENED_BY_MESSAGE, sources_of
from agentq.core.status import TERMINAL_STATUSES, TaskStatus

__all__ = [
    "AGENT_REF_PATTERN",
    "ALLOWED_TRANSITIONS",
    "ASKS",
    "DEFAULT_MODEL",
    "MAX_CONCURRENCY_KEY_CHARS",
    "MAX_COST_USD",
    "MAX_DEPTH",
    "MAX_FALLBACKS",
    "MAX_GOAL_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE_CHARS",
    "MAX_TIMEOUT_SECONDS",
    "MAX_TOKENS",
    "MCP_SERVER_PATTERN",
    "MCP_SERVER_RULE",
    "REMOTE_TOOL_PREFIX",
    "REOPENED_BY_MESSAGE",
    "SET_BY_AGENTQ",
    "TASK_ENDS",
    "TERMINAL_STATUSES",
    "ApprovalDefault",
    "CallStep",
    "CommittedStep",
    "CompactStep",
    "Concurrency",
    "ConcurrencyConflict",
    "Constraints",
    "DoubleTexting",
    "Effort",
    "FallbackNote",
    "GradeCheck",
    "GradeStep",
    "LLMStep",
    "Lease",
    "LostClaim",
    "McpToolPin",
    "MessageStep",
    "ModelChoice",
    "Notify",
    "NotifyEvent",
    "OnlineGrade",
    "OutcomeSpec",
    "Priority",
    "Provider",
    "RemoteAgentRef",
    "RetryState",
    "Script",
    "ScriptToolCall",
    "ScriptTurn",
    "Step",
    "StepRecord",
    "StrictModel",
    "Task",
    "TaskStatus",
    "TaskSubmission",
    "ToolHistory",
    "ToolOutcome",
    "ToolPolicy",
    "ToolsStep",
    "Usage",
    "UserMessage",
    "asks_for_calls",
    "distinct_fallbacks",
    "repeated_tool_use_id",
    "sources_of",
    "unique_tool_names",
    "usable_mcp_server_name",
]
