"""Typed records that cross the storage seam (what repositories return besides ``Task`` and
``StepRecord``): callers read attributes, never a raw item's keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from agentq.core.endusers import Approver
from agentq.core.fanout import ChildPlan
from agentq.core.models import CompactStep, LLMStep, ToolOutcome
from agentq.core.pricing import micros
from agentq.core.reservation import Reservation as Reservation


@dataclass(frozen=True)
class BudgetState:
    cap: int
    reserved: int
    used: int
    available: int
    cost_usd: Decimal
    tokens_in: int = 0
    tokens_out: int = 0
    settled: bool = False
    # The same ledger in millionths of a dollar (``max_cost_usd``; a budget without one has
    # NO_MONEY_CAP, so both ledgers always run and one code path keeps both exact).
    cap_micros: int = 0
    reserved_micros: int = 0
    used_micros: int = 0
    available_micros: int = 0
    # The part of ``used`` (and ``used_micros``) whose calls' outcomes are unknown: holds counted
    # as spent because no one learned what their calls used (a worker killed mid-call, a reply
    # cut in the middle), and a folded child's. At most the holds; the rest of ``used`` is what
    # the provider reported (``known``).
    unknown: int = 0
    unknown_micros: int = 0

    @property
    def known(self) -> int:
        return self.used - self.unknown

    @property
    def known_micros(self) -> int:
        return self.used_micros - self.unknown_micros


@dataclass(frozen=True)
class BudgetDelta:
    """How a committed LLM call settles its reservation against the root budget."""

    reserved: int
    used: int
    cost_usd: Decimal
    tokens_in: int
    tokens_out: int
    reserved_micros: int = 0  # the dollars the hold took, in millionths

    @property
    def used_micros(self) -> int:
        return micros(self.cost_usd)


NO_USAGE = BudgetDelta(reserved=0, used=0, cost_usd=Decimal(0), tokens_in=0, tokens_out=0)


@dataclass(frozen=True)
class Inbox:
    """What META says of a task's messages (``storage.messages``): how many it accepted, how
    many the conversation holds, and an interrupt asked for and not yet heard."""

    received: int = 0
    delivered: int = 0
    interrupt_at: float | None = None

    @property
    def waiting(self) -> int:
        return self.received - self.delivered


@dataclass(frozen=True)
class EffectRecord:
    tool_use_id: str
    state: Literal["started", "done"]
    content: str | None
    is_error: bool
    epoch: int
    # A remote A2A agent's call: the task it started there (id, endpoint, context, the
    # questions already answered), recorded once the send answered (``core.engine._remote``).
    remote: dict[str, Any] | None = None
    # The call it was begun for (``core.call_keys``): its LLM step and tool, and when (a
    # record without a step was begun before records named their call).
    step: int | None = None
    tool: str | None = None
    started_at: float = 0.0


@dataclass(frozen=True)
class ClaimOwner:
    """The worker process whose liveness keeps a claimed task alive (``storage.workers``): its
    id and liveness epoch, and the task's queue message (its receipt and tier), which whoever
    finds the worker dead makes visible again so that the task resumes at once."""

    worker: str
    epoch: int
    message: str | None = None
    queue: str | None = None


@dataclass(frozen=True)
class ClaimRecord:
    """One claim of a task's lease: who took it, when, the previous holder's last beat, and the
    status it took the task from (``running``: it took over a run in progress, a resume; None in
    a record written before claims kept it)."""

    epoch: int
    worker: str
    at: float
    prev_heartbeat_at: float | None = None
    claimed_from: str | None = None

    @property
    def takeover(self) -> bool | None:
        return None if self.claimed_from is None else self.claimed_from == "running"


@dataclass(frozen=True)
class ConversationMark:
    """A turn of a conversation that is not a step, as its event log recorded it: a follow-up
    that reopened the answered or interrupted task (``message``: its number), an interrupt asked
    for (by ``POST /interrupt``, or by a message sent with the ``interrupt`` double-texting
    policy: ``message``), and the stop it caused (the task went ``idle``). ``after_step``: the
    step committed when it happened."""

    kind: Literal["follow_up", "interrupt_requested", "interrupted"]
    at: float
    after_step: int
    message: int | None = None


@dataclass(frozen=True)
class ApprovalRecord:
    use_id: str
    state: Literal["pending", "approved", "rejected"]
    question: str
    asked_at: float
    note: str | None = None
    decided_by: str | None = None  # the tenant whose key or token decided ("timeout", "vault": agentq itself)
    decided_at: float | None = None
    credential: dict[str, str] | None = None  # request_credential: {"name", "host"} it waits for
    decided_by_user: str | None = None  # the end user whose token decided (None: an API key, agentq)
    # Who may decide it, fixed when it was asked (``core.endusers.Approver``). A record asked
    # before approvers existed has none stored: ``user``, who could decide it when it was asked.
    approver: Approver = "user"
    # The call it was asked for (``core.call_keys``): its LLM step and tool (None: a soft
    # threshold's, or one asked before records named their call).
    step: int | None = None
    tool: str | None = None

    def may_decide(self, by_user: str | None) -> bool:
        """Whether a decision made by ``by_user``'s token (None: a tenant's API key, or agentq
        itself: a timeout, the vault) may decide it: a token only an ask its user may decide."""
        return by_user is None or self.approver == "user"

    @property
    def decider(self) -> str:
        """Who decided, as the model and a person read it: the end user and their tenant, or the tenant."""
        if self.decided_by_user is not None:
            return f"{self.decided_by_user} (an end user of {self.decided_by or 'the tenant'})"
        return self.decided_by or "a reviewer"


@dataclass(frozen=True)
class SpawnRecord:
    spawn_id: str
    children: list[str]
    max_concurrency: int
    state: Literal["creating", "created"]
    created_at: float
    epoch: int
    execution_arn: str | None = None
    woken: bool = False
    pending: list[ToolOutcome] = field(default_factory=list)
    plans: list[ChildPlan] = field(default_factory=list)
    step: int | None = None  # the LLM step of the call that spawned it (``core.call_keys``; None: from before)


@dataclass(frozen=True)
class IdempotencyRecord:
    tenant: str
    key: str
    task_id: str
    request_hash: str
    created_at: float
    expires_at: int


OrphanReason = Literal["lease_lost", "interrupted", "timed_out", "commit_failed"]


@dataclass(frozen=True)
class OrphanCall:
    """An LLM call that happened but whose step was never committed: its worker lost the lease
    (``lease_lost``), a person interrupted the task while it answered (``interrupted``), the
    task's timeout cut it and its answer came after all (``timed_out``), or a write of its commit
    failed (``commit_failed``: the store throttled past the retries, an outage; the run ended on it)."""

    number: int
    epoch: int
    call: LLMStep | CompactStep
    reason: OrphanReason = "lease_lost"
