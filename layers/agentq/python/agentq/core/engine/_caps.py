"""The windows an LLM call holds on before it is sent, beyond its task tree's budget: the
tenant's hourly window (``storage.tenant_windows``) and the caps of the task's end user, agent
and API key (``core.caps``, ``storage.scope_caps``).

Invariant (ARCHITECTURE 4, "spend <= cap at every scope"): a call, the agent's own or the
grading model's (``_grade_budget``), goes out only under a hold
on every window that caps it, taken with one conditional write per window item, and the hold
is settled to what the call used by whoever learns it (the run's commit, a discard of an answer
whose lease was lost, a zombie's late answer) through the same ``settle`` the tenant window
uses: every path that settles the tenant's hold settles the caps' with it, because both are one
``CallHold``.

A hold that would pass a cap defers the task until the window rolls over (or a raise lets it
go), holding nothing. One that would pass a soft threshold pauses the task for a person's
approval (the approval book a tool's ``ask`` uses, under ``core.caps.approval_id``): approved,
the task holds up to the cap for the rest of that window; rejected, it ends ``cost_exceeded``
naming the cap.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentq.core.caps import CapHold, CapReached, ScopeCap, SoftCapReached, counted, scopes_of
from agentq.core.engine._finish import finish_without_step
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._session import Session
from agentq.core.engine.result import RunResult
from agentq.core.models import Task, TaskStatus
from agentq.core.ports import ApprovalBook, ScopeCapsPort, TaskLeases, TenantWindowsPort
from agentq.core.tenancy import TenantCapReached, TenantLimits, WindowHold

MAX_APPROVALS_A_CALL = 8  # one per soft threshold a call can meet: 3 scopes x 2 windows, and room


@dataclass(frozen=True)
class CallHold:
    """One call's holds: on the tenant's window and on its scopes' caps (either may be None)."""

    tenant: WindowHold | None
    caps: CapHold | None

    def record(self) -> dict[str, Any]:
        """The holds as META keeps them beside a batch (``_llm_batch``): the batch's call holds
        on the windows for the batch's whole life, and whoever learns its outcome, maybe another
        worker a day later, settles them from this."""
        out: dict[str, Any] = {}
        if self.tenant is not None:
            out["tenant"] = dataclasses.asdict(self.tenant)
        if self.caps is not None:
            out["caps"] = {**dataclasses.asdict(self.caps), "scopes": [list(p) for p in self.caps.scopes]}
        return out

    @classmethod
    def recorded(cls, raw: Mapping[str, Any]) -> CallHold | None:
        """The holds ``record`` wrote (None: nothing held, nothing capped the call)."""
        t, c = raw.get("tenant"), raw.get("caps")
        tenant = WindowHold(str(t["tenant"]), str(t["hour"]), int(t["amount"]), int(t["micros"])) if t else None
        caps = (
            CapHold(str(c["tenant"]), tuple((str(scope), str(name)) for scope, name in c["scopes"]), str(c["day"]),
                    str(c["hour"]), int(c["amount"]), int(c["micros"]))
            if c else None
        )  # fmt: skip
        return cls(tenant, caps) if tenant is not None or caps is not None else None


def _parts(hold: Any) -> tuple[Any, Any]:
    """A call's hold on the tenant's window and on its scopes' caps: a ``CallHold``'s two, or a
    tenant window's hold alone (``CallWindows.hold``, the ``TenantWindowsPort`` side)."""
    return (hold.tenant, hold.caps) if isinstance(hold, CallHold) else (hold, None)


def spend_holds(tenant_windows: TenantWindowsPort, scope_caps: ScopeCapsPort, hold: Any) -> None:
    """``CallWindows.spend`` for a caller with no run (a cancel: ``_llm_batch``)."""
    tenant, caps = _parts(hold)
    if tenant is not None:
        tenant_windows.settle(tenant, tenant.amount, tenant.micros)
    if caps is not None:
        scope_caps.settle(caps, caps.amount, caps.micros)


class CallWindows:
    """``TenantWindowsPort`` for the parts that settle a call's hold (they need not know what it
    holds on), and ``take`` for the turn that takes it."""

    def __init__(self, tenant: TenantWindowsPort, caps: ScopeCapsPort, approvals: ApprovalBook) -> None:
        self.tenant, self.caps, self.approvals = tenant, caps, approvals

    def limits(self, tenant: str) -> TenantLimits | None:
        return self.tenant.limits(tenant)

    def with_default(self, default: TenantLimits | None) -> CallWindows:
        return CallWindows(self.tenant.with_default(default), self.caps, self.approvals)

    def hold(self, tenant: str, limits: TenantLimits, amount: int, now: float | None = None, *, micros: int = 0) -> Any:
        return self.tenant.hold(tenant, limits, amount, now, micros=micros)

    def caps_of(self, task: Task, *, count_user: bool = False) -> list[ScopeCap]:
        """The caps the task spends against (read once per claim; no read without a scope).
        ``count_user``: the end user's day is counted even without a cap of the user (a policy
        rule of the tenant reads it: ``core.caps.counted``)."""
        scopes = scopes_of(task)
        caps = self.caps.applicable(task.tenant, scopes) if scopes else []
        if count_user and task.user and not any(c.scope == "user" for c in caps):
            caps = [counted(task.tenant, task.user), *caps]  # the user's first, as ``applicable`` orders them
        return caps

    def settle(self, hold: Any, used: int, used_micros: int = 0) -> None:
        """Replace a call's holds by what it used (``used=0``: give them back)."""
        tenant, caps = _parts(hold)
        if tenant is not None:
            self.tenant.settle(tenant, used, used_micros)
        if caps is not None:
            self.caps.settle(caps, used, used_micros)

    def spend(self, hold: Any) -> None:
        """Count a call's holds as spent at their size: its outcome is unknown (cut at the task's
        timeout, or failed after an attempt that may have been billed), as the task's budget
        counts its hold (``BudgetHolds.spend``). Every window keeps what it held, the caps' too."""
        spend_holds(self.tenant, self.caps, hold)

    def take(
        self, s: Session, amount: int, micros: int, tasks: TaskLeases, holds: BudgetHolds, *, result: str | None = None
    ) -> CallHold | RunResult | None:
        """The call's holds (None: nothing caps it), or how the run ends instead: deferred at a
        cap (the tenant's or a scope's), paused at a soft threshold, ended at a rejected one
        (with ``result`` as the task's result, else the model's last text: a grade keeps its
        answer). On every way out but a hold, the task's budget hold goes back with the lease.
        The agent's turn and the grading model's call (``_grade_budget``) take it alike."""
        if s.limits is None and not s.caps:
            return None
        for _ in range(MAX_APPROVALS_A_CALL):
            try:
                return self._hold(s, amount, micros)
            except TenantCapReached as exc:  # not this task's fault: try again next hour
                holds.hand_back(s)
                return RunResult(s.task_id, "retry", error={**exc.to_dict(), "retry_after": exc.retry_after})
            except CapReached as exc:  # wait for the window to roll over: a delayed message, no receive spent
                holds.hand_back(s)
                error = {**exc.to_dict(), "scope": exc.scope, "window": exc.window, "retry_after": exc.retry_after}
                return RunResult(s.task_id, "deferred", error=error)
            except SoftCapReached as exc:
                ended = self._soft(s, exc, tasks, holds, result)
                if ended is not None:
                    return ended
        raise RuntimeError(f"task {s.task_id}: more soft thresholds than a call can meet")

    def try_take(self, s: Session, amount: int, micros: int) -> tuple[bool, CallHold | None]:
        """For a call that never stops its task (an online grade's): ``(True, its holds)``, or
        ``(False, None)`` with nothing held when a cap, or a soft threshold no person approved
        going past, is in the way (it neither defers nor pauses the task)."""
        if s.limits is None and not s.caps:
            return True, None
        try:
            return True, self._hold(s, amount, micros)
        except (TenantCapReached, CapReached, SoftCapReached):
            return False, None

    def _hold(self, s: Session, amount: int, micros: int) -> CallHold:
        window = self.tenant.hold(s.task.tenant, s.limits, amount, micros=micros) if s.limits is not None else None
        try:
            # the task's user reads the refusal: it names no shared window's spend (storage/scope_caps.py)
            approved, user = frozenset(s.caps_approved), s.task.user
            capped = self.caps.hold(s.caps, amount, micros=micros, approved=approved, user=user) if s.caps else None
        except (CapReached, SoftCapReached):
            if window is not None:
                self.tenant.settle(window, 0)
            raise
        return CallHold(window, capped)

    def _soft(
        self, s: Session, exc: SoftCapReached, tasks: TaskLeases, holds: BudgetHolds, result: str | None = None
    ) -> RunResult | None:
        """None when a person approved going past this threshold (the call tries again), else
        the run's end: paused to ask, or ended ``cost_exceeded`` when the answer was no."""
        record = self.approvals.get(s.task_id, exc.approval)
        if record is not None and record.state == "approved":
            s.caps_approved.add(exc.approval)
            return None
        if record is not None and record.state != "pending":
            ended = finish_without_step(tasks, holds, s, TaskStatus.COST_EXCEEDED,
                                        note=f" ({exc.message}; a person declined)", result=result)  # fmt: skip
            return ended
        holds.release(s)  # a paused task holds nothing
        # The tenant's to decide: a cap is the operator's line on what a user, an agent or a key
        # spends, and a user approving its own way past it (or past one its agent's users share)
        # would decide what the line is there to ask the operator.
        self.approvals.request(s.lease, exc.approval, exc.message, approver="tenant")
        s.task = s.task.model_copy(update={"status": TaskStatus.PAUSED})
        paused = RunResult(s.task_id, "waiting", status=TaskStatus.PAUSED)
        timeout = s.task.submission.constraints.approval_timeout_seconds
        if timeout is not None:
            paused.approval_due = (record.asked_at if record is not None else time.time()) + timeout
        return paused
