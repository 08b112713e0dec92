"""A recording wrapper around the engine's storage ports, for the engine's characterisation test.

Every call the engine makes through ``EngineStorage`` (``tasks.claim``, ``steps.commit``,
``budgets.reserve``, ...) and every crash point it passes is logged, in order, as one line with
its arguments and its answer rendered without what differs from run to run (ids are aliased by
first appearance, times and durations blanked). Two engines that log the same lines make the
same writes in the same order, which is what a restructuring of the engine must keep.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from decimal import Decimal
from enum import Enum
from typing import Any

from pydantic import BaseModel

from agentq.core import faults
from agentq.core.models import Lease, StepRecord, Task

# Fields that hold a clock reading or a duration: blanked, they differ on every run.
TIME_FIELDS = frozenset(
    {
        "at", "asked_at", "committed_at", "created_at", "decided_at", "duration_ms", "expires_at", "lease_expires",
        "next_at", "started_at", "submitted_at", "until", "updated_at", "heartbeat_at", "claimed_at", "ended_at",
        "retry_after", "wait", "hold_until", "lease_until", "approval_due", "batch_poll", "deadline",
    }
)  # fmt: skip
# Ids that differ per run: task ids (uuid4 hex), child ids, tool_use ids, other hashes.
ID_PATTERNS = (
    ("T", re.compile(r"[0-9a-f]{12}-[0-9a-f]{20}")),  # a child task (fanout.child_id_for)
    ("T", re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")),  # a task (uuid4 hex)
    ("U", re.compile(r"toolu_[0-9a-f]{24}")),  # a scripted tool_use id
    ("H", re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{12,}(?![0-9a-zA-Z])")),  # any other hash
)
PORTS = (
    "tasks",
    "steps",
    "budgets",
    "windows",
    "caps",
    "approvals",
    "spawns",
    "effects",
    "notes",
    "flow",
    "messages",
    "memory_stores",
    "workspaces",
    "policies",
    "vault",
    "quality",
)


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._aliases: dict[str, str] = {}
        self._counts: Counter[str] = Counter()

    def note(self, line: str) -> None:
        self.lines.append(line)

    def alias(self, text: str) -> str:
        for prefix, pattern in ID_PATTERNS:
            text = pattern.sub(functools.partial(self._alias_match, prefix), text)
        return text

    def _alias_match(self, prefix: str, match: re.Match[str]) -> str:
        return self._alias_of(prefix, match.group(0))

    def _alias_of(self, prefix: str, raw: str) -> str:
        if raw not in self._aliases:
            self._counts[prefix] += 1
            self._aliases[raw] = f"<{prefix}{self._counts[prefix]}>"
        return self._aliases[raw]

    def render(self, value: Any) -> str:
        if value is None or isinstance(value, bool | int | Decimal):
            return str(value)
        if isinstance(value, float):
            return "<float>"
        if isinstance(value, str):
            text = self.alias(value)
            return repr(text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)")
        if isinstance(value, Enum):
            return str(value.value)
        if isinstance(value, Lease):
            return f"Lease({self.alias(value.task_id)} e{value.epoch} {value.owner})"
        if isinstance(value, Task):
            return f"Task({self.alias(value.task_id)} {value.status.value} step={value.step})"
        if isinstance(value, StepRecord):
            return f"Step({value.number} {value.body.kind} e{value.epoch})"
        if isinstance(value, BaseModel):
            return self._fields(type(value).__name__, dict(value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._fields(
                type(value).__name__, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            )
        if isinstance(value, dict):
            return self._fields("", value)
        if isinstance(value, list | tuple):
            return "[" + ", ".join(self.render(v) for v in value) + "]"
        return f"<{type(value).__name__}>"

    def _fields(self, name: str, fields: dict[Any, Any]) -> str:
        shown = ", ".join(
            f"{self.alias(str(k))}={'<t>' if k in TIME_FIELDS and v is not None else self.render(v)}"
            for k, v in fields.items()
        )
        return f"{name}{{{shown}}}"


class RecordingPort:
    """One storage port (``storage.tasks``, ...) whose calls are logged by the recorder."""

    def __init__(self, name: str, inner: Any, recorder: Recorder) -> None:
        self._name, self._inner, self._recorder = name, inner, recorder

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if not callable(value):
            return value
        recorder, name = self._recorder, self._name

        def call(*args: Any, **kwargs: Any) -> Any:
            shown = [recorder.render(a) for a in args]
            shown += [f"{k}={'<t>' if k in TIME_FIELDS and v is not None else recorder.render(v)}"
                      for k, v in kwargs.items()]  # fmt: skip
            line = f"{name}.{attr}({', '.join(shown)})"
            try:
                result = value(*args, **kwargs)
            except Exception as exc:
                recorder.note(f"{line} !! {type(exc).__name__}")
                raise
            if attr == "with_default":  # the engine's view of the tenant windows: recorded too
                recorder.note(line)
                return RecordingPort(name, result, recorder)
            recorder.note(f"{line} -> {recorder.render(result)}")
            return result

        return call


class RecordingStorage:
    """``EngineStorage`` over a real one, logging every call; ``raw`` is the unrecorded store
    (what the test itself does between runs, as an operator or another worker would)."""

    def __init__(self, raw: Any, recorder: Recorder) -> None:
        self.raw = raw
        for port in PORTS:
            setattr(self, port, RecordingPort(port, getattr(raw, port), recorder))


class RecordingCrashPoints(Counter[str]):
    """``faults._passes`` while ``AGENTQ_CRASH_AT`` names no real point: each pass is logged."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def __setitem__(self, key: str, value: int) -> None:
        self._recorder.note(f"crash_point({key})")
        super().__setitem__(key, value)


def record_crash_points(monkeypatch: Any, recorder: Recorder) -> None:
    monkeypatch.setenv("AGENTQ_CRASH_AT", "recording:1")
    monkeypatch.setattr(faults, "_passes", RecordingCrashPoints(recorder))
