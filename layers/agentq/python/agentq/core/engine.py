"""The agent loop: claim, rebuild from committed steps, and go on step by step.

Order of writes in one turn (each a crash point, see ``faults``):
reserve -> LLM call -> commit LLM step (tool intents durable) -> per side-effecting tool:
begin effect -> run -> finish effect -> commit tools step (+ reserve the next call).
A worker killed anywhere loses at most the step in flight; the next worker rebuilds the
conversation from the committed steps and continues. Knows nothing of SQS or Lambda: the
adapters pass a deadline and read the ``RunResult``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from agentq import observe
from agentq.core.approval import APPROVAL_TOOL, decision_outcome
from agentq.core.context import (
    COMPACT_MAX_TOKENS,
    RECALL_TOOL,
    cleared,
    compaction_messages,
    context_window,
    recall_tool,
    resumed_goal,
    tool_results,
)
from agentq.core.dependencies import dependency_goal
from agentq.core.errors import (
    DETERMINISTIC_FAULTS,
    BudgetExceeded,
    IllegalTransition,
    LeaseLost,
    ProviderError,
    fault_error,
)
from agentq.core.fanout import (
    SPAWN_TOOL,
    FanoutLauncher,
    SpawnRejected,
    child_outcome,
    parse_spawn_input,
    plan_children,
    render_spawn_result,
)
from agentq.core.faults import crash_point
from agentq.core.flow import Admission, flow_key
from agentq.core.models import (
    CallStep,
    CompactStep,
    Constraints,
    Lease,
    LLMStep,
    RetryState,
    StepRecord,
    Task,
    TaskStatus,
    TaskSubmission,
    ToolOutcome,
    ToolsStep,
)
from agentq.core.output import FINAL_ANSWER_TOOL, answer_of, feedback, final_answer_tool
from agentq.core.output import INSTRUCTION as OUTPUT_INSTRUCTION
from agentq.core.ports import EngineStorage
from agentq.core.pricing import NO_MONEY_CAP, PriceTable, load_price_table, micros
from agentq.core.providers import LLMRequest, LLMResponse, ProviderFactory, default_provider_factory
from agentq.core.providers.base import (
    BATCH_PRICE_RATIO,
    BATCH_WINDOW_SECONDS,
    DEFAULT_MAX_CALL_SECONDS,
    BatchProvider,
    RetryNotice,
    reporting_retries,
    reporting_text,
)
from agentq.core.records import NO_USAGE, ApprovalRecord, BudgetDelta, Reservation
from agentq.core.secrets import Secrets, SecretSource
from agentq.core.tenancy import TenantCapReached, TenantLimits
from agentq.core.tools import ToolContext, ToolRegistry, default_registry, idempotency_key_for
from agentq.core.tools.mcp import McpServers, mcp_tool_specs

log = logging.getLogger("agentq.engine")

Outcome = Literal["finished", "continue", "retry", "deferred", "lease_lost", "not_claimed", "stopped", "waiting"]


class HoldsInFlight(Exception):
    """The budget cannot cover the next call while an older epoch's call may still be charged:
    the task waits ``wait`` seconds for that hold's deadline instead of overshooting the cap."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"a lost lease's call may complete within {wait:.1f}s")
        self.wait = wait


def _reservation(epoch: int, raw: dict[str, int | float]) -> Reservation:
    until = raw.get("until")
    return Reservation(
        amount=int(raw["amount"]),
        epoch=epoch,
        step=int(raw["step"]),
        until=None if until is None else float(until),
        micros=int(raw.get("usd", 0)),
    )


# A call must start within this many seconds of its hold's reservation, or the hold's deadline
# is moved first (a fenced write): the deadline is reservation + this + the maximum call time.
CALL_START_SLACK_SECONDS = 2.0

# Input estimate: 3 characters a token over the JSON of the request. Claude averages about
# 3.5-4 on English and JSON, so this over-reserves slightly and the budget cap holds.
ESTIMATE_CHARS_PER_TOKEN = 3
MIN_OUTPUT_TOKENS = 16
# Native compaction: a request this close to the trigger may be compacted by the server first;
# the summary that call writes is held at this many output tokens.
NATIVE_TRIGGER_MARGIN = 0.8
NATIVE_SUMMARY_TOKENS = 16_384


@dataclass(frozen=True)
class EngineConfig:
    lease_seconds: float = 30.0
    heartbeat_seconds: float | None = None  # default: a third of the lease
    slice_margin_seconds: float = 30.0  # stop this long before the caller's deadline
    default_tenant_limits: TenantLimits | None = None  # for tenants without limits of their own
    # The longest a provider call (its retries included) can take to complete. A hold stays
    # counted that long after its call could have started, even if its worker lost the lease.
    max_call_seconds: float = DEFAULT_MAX_CALL_SECONDS


@dataclass
class RunResult:
    task_id: str
    outcome: Outcome
    status: TaskStatus | None = None
    steps_committed: int = 0
    resumed_from_step: int = 0
    error: dict[str, Any] | None = None
    claimed: Task | None = None  # the task as this run claimed it (latency figures)
    # Ended while an older epoch's call may still be charged: its hold goes back after this.
    lapsed_until: float | None = None
    approval_due: float | None = None  # paused on an approval that takes its default at this time
    batch_poll: float | None = None  # waiting on a batch (economy): look at it again in this many seconds


@dataclass
class Session:
    """One worker's hold on one task: its lease, the conversation so far, and its clock."""

    lease: Lease
    task: Task
    steps: list[StepRecord]
    messages: list[dict[str, Any]]
    deadline: float | None
    committed: int = 0
    lost: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event | None = None  # set by a worker shutting down: end at the next step boundary
    limits: TenantLimits | None = None  # the tenant's hourly window, read once per claim
    claim_seconds: float = 0.0  # how long the claim's conditional write took (the worker sizes its intake on it)
    commit_sent_at: float | None = None  # a step commit is on the wire: it renews (or ends) the lease
    tools: ToolRegistry | None = None  # the worker's tools plus the task's MCP tools (Engine._registry)
    live_text: str | None = None  # a streamed call's text so far, which the heartbeat publishes
    # Engine._context of the next step, worked out once per step (the reservation's estimate,
    # the request and the step record all need it; each costs a pass over the conversation).
    context: tuple[int, list[dict[str, Any]], int, bool] | None = None
    earlier_turns: int = 0  # LLM turns before the steps loaded (a resume starts at the latest compaction)
    short_of: Literal["tokens", "money"] = "tokens"  # what the budget lacked when a hold was refused
    admission: Admission | None = None  # fleet flow control's answer for the call in progress (core.flow)
    goal: str = ""  # the first message: the submission's goal, with its dependencies' results (core.dependencies)

    @property
    def next_step(self) -> int:
        return self.steps[-1].number + 1 if self.steps else 1

    @property
    def llm_turns(self) -> int:
        return self.earlier_turns + sum(1 for s in self.steps if s.body.kind == "llm")


class LeaseKeeper:
    """Extends the lease in the background; a failed extension marks the session lost.

    ``on_beat`` runs after each successful extension (the SQS adapter extends the message's
    visibility there). One thread per task: right for Lambda and single-task runs; the
    long-running worker shares one heartbeat thread across all its tasks instead.
    """

    def __init__(
        self,
        store: EngineStorage,
        session: Session,
        lease_seconds: float,
        interval: float,
        on_beat: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.session = session
        self.lease_seconds = lease_seconds
        self.interval = interval
        self.on_beat = on_beat
        self._stop = threading.Event()
        # Started in the task's context, so its log lines name the task and step too.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._run,),
            name=f"lease-{session.lease.task_id[:8]}",
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
                self.session.lease = self.store.tasks.extend_lease(
                    self.session.lease, self.lease_seconds, live_text=self.session.live_text
                )
                if self.on_beat is not None:
                    self.on_beat()
            except LeaseLost:
                log.warning("lease lost for task %s", self.session.lease.task_id)
                self.session.lost.set()
                return
            except Exception:  # network blip: the next beat may succeed before expiry
                log.exception("heartbeat failed for task %s", self.session.lease.task_id)


KeeperFactory = Callable[["Session"], AbstractContextManager[Any]]


class _TaskNotes:
    """Notes seen by tools: reads are free, writes are fenced by the worker's lease."""

    def __init__(self, store: EngineStorage, session: Session) -> None:
        self.store = store
        self.session = session

    def read_note(self, key: str) -> str | None:
        return self.store.notes.read(self.session.lease.task_id, key)

    def write_note(self, key: str, value: str) -> None:
        self.store.notes.write(self.session.lease, key, value)


def conversation(
    goal: str, steps: list[StepRecord], output_schema: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Messages API history rebuilt from committed steps: the goal, then each step's turn
    (with an ``output_schema``, a text answer that was not valid is followed by the feedback
    the model was given, derived again from the step: ``core.output``). A compaction starts
    it again from the goal and its summary (``core.context``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": goal}]
    for record in steps:
        body = record.body
        if isinstance(body, CompactStep):
            summary = body.text()
            if summary:  # a compaction that wrote nothing leaves the conversation as it was
                messages = [{"role": "user", "content": resumed_goal(goal, summary)}]
        elif isinstance(body, LLMStep):
            messages.append({"role": "assistant", "content": body.content})
            if output_schema is not None and not body.tool_uses() and not answer_of(output_schema, body.content)[0]:
                messages.append({"role": "user", "content": feedback(output_schema, body.content)})
        else:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": r.tool_use_id,
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in body.results
                    ],
                }
            )
    return messages


def final_text(messages: list[dict[str, Any]]) -> str | None:
    """The last thing the assistant said in words: the result, or the partial result."""
    for message in reversed(messages):
        if message["role"] != "assistant":
            continue
        texts = [b["text"] for b in message["content"] if b.get("type") == "text" and b.get("text")]
        if texts:
            return "\n".join(texts)
    return None


def estimate_input_tokens(request: LLMRequest) -> int:
    text = json.dumps([request.system, request.messages, request.tools], separators=(",", ":"))
    return math.ceil(len(text) / ESTIMATE_CHARS_PER_TOKEN) + 16


class Engine:
    def __init__(
        self,
        store: EngineStorage,
        *,
        worker_id: str,
        tools: ToolRegistry | None = None,
        providers: ProviderFactory = default_provider_factory,
        prices: PriceTable | None = None,
        config: EngineConfig = EngineConfig(),
        fanout: FanoutLauncher | None = None,
        secrets: SecretSource | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.tools = tools if tools is not None else default_registry()
        self.secrets: SecretSource = secrets if secrets is not None else Secrets.from_env()
        self._mcp = mcp
        self.providers = providers
        self.prices = prices or load_price_table()
        self.config = config
        self.fanout = fanout
        self.windows = store.windows.with_default(config.default_tenant_limits)

    # ------------------------------------------------------------------ entry

    def run(
        self,
        task_id: str,
        *,
        deadline: float | None = None,
        keeper: KeeperFactory | None = None,
        on_beat: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult:
        """Run ``task_id`` until it ends, loses its lease, or ``deadline`` draws near.

        ``keeper`` replaces the per-task heartbeat thread (the worker's shared heartbeat);
        ``on_beat`` is called on every heartbeat of the default one. Every line logged
        meanwhile, in this thread or the threads it starts, carries the task id and the step.
        """
        with observe.task_context(task_id=task_id, worker_id=self.worker_id):
            return self._run(task_id, deadline=deadline, keeper=keeper, on_beat=on_beat, stop=stop)

    def _run(
        self,
        task_id: str,
        *,
        deadline: float | None,
        keeper: KeeperFactory | None,
        on_beat: Callable[[], None] | None,
        stop: threading.Event | None,
    ) -> RunResult:
        sent = time.monotonic()
        claimed = self.store.tasks.claim(task_id, self.worker_id, self.config.lease_seconds)
        claim_seconds = time.monotonic() - sent
        if claimed is None:
            return RunResult(task_id, "not_claimed")
        lease, task = claimed
        observe.bind(lease_epoch=lease.epoch)
        crash_point("after_claim")
        # The lease is kept alive from here, before the reads that rebuild the session: on a
        # loaded store they can take a good part of the lease.
        session = Session(
            lease=lease, task=task, steps=[], messages=[], deadline=deadline, stop=stop, claim_seconds=claim_seconds
        )
        interval = self.config.heartbeat_seconds or self.config.lease_seconds / 3
        guard = (
            keeper(session)
            if keeper
            else LeaseKeeper(self.store, session, self.config.lease_seconds, interval, on_beat)
        )
        resumed_from = 0
        with guard:
            try:
                # What the claim found committed, from the latest compaction on: nothing before
                # it is sent again, so nothing before it is read.
                steps = self.store.steps.load(task_id, upto=task.step, since=task.compacted_at)
                resumed_from = steps[-1].number if steps else 0
                session.steps = list(steps)
                session.earlier_turns = task.llm_steps - session.llm_turns
                session.goal = self._goal(task)
                session.messages = conversation(session.goal, steps, task.submission.output_schema)
                session.limits = self.windows.limits(task.tenant)
                self._settle_stale_reservation(session)
                result = self._loop(session)
            except HoldsInFlight as exc:
                result = self._defer(session, exc.wait)
            except LeaseLost as exc:
                result = _lease_lost(task_id, exc)
            except DETERMINISTIC_FAULTS as exc:
                result = self._fail_on_fault(session, exc)
            except Exception:  # an outage: give the lease back, so the redelivery can claim at once
                self._give_back(session)
                raise
        result.steps_committed = session.committed
        result.resumed_from_step = resumed_from
        result.claimed = task
        if result.status is not None and result.status.terminal:
            live = [float(h["until"]) for h in session.task.lapsed_holds.values() if h.get("until")]
            result.lapsed_until = max(live, default=None)
        return result

    def _goal(self, task: Task) -> str:
        """The task's goal, followed by the results of the tasks it depends on (immutable once
        they succeeded, so every claim rebuilds the same first message)."""
        if not task.submission.depends_on:
            return task.submission.goal
        found = {t.task_id: t for t in self.store.tasks.get_many(task.submission.depends_on)}
        return dependency_goal(task.submission.goal, [found[i] for i in task.submission.depends_on if i in found])

    def release_lapsed_holds(self, task: Task) -> float:
        """Return the lapsed holds of ``task`` (ended or not) whose calls can no longer
        complete; the seconds until the last live one can (0: none is left)."""
        now = time.time()
        live = []
        for epoch, raw in task.lapsed_holds.items():
            held = _reservation(epoch, raw)
            if held.until is None or held.until <= now:
                self.store.budgets.return_lapsed(task.task_id, task.budget_id, held, parent_id=task.parent_id)
            else:
                live.append(held.until - now)
        return max(live, default=0.0)

    def _defer(self, s: Session, wait: float) -> RunResult:
        """Give the lease back and come back when the lapsed hold's call can no longer complete."""
        self.store.tasks.release(s.lease)
        log.info("task %s deferred %.1fs: a lost lease's call may still be charged", s.lease.task_id, wait)
        return RunResult(
            s.lease.task_id,
            "deferred",
            error={"code": "call_in_flight", "message": str(HoldsInFlight(wait)), "retry_after": wait},
        )

    def _fail_on_fault(self, s: Session, exc: Exception) -> RunResult:
        """A fault that running the task again would meet again (``DETERMINISTIC_FAULTS``):
        the task ends ``failed`` with it now, so its status says why and a parent wakes."""
        log.exception("task %s failed: %s", s.lease.task_id, type(exc).__name__)
        error = fault_error(exc)
        try:
            self._release_inflight(s)
            self.store.tasks.transition(
                s.lease.task_id, TaskStatus.FAILED, lease=s.lease, result=final_text(s.messages), error=error
            )
        except LeaseLost as lost:
            return _lease_lost(s.lease.task_id, lost)
        s.task = s.task.model_copy(update={"status": TaskStatus.FAILED})
        return RunResult(s.lease.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _give_back(self, s: Session) -> None:
        """The reservation and the lease back, as after a retryable provider error (a later
        claim would return a reservation left behind anyway, see ``_settle_stale_reservation``)."""
        try:
            self._release_inflight(s)
            self.store.tasks.release(s.lease)
        except Exception:  # lost, or the store is what failed: the lease lapses by itself
            log.debug("could not give task %s back", s.lease.task_id, exc_info=True)

    def _settle_stale_reservation(self, session: Session) -> RunResult | None:
        """Holds left by older epochs: set a live one aside, return the ones whose call is over.

        An older epoch's worker may be paused, not dead, with its call in flight: until the
        hold's deadline that call can still complete and be charged (by that worker, as an
        orphan), so a live hold stays counted, set aside as lapsed, and this run reserves on
        top of it when the budget covers both (``_reserve`` waits for it only when it does
        not). After the deadline the call can no longer complete; whether it happened is
        unknowable, so the hold is returned, not guessed at.
        """
        now = time.time()
        task = session.task
        for epoch, raw in task.lapsed_holds.items():
            held = _reservation(epoch, raw)
            if held.until is None or held.until <= now:
                self.store.budgets.return_lapsed(task.task_id, task.budget_id, held, parent_id=task.parent_id)
        current = task.inflight
        batch = task.batch
        if current and batch and int(current["epoch"]) == int(batch["epoch"]) != session.lease.epoch:
            # The hold of the batched call this task waited on: its result is settled by this run.
            held = _reservation(int(current["epoch"]), current)
            self.store.budgets.adopt(session.lease, held)
            session.task = task.model_copy(update={"inflight": {**current, "epoch": session.lease.epoch}})
        elif current and int(current["epoch"]) != session.lease.epoch:
            held = _reservation(int(current["epoch"]), current)
            if held.until is not None and held.until > now:
                self.store.budgets.set_aside(session.lease, held)
                log.info(
                    "task %s: epoch %s's call may complete until %.3f; its hold stays counted",
                    task.task_id, held.epoch, held.until,
                )  # fmt: skip
                lapsed = {**task.lapsed_holds, held.epoch: dict(current)}
                session.task = task.model_copy(update={"inflight": None, "lapsed_holds": lapsed})
            else:
                self._release_inflight(session)
        return None

    def _wait_for_lapsed_holds(self, s: Session) -> tuple[float, bool]:
        """When the budget cannot cover this call: return the lapsed holds whose deadline has
        passed, and say how long until the earliest live one ends (0: none is live, the
        budget really is spent) and whether any went back."""
        now = time.time()
        task = self.store.tasks.get(s.lease.task_id)
        live, returned = [], False
        for epoch, raw in task.lapsed_holds.items():
            held = _reservation(epoch, raw)
            if held.until is None or held.until <= now:
                returned |= self.store.budgets.return_lapsed(
                    task.task_id, task.budget_id, held, parent_id=task.parent_id
                )
            else:
                live.append(held.until - now)
        return min(live, default=0.0), returned

    # ------------------------------------------------------------------- loop

    def _loop(self, s: Session) -> RunResult:
        task_id = s.lease.task_id
        while True:
            observe.bind(step=s.next_step)
            self._check_lease(s)
            last = s.steps[-1].body if s.steps else None
            if isinstance(last, LLMStep) and last.tool_uses():
                parked = self._run_tools(s, last)
                if parked is not None:
                    return parked
                if s.task.status.terminal:
                    return RunResult(task_id, "finished", status=s.task.status)
                continue
            if isinstance(last, LLMStep) and not (
                s.task.submission.output_schema is not None and not s.task.status.terminal
            ):  # already finished: committed with its terminal status
                return RunResult(task_id, "finished", status=s.task.status)
            stop = self._stop_reason(s)
            if stop == "slice":
                # The next call will not start under this lease: its hold goes back now, known
                # unspent, rather than counted until its deadline by the next claim.
                self._release_inflight(s)
                self.store.tasks.release(s.lease)
                return RunResult(task_id, "continue")
            if stop is not None:
                return self._finish_without_step(s, stop)
            outcome = self._llm_turn(s)
            if outcome is not None:
                return outcome

    def _check_lease(self, s: Session) -> None:
        if s.lost.is_set():
            raise LeaseLost(f"lease epoch {s.lease.epoch} of task {s.lease.task_id} could not be extended")

    def _stop_reason(self, s: Session) -> TaskStatus | Literal["slice"] | None:
        """Why the next LLM call must not start: a cap, the task timeout, or the time slice."""
        constraints = s.task.submission.constraints
        now = time.time()
        if s.llm_turns >= constraints.max_steps:
            return TaskStatus.COST_EXCEEDED
        started = s.task.started_at or now
        if now >= started + constraints.timeout_seconds:
            return TaskStatus.TIMED_OUT
        if s.deadline is not None and now >= s.deadline - self.config.slice_margin_seconds:
            return "slice"
        if s.stop is not None and s.stop.is_set():
            return "slice"
        return None

    def _stop_error(self, s: Session, status: TaskStatus) -> dict[str, Any]:
        c = s.task.submission.constraints
        if status is TaskStatus.TIMED_OUT:
            return {"code": "timeout", "message": f"task ran past its timeout of {c.timeout_seconds}s"}
        if s.llm_turns >= c.max_steps:
            return {"code": "max_steps_exceeded", "message": f"task used all {c.max_steps} steps"}
        if s.short_of == "money":
            root = c.max_cost_usd if s.task.parent_id is None else None
            cap = f" (${root})" if root is not None else ""
            return {
                "code": "budget_exceeded",
                "message": f"money budget of the root task is exhausted{cap}: the next call could cost more than is left",
            }
        return {
            "code": "budget_exceeded",
            "message": f"token budget of the root task is exhausted (cap {c.max_tokens})",
        }

    def _finish_without_step(self, s: Session, status: TaskStatus) -> RunResult:
        self._release_inflight(s)
        error = self._stop_error(s, status)
        self.store.tasks.transition(s.lease.task_id, status, lease=s.lease, result=final_text(s.messages), error=error)
        s.task = s.task.model_copy(update={"status": status})
        return RunResult(s.lease.task_id, "finished", status=status, error=error)

    def _release_inflight(self, s: Session) -> None:
        """Return the held reservation, exactly once (see ``EngineStorage.settle_orphan``)."""
        held = s.task.inflight
        if held:
            self.store.budgets.settle_orphan(
                s.lease.task_id,
                s.task.budget_id,
                BudgetDelta(
                    reserved=int(held["amount"]),
                    used=0,
                    cost_usd=NO_USAGE.cost_usd,
                    tokens_in=0,
                    tokens_out=0,
                    reserved_micros=int(held.get("usd", 0)),
                ),
                inflight_epoch=int(held["epoch"]),
                parent_id=s.task.parent_id,
            )
            s.task = s.task.model_copy(update={"inflight": None})

    # -------------------------------------------------------------- LLM turn

    def _registry(self, s: Session) -> ToolRegistry:
        """The tools of this task: the worker's, plus the MCP tools its agent version pinned."""
        if s.tools is None:
            pins = s.task.submission.mcp_tools
            if pins and self._mcp is None:
                self._mcp = McpServers.from_env(secrets=self.secrets if isinstance(self.secrets, Secrets) else None)
            extra = mcp_tool_specs(pins, self._mcp) if pins else []
            schema = s.task.submission.output_schema
            if schema is not None:
                extra.append(final_answer_tool(schema))
            s.tools = self.tools.with_tools(extra)
        return s.tools

    def _context(self, s: Session) -> tuple[list[dict[str, Any]], int, bool]:
        """The messages the next call sends, how many tool results they clear, and whether the
        call must be a compaction (``core.context``): the previous call's boundary, moved up to
        all but the latest ``keep_tool_results`` when the request would pass the threshold of
        the model's window; a compaction when it still would, and a turn was taken since the
        last one (a summary that is itself over the threshold is not summarised again)."""
        if s.context is not None and s.context[0] == s.next_step:
            return s.context[1], s.context[2], s.context[3]
        sub = s.task.submission
        last = None
        for record in reversed(s.steps):
            if isinstance(record.body, CompactStep):
                break  # tool results are counted from the compaction on
            if isinstance(record.body, LLMStep):
                last = record.body
                break
        boundary = last.cleared_before if last is not None else 0
        messages = cleared(s.messages, boundary)
        limit = context_window(sub.model) * sub.constraints.context_threshold
        compact = False
        if sub.constraints.compaction != "native" and self._estimate(sub.model, sub.system, messages) > limit:
            moved = max(boundary, tool_results(s.messages) - sub.constraints.keep_tool_results)
            if moved > boundary:
                boundary, messages = moved, cleared(s.messages, moved)
            compact = (
                sub.constraints.compaction == "summary"
                and last is not None
                and self._estimate(sub.model, sub.system, messages) > limit
            )
        s.context = (s.next_step, messages, boundary, compact)
        return messages, boundary, compact

    @staticmethod
    def _estimate(model: str, system: str | None, messages: list[dict[str, Any]]) -> int:
        return estimate_input_tokens(LLMRequest(model=model, system=system, messages=messages, tools=[], max_tokens=1))

    def _max_out(self, s: Session) -> int:
        """The output allowance of the next call: a compaction's summary is kept short."""
        max_out = s.task.submission.constraints.max_output_tokens
        return min(max_out, COMPACT_MAX_TOKENS) if self._context(s)[2] else max_out

    def _request(self, s: Session, max_tokens: int) -> LLMRequest:
        sub = s.task.submission
        system = sub.system
        if sub.output_schema is not None:
            system = f"{system}\n\n{OUTPUT_INSTRUCTION}" if system else OUTPUT_INSTRUCTION
        messages, boundary, compact = self._context(s)
        tools = self._registry(s).schemas(task_tools(sub))
        if boundary or s.task.compacted_at:
            tools.append(recall_tool().schema())
        thinking = sub.constraints.thinking_budget_tokens
        native = sub.constraints.compaction == "native"
        return LLMRequest(
            compact_at=int(context_window(sub.model) * sub.constraints.context_threshold) if native else None,
            model=sub.model,
            system=system,
            # A compaction sends the turn's own request plus the instruction (the same tools
            # too): its whole prefix is the cached one.
            messages=compaction_messages(messages) if compact else messages,
            tools=tools,
            max_tokens=max_tokens,
            task_id=s.lease.task_id,
            cache_ttl=_cache_ttl(sub.constraints),
            effort=None if compact else sub.constraints.effort,
            thinking_budget=thinking if not compact and max_tokens > (thinking or 0) else None,
        )

    def _wanted_reservation(self, s: Session) -> tuple[int, int]:
        """(input estimate, full reservation) for the next LLM call."""
        max_out = self._max_out(s)
        request = self._request(s, max_out)
        est_in = estimate_input_tokens(request)
        if request.compact_at and est_in >= request.compact_at * NATIVE_TRIGGER_MARGIN:
            # The server may compact first: a call of its own that reads the context and writes
            # a summary, billed with this one. Its hold covers that too, so used <= cap holds.
            return est_in, est_in + max_out + est_in + NATIVE_SUMMARY_TOKENS
        return est_in, est_in + max_out

    def _reserve(self, s: Session) -> int | None:
        """Hold tokens for the next call; returns the amount, or None when the budget is spent.

        Tries the full estimate first; near the cap, shrinks the output allowance to what is
        left (a last, shorter answer) before giving up.
        """
        est_in, wanted = self._wanted_reservation(s)
        held = s.task.inflight
        if held and held["epoch"] == s.lease.epoch and held["amount"] >= est_in + MIN_OUTPUT_TOKENS:
            return int(held["amount"])
        self._release_inflight(s)
        amount = self._try_hold(s, est_in, wanted)
        if amount is None:
            wait, returned = self._wait_for_lapsed_holds(s)
            if wait > 0:  # a lost lease's call may still be charged: wait for it, never overshoot
                raise HoldsInFlight(wait)
            if returned:  # lapsed holds whose calls are over went back: the budget may cover it now
                amount = self._try_hold(s, est_in, wanted)
        return amount

    def _try_hold(self, s: Session, est_in: int, wanted: int) -> int | None:
        """The full estimate, else what is left (of tokens and of money) if it still allows a
        short answer."""
        try:
            self._hold(s, wanted, est_in)
            return wanted
        except BudgetExceeded:
            state = self.store.budgets.get(s.task.budget_id)
            affordable = est_in + self._affordable_output(s, est_in, state.available_micros)
            amount = min(wanted, state.available, affordable)
            s.short_of = "money" if affordable < min(wanted, state.available) else "tokens"
            if amount < est_in + MIN_OUTPUT_TOKENS:
                return None
            try:
                self._hold(s, amount, est_in)
                return amount
            except BudgetExceeded:
                return None

    def _affordable_output(self, s: Session, est_in: int, available_micros: int) -> int:
        """The most output tokens a call of ``est_in`` input can be allowed on what is left of
        the money budget (negative: not even the input)."""
        price = self.prices.price_for(s.task.submission.model)
        if price is None or price.output_per_mtok <= 0:
            return 1 << 40
        if _economy(s):  # a batched call costs half: twice the money goes as far
            available_micros *= 2
        base = price.hold_micros(est_in, 0)
        if base > available_micros:
            return -1
        out = int((available_micros - base) / price.output_per_mtok)
        while out > 0 and price.hold_micros(est_in, out) > available_micros:
            out -= 1  # rounding up to the millionth may cost one token
        return out

    def _hold_micros(self, s: Session, amount: int, est_in: int) -> int:
        """The money a hold of ``amount`` tokens (``est_in`` of them input) takes: its call at
        the most it can cost."""
        price = self.prices.price_for(s.task.submission.model)
        if price is None:
            return 0
        est_in = min(est_in, amount)
        most = price.hold_micros(est_in, amount - est_in)
        return math.ceil(most * BATCH_PRICE_RATIO) if _economy(s) else most

    def _hold(self, s: Session, amount: int, est_in: int) -> None:
        until = self._hold_until(s)
        money = self._hold_micros(s, amount, est_in)
        self.store.budgets.reserve(s.lease, s.task.budget_id, amount, s.next_step, until=until, micros=money)
        s.task = s.task.model_copy(
            update={
                "inflight": {
                    "amount": amount,
                    "epoch": s.lease.epoch,
                    "step": s.next_step,
                    "until": until,
                    "usd": money,
                }
            }
        )

    def _hold_until(self, s: Session) -> float:
        """The deadline of a hold taken now: its call starts within the slack, then runs at most
        the provider's maximum call time (a batched call: the batch's 24-hour window)."""
        window = BATCH_WINDOW_SECONDS if _economy(s) else 0.0
        return time.time() + CALL_START_SLACK_SECONDS + window + self.config.max_call_seconds

    def _before_call(self, s: Session) -> None:
        """Make sure the hold outlives the call about to start: if the start came later than its
        reservation allowed for, move the deadline first (fenced: a zombie stops here)."""
        self._extend_hold(s, time.time())

    def _extend_hold(self, s: Session, start: float) -> None:
        """The hold's deadline covers an attempt starting at ``start`` (moved, fenced, if not)."""
        held = s.task.inflight or {}
        until = held.get("until")
        if held and (until is None or start + self.config.max_call_seconds > until):
            new_until = start + CALL_START_SLACK_SECONDS + self.config.max_call_seconds
            ticket = Reservation(
                amount=int(held["amount"]), epoch=s.lease.epoch, step=int(held["step"]), micros=int(held.get("usd", 0))
            )
            self.store.budgets.extend_hold(s.lease, ticket, new_until)
            s.task = s.task.model_copy(update={"inflight": {**held, "until": new_until}})

    def _admit(self, s: Session) -> RunResult | None:
        """Fleet-wide flow control before the call (``core.flow``): a circuit open, a 429's
        slow-down or an empty rate bucket defers the task (its next call's hold goes back with
        the lease; the delayed message spends no receive toward the DLQ)."""
        sub = s.task.submission
        s.admission = None
        if sub.provider == "scripted" or _economy(s):  # no provider to protect; batches queue at the provider
            return None
        est_in, wanted = self._wanted_reservation(s)
        admission = self.store.flow.admit(flow_key(sub.provider, sub.model), est_in, wanted - est_in)
        if admission.ok:
            s.admission = admission
            return None
        self._release_inflight(s)
        self.store.tasks.release(s.lease)
        log.info("task %s deferred %.1fs: %s for %s", s.lease.task_id, admission.wait, admission.reason, sub.model)
        message = {"circuit_open": f"the circuit for {sub.provider}/{sub.model} is open after repeated failures",
                   "slowed_down": f"{sub.provider} asked the fleet to slow down for {sub.model} (429)",
                   "rate_limited": f"the fleet's rate limit for {sub.provider}/{sub.model} is spent"}  # fmt: skip
        return RunResult(
            s.lease.task_id, "deferred",
            error={"code": admission.reason, "message": message.get(admission.reason, admission.reason),
                   "retry_after": max(1.0, admission.wait)},
        )  # fmt: skip

    def _llm_turn(self, s: Session) -> RunResult | None:
        deferred = self._admit(s)
        if deferred is not None:
            return deferred
        reserved = self._reserve(s)
        if reserved is None:
            observe.record_budget_refusal("task")
            return self._finish_without_step(s, TaskStatus.COST_EXCEEDED)
        crash_point("after_reserve")
        hold = None
        held_usd = (s.task.inflight or {}).get("usd", 0)
        batch = s.task.batch if s.task.batch and int(s.task.batch["step"]) == s.next_step else None
        if s.limits is not None:
            try:
                # A batch's result was paid for when it was sent: the window counts it now, from 0.
                amount, money = (0, 0) if batch else (reserved, int(held_usd))
                hold = self.windows.hold(s.task.tenant, s.limits, amount, micros=money)
            except TenantCapReached as exc:  # not this task's fault: try again next hour
                self._release_inflight(s)
                self.store.tasks.release(s.lease)
                return RunResult(s.lease.task_id, "retry", error={**exc.to_dict(), "retry_after": exc.retry_after})
        est_in, _ = self._wanted_reservation(s)
        max_out = max(MIN_OUTPUT_TOKENS, min(self._max_out(s), reserved - est_in))
        request = self._request(s, max_out)
        compact = self._context(s)[2]
        if _economy(s):
            try:
                sent = self._batched(s, request, hold, batch)
            except ProviderError as exc:
                return self._call_failed(s, exc, hold)
            if isinstance(sent, RunResult):
                return sent
            response, started = sent
            return self._answered(s, request, response, started, reserved, max_out, hold, compact)
        try:
            self._before_call(s)
        except LeaseLost:
            # Nothing went on the wire, so no call can be charged: the hold goes back now (from
            # wherever a successor set it aside), not at its deadline.
            self._release_inflight(s)
            if hold is not None:
                self.windows.settle(hold, 0)
            raise
        started = time.time()
        try:
            provider = self.providers(s.task.submission)  # may fail too (a key it cannot read)
            with (
                observe.llm_call(
                    provider=provider.name,
                    model=request.model,
                    max_tokens=max_out,
                    task_id=s.lease.task_id,
                    step=s.next_step,
                ) as call,
                reporting_retries(lambda notice: self._note_retry(s, notice)),
                reporting_text(lambda text: setattr(s, "live_text", text)),
            ):
                try:
                    response = provider.complete(request)
                finally:
                    s.live_text = None
                call.answered(response)
        except ProviderError as exc:
            return self._call_failed(s, exc, hold)
        return self._answered(s, request, response, started, reserved, max_out, hold, compact)

    def _call_failed(self, s: Session, exc: ProviderError, hold: Any) -> RunResult:
        """The provider failed the call (its retries spent): the hold goes back; the task is
        tried again later, or fails now when no retry can help."""
        self._release_inflight(s)
        if hold is not None:
            self.windows.settle(hold, 0)
        error: dict[str, Any] = {
            "code": exc.code,
            "message": exc.message,
            "status_code": exc.status_code,
            "attempts": exc.attempts,
        }
        if exc.retryable and s.admission is not None:  # an outage or an overload: the fleet learns of it
            sub = s.task.submission
            key = flow_key(sub.provider, sub.model)
            if exc.status_code == 429 and exc.retry_after:
                self.store.flow.slow_down(key, exc.retry_after)
            if self.store.flow.failed(key, s.admission):
                # Open: the task waits for the circuit, not for the DLQ.
                self.store.tasks.release(s.lease, forget_batch=s.task.batch is not None)
                wait = self.store.flow.cooldown_seconds
                return RunResult(
                    s.lease.task_id, "deferred", error={**error, "code": "circuit_open", "retry_after": wait}
                )
        if exc.retryable:
            self.store.tasks.release(s.lease, forget_batch=s.task.batch is not None)
            return RunResult(s.lease.task_id, "retry", error=error)
        self.store.tasks.transition(
            s.lease.task_id, TaskStatus.FAILED, lease=s.lease, result=final_text(s.messages), error=error
        )
        return RunResult(s.lease.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _batched(
        self, s: Session, request: LLMRequest, hold: Any, batch: dict[str, Any] | None
    ) -> RunResult | tuple[LLMResponse, float]:
        """Economy: the turn goes out as a batch of one and the task parks in ``waiting``,
        holding no compute and keeping its budget hold (deadline: the batch's 24-hour window);
        the run that claims it once the batch ended gets the answer here, to commit as any.

        A worker killed between sending the batch and parking leaves the hold of its epoch: the
        next claim sets it aside until that deadline and sends the turn again (the batch that
        may have gone out is never read, like any call whose worker died with the answer)."""
        provider = self.providers(s.task.submission)
        if not isinstance(provider, BatchProvider):
            raise ProviderError(
                f"economy: the {s.task.submission.provider} provider has no batch API", retryable=False,
                code="economy_unsupported",
            )  # fmt: skip
        if batch is not None:
            response = provider.batch_result(str(batch["id"]), str(batch["custom_id"]))
            if response is None:  # looked at before it ended: wait again
                return self._park_for_batch(s, batch, hold)
            return response, float(batch["submitted_at"])
        custom_id = f"{s.lease.task_id}-s{s.next_step}-e{s.lease.epoch}"[:64]
        record = {"custom_id": custom_id, "step": s.next_step, "epoch": s.lease.epoch, "submitted_at": time.time()}
        record["id"] = provider.submit_batch(request, custom_id)
        crash_point("after_batch_submit")
        return self._park_for_batch(s, record, hold)

    def _park_for_batch(self, s: Session, record: dict[str, Any], hold: Any) -> RunResult:
        if hold is not None:  # the tenant window counts the call when its result is in
            self.windows.settle(hold, 0)
        self.store.tasks.transition(s.lease.task_id, TaskStatus.WAITING, lease=s.lease, extra={"batch": record})
        s.task = s.task.model_copy(update={"status": TaskStatus.WAITING, "batch": record})
        log.info("task %s: turn %s sent as batch %s", s.lease.task_id, record["step"], record["id"])
        return RunResult(s.lease.task_id, "waiting", status=TaskStatus.WAITING, batch_poll=batch_poll_seconds(record))

    def _answered(
        self,
        s: Session,
        request: LLMRequest,
        response: LLMResponse,
        started: float,
        reserved: int,
        max_out: int,
        hold: Any,
        compact: bool,
    ) -> RunResult | None:
        """Commit the call's answer as the next step, settling its hold with what it used."""
        crash_point("after_llm_call")
        if s.admission is not None:
            sub, usage = s.task.submission, response.usage
            key = flow_key(sub.provider, sub.model)
            self.store.flow.succeeded(key, s.admission)
            # Against a provider's input limit count uncached and cache-write tokens, not reads.
            self.store.flow.settle(
                key, s.admission, usage.input_tokens + usage.cache_creation_input_tokens, usage.output_tokens
            )
        batched = _economy(s)
        cost = self._cost(s, response.model or request.model, request.model, response)
        if batched:
            cost = cost * BATCH_PRICE_RATIO
        answered = CallStep(
            content=response.content,
            stop_reason=response.stop_reason,
            model=response.model or request.model,
            usage=response.usage,
            cost_usd=cost,
            reserved_tokens=reserved,
            attempts=response.attempts,
            started_at=started,
            duration_ms=int((time.time() - started) * 1000),
            batched=batched,
        )
        settle = BudgetDelta(
            reserved=reserved,
            used=response.usage.total,
            cost_usd=cost,
            tokens_in=response.usage.input_total,
            tokens_out=response.usage.output_tokens,
            reserved_micros=int((s.task.inflight or {}).get("usd", 0)),
        )
        step: LLMStep | CompactStep
        if compact:
            step = CompactStep(**dict(answered), summarised_through=s.next_step - 1)
            summary = step.text()
            goal = s.goal or s.task.submission.goal
            messages = [{"role": "user", "content": resumed_goal(goal, summary)}] if summary else s.messages
            finish, result, error = None, None, None
        else:
            step = LLMStep(**dict(answered), cleared_before=self._context(s)[1])
            messages, finish, result, error = self._turn_outcome(s, step, max_out)
        until = (s.task.inflight or {}).get("until")
        if until is not None and time.time() > until:
            log.warning(
                "task %s: call answered after its hold's deadline; raise AGENTQ_MAX_CALL_SECONDS", s.lease.task_id
            )
        try:
            self._check_lease(s)  # the heartbeat may have learned first that the lease is lost
            record = self._commit(
                s,
                step,
                settle=settle,
                finish=finish,
                result=result,
                error=error,
            )
        except LeaseLost:
            # The provider answered, so the tokens are spent whoever owns the task now, and
            # whoever learned of the lost lease: the ledger gets them once, as an orphan.
            self.store.budgets.settle_orphan(
                s.lease.task_id, s.task.budget_id, settle, inflight_epoch=s.lease.epoch, parent_id=s.task.parent_id
            )
            self.store.steps.record_orphan(s.lease, s.next_step, step)
            if hold is not None:
                self.windows.settle(hold, response.usage.total, micros(cost))
            raise
        if hold is not None:
            self.windows.settle(hold, response.usage.total, micros(cost))
        self._committed(s, record, messages)
        update: dict[str, Any] = {"inflight": None, "batch": None, **({"status": finish} if finish else {})}
        if compact:
            update["compacted_at"] = record.number
        s.task = s.task.model_copy(update=update)
        crash_point("after_compaction" if compact else "after_llm_commit")
        if finish:
            return RunResult(s.lease.task_id, "finished", status=finish)
        return None

    def _turn_outcome(
        self, s: Session, step: LLMStep, max_out: int
    ) -> tuple[list[dict[str, Any]], TaskStatus | None, str | None, dict[str, Any] | None]:
        """The conversation after an agent turn, and whether (and how) the turn ends the task."""
        messages = [*s.messages, {"role": "assistant", "content": step.content}]
        finish, error = self._turn_end(step, max_out, shrunk=max_out < s.task.submission.constraints.max_output_tokens)
        result = final_text(messages) if finish else None
        schema = s.task.submission.output_schema
        if schema is not None and error is None:
            answered, answer = answer_of(schema, step.content)
            if answered:  # a valid final answer ends the task, whatever else the turn holds
                finish, result = TaskStatus.SUCCEEDED, json.dumps(answer, ensure_ascii=False)
            elif finish is TaskStatus.SUCCEEDED:  # text that is not a valid answer: the model is told why
                finish = None
                messages.append({"role": "user", "content": feedback(schema, step.content)})
        return messages, finish, result, error

    def _cost(self, s: Session, answered: str, asked: str, response: LLMResponse) -> Decimal:
        """The call's cost, priced by the model that answered, else by the one asked for (a
        submission names a priced model: ``check_submission``). Never $0 without a word."""
        for model in (answered, asked):
            if self.prices.price_for(model) is not None:
                return self.prices.cost(model, response.usage)
        if s.task.submission.provider != "scripted":
            log.warning("no price for model %r (nor %r): this call is recorded at $0; add it to AGENTQ_PRICES",
                        answered, asked)  # fmt: skip
        return Decimal(0)

    def _note_retry(self, s: Session, notice: RetryNotice) -> None:
        """A provider call failed and will be tried again: say so where status and the trace
        read it (the write is fenced; a failure to write it changes nothing else)."""
        now = time.time()
        log.warning(
            "model call failed (attempt %d of %d, %s): %s; next try in %.1fs",
            notice.attempt, notice.max_attempts, notice.code, notice.message, notice.delay,
        )  # fmt: skip
        state = RetryState(
            step=s.next_step,
            scope="call",
            attempt=notice.attempt,
            max_attempts=notice.max_attempts,
            code=notice.code[:64],
            message=notice.message[:500],
            status_code=notice.status_code,
            at=now,
            next_at=now + notice.delay,
        )
        if notice.status_code == 429 and s.admission is not None:  # the whole fleet slows down, not only this call
            sub = s.task.submission
            self.store.flow.slow_down(flow_key(sub.provider, sub.model), notice.delay)
        try:
            self.store.tasks.record_retry(s.lease.task_id, state, lease=s.lease)
            self._extend_hold(s, now + notice.delay)  # the next attempt is a call of its own
        except LeaseLost:
            # Lost: no further attempt starts, so none can be answered past its hold's deadline.
            s.lost.set()
            raise
        except Exception:
            log.warning("could not record the retry of task %s", s.lease.task_id, exc_info=True)

    @staticmethod
    def _turn_end(step: LLMStep, max_out: int, *, shrunk: bool) -> tuple[TaskStatus | None, dict[str, Any] | None]:
        """Whether this assistant turn ends the task: tool calls go on; an answer succeeds;
        an answer cut off at the output limit is a failure that says which limit to raise
        (a truncated tool call is dropped by the provider, so it cannot be carried out), or,
        when the limit was lowered to fit what was left of the budget, the budget ran out."""
        if step.stop_reason == "max_tokens" and shrunk:
            return TaskStatus.COST_EXCEEDED, {
                "code": "budget_exceeded",
                "message": f"the budget ran out during the model's turn ({max_out} output tokens were left)",
            }
        if step.stop_reason == "max_tokens":
            return TaskStatus.FAILED, {
                "code": "output_truncated",
                "message": f"the model's turn was cut off at {max_out} output tokens; raise constraints.max_output_tokens",
            }
        if step.tool_uses():
            return None, None
        return TaskStatus.SUCCEEDED, None

    def _commit(self, s: Session, body: Any, **kwargs: Any) -> StepRecord:
        """Commit ``body`` as the next step; unless it ends the task, the same write renews
        the lease, and the session learns the new expiry. While it is on the wire the
        heartbeat may leave the lease alone: the commit renews it or ends the task."""
        s.commit_sent_at = time.time()
        until = None if kwargs.get("finish") else s.commit_sent_at + self.config.lease_seconds
        try:
            record = self.store.steps.commit(
                s.lease, s.next_step, body, root_id=s.task.budget_id, lease_until=until, **kwargs
            )
        finally:
            s.commit_sent_at = None
        if until is not None:
            s.lease = s.lease.model_copy(update={"expires_at": until})
        finish = kwargs.get("finish")
        if finish is not None:
            error = kwargs.get("error") or {}
            observe.task_status_changed(
                s.lease.task_id, s.task.tenant, finish.value, **({"error": error["code"]} if error else {})
            )
        return record

    def _committed(self, s: Session, record: StepRecord, messages: list[dict[str, Any]]) -> None:
        s.steps.append(record)
        s.messages = messages
        s.committed += 1
        body = record.body
        if isinstance(body, LLMStep | CompactStep):
            log.debug(
                f"{body.kind} step committed",
                extra={"kind": body.kind, "model": body.model, "stop_reason": body.stop_reason,
                       "tokens_in": body.usage.input_total, "tokens_out": body.usage.output_tokens},
            )  # fmt: skip
        else:
            log.debug(
                "tools step committed", extra={"kind": "tools", "tool_errors": sum(r.is_error for r in body.results)}
            )

    # ------------------------------------------------------------------ tools

    def _run_tools(self, s: Session, llm: LLMStep) -> RunResult | None:
        """Run the turn's tool calls and commit their results; a spawn may park the task
        in ``waiting`` instead, and a call that needs a person's decision in ``paused``
        (returns that RunResult)."""
        allowlist = task_tools(s.task.submission)
        uses = llm.tool_uses()
        decided = self._decisions(s, uses, allowlist)
        if isinstance(decided, RunResult):
            return decided
        spawns = [u for u in uses if u["name"] == SPAWN_TOOL and SPAWN_TOOL in allowlist and u["id"] not in decided]
        if spawns and self.fanout is not None:
            outcomes = self._spawn_turn(s, uses, spawns[0], decided)
            if isinstance(outcomes, RunResult):
                return outcomes
        else:
            notes = _TaskNotes(self.store, s)
            outcomes = []
            for use in uses:
                self._check_lease(s)
                outcomes.append(decided.get(use["id"]) or self._run_one_tool(s, use, allowlist, notes))
        self._check_lease(s)
        body = ToolsStep(results=outcomes)
        messages = conversation(
            s.goal or s.task.submission.goal, [*s.steps, _draft(s, body)], s.task.submission.output_schema
        )
        record = self._commit_tools(s, body, messages)
        self._committed(s, record, messages)
        crash_point("after_tools_commit")
        return None

    # -------------------------------------------------------------- approvals

    def _decisions(
        self, s: Session, uses: list[dict[str, Any]], allowlist: list[str]
    ) -> dict[str, ToolOutcome] | RunResult:
        """The outcomes a person decided for this turn's calls, or park the task in ``paused``
        until the next decision is made.

        ``request_approval`` gets the decision as its result; if it was rejected, no other call
        of the turn runs (the approval gated them). A call of a tool whose policy is ``ask``
        waits for its own decision (one at a time, in the turn's order); rejected, it gets the
        denial as its result and never runs. Decisions are stored, so a resumed worker reads
        them instead of asking again, and never runs a rejected call.
        """
        policies = s.task.submission.constraints.tool_policies
        decided: dict[str, ToolOutcome] = {}
        approvals = [u for u in uses if u["name"] == APPROVAL_TOOL and APPROVAL_TOOL in allowlist]
        if approvals:
            use = approvals[0]
            question = str((use.get("input") or {}).get("question") or "(no question given)")
            record = self._decision(s, use, question)
            if isinstance(record, RunResult):
                return record
            decided[use["id"]] = decision_outcome(use, record, record.asked_at, time.time())
            if record.state != "approved":
                for other in uses:
                    if other["id"] != use["id"]:
                        decided[other["id"]] = _error_outcome(
                            other,
                            f"not run: the approval asked for in this turn was rejected ({record.note or 'no note'})",
                        )
                return decided
        for use in uses:
            if policies.get(use["name"]) != "ask" or use["name"] not in allowlist:
                continue
            shown = json.dumps(use.get("input") or {}, sort_keys=True)
            question = f"Run {use['name']} with {shown}?"[:4000]
            record = self._decision(s, use, question)
            if isinstance(record, RunResult):
                return record
            if record.state != "approved":
                by = record.decided_by or "a reviewer"
                decided[use["id"]] = _error_outcome(
                    use, f"REJECTED by {by}: {record.note or '(no note)'}; {use['name']} was not run"
                )
        return decided

    def _decision(self, s: Session, use: dict[str, Any], question: str) -> ApprovalRecord | RunResult:
        """The stored decision on ``use``, or ask for one and park the task in ``paused``."""
        record = self.store.approvals.get(s.lease.task_id, use["id"])
        if record is not None and record.state != "pending":
            return record
        self.store.approvals.request(s.lease, use["id"], question)
        s.task = s.task.model_copy(update={"status": TaskStatus.PAUSED})
        paused = RunResult(s.lease.task_id, "waiting", status=TaskStatus.PAUSED)
        timeout = s.task.submission.constraints.approval_timeout_seconds
        if timeout is not None:  # asked before (a resumed worker): the first ask's clock runs on
            paused.approval_due = (record.asked_at if record is not None else time.time()) + timeout
        return paused

    # ---------------------------------------------------------------- spawns

    def _spawn_turn(
        self, s: Session, uses: list[dict[str, Any]], spawn_use: dict[str, Any], decided: dict[str, ToolOutcome]
    ) -> list[ToolOutcome] | RunResult:
        """The spawn protocol: create the children once, start their execution once, park the
        parent until it is woken, then turn the children's ends into one tool result."""
        assert self.fanout is not None
        task = s.task
        spawn_id = spawn_use["id"]
        record = self.store.spawns.get(task.task_id, spawn_id)
        if record is None:
            allowlist = task_tools(task.submission)
            notes = _TaskNotes(self.store, s)
            pending = [
                decided.get(use["id"]) or self._run_one_tool(s, use, allowlist, notes)
                if use["name"] != SPAWN_TOOL
                else _error_outcome(use, f"only one {SPAWN_TOOL} call is carried out per turn")
                for use in uses
                if use is not spawn_use
            ]
            try:
                spec = parse_spawn_input(spawn_use.get("input") or {})
                budget = self.store.budgets.get(task.budget_id)
                money = budget.available_micros if budget.cap_micros < NO_MONEY_CAP else None
                plans = plan_children(task, spawn_id, spec, budget.available, available_micros=money)
                max_concurrency = spec.max_concurrency or len(plans)
                self.store.spawns.create(s.lease, task, spawn_id, plans, pending, max_concurrency)
            except (SpawnRejected, BudgetExceeded) as exc:
                if isinstance(exc, BudgetExceeded):
                    observe.record_budget_refusal("task")
                refused = _error_outcome(spawn_use, str(exc))
                by_id = {o.tool_use_id: o for o in [*pending, refused]}
                return [by_id[u["id"]] for u in uses]
            crash_point("after_spawn")
            record = self.store.spawns.get(task.task_id, spawn_id)
            assert record is not None
        if record.state == "creating":  # a crash cut the child writes short: redo them
            self.store.spawns.write_children(task, spawn_id, record.plans)
        children = self.store.tasks.get_many(record.children)
        if not record.execution_arn:
            arn = self.fanout.start(
                parent=task,
                spawn_id=spawn_id,
                children=[(c.task_id, c.submission.constraints.timeout_seconds) for c in children],
                max_concurrency=record.max_concurrency,
            )
            self.store.spawns.mark(task.task_id, spawn_id, execution_arn=arn)
        if not record.woken and not all(c.status.terminal for c in children):
            self.store.tasks.transition(task.task_id, TaskStatus.WAITING, lease=s.lease)
            s.task = task.model_copy(update={"status": TaskStatus.WAITING})
            return RunResult(task.task_id, "waiting", status=TaskStatus.WAITING)
        entries = []
        for child in children:
            ended = child  # as it ended, after a timeout is recorded
            timed_out = not child.status.terminal
            if timed_out:  # its execution iteration gave up: stop it where it stands
                partial = final_text(conversation(child.submission.goal, self.store.steps.load(child.task_id)))
                try:
                    self.store.tasks.transition(
                        child.task_id,
                        TaskStatus.TIMED_OUT,
                        result=partial,
                        error={"code": "timeout", "message": "sub-agent deadline passed"},
                    )
                    ended = child.model_copy(update={"result": partial})
                except IllegalTransition:
                    ended = self.store.tasks.get(child.task_id)
                    timed_out = ended.status is TaskStatus.TIMED_OUT or not ended.status.terminal
            self.store.budgets.settle_child(task.budget_id, child.task_id)
            entries.append(child_outcome(ended, timed_out=timed_out))
        spawn_outcome = ToolOutcome(
            tool_use_id=spawn_id,
            name=SPAWN_TOOL,
            content=render_spawn_result(entries),
            started_at=record.created_at,
            duration_ms=int((time.time() - record.created_at) * 1000),
        )
        by_id = {o.tool_use_id: o for o in [*record.pending, spawn_outcome]}
        return [by_id[u["id"]] for u in uses]

    def _run_one_tool(self, s: Session, use: dict[str, Any], allowlist: list[str], notes: _TaskNotes) -> ToolOutcome:
        if use["name"] == RECALL_TOOL:
            return _recalled(self.store, s, use)
        registry = self._registry(s)
        spec = registry.get(use["name"])
        side_effects = bool(spec and spec.side_effects and use["name"] in allowlist)
        circuit = f"tool/{use['name']}"
        admission = self.store.flow.admit(circuit, 0, 0) if spec is not None else None
        if admission is not None and not admission.ok:  # it failed repeatedly, fleet-wide: not run, not started
            return _error_outcome(
                use,
                f"tool {use['name']!r} is unavailable: it failed repeatedly and its circuit is open; try again in "
                f"{admission.wait:.0f}s, or do without it",
            )
        started = time.time()
        if side_effects:
            prior = self.store.effects.begin(s.lease, use["id"], use["name"])
            crash_point("after_effect_begin")
            if prior is not None:
                return self._prior_effect(use, prior, started)
        ctx = ToolContext(
            task_id=s.lease.task_id,
            tool_use_id=use["id"],
            idempotency_key=idempotency_key_for(s.lease.task_id, use["id"]),
            notes=notes,
            deadline=self._tool_deadline(s),
            secrets=self.secrets,
        )
        with observe.tool_call(
            use["name"], registered=spec is not None, call_id=use["id"], task_id=s.lease.task_id, step=s.next_step
        ) as call:
            run = registry.execute(use["name"], use.get("input") or {}, ctx, allowlist)
            call.finished(run.status, run.is_error)
        crash_point("after_tool_run")
        if admission is not None:
            if run.tool_failed:
                self.store.flow.failed(circuit, admission)
            else:
                self.store.flow.succeeded(circuit, admission)
        outcome = ToolOutcome(
            tool_use_id=use["id"],
            name=use["name"],
            content=run.content,
            is_error=run.is_error,
            status=run.status,
            side_effects=side_effects,
            started_at=started,
            duration_ms=run.duration_ms,
        )
        if side_effects:
            self.store.effects.finish(s.lease, use["id"], outcome)
            crash_point("after_effect_finish")
        return outcome

    def _prior_effect(self, use: dict[str, Any], prior: Any, started: float) -> ToolOutcome:
        """A side-effecting call that an earlier worker already started: never run it again."""
        if prior.state == "done":
            return ToolOutcome(
                tool_use_id=use["id"],
                name=use["name"],
                content=prior.content or "",
                is_error=prior.is_error,
                status="replayed",
                side_effects=True,
                started_at=started,
                duration_ms=0,
            )
        return ToolOutcome(
            tool_use_id=use["id"],
            name=use["name"],
            content=(
                f"outcome unknown: tool '{use['name']}' was started by a worker that stopped before "
                "recording its result. It was NOT run again, to avoid repeating a side effect. "
                "Check its effect before deciding whether to retry."
            ),
            is_error=True,
            status="unknown_outcome",
            side_effects=True,
            started_at=started,
            duration_ms=0,
        )

    def _tool_deadline(self, s: Session) -> float | None:
        started = s.task.started_at or time.time()
        deadlines = [started + s.task.submission.constraints.timeout_seconds]
        if s.deadline is not None:
            deadlines.append(s.deadline)
        return min(deadlines)

    def _commit_tools(self, s: Session, body: ToolsStep, messages: list[dict[str, Any]]) -> StepRecord:
        """Commit the tool results, and in the same write either end the task (cap, timeout)
        or reserve tokens for the next LLM call, saving one round trip per turn."""
        number = s.next_step
        preview = Session(
            s.lease, s.task, [*s.steps, _draft(s, body)], messages, s.deadline, earlier_turns=s.earlier_turns
        )
        stop = self._stop_reason(preview)
        if isinstance(stop, TaskStatus):
            error = self._stop_error(preview, stop)
            record = self._commit(s, body, finish=stop, result=final_text(messages), error=error)
            s.task = s.task.model_copy(update={"status": stop})
            return record
        reserve = money = 0
        if stop is None:
            est_in, reserve = self._wanted_reservation(preview)
            money = self._hold_micros(preview, reserve, est_in)
        until = self._hold_until(s)
        try:
            record = self._commit(
                s, body, reserve_next=reserve, reserve_next_micros=money, hold_until=until if reserve else None
            )
        except BudgetExceeded:
            record = self._commit(s, body)
            reserve = 0
        if reserve:
            ticket = {"amount": reserve, "epoch": s.lease.epoch, "step": number + 1, "until": until, "usd": money}
            s.task = s.task.model_copy(update={"inflight": ticket})
        return record


def _economy(s: Session) -> bool:
    return s.task.submission.constraints.economy


def batch_poll_seconds(batch: dict[str, Any]) -> float:
    """When to look at a batch again: soon at first, then a quarter of its age (most end
    within minutes; none lasts past 24 hours), between ``AGENTQ_BATCH_POLL_SECONDS`` (30) and
    SQS's longest delay."""
    floor = float(os.environ.get("AGENTQ_BATCH_POLL_SECONDS", "30"))
    return min(900.0, max(floor, (time.time() - float(batch["submitted_at"])) / 4))


def _lease_lost(task_id: str, exc: LeaseLost) -> RunResult:
    """Fenced out: by a cancel (the status moved: ``stopped``) or by another worker."""
    status = exc.details.get("status")
    return RunResult(task_id, "stopped" if status is not None else "lease_lost", status=status, error=exc.to_dict())


def _cache_ttl(constraints: Constraints) -> Literal["5m", "1h"]:
    """The prompt cache's TTL for a task's calls: an hour where it may wait longer than five
    minutes between two calls (a person's approval, sub-agents), so the wait does not cost a
    full re-read of the conversation; else five minutes (a cheaper write)."""
    offered = offered_tools(constraints)
    pauses = APPROVAL_TOOL in offered or SPAWN_TOOL in offered
    asks = any(policy == "ask" for name, policy in constraints.tool_policies.items() if name in offered)
    return "1h" if pauses or asks else "5m"


def task_tools(submission: TaskSubmission) -> list[str]:
    """The tools a task's model is offered: its allowed ones, and final_answer with an output schema."""
    offered = offered_tools(submission.constraints)
    return [*offered, FINAL_ANSWER_TOOL] if submission.output_schema is not None else offered


def offered_tools(constraints: Constraints) -> list[str]:
    """The tools a task's model is shown and may run: its allowlist without the denied ones."""
    return [name for name in constraints.tools if constraints.tool_policies.get(name) != "deny"]


def _recalled(store: EngineStorage, s: Session, use: dict[str, Any]) -> ToolOutcome:
    """``recall``: a tool result cleared from the context, read from the task's own steps
    (those before the latest compaction from the store: a resumed session does not hold them)."""
    wanted = (use.get("input") or {}).get("tool_use_id")
    first = s.steps[0].number if s.steps else 1
    for steps in (s.steps, store.steps.load(s.lease.task_id, upto=first - 1) if first > 1 else []):
        for record in steps:
            if isinstance(record.body, ToolsStep):
                for result in record.body.results:
                    if result.tool_use_id == wanted:
                        return ToolOutcome(
                            tool_use_id=use["id"], name=RECALL_TOOL, content=result.content,
                            is_error=result.is_error, started_at=time.time(), duration_ms=0,
                        )  # fmt: skip
    return _error_outcome(use, f"no tool result with id {wanted!r} in this task")


def _error_outcome(use: dict[str, Any], message: str) -> ToolOutcome:
    return ToolOutcome(
        tool_use_id=use["id"],
        name=use["name"],
        content=message,
        is_error=True,
        status="error",
        started_at=time.time(),
        duration_ms=0,
    )


def _draft(s: Session, body: ToolsStep) -> StepRecord:
    return StepRecord(
        task_id=s.lease.task_id, number=s.next_step, epoch=s.lease.epoch, committed_at=time.time(), body=body
    )
