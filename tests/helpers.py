"""Small builders shared by tests."""

from __future__ import annotations

from typing import Any

from agentq.models import TaskSubmission


def scripted(turns: list[dict[str, Any]], *, tools: list[str] | None = None, **constraints: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "test goal",
            "provider": "scripted",
            "script": {"turns": turns},
            "constraints": {"tools": tools or [], **constraints},
        }
    )


def call(name: str, **inputs: Any) -> dict[str, Any]:
    return {"name": name, "input": inputs}
