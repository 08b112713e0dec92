"""A task as the store reads it (``Task``, its META item), with its lease and its latest retry."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentq.core.models.strict import StrictModel
from agentq.core.models.submission import TaskSubmission
from agentq.core.reservation import Reservation, Seen
from agentq.core.status import TaskStatus
from agentq.core.workspace import WorkspaceRef


class Lease(StrictModel):
    task_id: str
    owner: str
    epoch: int
    expires_at: float


class LostClaim(StrictModel):
    """The claim a claim took the task over from whose worker never gave the lease back (its
    lease lapsed, or its worker's liveness): killed, or stalled. What the trace tells of it, its
    ``run`` span never sent by its own worker (``observe.otel.task_run``)."""

    epoch: int
    worker: str
    claimed_at: float
    heartbeat_at: float | None = None  # its worker's last sign of life


class RetryState(StrictModel):
    """The latest retry of a task: the failure, which attempt it ended, when the next try is.

    ``scope`` says who retries: ``call``, the worker retrying the provider call while it holds
    the task; ``delivery``, the queue bringing the task back after the call's attempts were
    spent (``attempt`` is then the delivery); ``deferral``, the task put off before its call
    by the fleet's flow control (``code``: circuit_open, slowed_down, rate_limited) or by a lost
    lease's call that may still be charged (call_in_flight): nothing failed, it waits. Kept beside META (``META#RETRY``), never in it:
    META is rewritten by every step commit and stays small. Current while ``step`` is not
    committed and the task has not ended; afterwards it is history (the trace shows it).
    """

    step: int = Field(description="the step the failed attempt was for")
    scope: Literal["call", "delivery", "deferral"]
    attempt: int = Field(ge=1)
    max_attempts: int = Field(ge=1)
    code: str = Field(max_length=64)
    message: str = Field(max_length=500)
    status_code: int | None = None
    at: float = Field(description="when the attempt failed")
    next_at: float = Field(description="when the next attempt starts")


class Task(BaseModel):
    """The META item of a task, as the store reads it."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    tenant: str
    status: TaskStatus
    submission: TaskSubmission
    root_id: str
    parent_id: str | None = None
    depth: int = 0
    step: int = 0
    llm_steps: int = 0
    compacted_at: int = 0  # the latest compaction step: a resume reads the steps from it on
    batch: dict[str, Any] | None = None  # economy: the batch the next LLM turn was sent in (id, custom_id, step, epoch)
    # The id of the batch whose windows' hold (``batch["windows"]``) was settled outside the step
    # commit that reads its answer (an errored or lost batch, a discarded answer, a cancel): by
    # whoever took it first (``TaskLeases.take_batch_hold``); no reader settles it again.
    batch_settled: str | None = None
    look_due: float | None = None  # waiting on a remote agent or a batch: its look's due (core.status.LOOK_DUE)
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires: float = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal(0)
    result: str | None = None
    error: dict[str, Any] | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    # Claim history lives in CLAIM# items (META stays small: every step commit rewrites it);
    # META keeps what the latency figures need.
    claim_count: int = 0
    resume_count: int = 0  # the claims that took over a run in progress (storage.leases)
    claimed_from: TaskStatus | None = None  # the status the latest claim took the task from
    first_claimed_at: float | None = None
    last_claimed_at: float | None = None
    inflight: Reservation | None = None  # the hold for the next LLM call (until: its deadline)
    # Holds of older epochs whose calls may still complete, set aside by a successor: by epoch.
    lapsed_holds: dict[int, Reservation] = Field(default_factory=dict)
    spawn_id: str | None = None  # the parent's spawn_subagents tool_use id, for a child
    key_id: str | None = None  # the API key that submitted its root: agentq stop --key, its caps
    task_token: str | None = None  # Step Functions callback token, for a child run by a fan-out
    heartbeat_at: float | None = None  # last sign of life of the lease holder
    prev_heartbeat_at: float | None = None  # ... of the previous holder, as seen by the last claim
    updated_at: float | None = None
    forked_from: dict[str, Any] | None = None  # {"task_id", "step"} of a fork's source
    expires_at: int | None = None  # set while terminal: when DynamoDB TTL deletes it (epoch seconds)
    retry: RetryState | None = None  # META#RETRY, read by Tasks.get (not by claim or get_many)
    live_text: str | None = None  # the tail of the text of a streamed call in flight (best effort)
    seen: Seen | None = None  # what that call billed so far, as its stream said (core.reservation)
    # A person's messages (storage.messages): accepted, delivered into the conversation, and an
    # interrupt asked for and not yet heard; a closed conversation takes no more.
    messages_received: int = 0
    messages_delivered: int = 0
    interrupt_at: float | None = None
    conversation_closed: bool = False
    # Each write that reopens an ended task (a follow-up, a redrive, a raised budget) starts its
    # next invocation: counted here, with when it started and the token totals it started from
    # (the telemetry's ``invoke_agent`` span of each, ``observe/otel.py``). 0: from the submission.
    invocation: int = 0
    invoked_at: float | None = None
    # When it first ended, set by the write that first reopened it (a follow-up, a redrive, a
    # raised budget), which keeps that end (``FIRSTEND``: ``TaskItems.first_end``). None: it
    # never left an end (or left it before this was kept).
    first_ended_at: float | None = None
    invocation_tokens_in: int = 0
    invocation_tokens_out: int = 0
    # The invocation whose ``invoke_agent`` span was sent and flushed (written after the flush):
    # a redelivery of an ended task sends it when the run that ended it died first. Written only
    # where OpenTelemetry export is on; None: none of this task's.
    traced_invocation: int | None = None
    # Set by the claim that took the task over from a worker that never gave the lease back
    # (``storage.leases``), never stored: the trace's account of that claim.
    lost_claim: LostClaim | None = None
    slots: list[str] = Field(default_factory=list)  # the running slots it holds (storage.running_slots)
    # The provider and model that answer since a fallback took over (set by the commit of the
    # step that records the switch); None: the task's own model answers.
    answered_by: dict[str, str] | None = None
    # The workspace as of the last committed step that changed it (core.workspace): what a
    # takeover restores. None: the submission's starting files (or an empty workspace).
    workspace: WorkspaceRef | None = None
    # The starting files a clone made (``WorkspaceSpec.git``), recorded once at the first claim
    # before any step ran: step 0's files. None: the start is the submission's own.
    workspace_start: WorkspaceRef | None = None
    # The latest grade of the task's answer (``core.engine._grade``, set by a grade step's
    # commit): score, passed, attempt, feedback, the grading model's tokens and dollars, and the
    # count of messages delivered when it was graded (a new round of the conversation starts
    # its attempts again). None: no outcome, or not graded yet.
    grade: dict[str, Any] | None = None

    @field_validator("inflight", mode="before")
    @classmethod
    def _stored_hold(cls, raw: Any) -> Any:
        """META stores a hold as a map (``storage.budgets.ticket_value``): read it as one."""
        if isinstance(raw, dict):
            return Reservation.from_ticket(raw) if raw else None
        return raw

    @field_validator("seen", mode="before")
    @classmethod
    def _stored_seen(cls, raw: Any) -> Any:
        return Seen.from_item(raw) if isinstance(raw, dict) else raw

    @field_validator("lapsed_holds", mode="before")
    @classmethod
    def _stored_lapsed_holds(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        return {
            int(epoch): Reservation.from_ticket(hold, epoch=int(epoch)) if isinstance(hold, dict) else hold
            for epoch, hold in raw.items()
        }

    @property
    def user(self) -> str | None:
        """The end user the task acts for (``core.endusers``): its submission's, which a child's
        copies from its parent (``core.fanout``)."""
        return self.submission.user

    @property
    def retrying(self) -> RetryState | None:
        """The retry in progress: its step not committed yet, the task not ended."""
        if self.retry is None or self.status.terminal or self.retry.step <= self.step:
            return None
        return self.retry

    @property
    def budget_id(self) -> str:
        """Every task draws on its own budget, kept on its META: the root's is the tree's cap, a
        child's is the share its parent allocated to it at spawn time."""
        return self.task_id

    @property
    def pickup_latency(self) -> float | None:
        """Submission to first claim."""
        return self.first_claimed_at - self.created_at if self.first_claimed_at is not None else None

    @property
    def last_resume_gap(self) -> float | None:
        """Previous holder's last heartbeat to the latest claim, when that claim resumed a run
        (took it from ``running``): an upper bound on how long the task sat with nobody working
        on it after a worker died. A claim after a follow-up or any other requeue measures the
        time the task was stopped, not a resume: None."""
        if self.claimed_from is not TaskStatus.RUNNING:
            return None
        if self.claim_count < 2 or self.prev_heartbeat_at is None or self.last_claimed_at is None:
            return None
        return self.last_claimed_at - self.prev_heartbeat_at
