"""agentq: a durable task queue for long-running AI agents.

The public API is re-exported here; modules are implementation detail.
"""

from agentq.client import ApiError, Client
from agentq.engine import Engine, EngineConfig, RunResult
from agentq.errors import (
    AgentqError,
    BudgetExceeded,
    IllegalTransition,
    LeaseLost,
    ProviderError,
    TaskNotFound,
    ValidationError,
)
from agentq.models import Constraints, Script, Task, TaskStatus, TaskSubmission
from agentq.pricing import PriceTable, load_price_table
from agentq.runtime import Settings, build_registry, build_store
from agentq.store import Store
from agentq.submit import parse_submission, submit
from agentq.tools import ToolContext, ToolRegistry, tool

__all__ = [
    "AgentqError",
    "ApiError",
    "BudgetExceeded",
    "Client",
    "Constraints",
    "Engine",
    "EngineConfig",
    "IllegalTransition",
    "LeaseLost",
    "PriceTable",
    "ProviderError",
    "RunResult",
    "Script",
    "Settings",
    "Store",
    "Task",
    "TaskNotFound",
    "TaskStatus",
    "TaskSubmission",
    "ToolContext",
    "ToolRegistry",
    "ValidationError",
    "build_registry",
    "build_store",
    "load_price_table",
    "parse_submission",
    "submit",
    "tool",
]
