"""The grading model's call under the task tree's budget, as any model call (ARCHITECTURE 4,
``used <= cap`` at every scope): its input estimate plus its output allowance are held before
the grade is begun, on the budget and on every window the agent's own calls hold on (the
tenant's hour and the caps of the task's end user, agent and API key: one ``CallHold`` taken by
``CallWindows.take``, the agent's turn's own path), and the grade's commit settles the hold to
what the call used, in the same write. A budget that cannot cover the hold ends the task
``cost_exceeded`` before anything is begun, the answer kept, and a raise of the cap resumes it
at the grade; a hold an older epoch's call may still be charged against defers it
(``HoldsInFlight``), as the agent's turn does; a scope's cap defers it, a soft threshold pauses
it for approval (rejected: ``cost_exceeded``, the answer kept), the tenant's hour retries it.

What may have been billed stays counted: a call that failed or ran past its time is counted
as spent, its outcome unknown; a worker killed mid-grade leaves its hold on META, which the next
claim counts (``BudgetHolds.take_over``); a worker that lost its lease after its call answered
settles the usage once, as an orphan; and a grade recorded by an older epoch and committed by a
later one settles that epoch's hold to the recorded usage, once (its ticket).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentq import observe
from agentq.core.engine._caps import CallWindows
from agentq.core.engine._holds import BudgetHolds, HoldsInFlight, call_micros
from agentq.core.engine._session import Session
from agentq.core.engine._stops import budget_error
from agentq.core.engine.conversation import estimate_input_tokens
from agentq.core.engine.result import RunResult
from agentq.core.errors import LeaseLost
from agentq.core.grading import GradeError
from agentq.core.models import GradeStep, TaskStatus, TaskSubmission
from agentq.core.ports import BudgetLedger, TaskLeases
from agentq.core.pricing import PriceTable
from agentq.core.providers import LLMRequest, LLMResponse
from agentq.core.providers.base import RetryNotice, reporting_retries
from agentq.core.records import BudgetDelta
from agentq.core.reservation import Reservation


@dataclass
class GradingCall:
    """The grading model's call of one grade: what it asks, and what holds the budget for it."""

    provider: str
    model: str
    submission: TaskSubmission  # the task's, with the grading model in it
    request: LLMRequest
    window: Any = None  # its hold on the tenant's hour and the scopes' caps (a ``CallHold``; None: nothing caps it)
    # An attempt failed or was abandoned after it may have reached the provider: its hold is
    # counted as spent (unknown), not returned.
    may_be_billed: bool = False
    # The call runs in a thread of its own (``core.grading.within``): its retries hold anew there
    # (``GradeBudget.retried``) under this lock, and none does once the grade stopped waiting.
    lock: threading.Lock = field(default_factory=threading.Lock)
    given_up: bool = False


def usage_of(step: GradeStep, reserved: int = 0, reserved_micros: int = 0) -> BudgetDelta:
    return BudgetDelta(
        reserved=reserved, used=step.usage.total, cost_usd=step.cost_usd, tokens_in=step.usage.input_total,
        tokens_out=step.usage.output_tokens, reserved_micros=reserved_micros,
    )  # fmt: skip


class GradeBudget:
    def __init__(
        self, holds: BudgetHolds, budgets: BudgetLedger, tasks: TaskLeases, windows: CallWindows, prices: PriceTable,
    ) -> None:  # fmt: skip
        self.holds, self.budgets, self.tasks, self.windows, self.prices = holds, budgets, tasks, windows, prices

    def estimate(self, call: GradingCall) -> tuple[int, int, int]:
        """What ``call`` will hold: its input estimate, its tokens in all (the input and its
        whole output allowance) and their most money at the grading model's price. The policy
        rules see the last two (``call.estimated_tokens``, ``call.estimated_usd_micros``)."""
        est_in = estimate_input_tokens(call.request)
        amount = est_in + call.request.max_tokens
        return est_in, amount, call_micros(self.prices.price_for(call.model), est_in, amount)

    def hold(self, s: Session, call: GradingCall, answer: str) -> RunResult | None:
        """Hold the budget, the tenant's hour and the scopes' caps for ``call``; None when held,
        else how the run ends, as before an agent's call: ``cost_exceeded`` with the answer kept
        (the budget, or a soft threshold a person declined), deferred at a scope's cap, paused at
        a soft threshold, or a retry next hour (the tenant's cap)."""
        est_in, amount, _ = self.estimate(call)
        if not self.holds.hold_call(s, est_in, amount, self.prices.price_for(call.model)):
            observe.record_budget_refusal("task")
            error = budget_error(s)
            self.tasks.transition(s.task_id, TaskStatus.COST_EXCEEDED, lease=s.lease, result=answer, error=error)
            s.task = s.task.model_copy(update={"status": TaskStatus.COST_EXCEEDED})
            return RunResult(s.task_id, "finished", status=TaskStatus.COST_EXCEEDED, error=error)
        held = s.task.inflight
        taken = self.windows.take(s, amount, held.micros if held else 0, self.tasks, self.holds, result=answer)
        if isinstance(taken, RunResult):
            return taken
        call.window = taken
        return None

    def try_hold(self, s: Session, call: GradingCall) -> bool:
        """Hold for a call that never stops the task (an online grade's, or a retry's: ``retried``):
        False (nothing held) when the budget, the tenant's hour or a scope's cap (or its soft
        threshold) cannot cover it."""
        est_in, amount, _ = self.estimate(call)
        if not self.holds.hold_call(s, est_in, amount, self.prices.price_for(call.model)):
            return False
        held = s.task.inflight
        fits, call.window = self.windows.try_take(s, amount, held.micros if held else 0)
        if not fits:  # the budget's hold goes back; the run goes on under its lease, to commit no grade
            self.holds.release(s)
        return fits

    def attempts(self, s: Session, call: GradingCall, send: Callable[[], LLMResponse]) -> LLMResponse:
        """The grading call's answer through its attempts (``send``, in the grading thread), each
        retry told to ``retried``."""
        with reporting_retries(lambda notice: self.retried(s, call, notice)):
            return send()

    def retried(self, s: Session, call: GradingCall, notice: RetryNotice) -> None:
        """An attempt of the grading call failed and another is to follow. One that may have been
        billed keeps its hold counted as spent, its outcome unknown, on the budget and on every
        window, and the next attempt holds anew, as an agent's call does (``ModelCall.rehold``).
        No attempt follows (``GradeError``) when they cannot cover it, or when the lease is lost
        meanwhile (the hold just taken goes back, known unsent), and no hold is taken once the
        grade stopped waiting for the call (``given_up``: an attempt scheduled before then goes
        out under the hold the run counts as spent)."""
        if notice.unbilled:
            return
        with call.lock:
            if call.given_up:
                raise GradeError(
                    "grader_timeout", "the grade stopped waiting for the grading model: no further attempt"
                )
            self.holds.spend(s, reportable=False)
            self.spend_window(call)
            call.may_be_billed = False  # the spent hold answers for that attempt; the next one's is to come
            try:
                held = self.try_hold(s, call)
                if held:
                    self.holds.cover(s, time.time() + notice.delay)
            except HoldsInFlight:  # an older epoch's call stands in the way: nothing held, no attempt now
                held = False
            except LeaseLost:
                self.holds.release(s)
                self.settle_window(call, 0, 0)
                raise GradeError(
                    "grader_failed", f"{notice.message}; the lease was lost before another attempt"
                ) from None
            if not held:
                raise GradeError("grader_failed", f"{notice.message}; no budget left for another attempt after one "
                                                  "that may have been billed")  # fmt: skip
            call.may_be_billed = True

    def gave_up(self, call: GradingCall) -> None:
        """The grade stopped waiting for the call (an answer, an error, its time): a retry still
        to come in its thread holds nothing more (it waits here for one holding now)."""
        with call.lock:
            call.given_up = True

    def sending(self, s: Session) -> None:
        """The call goes on the wire now: its hold must outlive it, and a lost lease keeps it."""
        held = s.task.inflight
        if held is not None:
            self.holds.cover(s, time.time())
            s.sent_hold_step = held.step

    def settlement(
        self, s: Session, call: GradingCall | None, step: GradeStep, prior_epoch: int | None
    ) -> tuple[BudgetDelta | None, BudgetDelta | None]:
        """What the grade's commit settles (``settle``: this run's hold to the call's usage) and
        what it only counts on the task (``counted``: a recorded grade's usage, settled against
        the hold of the epoch that made its call)."""
        held = s.task.inflight if call is not None else None
        if step.replayed:
            if held is not None:  # this run held for a call it did not make: known unspent
                self.holds.release(s)
                self.settle_window(call, 0, 0)
            if prior_epoch is not None and prior_epoch != s.lease.epoch and step.reserved_tokens:
                if step.may_be_billed:  # its call's outcome is unknown: its hold is counted as spent, never returned
                    held_then = Reservation(step.reserved_tokens, prior_epoch, s.next_step, micros=step.reserved_micros)
                    self.holds.spend_recorded(s.task, held_then)
                    return None, None
                delta = usage_of(step, step.reserved_tokens, step.reserved_micros)
                self.budgets.settle_orphan(
                    s.task_id, s.task.budget_id, delta, inflight_epoch=prior_epoch, parent_id=s.task.parent_id,
                    ticketed=True,
                )  # fmt: skip
                return None, usage_of(step) if step.usage.total or step.cost_usd else None
            return (usage_of(step) if step.usage.total or step.cost_usd else None), None
        if held is not None and call is not None and call.may_be_billed:
            self.holds.spend(s)  # its outcome unknown: counted at its hold, corrected if ever reported
            self.spend_window(call)  # the tenant's hour and the scopes' caps keep it too
            held = None
        if held is None:
            return (usage_of(step) if step.usage.total or step.cost_usd else None), None
        return usage_of(step, held.amount, held.micros), None

    def settled(self, s: Session, call: GradingCall | None, settle: BudgetDelta | None) -> None:
        """After the commit: the hold is gone with it, and the tenant's hour and the scopes'
        caps take the usage."""
        if call is not None and settle is not None and settle.reserved:
            s.task = s.task.model_copy(update={"inflight": None})
        if call is not None:
            used = settle.used if settle is not None else 0
            self.settle_window(call, used, settle.used_micros if settle is not None else 0)

    def abandoned(self, call: GradingCall | None) -> None:
        """The run stops between the hold and the grade's record (a lost lease, an error): the
        windows' hold (the tenant's hour, the scopes' caps) is given back if nothing was sent,
        and kept, counted as spent, if the call may have been billed. Left held, a cap would
        refuse calls never made until its window ends (the budget's hold is the next claim's to
        count: ``BudgetHolds``). A window settled already (``orphaned``) is left as it is."""
        if call is not None and call.may_be_billed:
            self.spend_window(call)
        else:
            self.settle_window(call, 0, 0)

    def spend_window(self, call: GradingCall | None) -> None:
        """The call's windows keep its hold, counted as spent (it may have been billed)."""
        if call is not None and call.window is not None:
            self.windows.spend(call.window)
            call.window = None

    def settle_window(self, call: GradingCall | None, used: int, used_micros: int) -> None:
        if call is not None and call.window is not None:
            self.windows.settle(call.window, used, used_micros)
            call.window = None

    def orphaned(self, s: Session, call: GradingCall | None, step: GradeStep) -> None:
        """The lease was lost after the grading model answered, before the grade was recorded:
        the usage is settled once against this run's hold, as a lost lease's answer is (a call
        whose outcome is unknown leaves its hold for the next claim to count)."""
        held = s.task.inflight
        if call is None or held is None or call.may_be_billed:
            return
        self.budgets.settle_orphan(
            s.task_id, s.task.budget_id, usage_of(step, held.amount, held.micros), inflight_epoch=held.epoch,
            parent_id=s.task.parent_id,
        )  # fmt: skip
        self.settle_window(call, step.usage.total, usage_of(step).used_micros)
        s.task = s.task.model_copy(update={"inflight": None})
