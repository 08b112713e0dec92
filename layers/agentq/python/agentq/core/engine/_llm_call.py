"""The LLM call on the wire: its attempts and their holds, the streamed text and usage it
reports, the fallback that takes it after an outage, and how it ends when it does not answer
(cut at the task's timeout, failed after its retries). What may have been billed stays counted
(ARCHITECTURE 4).

A ``Call`` is one call's own state, made by the turn and gone with it: what it sends, what it
holds, the model it goes to, and what its attempts told so far. The run's ``Session`` keeps the
conversation and the hold on META (``Task.inflight``); a call's attempts are nothing to the
next call, so they live here, not there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentq import observe
from agentq.core.engine._caps import CallWindows
from agentq.core.engine._cut import CutCall, call_until, settle_late
from agentq.core.engine._finish import finish_without_step
from agentq.core.engine._holds import MIN_OUTPUT_TOKENS, BudgetHolds
from agentq.core.engine._input_count import allowance, refit, resized
from agentq.core.engine._llm_route import ModelRouter, Route
from agentq.core.engine._policy import PolicyGate, refuse_model_call
from agentq.core.engine._session import LeaseState, Session
from agentq.core.engine._stops import timeout_at
from agentq.core.engine.conversation import final_text
from agentq.core.engine.result import RunResult
from agentq.core.errors import CallCut, LeaseLost, ProviderError
from agentq.core.models import LLMStep, RetryState, TaskStatus, TaskSubmission, Usage
from agentq.core.policies import Verdict
from agentq.core.ports import BudgetLedger, FlowPort, StepLog, TaskLeases
from agentq.core.pricing import PriceTable, dollars, micros
from agentq.core.providers import LLMRequest, LLMResponse, ProviderFactory
from agentq.core.providers.base import (
    RemoteProvider,
    RetryNotice,
    StreamingProvider,
    reporting_retries,
    reporting_text,
    reporting_usage,
)
from agentq.core.reservation import Reservation, Seen

log = logging.getLogger("agentq.engine")


@dataclass
class Call:
    """One model call of an LLM turn, from its hold to its answer or its end."""

    request: LLMRequest  # as built for the task's own model (``asked``: as its model gets it)
    max_out: int  # its output allowance (shrunk to what is left near the cap)
    reserved: int  # the tokens its hold holds
    compact: bool  # a compaction: its answer summarises the conversation
    window: Any  # its hold on the tenant's hour and the scopes' caps (a ``CallHold``; None: nothing caps it)
    route: Route = field(default_factory=Route)  # the model it goes to (a fallback replaces it)
    started: float = 0.0  # when it went out (a batch: when it was submitted)
    # An attempt may have been billed (reported by its retries); False while every attempt
    # failed unbilled: then a lease lost mid-call gives the hold back.
    may_be_billed: bool = False
    # When its next attempt starts (a retry's wait ends): a cut before it finds no attempt on
    # the wire, so a hold whose attempts were all unbilled goes back.
    next_attempt_at: float | None = None
    # The call runs on a thread of its own (``call_until``), whose retries change the hold and the
    # windows' (``note_retry``, ``rehold``) while the run may cut the call at the task's timeout
    # (``cut``), which reads and settles them: one at a time, and none of the retry's after the cut.
    lock: threading.Lock = field(default_factory=threading.Lock)
    cut_off: bool = False
    # The batch whose answer it reads, when ``window`` is the hold that batch's park recorded:
    # the commit of the answer settles it; anyone else only once they took it (``settling``).
    batch: str | None = None
    # Under a hold the cap shrank: the input its allowance was sized on (the estimate, or its
    # provider's count); a fallback's model counts it again (``_input_count.refit``).
    sized: int | None = None

    @property
    def asked(self) -> LLMRequest:
        """The request as the model it goes to gets it."""
        return self.route.asked(self.request)


def waited_on(s: Session) -> dict[str, Any] | None:
    """The batch the task waits on for its next turn (its answer is read, not sent anew), if any."""
    batch = s.task.batch
    return batch if batch is not None and int(batch["step"]) == s.next_step else None


def settling(tasks: TaskLeases, s: Session, call: Call) -> Any:
    """The windows' hold this run may settle for ``call`` other than by committing its answer
    (it failed, or its answer is discarded): its own, or a batch's recorded hold once this run
    took its settling (``TaskLeases.take_batch_hold``), so it is settled once whoever meets
    the batch's outcome; None when another took it."""
    if call.window is None or call.batch is None:
        return call.window
    return call.window if tasks.take_batch_hold(s.lease, call.batch) else None


class NoHoldForRetry(ProviderError):
    """A failed attempt that may have been billed used up its hold, and the budget cannot cover
    another: the call stops retrying and fails with that attempt's error (``ModelCall.rehold``)."""

    def __init__(self, notice: RetryNotice) -> None:
        super().__init__(
            f"{notice.message}; no budget left for another attempt after one that may have been billed",
            retryable=True, status_code=notice.status_code, attempts=notice.attempt, code=notice.code,
        )  # fmt: skip


def task_models(sub: TaskSubmission) -> list[str]:
    """The models a task names: its own and its fallbacks' (any of them may answer its calls)."""
    return [sub.model, *(f.model for f in sub.fallbacks)]


def call_cost(
    prices: PriceTable, provider: str, answered: str, asked: str, response: LLMResponse,
    *, named: Sequence[str] = (), hold_usd: Decimal | None = None, task_id: str = "",
) -> Decimal:  # fmt: skip
    """The call's cost. Priced by the model that answered when it is the one asked (or a dated
    id of it) or another the task named (``named``: its fallbacks, whose hold is sized on the
    dearest of them, so it covers whichever answers); else by the one asked for (a submission
    names a priced model: ``check_submission``). Never $0 without a word.

    A reply naming a model the task never named (a gateway or router answering in another
    model than asked) may be billed at either model's price: it is charged the dearer of the
    two, whole, so the ledger never says less than may have been billed (a settlement is never
    clamped: ARCHITECTURE 4). Its hold was sized on the models the task named, so the dearer
    price may pass ``hold_usd``, the money that hold took (before a batch's discount), and
    ``usd_used`` then passes ``usd_cap`` by the difference, as a request denser than its
    estimate does: the task's next hold is refused. A warning and a span event name both models
    and what was charged past the hold. Before, it was priced as the model the reply named
    without a word, and a cheaper one named was charged less than the model asked."""
    usage = response.usage
    if any(prices.same_model(answered, model) for model in (asked, *named)) and prices.price_for(answered):
        return prices.cost(answered, usage)
    priced = [prices.cost(model, usage) for model in (answered, asked) if prices.price_for(model) is not None]
    if not priced:
        if provider != "scripted":
            log.warning("no price for model %r (nor %r): this call is recorded at $0; add it to AGENTQ_PRICES",
                        answered, asked)  # fmt: skip
        return Decimal(0)
    cost = max(priced)
    if prices.same_model(answered, asked):
        return cost  # an unpriced spelling of the model asked: its price
    past = cost - hold_usd if hold_usd is not None and cost > hold_usd else Decimal(0)
    beyond = f", ${past} of it past the call's hold: used may pass the cap by that" if past else ""
    log.warning("task %s: the call for %r was answered by %r, a model the task did not name: charged $%s, "
                "the dearer of the two models' prices%s", task_id, asked, answered, cost, beyond)  # fmt: skip
    observe.otel.event("agentq.model_substituted", {"agentq.asked_model": asked, "agentq.answered_model": answered,
                                                    "agentq.cost_usd": str(cost), "agentq.past_hold_usd": str(past)})  # fmt: skip
    return cost


class ModelCall:
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
        router: ModelRouter,
        policy: PolicyGate | None = None,
    ) -> None:
        self.tasks, self.steps, self.budgets, self.flow = tasks, steps, budgets, flow
        self.windows, self.providers, self.prices = windows, providers, prices
        self.holds, self.router, self.policy = holds, router, policy

    def make(self, s: Session, call: Call, demand: tuple[int, int]) -> LLMResponse | RunResult:
        """The model's answer to ``call``, through its attempts and its fallbacks (each asked for
        ``demand``: the input estimate, the whole hold); or how the run ends instead (the call
        cut at the task's timeout, failed after its retries). ``LeaseLost`` when a fenced write
        learnt of it, the hold given back first when no attempt can have been billed."""
        try:
            self.holds.cover(s, time.time())
        except LeaseLost:
            # Nothing went on the wire, so no call can be charged: the hold goes back now (from
            # wherever a successor set it aside), not at its deadline.
            self.unspent(s, call)
            raise
        call.started = time.time()
        while True:
            try:
                return self.call(s, call)
            except CallCut as cut:
                return self.cut(s, call, cut)
            except LeaseLost:
                # Learnt between attempts (``note_retry``), after the last one failed. When
                # every attempt failed unbilled (an error status, no connection), the call
                # cannot be charged: its hold goes back now, from wherever a successor put it
                # (set aside, or already counted as spent), not kept as an unknown.
                if not call.may_be_billed:
                    self.unspent(s, call)
                raise
            except ProviderError as exc:
                # The failed model's last attempt was not reported as a retry: the error says
                # whether it may have been billed (the earlier ones were told by their notices).
                call.may_be_billed = call.may_be_billed or exc.maybe_billed
                if s.task.inflight is None:  # no hold for another try
                    return self.failed(s, call, exc)
                ended = self.fall_back(s, call, exc, demand)
                if ended is not None:
                    return ended

    def fall_back(self, s: Session, call: Call, exc: ProviderError, demand: tuple[int, int]) -> RunResult | None:
        """The failed call goes to the next of the task's models (``ModelRouter.fall_over``), under
        a hold of its own when an attempt may have been billed (``rehold``); None when it goes
        there, else how the run ends: no fallback, one a rule denies, one the budget or a window
        cannot hold for, or one a shrunk hold leaves no answer once its provider counted the input
        (``refit``) (nothing is sent to it, its admission goes back, and the failed model's
        failure was told to the fleet by ``fall_over``). A lease lost before its call starts gives
        back what was held for that call, never sent (as ``make`` does), and its admission."""
        route = self.router.fall_over(s.task, s.steps, call.route, exc, demand)
        if route is None:
            return self.failed(s, call, exc)
        refused = self.vetted(s, route)
        if refused is not None:
            return self.failed(s, call, exc, refused)
        try:
            if (call.sized is not None and not self.refit(s, call, route)) or (
                call.may_be_billed and not self.rehold(s, call)
            ):
                self.router.give_back(s.task.submission, route)
                return self.failed(s, call, exc, told_fleet=True)
            call.route = route
            self.holds.cover(s, time.time())  # the next model's call is an attempt of its own
        except LeaseLost:
            self.router.give_back(s.task.submission, route)
            self.unspent(s, call)  # a possibly billed attempt's hold is spent already (``rehold``)
            raise
        return None

    def refit(self, s: Session, call: Call, route: Route) -> bool:
        """A call under a shrunk hold goes to ``route``'s model sized on its input as that model's
        provider counts it, where it can (another tokenizer may count more: ``_input_count``);
        False when what the hold leaves it is below the shortest answer, or the count fails."""
        assert call.sized is not None
        try:
            sized = refit(self.providers, s, route.submission(s.task.submission), route.asked(call.request), call.sized)
        except ProviderError as exc:
            log.warning("task %s: the fallback's count of the call's input failed (%s): not sent", s.task_id, exc.code)
            return False
        max_out = allowance(self.holds.requests, s, call.reserved, sized)
        if max_out < MIN_OUTPUT_TOKENS:
            return False
        call.request, call.max_out, call.sized = resized(call.request, max_out), max_out, sized
        return True

    def vetted(self, s: Session, route: Route) -> Verdict | None:
        """The fallback that is to take the call makes a model call of its own: checked as the
        first model's was (``PolicyGate.model_verdict``), with the call's hold as its estimate.
        None: it goes. Else the rule's verdict: nothing is sent to it (its admission goes back),
        the failed model's attempts are accounted as any failed call's are, and the task ends
        ``failed`` naming the rule (``failed(refused=)``), as when the first model is denied."""
        if self.policy is None:
            return None
        held, sub = s.task.inflight, s.task.submission
        verdict = self.policy.model_verdict(s, route.model(sub), (held.amount, held.micros) if held else (0, 0))
        if verdict.effect == "allow":
            return None
        self.router.give_back(sub, route)
        return verdict

    def rehold(self, s: Session, call: Call) -> bool:
        """An attempt that may have been billed failed, and another is to follow (a retry, or a
        fallback's call): the failed one's hold is counted as spent, its outcome unknown, and
        the next attempt gets a hold of its own, so what the provider may bill never passes the
        cap (ARCHITECTURE 4). The new hold is the spent one's size, never less: the request on
        the wire asks for as much output as before, and the answer settles against it. The
        windows that cap the call (the tenant's hour, the scopes' caps) keep the failed attempt's
        hold as spent too, and are held on anew for the next. False when the budget or a window
        cannot cover it: no further attempt, nothing held for it."""
        spent = self.holds.spend(s, reportable=False)
        s.held.seen = None  # what that attempt billed went with its hold
        call.may_be_billed = False  # the spent hold answers for that attempt; this one's are to come
        if call.window is not None:
            self.windows.spend(call.window)
            call.window = None
        if spent is None or not self.holds.hold_again(s, spent.amount):
            return False
        held = s.task.inflight
        fits, call.window = self.windows.try_take(s, held.amount, held.micros) if held else (False, None)
        if not fits:
            self.holds.release(s)
            return False
        s.sent_hold_step = s.next_step  # its attempt goes out at once: never "unsent"
        return True

    def unspent(self, s: Session, call: Call, *, forget_batch: bool = False) -> None:
        """The call's hold goes back, with the tenant window's hold for it: this run knows the call
        uncharged (nothing sent, or every attempt unbilled). ``forget_batch``: see ``failed``."""
        self.holds.release(s, forget_batch=forget_batch)
        if call.window is not None:
            self.windows.settle(call.window, 0)

    def call(self, s: Session, call: Call) -> LLMResponse:
        """The model's answer; ``CallCut`` when the task's timeout passes first (``cut``)."""
        request = call.asked
        sub = call.route.submission(s.task.submission)
        provider = self.providers(sub)  # may fail too (a key it cannot read)
        cut = CutCall(s.task_id, s.task.budget_id, s.task.parent_id, s.lease, s.next_step, s.task.inflight)
        started = call.started
        with (
            observe.llm_call(
                provider=provider.name, model=request.model, max_tokens=call.max_out, task_id=s.task_id,
                step=s.next_step, endpoint=provider.endpoint if isinstance(provider, RemoteProvider) else None,
                streams=isinstance(provider, StreamingProvider) and provider.streams(request),
            ) as observed,
            reporting_retries(lambda notice: self.note_retry(s, call, notice)),
            reporting_text(lambda text: setattr(s.held, "live_text", text)),
            # The hold as it is when the usage is told: a retry's may have replaced the first.
            reporting_usage(lambda usage: self.saw(s.held, s.task.inflight, request.model, usage)),
        ):  # fmt: skip
            try:
                response = call_until(
                    timeout_at(s),
                    lambda: provider.complete(request),
                    lambda late: self.late(cut, request, late, started, sub),
                )
            finally:
                s.held.live_text = None
            observed.answered(response)
        s.held.seen = None  # the step carries its usage now
        return response

    def saw(self, held: LeaseState, hold: Reservation | None, model: str, usage: Usage) -> None:
        """A streamed call's usage so far, under the hold it is made under: the heartbeat
        publishes it, so a hold counted as spent leaves only the rest unknown (``Seen``)."""
        if hold is None:
            return
        price = self.prices.price_for(model)
        cost = micros(price.cost(usage)) if price else 0
        held.seen = Seen(hold.epoch, hold.step, hold.until, usage.input_total, usage.output_tokens, cost)

    def cut(self, s: Session, call: Call, cut: CallCut) -> RunResult:
        """The task's timeout passed with the call in flight: the call is cut (``_cut``), the
        hold counted as spent, since whether the provider answered and billed it is unknown (an
        answer that still comes corrects it: ``late``), and the task ends ``timed_out`` now. A
        call the deadline stopped before it started gives its hold back."""
        with call.lock:  # a retry being noted on the call's thread changes the holds first, then sees the cut
            call.cut_off = True
            return self._cut(s, call, cut)

    def _cut(self, s: Session, call: Call, cut: CallCut) -> RunResult:
        window = call.window
        between_attempts = call.next_attempt_at is not None and timeout_at(s) < call.next_attempt_at
        if not cut.sent or (between_attempts and not call.may_be_billed):
            # Nothing on the wire that this hold answers for: the call never started, or it was
            # cut in a retry's wait after attempts that were all unbilled (or spent: ``rehold``).
            if window is not None:
                self.windows.settle(window, 0)
            return finish_without_step(self.tasks, self.holds, s, TaskStatus.TIMED_OUT)
        held = self.holds.spend(s)
        if window is not None:  # the tenant's hour and the scopes' caps keep the hold, as the budget does
            self.windows.spend(window)
        note = (
            f"; the model call in flight was cut and its hold of {held.amount} tokens counted as spent" if held else ""
        )
        log.info("task %s: timed out with the call of step %d in flight%s", s.task_id, s.next_step, note)
        # Not released after: the cut call's thread may still be reporting a retry, and its
        # write of the session would bring the spent hold back into it.
        return finish_without_step(self.tasks, self.holds, s, TaskStatus.TIMED_OUT, note=note, release=False)

    def late(
        self, cut: CutCall, request: LLMRequest, response: LLMResponse, started: float, sub: TaskSubmission
    ) -> None:
        """The answer of a call cut at the task's timeout, come after all: charged as an orphan."""
        provider, model = sub.provider, response.model or request.model
        hold_usd = dollars(cut.hold.micros) if cut.hold else None  # what its hold took
        cost = call_cost(self.prices, provider, model, request.model, response, named=task_models(sub), hold_usd=hold_usd,
                         task_id=cut.task_id)  # fmt: skip
        step = LLMStep(
            content=response.content,
            stop_reason=response.stop_reason,
            model=model,
            usage=response.usage,
            cost_usd=cost,
            reserved_tokens=cut.hold.amount if cut.hold else 0,
            attempts=response.attempts,
            started_at=started,
            duration_ms=int((time.time() - started) * 1000),
            provider=provider,
        )
        settle_late(self.budgets, self.steps, cut, step)

    def failed(
        self, s: Session, call: Call, exc: ProviderError, refused: Verdict | None = None, *, told_fleet: bool = False
    ) -> RunResult:
        """The provider failed the call (its retries spent); the task is tried again later, or
        fails now when no retry can help. The hold goes back when no attempt can have been
        billed; when one may have been (``Call.may_be_billed``), it is counted as spent, as the
        unknown it is (ARCHITECTURE 4), not returned on a guess. ``told_fleet``: the failure was
        counted toward the model's circuit already (``ModelRouter.fall_over``).

        A batch whose read failed is forgotten in the write that settles its hold: its outcome
        (errored, expired, lost by the API) is all it will ever say, so a later run (a retry, a
        redrive) sends the turn anew rather than read it again and count its hold a second time."""
        window = call.window = settling(self.tasks, s, call)
        read = waited_on(s) is not None
        if call.may_be_billed:
            held = self.holds.spend(s, reportable=False, forget_batch=read)
            if window is not None:  # the tenant's hour and the scopes' caps keep it too, as the budget does
                self.windows.spend(window)
            if held is not None:
                log.info("task %s: call of step %d failed after an attempt that may have been billed; its hold "
                         "of %d tokens counted as unknown", s.task_id, s.next_step, held.amount)  # fmt: skip
        else:
            self.unspent(s, call, forget_batch=read)
        if refused is not None:  # the fallback is denied: the fleet heard of the failure (``fall_over``)
            model = f"{call.route.provider(s.task.submission)}/{call.route.model(s.task.submission)}"
            what = f"the fallback's model call (after {model} failed: {exc.code})"
            return refuse_model_call(self.tasks, self.holds, s, refused, what=what)
        error: dict[str, Any] = {
            "code": exc.code,
            "message": exc.message,
            "status_code": exc.status_code,
            "attempts": exc.attempts,
        }
        admission = call.route.admission
        if (
            exc.retryable and admission is not None and not told_fleet
        ):  # an outage or an overload: the fleet learns of it
            key = call.route.key(s.task.submission)
            if exc.status_code == 429 and exc.retry_after:
                self.flow.slow_down(key, exc.retry_after)
            if self.flow.failed(key, admission):
                # Open: the task waits for the circuit, not for the DLQ.
                self.tasks.release(s.lease, forget_batch=s.task.batch is not None)
                wait = self.flow.cooldown_seconds
                return RunResult(s.task_id, "deferred", error={**error, "code": "circuit_open", "retry_after": wait})
        if exc.retryable:
            self.tasks.release(s.lease, forget_batch=s.task.batch is not None)
            return RunResult(s.task_id, "retry", error=error)
        self.tasks.transition(s.task_id, TaskStatus.FAILED, lease=s.lease, result=final_text(s.messages), error=error)
        return RunResult(s.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def note_retry(self, s: Session, call: Call, notice: RetryNotice) -> None:
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
        if notice.status_code == 429 and call.route.admission is not None:  # the whole fleet slows, not only this call
            self.flow.slow_down(call.route.key(s.task.submission), notice.delay)
        with call.lock:  # the cut, on the run's thread, reads and settles what this changes
            if call.cut_off:  # the task's timeout cut the call: its hold is the cut's to count; no attempt follows
                return
            if not notice.unbilled:
                call.may_be_billed = True
            call.next_attempt_at = now + notice.delay
            try:
                self.tasks.record_retry(s.task_id, state, lease=s.lease)
                if call.may_be_billed and not self.rehold(s, call):
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
