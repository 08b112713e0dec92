"""The LLM turn: admit the call (fleet flow control), hold the budget, call the model (or send
the turn as a batch), and commit its answer as the next step, settling the hold with what the
call used in the same write.

A call answered after its worker lost the lease is still paid for: its usage is settled once
as an orphan (ARCHITECTURE 4) and kept in the trace, and the step is left to the new owner.
"""

from __future__ import annotations

import time

from agentq import observe
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._finish import finish_without_step
from agentq.core.engine._holds import MIN_OUTPUT_TOKENS, BudgetHolds
from agentq.core.engine._llm_answer import Answers
from agentq.core.engine._llm_batch import Batches
from agentq.core.engine._llm_call import ModelCall
from agentq.core.engine._llm_route import ModelRouter
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine.result import RunResult
from agentq.core.errors import CallCut, LeaseLost, ProviderError
from agentq.core.faults import crash_point
from agentq.core.models import TaskStatus
from agentq.core.ports import BudgetLedger, FlowPort, StepLog, TaskLeases, TenantWindowsPort
from agentq.core.pricing import PriceTable
from agentq.core.providers import ProviderFactory
from agentq.core.tenancy import TenantCapReached


class LLMTurn:
    def __init__(
        self,
        tasks: TaskLeases,
        steps: StepLog,
        budgets: BudgetLedger,
        flow: FlowPort,
        windows: TenantWindowsPort,
        providers: ProviderFactory,
        prices: PriceTable,
        holds: BudgetHolds,
        requests: RequestBuilder,
        writer: StepWriter,
    ) -> None:
        self.tasks, self.steps, self.budgets, self.flow = tasks, steps, budgets, flow
        self.windows, self.providers, self.prices = windows, providers, prices
        self.holds, self.requests, self.writer = holds, requests, writer
        self.router = ModelRouter(flow, requests, holds)
        self.calls = ModelCall(tasks, steps, budgets, flow, windows, providers, prices, holds, self.router)
        self.batches = Batches(providers, tasks, windows)
        self.answers = Answers(steps, budgets, flow, windows, requests, writer, self.router, self.calls)

    def run(self, s: Session) -> RunResult | None:
        """One call and its commit (None), or how the run ends instead."""
        deferred = self.router.admit(s)
        if deferred is not None:
            return deferred
        reserved = self.holds.reserve(s)
        if reserved is None:
            observe.record_budget_refusal("task")
            return finish_without_step(self.tasks, self.holds, s, TaskStatus.COST_EXCEEDED)
        crash_point("after_reserve")
        window = None
        held_usd = s.task.inflight.micros if s.task.inflight else 0
        batch = s.task.batch if s.task.batch and int(s.task.batch["step"]) == s.next_step else None
        if s.limits is not None:
            try:
                # A batch's result was paid for when it was sent: the window counts it now, from 0.
                amount, money = (0, 0) if batch else (reserved, held_usd)
                window = self.windows.hold(s.task.tenant, s.limits, amount, micros=money)
            except TenantCapReached as exc:  # not this task's fault: try again next hour
                self.holds.hand_back(s)
                return RunResult(s.task_id, "retry", error={**exc.to_dict(), "retry_after": exc.retry_after})
        est_in, _ = self.requests.wanted_reservation(s)
        max_out = max(MIN_OUTPUT_TOKENS, min(self.requests.max_out(s), reserved - est_in))
        request = self.requests.request(s, max_out)
        compact = self.requests.compacting(s)
        held = s.task.inflight
        s.sent_hold_step = held.step if held else s.next_step  # from here the call may be on the wire
        if s.economy:
            try:
                sent = self.batches.batched(s, request, window, batch)
            except ProviderError as exc:
                return self.calls.call_failed(s, exc, window)
            if isinstance(sent, RunResult):
                return sent
            response, started = sent
            return self.answers.answered(s, request, response, started, reserved, max_out, window, compact)
        try:
            self.holds.cover(s, time.time())
        except LeaseLost:
            # Nothing went on the wire, so no call can be charged: the hold goes back now (from
            # wherever a successor set it aside), not at its deadline.
            self.calls.unspent(s, window)
            raise
        started = time.time()
        s.call_may_be_billed, s.next_attempt_at = False, None
        while True:
            asked = self.calls.asked(s, request)
            try:
                response = self.calls.call(s, asked, max_out, started)
                break
            except CallCut as cut:
                return self.calls.cut(s, window, cut)
            except LeaseLost:
                # Learnt between attempts (``_note_retry``), after the last one failed. When
                # every attempt failed unbilled (an error status, no connection), the call
                # cannot be charged: its hold goes back now, from wherever a successor put it
                # (set aside, or already counted as spent), not kept as an unknown.
                if not s.call_may_be_billed:
                    self.calls.unspent(s, window)
                raise
            except ProviderError as exc:
                # The failed model's last attempt was not reported as a retry: the error says
                # whether it may have been billed (the earlier ones were told by their notices).
                s.call_may_be_billed = s.call_may_be_billed or exc.maybe_billed
                if s.task.inflight is None or not self.router.fall_over(s, exc):  # none: no hold for another try
                    return self.calls.call_failed(s, exc, window)
                if s.call_may_be_billed and not self.calls.rehold(s):
                    return self.calls.call_failed(s, exc, window)
                self.holds.cover(s, time.time())  # the next model's call is an attempt of its own
        return self.answers.answered(s, asked, response, started, reserved, max_out, window, compact)
