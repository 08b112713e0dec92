"""agentq: a durable task queue for long-running AI agents.

The public API is re-exported here, lazily (PEP 562): ``import agentq`` loads nothing else,
so a Lambda that needs one corner of the package (the authorizer needs only the API-key
lookup) does not pay for the engine, the providers or the HTTP client at cold start.

Layers, inner to outer (an inner one never imports an outer one; ``make layers``
checks it): ``core`` (models, engine, tools, providers, pricing) → ``storage`` (the DynamoDB
single table behind repositories, and an in-memory twin) → ``queueing`` and ``control`` →
``api``, ``cli``, ``local``. ``observe`` is used by all of them; ``resources`` names what
both CDK and the local stack create; ``runtime`` wires a configuration into objects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The package's version, pyproject.toml's (tests/test_public_exports.py holds them equal): here
# because the Lambda layer ships the package without its metadata (importlib.metadata has none).
__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "ApiError": "agentq.api.client",
    "Client": "agentq.api.client",
    "AgentSpec": "agentq.core.agents",
    "AgentVersion": "agentq.core.agents",
    "Engine": "agentq.core.engine",
    "EngineConfig": "agentq.core.engine",
    "RunResult": "agentq.core.engine",
    "AgentqError": "agentq.core.errors",
    "BudgetExceeded": "agentq.core.errors",
    "IllegalTransition": "agentq.core.errors",
    "LeaseLost": "agentq.core.errors",
    "ProviderError": "agentq.core.errors",
    "TaskNotFound": "agentq.core.errors",
    "ValidationError": "agentq.core.errors",
    "Constraints": "agentq.core.models",
    "Script": "agentq.core.models",
    "Task": "agentq.core.models",
    "TaskStatus": "agentq.core.models",
    "TaskSubmission": "agentq.core.models",
    "PriceTable": "agentq.core.pricing",
    "load_price_table": "agentq.core.pricing",
    "Settings": "agentq.runtime",
    "build_registry": "agentq.runtime",
    "build_store": "agentq.runtime",
    "parse_submission": "agentq.control.submit",
    "submit": "agentq.control.submit",
    "ToolContext": "agentq.core.tools",
    "ToolRegistry": "agentq.core.tools",
    "tool": "agentq.core.tools",
    "GradeInput": "agentq.core.graders",
    "grader": "agentq.core.graders",
}

# Literal, so type checkers and linters see the public names; a test keeps it equal to _EXPORTS.
__all__ = [
    "AgentSpec",
    "AgentVersion",
    "AgentqError",
    "ApiError",
    "BudgetExceeded",
    "Client",
    "Constraints",
    "Engine",
    "EngineConfig",
    "GradeInput",
    "IllegalTransition",
    "LeaseLost",
    "PriceTable",
    "ProviderError",
    "RunResult",
    "Script",
    "Settings",
    "Task",
    "TaskNotFound",
    "TaskStatus",
    "TaskSubmission",
    "ToolContext",
    "ToolRegistry",
    "ValidationError",
    "build_registry",
    "build_store",
    "grader",
    "load_price_table",
    "parse_submission",
    "submit",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from agentq.api.client import ApiError, Client
    from agentq.control.submit import parse_submission, submit
    from agentq.core.agents import AgentSpec, AgentVersion
    from agentq.core.engine import Engine, EngineConfig, RunResult
    from agentq.core.errors import (
        AgentqError,
        BudgetExceeded,
        IllegalTransition,
        LeaseLost,
        ProviderError,
        TaskNotFound,
        ValidationError,
    )
    from agentq.core.graders import GradeInput, grader
    from agentq.core.models import Constraints, Script, Task, TaskStatus, TaskSubmission
    from agentq.core.pricing import PriceTable, load_price_table
    from agentq.core.tools import ToolContext, ToolRegistry, tool
    from agentq.runtime import Settings, build_registry, build_store
