"""Side-effect records (``EFFECT#tool_use_id``): checkpoint before effect.

A side-effecting tool runs only after its ``started`` record is written (a conditional put,
fenced by the lease in the same transaction), so it runs at most once per ``tool_use_id``. An
existing record means an earlier worker got there first: its result if it finished, or a
``started`` record whose outcome nobody knows, which is reported as such, never re-run.
"""

from __future__ import annotations

import time
from typing import Any

from agentq.core.models import Lease, ToolOutcome
from agentq.core.records import EffectRecord
from agentq.storage import keys
from agentq.storage.leases import why_fenced
from agentq.storage.serdes import Payloads
from agentq.storage.table import Check, Patch, Put, Table, TransactionCancelled, Update, absent, fence, plain


class Effects:
    def __init__(self, table: Table, payloads: Payloads) -> None:
        self.table = table
        self.payloads = payloads

    def begin(self, lease: Lease, tool_use_id: str, name: str, step: int | None = None) -> EffectRecord | None:
        """Record that a side-effecting tool is about to run; None means "go ahead, run it".
        ``step``: the LLM step of the call it is begun for (``core.call_keys``), on the record."""
        item = {
            **keys.item_key(lease.task_id, f"{keys.EFFECT}{tool_use_id}"),
            "tool": name,
            "state": "started",
            "epoch": lease.epoch,
            "started_at": time.time(),
            **({"step": step} if step is not None else {}),
        }
        try:
            self.table.transact(
                [Check("lease", keys.meta_key(lease.task_id), fence(lease)), Put("effect", item, absent())]
            )
            return None
        except TransactionCancelled as exc:
            if "lease" in exc.failed:
                raise why_fenced(self.table, lease) from exc
            return self.get(lease.task_id, tool_use_id)

    def finish(self, lease: Lease, tool_use_id: str, outcome: ToolOutcome) -> None:
        stored = self.payloads.encode(
            f"{keys.payload_prefix(lease.task_id)}effects/{tool_use_id}-e{lease.epoch}.txt", outcome.content
        )
        update = Update(set={"state": "done", "is_error": outcome.is_error, "finished_at": time.time(), **stored})
        try:
            self.table.transact(
                [
                    Check("lease", keys.meta_key(lease.task_id), fence(lease)),
                    Patch("effect", keys.item_key(lease.task_id, f"{keys.EFFECT}{tool_use_id}"), update),
                ]
            )
        except TransactionCancelled as exc:
            fenced = why_fenced(self.table, lease)
            if fenced.details.get("gone"):  # purged under the call: its outcome, put first, goes too
                self.payloads.delete_prefix(keys.payload_prefix(lease.task_id))
            raise fenced from exc

    def remember(self, lease: Lease, tool_use_id: str, remote: dict[str, Any]) -> None:
        """Record on a started call what it started at a remote A2A agent (fenced): a worker
        that resumes the call looks at that task again instead of sending anything."""
        update = Update(set={"remote": remote})
        try:
            self.table.transact(
                [
                    Check("lease", keys.meta_key(lease.task_id), fence(lease)),
                    Patch("effect", keys.item_key(lease.task_id, f"{keys.EFFECT}{tool_use_id}"), update),
                ]
            )
        except TransactionCancelled as exc:
            raise why_fenced(self.table, lease) from exc

    def get(self, task_id: str, tool_use_id: str) -> EffectRecord | None:
        raw = self.table.get(keys.item_key(task_id, f"{keys.EFFECT}{tool_use_id}"))
        if raw is None:
            return None
        data = plain(raw)
        content = self.payloads.decode(data) if ("body" in data or "ref" in data) else None
        return EffectRecord(
            tool_use_id=tool_use_id,
            state=data["state"],
            content=content,
            is_error=bool(data.get("is_error", False)),
            epoch=data["epoch"],
            remote=data.get("remote"),
            step=int(data["step"]) if "step" in data else None,
            tool=data.get("tool"),
            started_at=float(data.get("started_at", 0.0)),
        )
