"""Human approval: the ``request_approval`` tool pauses a task until a person decides.

The task moves to ``paused`` and holds no worker. ``agentq approve|reject`` (or the API)
records the decision, which the model then reads as the tool's result, and the task resumes
from its checkpoint. Other tool calls of the same turn wait for the decision too, so an
approval can gate a side effect requested alongside it.

``request_credential`` is the same pause for a credential the task's user lacks
(``core.vault``): the question names the credential and the host, and it is decided by the
user adding the credential (``control.vault.put``), or declined like any approval.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from agentq.core.models import ToolOutcome
from agentq.core.records import ApprovalRecord
from agentq.core.tools import ToolSpec, tool
from agentq.core.vault import NAME_PATTERN, REQUEST_CREDENTIAL_TOOL

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
    by = record.decider
    return ToolOutcome(
        tool_use_id=use["id"],
        name=APPROVAL_TOOL,
        content=f"{verdict} by {by}: {note}",
        started_at=started_at,
        duration_ms=int((now - started_at) * 1000),
    )


@tool(name=REQUEST_CREDENTIAL_TOOL, side_effects=False, timeout_seconds=10)
def request_credential(
    name: Annotated[str, Field(pattern=NAME_PATTERN, description="the credential a tool said is unavailable")],
    host: Annotated[str, Field(max_length=255, pattern=r"^[^\s]*$", description="the host it is for")] = "",
    reason: Annotated[str, Field(max_length=2000, description="why the task needs it, for the user")] = "",
) -> str:
    """Ask the user this task acts for to add a credential a tool said is unavailable
    (credential_unavailable); the task pauses until they add it (or decline), then this returns
    and you may retry the call. You never see the credential itself."""
    raise RuntimeError("request_credential is carried out by the agentq engine")


def credential_request_spec() -> ToolSpec:
    return request_credential


def credential_question(user: str | None, name: str, host: str, reason: str) -> str:
    who = f"user {user}" if user else "the tenant"
    at = f" for {host}" if host else ""
    command = f"agentq vault put {name}" + (f" --user {user}" if user else "") + (f" --host {host}" if host else "")
    why = f" ({reason})" if reason else ""
    return f"credential {name!r}{at} is needed from {who}{why}: add it ({command}) and the task resumes"


def credential_outcome(
    use: dict[str, Any], record: ApprovalRecord | None, started_at: float, now: float
) -> ToolOutcome:
    """What ``request_credential`` returns: added (record None: it was there already, or the
    user added it) or declined."""
    name = str((use.get("input") or {}).get("name", ""))
    if record is None or record.state == "approved":
        content = f"credential {name!r} is available now: retry the call that needed it"
    else:
        who = record.decider if record.decided_by or record.decided_by_user else "the user"
        content = f"DECLINED by {who}: {record.note or '(no note)'}; go on without it"
    return ToolOutcome(
        tool_use_id=use["id"],
        name=REQUEST_CREDENTIAL_TOOL,
        content=content,
        is_error=record is not None and record.state != "approved",
        status="ok" if record is None or record.state == "approved" else "error",
        started_at=started_at,
        duration_ms=int((now - started_at) * 1000),
    )
