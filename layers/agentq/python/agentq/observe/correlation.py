"""Which task a log line is about, without passing it to every logger call.

The engine opens a ``task_context`` when it takes a task and ``bind``s the lease epoch and the
step in flight as they change; ``CorrelationFilter`` (on the handler that writes the lines)
copies them onto every record, where a JSON formatter makes them top-level fields.

A context variable, not a global: each worker thread runs its own task, and a thread that
starts with ``contextvars.copy_context()`` (the tool runner, the lease keeper) logs as the
task that started it. The fields live in one dict per scope, shared by such copies, so a step
bound later shows up in their lines too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

FIELDS = ("task_id", "step", "lease_epoch", "worker_id")

_current: ContextVar[dict[str, Any] | None] = ContextVar("agentq_correlation", default=None)


@contextmanager
def task_context(**fields: Any) -> Iterator[None]:
    """Fields for every line logged in this block (and its copied contexts); nested scopes
    inherit the outer fields, and leaving a scope restores the outer ones."""
    outer = _current.get()
    token = _current.set({**(outer or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _current.reset(token)


def bind(**fields: Any) -> None:
    """Update the innermost scope (no-op outside any): the step in flight, the lease epoch."""
    scope = _current.get()
    if scope is not None:
        scope.update(fields)


def current() -> dict[str, Any]:
    return dict(_current.get() or {})


class CorrelationFilter(logging.Filter):
    """Adds the current task's fields to each record it passes; never drops one. A field the
    call site set itself (``extra={"task_id": ...}``) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = _current.get()
        if scope:
            for key, value in scope.items():
                if key not in record.__dict__:
                    setattr(record, key, value)
        return True


def has_correlation_filter(handler: logging.Handler) -> bool:
    return any(isinstance(f, CorrelationFilter) for f in handler.filters)
