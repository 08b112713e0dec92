"""Human approval: the ``request_approval`` tool pauses a task until a person decides.

The task moves to ``paused`` and holds no worker. ``agentq approve|reject`` (or the API)
records the decision, which the model then reads as the tool's result, and the task resumes
from its checkpoint. Other tool calls of the same turn wait for the decision too, so an
approval can gate a side effect requested alongside it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from agentq.core.models import ToolOutcome
from agentq.core.records import ApprovalRecord
from agentq.core.tools import ToolSpec, tool

APPROVAL_TOOL = "request_approval"


@tool(name=APPROVAL_TOOL, side_effects=False, timeout_seconds=10)
def request_approval(
    question: Annotated[str, Field(min_length=1, max_length=4000, description="what a person must approve or reject")],
    details: Annotated[str, Field(max_length=20_000, description="context the reviewer needs")] = "",
) -> str:
    """Ask a person to approve or reject something before you go on; the task pauses until
    they decide, and their decision and note come back as this tool's result."""
    raise RuntimeError("request_approval is carried out by the agentq engine")


def approval_tool_spec() -> ToolSpec:
    return request_approval


def decision_outcome(use: dict[str, Any], record: ApprovalRecord, started_at: float, now: float) -> ToolOutcome:
    verdict = "APPROVED" if record.state == "approved" else "REJECTED"
    note = record.note or "(no note)"
    by = record.decided_by or "a reviewer"
    return ToolOutcome(
        tool_use_id=use["id"],
        name=APPROVAL_TOOL,
        content=f"{verdict} by {by}: {note}",
        started_at=started_at,
        duration_ms=int((now - started_at) * 1000),
    )
