"""The LLM turn: admit the call (fleet flow control), hold the budget, call the model (or send
the turn as a batch), and commit its answer as the next step, settling the hold with what the
call used in the same write.

A call answered after its worker lost the lease is still paid for: its usage is settled once
as an orphan (ARCHITECTURE 4) and kept in the trace, and the step is left to the new owner.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from decimal import Decimal
from typing import Any

from agentq import observe
from agentq.core.context import resumed_goal
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._cut import CutCall, call_until, settle_late
from agentq.core.engine._holds import MIN_OUTPUT_TOKENS, BudgetHolds
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine._stops import stop_error, timeout_at
from agentq.core.engine.conversation import final_text
from agentq.core.engine.result import RunResult
from agentq.core.errors import CallCut, ConversationMoved, LeaseLost, ProviderError
from agentq.core.faults import crash_point
from agentq.core.flow import Admission, flow_key
from agentq.core.models import CallStep, CompactStep, FallbackNote, LLMStep, ModelChoice, RetryState, TaskStatus, Usage
from agentq.core.output import answer_of, feedback
from agentq.core.ports import BudgetLedger, FlowPort, StepLog, TaskLeases, TenantWindowsPort
from agentq.core.pricing import PriceTable, micros
from agentq.core.providers import LLMRequest, LLMResponse, ProviderFactory
from agentq.core.providers.base import (
    BATCH_PRICE_RATIO,
    BatchProvider,
    RemoteProvider,
    RetryNotice,
    reporting_retries,
    reporting_text,
    reporting_usage,
)
from agentq.core.records import BudgetDelta, OrphanReason
from agentq.core.reservation import Seen
from agentq.core.tenancy import TenantCapReached

log = logging.getLogger("agentq.engine")

# A call that still fails with one of these after its retries is an outage or an overload of its
# model: a task with fallbacks sends it to the next (``LLMTurn._fall_over``).
FALLBACK_CODES = frozenset(
    {"overloaded", "rate_limited", "provider_server_error", "provider_unreachable", "provider_timeout"}
)

DEFERRAL_MESSAGES = {
    "circuit_open": "the circuit for {provider}/{model} is open after repeated failures",
    "slowed_down": "{provider} asked the fleet to slow down for {model} (429)",
    "rate_limited": "the fleet's rate limit for {provider}/{model} is spent",
}


class NoHoldForRetry(ProviderError):
    """A failed attempt that may have been billed used up its hold, and the budget cannot cover
    another: the call stops retrying and fails with that attempt's error (``LLMTurn._rehold``)."""

    def __init__(self, notice: RetryNotice) -> None:
        super().__init__(
            f"{notice.message}; no budget left for another attempt after one that may have been billed",
            retryable=True, status_code=notice.status_code, attempts=notice.attempt, code=notice.code,
        )  # fmt: skip


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

    def run(self, s: Session) -> RunResult | None:
        """One call and its commit (None), or how the run ends instead."""
        deferred = self._admit(s)
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
                sent = self._batched(s, request, window, batch)
            except ProviderError as exc:
                return self._call_failed(s, exc, window)
            if isinstance(sent, RunResult):
                return sent
            response, started = sent
            return self._answered(s, request, response, started, reserved, max_out, window, compact)
        try:
            self.holds.cover(s, time.time())
        except LeaseLost:
            # Nothing went on the wire, so no call can be charged: the hold goes back now (from
            # wherever a successor set it aside), not at its deadline.
            self._unspent(s, window)
            raise
        started = time.time()
        s.call_may_be_billed, s.next_attempt_at = False, None
        while True:
            asked = self._asked(s, request)
            try:
                response = self._call(s, asked, max_out, started)
                break
            except CallCut as cut:
                return self._cut(s, window, cut)
            except LeaseLost:
                # Learnt between attempts (``_note_retry``), after the last one failed. When
                # every attempt failed unbilled (an error status, no connection), the call
                # cannot be charged: its hold goes back now, from wherever a successor put it
                # (set aside, or already counted as spent), not kept as an unknown.
                if not s.call_may_be_billed:
                    self._unspent(s, window)
                raise
            except ProviderError as exc:
                # The failed model's last attempt was not reported as a retry: the error says
                # whether it may have been billed (the earlier ones were told by their notices).
                s.call_may_be_billed = s.call_may_be_billed or exc.maybe_billed
                if s.task.inflight is None or not self._fall_over(s, exc):  # none: no hold for another try
                    return self._call_failed(s, exc, window)
                if s.call_may_be_billed and not self._rehold(s):
                    return self._call_failed(s, exc, window)
                self.holds.cover(s, time.time())  # the next model's call is an attempt of its own
        return self._answered(s, asked, response, started, reserved, max_out, window, compact)

    def _rehold(self, s: Session) -> bool:
        """An attempt that may have been billed failed, and another is to follow (a retry, or a
        fallback's call): the failed one's hold is counted as spent, its outcome unknown, and
        the next attempt gets a hold of its own, so what the provider may bill never passes the
        cap (ARCHITECTURE 4). The new hold is the spent one's size, never less: the request on
        the wire asks for as much output as before, and the answer settles against it. False when
        the budget cannot cover it: no further attempt."""
        spent = self.holds.spend(s)
        s.held.seen = None  # what that attempt billed went with its hold
        s.call_may_be_billed = False  # the spent hold answers for that attempt; this one's are to come
        if spent is None or not self.holds.hold_again(s, spent.amount):
            return False
        s.sent_hold_step = s.next_step  # its attempt goes out at once: never "unsent"
        return True

    def _unspent(self, s: Session, window: Any) -> None:
        """The call's hold goes back, with the tenant window's hold for it: this run knows the call
        uncharged (nothing sent, or every attempt unbilled)."""
        self.holds.release(s)
        if window is not None:
            self.windows.settle(window, 0)

    def _asked(self, s: Session, request: LLMRequest) -> LLMRequest:
        """The request as it goes to the model chosen for it (a fallback's own model id)."""
        choice = s.model_choice
        return request if choice is None else request.model_copy(update={"model": choice.model})

    def _call(self, s: Session, request: LLMRequest, max_out: int, started: float) -> LLMResponse:
        """The model's answer; ``CallCut`` when the task's timeout passes first (``_cut``)."""
        sub = s.task.submission
        choice = s.model_choice
        if choice is not None and (choice.provider, choice.model) != (sub.provider, sub.model):
            sub = sub.model_copy(update={"provider": choice.provider, "model": choice.model})
        provider = self.providers(sub)  # may fail too (a key it cannot read)
        cut = CutCall(s.task_id, s.task.budget_id, s.task.parent_id, s.lease, s.next_step, s.task.inflight)
        with (
            observe.llm_call(
                provider=provider.name, model=request.model, max_tokens=max_out, task_id=s.task_id,
                step=s.next_step, endpoint=provider.endpoint if isinstance(provider, RemoteProvider) else None,
            ) as call,
            reporting_retries(lambda notice: self._note_retry(s, notice)),
            reporting_text(lambda text: setattr(s.held, "live_text", text)),
            reporting_usage(lambda usage: self._saw(s, request.model, usage)),
        ):  # fmt: skip
            try:
                response = call_until(
                    timeout_at(s),
                    lambda: provider.complete(request),
                    lambda late: self._late(cut, request, late, started, sub.provider),
                )
            finally:
                s.held.live_text = None
            call.answered(response)
        s.held.seen = None  # the step carries its usage now
        return response

    def _saw(self, s: Session, model: str, usage: Usage) -> None:
        """A streamed call's usage so far, under the hold it is made under: the heartbeat
        publishes it, so a hold counted as spent leaves only the rest unknown (``Seen``)."""
        held = s.task.inflight
        if held is None:
            return
        price = self.prices.price_for(model)
        cost = micros(price.cost(usage)) if price else 0
        s.held.seen = Seen(held.epoch, held.step, held.until, usage.input_total, usage.output_tokens, cost)

    def _cut(self, s: Session, window: Any, cut: CallCut) -> RunResult:
        """The task's timeout passed with the call in flight: the call is cut (``_cut``), the
        hold counted as spent, since whether the provider answered and billed it is unknown (an
        answer that still comes corrects it: ``_late``), and the task ends ``timed_out`` now. A
        call the deadline stopped before it started gives its hold back."""
        between_attempts = s.next_attempt_at is not None and timeout_at(s) < s.next_attempt_at
        if not cut.sent or (between_attempts and not s.call_may_be_billed):
            # Nothing on the wire that this hold answers for: the call never started, or it was
            # cut in a retry's wait after attempts that were all unbilled (or spent: ``_rehold``).
            if window is not None:
                self.windows.settle(window, 0)
            return finish_without_step(self.tasks, self.holds, s, TaskStatus.TIMED_OUT)
        held = self.holds.spend(s)
        if window is not None:  # the tenant's hour keeps the hold, as the budget does
            self.windows.settle(window, window.amount, window.micros)
        note = (
            f"; the model call in flight was cut and its hold of {held.amount} tokens counted as spent" if held else ""
        )
        log.info("task %s: timed out with the call of step %d in flight%s", s.task_id, s.next_step, note)
        # Not released after: the cut call's thread may still be reporting a retry, and its
        # write of the session would bring the spent hold back into it.
        return finish_without_step(self.tasks, self.holds, s, TaskStatus.TIMED_OUT, note=note, release=False)

    def _late(self, cut: CutCall, request: LLMRequest, response: LLMResponse, started: float, provider: str) -> None:
        """The answer of a call cut at the task's timeout, come after all: charged as an orphan."""
        step = LLMStep(
            content=response.content,
            stop_reason=response.stop_reason,
            model=response.model or request.model,
            usage=response.usage,
            cost_usd=self._cost(provider, response.model or request.model, request.model, response),
            reserved_tokens=cut.hold.amount if cut.hold else 0,
            attempts=response.attempts,
            started_at=started,
            duration_ms=int((time.time() - started) * 1000),
            provider=provider,
        )
        settle_late(self.budgets, self.steps, cut, step)

    def _fall_over(self, s: Session, exc: ProviderError) -> bool:
        """After the model's call failed with an overload or an outage (its retries spent),
        the next of the task's models whose circuit lets it through takes the call: the
        failure counts toward the failed model's circuit, as any failed call does."""
        if not (exc.retryable and exc.code in FALLBACK_CODES and s.admission is not None and s.model_choice):
            return False
        failed = s.model_choice
        order = self._candidates(s)
        for choice in order[order.index(failed) + 1 :]:
            est_in, wanted = self.requests.wanted_reservation(s)
            admission = self.flow.admit(flow_key(choice.provider, choice.model), est_in, wanted - est_in)
            if not admission.ok:
                continue
            key = flow_key(failed.provider, failed.model)
            if exc.status_code == 429 and exc.retry_after:
                self.flow.slow_down(key, exc.retry_after)
            self.flow.failed(key, s.admission)
            log.warning("task %s: %s/%s failed (%s); falling back to %s/%s", s.task_id, failed.provider,
                        failed.model, exc.code, choice.provider, choice.model)  # fmt: skip
            observe.otel.event("agentq.fallback", {"agentq.failed_model": f"{failed.provider}/{failed.model}",
                                                   "agentq.error_code": exc.code, "gen_ai.request.model": choice.model,
                                                   "gen_ai.provider.name": choice.provider})  # fmt: skip
            s.admission, s.model_choice = admission, choice
            first = s.fallback_note or FallbackNote(provider=failed.provider, model=failed.model, reason=exc.code)
            s.fallback_note = first.model_copy(update={"reason": exc.code})
            return True
        return False

    def _candidates(self, s: Session) -> list[ModelChoice]:
        """The task's models in the order this call tries them: from the one its latest call
        step records (a resume and a fork go on with the model that answered), then the others
        in the order the task names them."""
        choices = s.task.submission.candidates()
        recorded = next((r.body for r in reversed(s.steps) if isinstance(r.body, CallStep) and r.body.provider), None)
        if recorded is None or len(choices) < 2:
            return choices
        same = [c for c in choices if c.provider == recorded.provider and recorded.model.startswith(c.model)]
        if not same:
            return choices
        start = choices.index(max(same, key=lambda c: len(c.model)))
        return choices[start:] + choices[:start]

    def _admit(self, s: Session) -> RunResult | None:
        """Fleet-wide flow control before the call (``core.flow``): a circuit open, a 429's
        slow-down or an empty rate bucket defers the task (its next call's hold goes back with
        the lease; the delayed message spends no receive toward the DLQ)."""
        sub = s.task.submission
        s.admission = None
        s.model_choice = None
        s.fallback_note = None
        if sub.provider == "scripted" or s.economy:  # no provider to protect; batches queue at the provider
            return None
        est_in, wanted = self.requests.wanted_reservation(s)
        order = self._candidates(s)
        refused: list[tuple[ModelChoice, Admission]] = []
        for choice in order:
            admission = self.flow.admit(flow_key(choice.provider, choice.model), est_in, wanted - est_in)
            if admission.ok:
                if refused:
                    log.info("task %s: %s for %s/%s; its call goes to %s/%s", s.task_id, refused[0][1].reason,
                             refused[0][0].provider, refused[0][0].model, choice.provider, choice.model)  # fmt: skip
                    first = refused[0][0]
                    s.fallback_note = FallbackNote(
                        provider=first.provider, model=first.model, reason=refused[-1][1].reason
                    )
                s.admission, s.model_choice = admission, choice
                return None
            refused.append((choice, admission))
            if admission.reason != "circuit_open":
                break  # a slow-down or a rate limit is waited for: it is not an outage
        self.holds.hand_back(s)
        choice, admission = refused[0]
        log.info("task %s deferred %.1fs: %s for %s", s.task_id, admission.wait, admission.reason, choice.model)
        known = DEFERRAL_MESSAGES.get(admission.reason)
        message = known.format(provider=choice.provider, model=choice.model) if known else admission.reason
        wait = min(a.wait for _, a in refused)
        return RunResult(
            s.task_id, "deferred",
            error={"code": admission.reason, "message": message, "retry_after": max(1.0, wait)},
        )  # fmt: skip

    def _call_failed(self, s: Session, exc: ProviderError, window: Any) -> RunResult:
        """The provider failed the call (its retries spent); the task is tried again later, or
        fails now when no retry can help. The hold goes back when no attempt can have been
        billed; when one may have been (``Session.call_may_be_billed``), it is counted as
        spent, as the unknown it is (ARCHITECTURE 4), not returned on a guess."""
        if s.call_may_be_billed:
            held = self.holds.spend(s)
            if window is not None:  # the tenant's hour keeps it too, as the budget does
                self.windows.settle(window, window.amount, window.micros)
            if held is not None:
                log.info("task %s: call of step %d failed after an attempt that may have been billed; its hold "
                         "of %d tokens counted as unknown", s.task_id, s.next_step, held.amount)  # fmt: skip
        else:
            self._unspent(s, window)
        error: dict[str, Any] = {
            "code": exc.code,
            "message": exc.message,
            "status_code": exc.status_code,
            "attempts": exc.attempts,
        }
        if exc.retryable and s.admission is not None:  # an outage or an overload: the fleet learns of it
            key = self._key(s)
            if exc.status_code == 429 and exc.retry_after:
                self.flow.slow_down(key, exc.retry_after)
            if self.flow.failed(key, s.admission):
                # Open: the task waits for the circuit, not for the DLQ.
                self.tasks.release(s.lease, forget_batch=s.task.batch is not None)
                wait = self.flow.cooldown_seconds
                return RunResult(s.task_id, "deferred", error={**error, "code": "circuit_open", "retry_after": wait})
        if exc.retryable:
            self.tasks.release(s.lease, forget_batch=s.task.batch is not None)
            return RunResult(s.task_id, "retry", error=error)
        self.tasks.transition(s.task_id, TaskStatus.FAILED, lease=s.lease, result=final_text(s.messages), error=error)
        return RunResult(s.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _batched(
        self, s: Session, request: LLMRequest, window: Any, batch: dict[str, Any] | None
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
                return self._park_for_batch(s, batch, window)
            return response, float(batch["submitted_at"])
        custom_id = f"{s.task_id}-s{s.next_step}-e{s.lease.epoch}"[:64]
        record = {"custom_id": custom_id, "step": s.next_step, "epoch": s.lease.epoch, "submitted_at": time.time()}
        record["id"] = provider.submit_batch(request, custom_id)
        crash_point("after_batch_submit")
        return self._park_for_batch(s, record, window)

    def _park_for_batch(self, s: Session, record: dict[str, Any], window: Any) -> RunResult:
        if window is not None:  # the tenant window counts the call when its result is in
            self.windows.settle(window, 0)
        self.tasks.transition(s.task_id, TaskStatus.WAITING, lease=s.lease, extra={"batch": record})
        s.task = s.task.model_copy(update={"status": TaskStatus.WAITING, "batch": record})
        log.info("task %s: turn %s sent as batch %s", s.task_id, record["step"], record["id"])
        return RunResult(s.task_id, "waiting", status=TaskStatus.WAITING, batch_poll=batch_poll_seconds(record))

    def _answered(
        self,
        s: Session,
        request: LLMRequest,
        response: LLMResponse,
        started: float,
        reserved: int,
        max_out: int,
        window: Any,
        compact: bool,
    ) -> RunResult | None:
        """Commit the call's answer as the next step, settling its hold with what it used."""
        crash_point("after_llm_call")
        if s.admission is not None:
            usage = response.usage
            key = self._key(s)
            self.flow.succeeded(key, s.admission)
            # Against a provider's input limit count uncached and cache-write tokens, not reads.
            self.flow.settle(
                key, s.admission, usage.input_tokens + usage.cache_creation_input_tokens, usage.output_tokens
            )
        cost = self._cost(s.task.submission.provider, response.model or request.model, request.model, response)
        if s.economy:
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
            batched=s.economy,
            provider=s.model_choice.provider if s.model_choice else s.task.submission.provider,
            fallback_from=s.fallback_note,
        )
        held = s.task.inflight
        settle = BudgetDelta(
            reserved=reserved,
            used=response.usage.total,
            cost_usd=cost,
            tokens_in=response.usage.input_total,
            tokens_out=response.usage.output_tokens,
            reserved_micros=held.micros if held else 0,
        )
        step: LLMStep | CompactStep
        if compact:
            step = CompactStep(**dict(answered), summarised_through=s.next_step - 1)
            summary = step.text()
            goal = s.goal or s.task.submission.goal
            messages = [{"role": "user", "content": resumed_goal(goal, summary)}] if summary else s.messages
            finish, result, error = None, None, None
        else:
            step = LLMStep(**dict(answered), cleared_before=self.requests.context(s)[1])
            messages, finish, result, error = self._turn_outcome(s, step, max_out)
        if held is not None and held.until is not None and time.time() > held.until:
            log.warning("task %s: call answered after its hold's deadline; raise AGENTQ_MAX_CALL_SECONDS", s.task_id)
        try:
            s.held.check()  # the heartbeat may have learned first that the lease is lost
            try:
                record = self.writer.commit(s, step, settle=settle, finish=finish, result=result, error=error)
            except ConversationMoved as moved:
                if moved.interrupt_at is not None:
                    raise
                s.inbox = dataclasses.replace(s.inbox, received=moved.received)
                # A message came in while the model answered: the answer is a turn, not the end.
                finish, result, error = None, None, None
                record = self.writer.commit(s, step, settle=settle)
        except ConversationMoved as moved:
            # Interrupted: the answer is discarded, and paid for, as a lost lease's would be.
            s.inbox = dataclasses.replace(s.inbox, received=moved.received, interrupt_at=moved.interrupt_at)
            self._discard(s, step, settle, window, response, cost, reason="interrupted")
            log.info("task %s: answer of step %d discarded (interrupted)", s.task_id, s.next_step)
            return None
        except LeaseLost:
            # The provider answered, so the tokens are spent whoever owns the task now, and
            # whoever learned of the lost lease: the ledger gets them once, as an orphan.
            self._discard(s, step, settle, window, response, cost, reason="lease_lost")
            raise
        if window is not None:
            self.windows.settle(window, response.usage.total, micros(cost))
        self.writer.committed(s, record, messages)
        update: dict[str, Any] = {"inflight": None, "batch": None, **({"status": finish} if finish else {})}
        if compact:
            update["compacted_at"] = record.number
        s.task = s.task.model_copy(update=update)
        crash_point("after_compaction" if compact else "after_llm_commit")
        if finish:
            return RunResult(s.task_id, "finished", status=finish)
        return None

    def _discard(
        self,
        s: Session,
        step: LLMStep | CompactStep,
        settle: BudgetDelta,
        window: Any,
        response: LLMResponse,
        cost: Decimal,
        *,
        reason: OrphanReason,
    ) -> None:
        """An answer that will not be committed: its usage is settled once, with the hold, and
        the call stays in the trace as an orphan, with why (``reason``)."""  # fmt: skip
        self.budgets.settle_orphan(
            s.task_id, s.task.budget_id, settle, inflight_epoch=s.lease.epoch, parent_id=s.task.parent_id
        )
        self.steps.record_orphan(s.lease, s.next_step, step, reason=reason)
        if window is not None:
            self.windows.settle(window, response.usage.total, micros(cost))
        s.task = s.task.model_copy(update={"inflight": None, "batch": None})

    def _turn_outcome(
        self, s: Session, step: LLMStep, max_out: int
    ) -> tuple[list[dict[str, Any]], TaskStatus | None, str | None, dict[str, Any] | None]:
        """The conversation after an agent turn, and whether (and how) the turn ends the task."""
        messages = [*s.messages, {"role": "assistant", "content": step.content}]
        finish, error = turn_end(step, max_out, shrunk=max_out < s.task.submission.constraints.max_output_tokens)
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

    def _key(self, s: Session) -> str:
        """The flow-control key of the call in progress: the model it goes to."""
        choice = s.model_choice
        sub = s.task.submission
        return flow_key(choice.provider, choice.model) if choice else flow_key(sub.provider, sub.model)

    def _cost(self, provider: str, answered: str, asked: str, response: LLMResponse) -> Decimal:
        """The call's cost, priced by the model that answered, else by the one asked for (a
        submission names a priced model: ``check_submission``). Never $0 without a word."""
        for model in (answered, asked):
            if self.prices.price_for(model) is not None:
                return self.prices.cost(model, response.usage)
        if provider != "scripted":
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
        observe.otel.event("agentq.retry", {"agentq.attempt": notice.attempt, "agentq.max_attempts": notice.max_attempts,
                                            "error.type": notice.code, "agentq.message": notice.message[:500],
                                            "agentq.next_try_seconds": notice.delay})  # fmt: skip
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
        if not notice.unbilled:
            s.call_may_be_billed = True
        s.next_attempt_at = now + notice.delay
        if notice.status_code == 429 and s.admission is not None:  # the whole fleet slows down, not only this call
            self.flow.slow_down(self._key(s), notice.delay)
        try:
            self.tasks.record_retry(s.task_id, state, lease=s.lease)
            if s.call_may_be_billed and not self._rehold(s):
                raise NoHoldForRetry(notice)
            self.holds.cover(s, now + notice.delay)  # the next attempt is a call of its own
        except LeaseLost:
            # Lost: no further attempt starts, so none can be answered past its hold's deadline.
            s.held.lost.set()
            raise
        except NoHoldForRetry:
            raise
        except Exception:
            log.warning("could not record the retry of task %s", s.task_id, exc_info=True)


def finish_without_step(
    tasks: TaskLeases, holds: BudgetHolds, s: Session, status: TaskStatus, *, note: str = "", release: bool = True
) -> RunResult:
    """End the task before its next call (a cap, the timeout), or with its call cut: the hold
    goes back (``release=False``: the cut counted it as spent), the status and the partial
    result are written under the lease. ``note`` is added to the error's message."""
    if release:
        holds.release(s)
    error = stop_error(s, status)
    if note:
        error = {**error, "message": error["message"] + note}
    tasks.transition(s.task_id, status, lease=s.lease, result=final_text(s.messages), error=error)
    s.task = s.task.model_copy(update={"status": status, **({} if release else {"inflight": None})})
    return RunResult(s.task_id, "finished", status=status, error=error)


def turn_end(step: LLMStep, max_out: int, *, shrunk: bool) -> tuple[TaskStatus | None, dict[str, Any] | None]:
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


def batch_poll_seconds(batch: dict[str, Any]) -> float:
    """When to look at a batch again: soon at first, then a quarter of its age (most end
    within minutes; none lasts past 24 hours), between ``AGENTQ_BATCH_POLL_SECONDS`` (30) and
    SQS's longest delay."""
    floor = float(os.environ.get("AGENTQ_BATCH_POLL_SECONDS", "30"))
    return min(900.0, max(floor, (time.time() - float(batch["submitted_at"])) / 4))
