"""Tools agents call: declare them with ``@tool``, run them through a ``ToolRegistry``.

The engine needs only this module: ``default_registry()`` for the built-in tools,
``ToolRegistry.schemas()`` for the model request and ``ToolRegistry.execute()`` for each
``tool_use`` block, which always returns a ``ToolExecution`` and never raises.
"""

from agentq.core.tools._context import NoteStore, ToolContext, idempotency_key_for
from agentq.core.tools._core import ToolExecution, ToolRegistry, ToolSpec, render_result, tool
from agentq.core.tools.builtin import (
    BUILTIN_TOOLS,
    default_registry,
    http_fetch,
    http_fetch_tool,
    note_read,
    note_write,
    python_exec,
    python_exec_tool,
)

__all__ = [
    "BUILTIN_TOOLS",
    "NoteStore",
    "ToolContext",
    "ToolExecution",
    "ToolRegistry",
    "ToolSpec",
    "default_registry",
    "http_fetch",
    "http_fetch_tool",
    "idempotency_key_for",
    "note_read",
    "note_write",
    "python_exec",
    "python_exec_tool",
    "render_result",
    "tool",
]
