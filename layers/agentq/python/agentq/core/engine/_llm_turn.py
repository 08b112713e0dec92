"""The LLM turn: admit the call (fleet flow control), hold the budget, call the model (or send
the turn as a batch), and commit its answer as the next step, settling the hold with what the
call used in the same write.

A call answered after its worker lost the lease is still paid for: its usage is settled once
as an orphan (ARCHITECTURE 4) and kept in the trace, and the step is left to the new owner.

This module only orders those steps; each is a module that owns what it touches: the route
(``_llm_route``), the call on the wire (``_llm_call``, whose ``Call`` is the call's own state),
the batch (``_llm_batch``) and the answer's commit (``_llm_answer``).
"""

from __future__ import annotations

from agentq import observe
from agentq.core.engine._caps import CallWindows
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._finish import finish_without_step
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._input_count import InputCount, allowance
from agentq.core.engine._llm_answer import Answers
from agentq.core.engine._llm_batch import RECORDED, Batches
from agentq.core.engine._llm_call import Call, ModelCall
from agentq.core.engine._llm_route import ModelRouter, Route, admitted
from agentq.core.engine._policy import PolicyGate, refuse_model_call
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine.result import RunResult
from agentq.core.errors import LeaseLost, ProviderError
from agentq.core.faults import crash_point
from agentq.core.models import TaskStatus
from agentq.core.ports import BudgetLedger, FlowPort, StepLog, TaskLeases
from agentq.core.pricing import PriceTable
from agentq.core.providers import ProviderFactory


class LLMTurn:
    def __init__(
        self,
        tasks: TaskLeases,
        steps: StepLog,
        budgets: BudgetLedger,
        flow: FlowPort,
        windows: CallWindows,
        providers: ProviderFactory,
        prices: PriceTable,
        holds: BudgetHolds,
        requests: RequestBuilder,
        writer: StepWriter,
        policy: PolicyGate | None = None,
    ) -> None:
        self.tasks, self.windows, self.holds, self.requests = tasks, windows, holds, requests
        self.policy = policy
        self.router = ModelRouter(flow)
        self.calls = ModelCall(tasks, steps, budgets, flow, windows, providers, prices, holds, self.router, policy)
        self.batches = Batches(providers, tasks)
        self.answers = Answers(tasks, steps, budgets, flow, windows, prices, requests, writer)

    def run(self, s: Session, *, cut: TaskStatus | None = None) -> RunResult | None:
        """One call and its commit (None), or how the run ends instead. ``cut``: the task ends so
        (its timeout passed) while it waits on its batch (``waited_on``): the batch's answer is
        read and charged, not committed (``Answers.cut``), and the task ends."""
        demand = self.requests.wanted_reservation(s)  # the call's input estimate and whole hold
        route = Route()
        # A run that reads the batch its task waits on sends nothing: the call was admitted and
        # checked against the rules as it went out, and the provider bills it whatever a rule or
        # a circuit says now. Refused here, the hold went back and the billed batch was never read.
        batch = s.task.batch if s.task.batch and int(s.task.batch["step"]) == s.next_step else None
        if admitted(s.task.submission) and batch is None:
            routed = self.router.admit(s.task, s.steps, demand)
            if isinstance(routed, RunResult):  # deferred: the next call's hold goes back with the lease
                self.holds.hand_back(s)
                return routed
            route = routed
        if self.policy is not None and batch is None:  # the model the route chose (a fallback's, past an open circuit)
            sub = s.task.submission
            verdict = self.policy.model_verdict(s, route.model(sub), self.holds.estimate(s, demand))
            if verdict.effect != "allow":  # nothing was sent: the task ends, naming the rule
                self.router.give_back(sub, route)
                return refuse_model_call(self.tasks, self.holds, s, verdict)
        # A hold the cap shrinks is sized on its input as the provider counts it (``_input_count``).
        count = None if batch is not None else InputCount(
            self.calls.providers, s, route.submission(s.task.submission),
            lambda max_tokens: route.asked(self.requests.request(s, max_tokens)),
        )  # fmt: skip
        try:
            reserved = self.holds.reserve(s, count)
        except ProviderError as exc:  # its input could not be counted: nothing sent on a guess, as an unbilled failure
            call = Call(self.requests.request(s, self.requests.max_out(s)), 0, 0, False, None, route)
            return self.calls.failed(s, call, exc)
        if reserved is None:
            observe.record_budget_refusal("task")
            return finish_without_step(self.tasks, self.holds, s, TaskStatus.COST_EXCEEDED)
        crash_point("after_reserve")
        held_usd = s.task.inflight.micros if s.task.inflight else 0
        kept = batch if batch is not None and RECORDED in batch else None
        if kept is not None:
            # The batch's call has held on the windows since it was sent: its answer settles that.
            window = self.batches.recorded(s, kept)
        else:
            # The tenant's window and the task's scopes' caps (core.engine._caps). A batch whose
            # record keeps no hold (parked before records kept one) gave it back: counted from 0.
            amount, money = (0, 0) if batch else (reserved, held_usd)
            taken = self.windows.take(s, amount, money, self.tasks, self.holds)
            if isinstance(taken, RunResult):
                return taken
            window = taken
        # The output allowance: what the hold leaves past all the call may read (its whole hold
        # less the allowance asked for: ``BudgetHolds.least``), never more than that allowance;
        # a shrunk hold's past the input its provider counted, where that is more than the estimate.
        sized = count.input_or(demand[0]) if count is not None else demand[0]
        max_out = allowance(self.requests, s, reserved, sized)
        shrunk = reserved < demand[1] or sized > demand[0]
        call = Call(
            self.requests.request(s, max_out), max_out, reserved, self.requests.compacting(s), window, route,
            batch=str(kept["id"]) if kept is not None else None, sized=sized if shrunk else None,
        )  # fmt: skip
        held = s.task.inflight
        s.sent_hold_step = held.step if held else s.next_step  # from here the call may be on the wire
        if s.economy:
            try:
                answer = self.batches.batched(s, call, batch, lambda notice: self.calls.note_retry(s, call, notice))
            except ProviderError as exc:
                # A batch's own result says whether it was billed (an errored or expired request
                # was not; one that cannot be read may have been); a creation's last attempt may
                # have made a batch.
                call.may_be_billed = exc.maybe_billed if batch is not None else call.may_be_billed or exc.maybe_billed
                return self.calls.failed(s, call, exc)
            except LeaseLost:
                # Learnt between attempts of the batch's creation (``note_retry``) or at the
                # park: when no attempt can have made a batch, the hold and the windows' go back
                # now, as a call's do (``ModelCall.make``); a batch made keeps them counted.
                if not call.may_be_billed:
                    self.calls.unspent(s, call)
                raise
        else:
            answer = self.calls.make(s, call, demand)
        if isinstance(answer, RunResult):
            return answer
        if cut is not None:
            self.answers.cut(s, call, answer)
            return finish_without_step(self.tasks, self.holds, s, cut)
        return self.answers.commit(s, call, answer)
