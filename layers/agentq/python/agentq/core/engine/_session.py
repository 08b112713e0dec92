"""One worker's hold on one task, in two parts with different owners.

``LeaseState`` is what the heartbeat shares with the loop (its own thread, or the worker's
shared heartbeat in ``queueing.heartbeat``): the lease it renews, the flag it raises when a
renewal is refused, the commit on the wire that renews the lease anyway, and the live text a
streamed call publishes. ``Session`` is the run's own state, touched by the loop's thread only:
the task as last written, the committed steps and the conversation they make. What one LLM call
alone touches (its request, its route, what its attempts told) is that call's
(``_llm_call.Call``), not the session's.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from agentq.core.call_keys import CallRef, call_ref
from agentq.core.caps import ScopeCap
from agentq.core.errors import LeaseLost
from agentq.core.models import Lease, StepRecord, Task, ToolHistory
from agentq.core.ports import NoteBook, TaskLeases
from agentq.core.records import Inbox
from agentq.core.reservation import Seen
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry

log = logging.getLogger("agentq.engine")


@dataclass
class LeaseState:
    """What the heartbeat and the loop share: written by both, each field by one side at a time."""

    lease: Lease
    tenant: str | None = None  # the task's: a message the heartbeat sends for it carries its fair-queue group
    lost: threading.Event = field(default_factory=threading.Event)
    commit_sent_at: float | None = None  # a step commit is on the wire: it renews (or ends) the lease
    live_text: str | None = None  # a streamed call's text so far, which the heartbeat publishes
    seen: Seen | None = None  # what that call billed so far, as its stream said: published with it
    # Since when (monotonic) a call that may reach the network through the egress proxy runs (a
    # shell of a task that allows hosts): the heartbeat looks at its task's META meanwhile
    # (``queueing.heartbeat``, ``stop_look_seconds``), so a stop ends it without waiting for a write.
    reaching_since: float | None = None
    why: LeaseLost | None = None  # what told this run its lease is gone (``lose``), if anything said

    def lose(self, why: LeaseLost) -> None:
        """Something other than the run learned that the task no longer runs under this lease
        (a refused lease write or live text, a read of META with a credential or by the
        heartbeat's look): ``lost`` is raised, which kills the task's running sandbox
        (``TaskWorkspace.halt``, ``sandbox.supervise``), and the run's next ``check`` raises
        ``why`` as the store told it (a stop's mark, a status, another epoch), so the run ends as
        that write would have ended it (``result.lease_lost``)."""
        if self.why is None:
            self.why = why
        self.lost.set()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the heartbeat or a read (``lose``) learned that the task is no
        longer this run's: with the reason the store gave, when one did."""
        if self.lost.is_set():
            why = self.why
            if why is not None:
                raise LeaseLost(why.message, **why.details)
            raise LeaseLost(f"lease epoch {self.lease.epoch} of task {self.lease.task_id} could not be extended")


@dataclass(frozen=True)
class Shortfall:
    """What the budget lacked when a call's hold was refused, in each unit: the least the call
    could hold (``needed_*``) against what the budget had left (``available_*``), in tokens and
    in millionths of a dollar. The task's error names each unit that is short, one or both
    (``_stops.budget_error``): a person raising the cap learns by how much, and a check of the
    ledger can tell an ending the billed usage caused from one the unknown did (bench/chaos.py).
    ``counted_input``: the call's input as its provider counted it before the hold was refused
    (``_input_count``: a shrunk hold's call); ``needed_tokens`` then reads it, with its margin,
    where it is more than the estimate."""

    needed_tokens: int
    available_tokens: int
    needed_micros: int
    available_micros: int
    counted_input: int | None = None

    @property
    def of_tokens(self) -> bool:
        return self.needed_tokens > self.available_tokens

    @property
    def of_money(self) -> bool:
        return self.needed_micros > self.available_micros


@dataclass
class Session:
    """The run's conversation state: the task as this run last wrote it, its committed steps
    and the messages they make; read and written by the loop's thread only."""

    held: LeaseState
    task: Task
    steps: list[StepRecord]
    messages: list[dict[str, Any]]
    deadline: float | None
    committed: int = 0
    stop: threading.Event | None = None  # set by a worker shutting down: end at the next step boundary
    limits: TenantLimits | None = None  # the tenant's hourly window, read once per claim
    caps: list[ScopeCap] = field(default_factory=list)  # its user's, agent's and key's caps, read once per claim
    caps_approved: set[str] = field(default_factory=set)  # soft thresholds a person let it pass (core.caps)
    tools: ToolRegistry | None = None  # the worker's tools plus the task's MCP tools (RequestBuilder.registry)
    # The context of the next step, worked out once per step (the reservation's estimate,
    # the request and the step record all need it; each costs a pass over the conversation).
    context: tuple[int, list[dict[str, Any]], int, bool] | None = None
    earlier_turns: int = 0  # LLM turns before the steps loaded (a resume starts at the latest compaction)
    shortfall: Shortfall | None = None  # what the budget lacked when a hold was refused (cleared by one taken)
    # The step of the hold under which this run has started sending a call (or submitted a
    # batch, or adopted one): a hold of another step, found when the lease is lost, is one whose
    # call never went out. The hold's own step, not the call's: a message delivered after the
    # tools commit that reserved the hold moves the call one step on, under that same hold.
    # The run's, not one call's: the loop reads it whichever turn learnt of the lost lease.
    sent_hold_step: int | None = None
    goal: str = ""  # the first message: the submission's goal, with its dependencies' results (core.dependencies)
    inbox: Inbox = field(default_factory=Inbox)  # a person's messages and interrupt, as META last said (_messages)
    workspace: Any = None  # the task's workspace on this worker, while the run holds it (_workspace.TaskWorkspace)
    verdicts: dict[str, Any] = field(default_factory=dict)  # the turn's policy verdicts by tool_use id (_policy)
    credentials: Any = None  # the vault of the task's user, opened on first use (_credentials.TaskCredentials)
    # The tool calls before a compaction that carries none of them (one from before they were
    # carried), read once a run: (the compaction's step, their history). ``_history``.
    tools_before: tuple[int, ToolHistory] | None = None

    @property
    def lease(self) -> Lease:
        return self.held.lease

    @property
    def task_id(self) -> str:
        return self.held.lease.task_id

    @property
    def next_step(self) -> int:
        return self.steps[-1].number + 1 if self.steps else 1

    def call(self, use: dict[str, Any]) -> CallRef:
        """``use``, a call of the turn being made, as its records are keyed and told apart
        (``core.call_keys``): the last step is the LLM step that asked for it."""
        return call_ref(use, self.steps[-1] if self.steps else None)

    @property
    def llm_turns(self) -> int:
        return self.earlier_turns + sum(1 for s in self.steps if s.body.kind == "llm")

    @property
    def economy(self) -> bool:
        return self.task.submission.constraints.economy


class LeaseKeeper:
    """Extends the lease in the background; a failed extension marks the lease lost.

    ``on_beat`` runs after each successful extension (the SQS adapter extends the message's
    visibility there). One thread per task: right for Lambda and single-task runs; the
    long-running worker shares one heartbeat thread across all its tasks instead.
    """

    def __init__(
        self,
        tasks: TaskLeases,
        held: LeaseState,
        lease_seconds: float,
        interval: float,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self.tasks = tasks
        self.held = held
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.on_beat = on_beat
        self._stop = threading.Event()
        # Started in the task's context, so its log lines name the task and step too.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._run,),
            name=f"lease-{held.lease.task_id[:8]}",
            daemon=True,
        )

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.held.lease = self.tasks.extend_lease(
                    self.held.lease, self.lease_seconds, live_text=self.held.live_text, seen=self.held.seen
                )
                if self.on_beat is not None:
                    self.on_beat()
            except LeaseLost as exc:
                log.warning("lease lost for task %s", self.held.lease.task_id)
                self.held.lose(exc)
                return
            except Exception:  # network blip: the next beat may succeed before expiry
                log.exception("heartbeat failed for task %s", self.held.lease.task_id)


# What keeps a run's lease alive: given the shared lease state, a context manager around the run.
KeeperFactory = Callable[[LeaseState], AbstractContextManager[Any]]


class TaskNotes:
    """Notes seen by tools: reads are free, writes are fenced by the worker's lease."""

    def __init__(self, notes: NoteBook, held: LeaseState) -> None:
        self.notes = notes
        self.held = held

    def read_note(self, key: str) -> str | None:
        return self.notes.read(self.held.lease.task_id, key)

    def write_note(self, key: str, value: str) -> None:
        self.notes.write(self.held.lease, key, value)
