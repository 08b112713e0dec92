"""Budget holds: tokens and dollars held on the root budget before each LLM call.

Invariant (ARCHITECTURE 4, ``used <= cap``): a call starts only under a hold that covers the
most it can use and cost; the hold is settled at what the call used in the step's commit, or
returned, exactly once (``EngineStorage.settle_orphan``'s ticket condition). A hold has a
deadline: its call starts within ``CALL_START_SLACK_SECONDS`` and lasts at most the maximum
call time, so a hold left by a worker that lost its lease stays counted (set aside as lapsed)
until its call can no longer complete. Then it is counted as spent, never returned: the
provider may have answered a paused worker that reports the answer later (then the ledger is
corrected to the real usage). Only a hold its own run knows unspent goes back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from agentq.core.engine._input_count import InputCount
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session, Shortfall
from agentq.core.engine._spent import LapsedHolds, count_as_spent, forgetting, spend_lapsed
from agentq.core.engine.config import EngineConfig
from agentq.core.errors import BudgetExceeded
from agentq.core.models import Task
from agentq.core.ports import BudgetLedger, TaskLeases
from agentq.core.pricing import ModelPrice, PriceTable
from agentq.core.providers.base import BATCH_PRICE_RATIO, BATCH_WINDOW_SECONDS
from agentq.core.records import NO_USAGE, BudgetDelta, BudgetState
from agentq.core.reservation import Reservation

log = logging.getLogger("agentq.engine")

# A call must start within this many seconds of its hold's reservation, or the hold's deadline
# is moved first (a fenced write): the deadline is reservation + this + the maximum call time.
CALL_START_SLACK_SECONDS = 2.0
MIN_OUTPUT_TOKENS = 16


class HoldsInFlight(Exception):
    """The budget cannot cover the next call while an older epoch's call may still be charged:
    the task waits ``wait`` seconds for that hold's deadline instead of overshooting the cap."""

    code = "call_in_flight"

    def __init__(self, wait: float, message: str | None = None) -> None:
        super().__init__(message or f"a lost lease's call may complete within {wait:.1f}s")
        self.wait = wait


class UnknownUsage(HoldsInFlight):
    """The budget cannot cover the next call only because of calls whose outcomes are unknown
    (their holds counted as spent: ``BudgetState.unknown``). Those calls may never have been
    billed, so the task is not ``cost_exceeded``: it waits, and looks again every ``wait``
    seconds, for a worker to report them (the ledger is corrected, the budget freed) or for a
    raise of the cap (ARCHITECTURE 4). Its timeout still ends it."""

    code = "unknown_usage"

    def __init__(self, wait: float, unknown: int, unknown_micros: int) -> None:
        money = f" and ${unknown_micros / 1_000_000:.6f}" if unknown_micros else ""
        super().__init__(
            wait,
            f"the budget is reached only by calls whose outcome no worker learned ({unknown} tokens{money} counted "
            f"at their holds); waiting for them to be reported, or for a raise (add_tokens/add_usd); next look in "
            f"{wait:.0f}s",
        )
        self.unknown, self.unknown_micros = unknown, unknown_micros


def call_micros(price: ModelPrice | None, est_in: int, amount: int) -> int:
    """The money a hold of ``amount`` tokens (``est_in`` of them input) holds at ``price``."""
    return price.hold_micros(min(est_in, amount), amount - min(est_in, amount)) if price else 0


class BudgetHolds:
    def __init__(
        self,
        budgets: BudgetLedger,
        tasks: TaskLeases,
        prices: PriceTable,
        config: EngineConfig,
        requests: RequestBuilder,
    ) -> None:
        self.budgets = budgets
        self.tasks = tasks
        self.prices = prices
        self.config = config
        self.requests = requests

    # ------------------------------------------------------------- lapsed holds

    def spend_lapsed(self, task: Task) -> LapsedHolds:
        """Count as spent the holds older epochs left on ``task`` whose calls can no longer
        complete: whether they were answered is unknown here (see the module)."""
        return spend_lapsed(self.budgets, task)

    def take_over(self, s: Session) -> None:
        """At claim: the holds left by older epochs. Those whose calls are over are counted as
        spent; the current hold of an older epoch is adopted (a batch this run settles), set
        aside as lapsed while its call may still complete, or counted as spent.

        An older epoch's worker may be paused, not dead, with its call in flight: until the
        hold's deadline that call can still complete and be charged (by that worker, as an
        orphan), so a live hold stays counted, set aside as lapsed, and this run reserves on
        top of it when the budget covers both (``reserve`` waits for it only when it does
        not). After the deadline the call can no longer complete, but whether the provider
        answered is unknown until that worker reports it (if ever): the hold is counted as
        spent, and corrected to the real usage when the call is reported (``settle_orphan``).
        """
        now = time.time()
        # The holds spent here are gone: the run's end (``lapsed_until``) names only the rest.
        task = s.task = s.task.model_copy(update={"lapsed_holds": self.spend_lapsed(s.task).kept})
        current, batch = task.inflight, task.batch
        if current and batch and current.epoch == int(batch["epoch"]) != s.lease.epoch:
            # The hold of the batched call this task waited on: its result is settled by this run.
            # The batch is this run's now too: a run that finds it still running parks with it
            # again, and the next claim must adopt the hold again, not take it for a lost worker's.
            self.budgets.adopt(s.lease, current, batch)
            s.sent_hold_step = current.step  # its batch went out: never "unsent"
            s.task = task.model_copy(
                update={"inflight": current.moved_to(epoch=s.lease.epoch), "batch": {**batch, "epoch": s.lease.epoch}}
            )
        elif current and current.epoch != s.lease.epoch:
            if not current.lapsed_by(now):
                current = current.with_seen(task.seen)  # what its call billed, kept with it
                self.budgets.set_aside(s.lease, current)
                log.info(
                    "task %s: epoch %s's call may complete until %.3f; its hold stays counted",
                    task.task_id, current.epoch, current.until,
                )  # fmt: skip
                lapsed = {**task.lapsed_holds, current.epoch: current}
                s.task = task.model_copy(update={"inflight": None, "lapsed_holds": lapsed})
            else:
                self._spend(task, current.with_seen(task.seen))
                s.task = task.model_copy(update={"inflight": None})

    # ------------------------------------------------------------ current hold

    def release(self, s: Session, *, forget_batch: bool = False) -> None:
        """Return the held reservation, exactly once (see ``EngineStorage.settle_orphan``).
        ``forget_batch``: it is the hold of the batch this run read, known unbilled, whose
        answer will not come: the batch's record goes with it."""
        held = s.task.inflight
        if held:
            self.budgets.settle_orphan(
                s.task_id,
                s.task.budget_id,
                BudgetDelta(
                    reserved=held.amount,
                    used=0,
                    cost_usd=NO_USAGE.cost_usd,
                    tokens_in=0,
                    tokens_out=0,
                    reserved_micros=held.micros,
                ),
                inflight_epoch=held.epoch,
                parent_id=s.task.parent_id,
                **forgetting(forget_batch),
            )
            s.task = s.task.model_copy(update={"inflight": None, **({"batch": None} if forget_batch else {})})

    def release_unsent(self, s: Session) -> None:
        """The lease is lost: give back this run's hold if its call never went out (one reserved
        at a tools commit, or before a call that had not started: ``Session.sent_hold_step``), since
        nothing can be charged for it. A hold whose call was sent stays as it is: its outcome
        may be unknown, and a zombie that learns it settles it (``settle_orphan``)."""
        held = s.task.inflight
        if held and held.epoch == s.lease.epoch and held.step != s.sent_hold_step:
            self.release(s)

    def spend(self, s: Session, *, reportable: bool = True, forget_batch: bool = False) -> Reservation | None:
        """Count the held reservation as spent, once: its call was cut in flight (the task's
        timeout) with its outcome unknown, as a call whose hold outlived its deadline
        (``spend_lapsed``): the provider may have answered, and billed, what this run stopped
        waiting for. An answer that still comes corrects it (``settle_orphan``, through the
        ``spent_<epoch>`` ticket). ``reportable=False``: its attempt failed and no answer can
        come (a retry follows, or the call gave up): no ticket is left, so none can be matched,
        later in the epoch, by the settlement of another hold. ``forget_batch``: it is the hold
        of the batch this run read and could not (lost by the API): the batch's record goes in
        the same write, so no later run (a redrive) reads it again and counts it twice."""
        held = s.task.inflight
        if held:
            # its stream's note: this run's
            self._spend(s.task, held.with_seen(s.held.seen), ticket=reportable, forget_batch=forget_batch)
            s.task = s.task.model_copy(update={"inflight": None, **({"batch": None} if forget_batch else {})})
        return held

    def spend_recorded(self, task: Task, held: Reservation) -> None:
        """Count as spent an older epoch's hold whose call its step records as possibly billed
        (a grade replayed: sent, then failed or abandoned), wherever its ticket is (current or
        set aside): the record's usage of nothing is no report of the call."""
        self._spend(task, held)

    def _spend(self, task: Task, held: Reservation, *, ticket: bool = True, forget_batch: bool = False) -> None:
        count_as_spent(self.budgets, task, held, ticket=ticket, forget_batch=forget_batch)

    def reserve(self, s: Session, count: InputCount | None = None) -> int | None:
        """Hold tokens for the next call; returns the amount, or None when the budget is spent.

        Tries the full estimate first; near the cap, shrinks the output allowance to what is
        left (a last, shorter answer) before giving up, sized on the input ``count`` says where
        it counts more than the estimate (``_input_count``). When it cannot, and an older epoch's
        call may still be charged, raises ``HoldsInFlight``: the task waits for that hold's
        deadline rather than overshoot the cap (its worker may report a usage below the hold
        meanwhile, and the difference comes back); past it the hold is counted as spent, and
        the hold tried again: a hold set aside at claim may lapse during the run, and when it
        alone stands in the way, now of unknown outcome, the task waits (``UnknownUsage``).
        """
        est_in, wanted = self.requests.wanted_reservation(s)
        kept = self._kept(s, wanted)
        if kept is not None:
            return kept.amount
        self.release(s)
        amount = self._try_hold(s, est_in, wanted, count)
        if amount is None:
            lapsed = self.spend_lapsed(self.tasks.get(s.task_id))
            if lapsed.live:  # a lost lease's call may still be charged: wait for it, never overshoot
                raise HoldsInFlight(min(lapsed.live))
            if lapsed.spent:
                # Holds whose deadline passed since the claim were just counted as spent: that
                # frees nothing, but they are unknown now, not held, and may alone stand in the
                # way (``_unless_only_unknown``, which the try above weighed them as held for).
                amount = self._try_hold(s, est_in, wanted, count)
        return amount

    def estimate(self, s: Session, demand: tuple[int, int]) -> tuple[int, int]:
        """The tokens and money the next call's hold holds, before ``reserve`` takes it: the
        hold this run already has for it when ``reserve`` keeps that one, else the full hold it
        tries first (``demand``: the input estimate and the whole reservation), at the price
        ``hold_micros`` sizes it on. What a policy rule reads as the call's estimate."""
        est_in, wanted = demand
        kept = self._kept(s, wanted)
        if kept is not None:
            return kept.amount, kept.micros
        return wanted, self.hold_micros(s, wanted, est_in)

    def least(self, s: Session, wanted: int) -> int:
        """The smallest hold the next call goes with (its whole hold is ``wanted``): all it may
        read, and the shortest answer. What it may read is the whole hold less the output
        allowance: its input, and when the server may compact first (``native`` compaction near
        the threshold) that compaction's own read and summary too, billed with the call. A
        compaction of our own is never shrunk: a summary cut short would stand for the history."""
        if self.requests.compacting(s):
            return wanted
        return min(wanted, wanted - self.requests.max_out(s) + MIN_OUTPUT_TOKENS)

    def _kept(self, s: Session, wanted: int) -> Reservation | None:
        """This run's hold, kept when it is the call's whole hold, or when its call already went
        out (a batch this run adopted: its request asked what that hold allows). A smaller one
        (a tools commit's, sized before a message made the request longer) goes back and the
        call holds afresh: its answer shrinks only when the budget refuses the whole hold."""
        held = s.task.inflight
        if held and held.epoch == s.lease.epoch and (held.amount >= wanted or held.step == s.sent_hold_step):
            return held
        return None

    def _try_hold(self, s: Session, est_in: int, wanted: int, count: InputCount | None = None) -> int | None:
        """The full estimate, else what is left (of tokens and of money) if it still allows a
        short answer, on the input ``count`` says where it is more than the estimate."""
        try:
            self._hold(s, wanted, est_in)
            return wanted
        except BudgetExceeded:
            state = self.budgets.get(s.task.budget_id)
            self._unless_only_unknown(s, state, est_in, wanted)
            amount, least = self._fit(s, state, est_in, wanted)
            sized = None
            if count is not None and least <= amount < wanted:  # shrunk: counted, asking the allowance it leaves
                sized = count.sized(amount - (wanted - self.requests.max_out(s)))
            if sized is not None and sized > est_in:  # a dense request: its output shrinks further
                est_in, wanted = self.requests.demand(s, sized)
                amount, least = self._fit(s, state, est_in, wanted)
            if amount < least:
                self._unless_only_unknown(s, state, est_in, least)
                self._refused(s, state, least, est_in, count)
                return None
            try:
                self._hold(s, amount, est_in)
                return amount
            except BudgetExceeded:  # another hold took what was left since the read: as it is now
                self._refused(s, None, least, est_in, count)
                return None

    def _refused(
        self, s: Session, state: BudgetState | None, least: int, est_in: int, count: InputCount | None
    ) -> None:
        """The refusal's figures on ``s`` (``Shortfall``), naming the input ``count`` counted."""
        short = self._shortfall(s, state, least, self.hold_micros(s, least, est_in))
        s.shortfall = dataclasses.replace(short, counted_input=count.counted if count is not None else None)

    def _fit(self, s: Session, state: BudgetState, est_in: int, wanted: int) -> tuple[int, int]:
        """The hold a call of ``est_in`` input gets of what ``state`` has left (tokens, money),
        at most its whole hold ``wanted``; and the least it goes with (``least``)."""
        affordable = est_in + self._affordable_output(s, est_in, state.available_micros)
        return min(wanted, state.available, affordable), self.least(s, wanted)

    def _shortfall(self, s: Session, state: BudgetState | None, tokens: int, micros: int) -> Shortfall:
        """A refused hold of ``tokens`` and ``micros`` against what the budget has left
        (``state``, or as read now)."""
        state = self.budgets.get(s.task.budget_id) if state is None else state
        return Shortfall(tokens, state.available, micros, state.available_micros)

    def _unless_only_unknown(self, s: Session, state: BudgetState, est_in: int, amount: int) -> None:
        """Raise ``UnknownUsage`` when a hold of ``amount`` would fit were the calls of unknown
        outcome known to be unbilled: they alone stand between the task and its next call."""
        self._unless_only_unknown_of(state, amount, self.hold_micros(s, amount, est_in))

    def _unless_only_unknown_of(self, state: BudgetState, amount: int, money: int) -> None:
        if not (state.unknown or state.unknown_micros):
            return
        fits_tokens = state.available + state.unknown >= amount
        fits_money = state.available_micros + state.unknown_micros >= money
        if fits_tokens and fits_money:
            raise UnknownUsage(self.config.unknown_recheck_seconds, state.unknown, state.unknown_micros)

    def hold_call(self, s: Session, est_in: int, amount: int, price: ModelPrice | None) -> bool:
        """A hold of exactly ``amount`` tokens (``est_in`` of them input) for a call that is not
        the agent's turn (the grading model's: ``_grade``), priced at ``price``; False when the
        budget cannot cover it (``s.shortfall`` says by how much). Never shrunk: the call's
        output allowance is its own. As ``reserve``: while an older epoch's call may still be
        charged, ``HoldsInFlight``; when only calls of unknown outcome stand in the way,
        ``UnknownUsage``."""
        money = call_micros(price, est_in, amount)
        until = time.time() + CALL_START_SLACK_SECONDS + self.config.max_call_seconds  # never batched
        for last in (False, True):
            try:
                self._hold(s, amount, est_in, money=money, until=until)
                return True
            except BudgetExceeded:
                state = self.budgets.get(s.task.budget_id)
                s.shortfall = self._shortfall(s, state, amount, money)
                self._unless_only_unknown_of(state, amount, money)
                if last:
                    return False
                lapsed = self.spend_lapsed(self.tasks.get(s.task_id))
                if lapsed.live:  # a lost lease's call may still be charged: wait for it, never overshoot
                    raise HoldsInFlight(min(lapsed.live)) from None
                if not lapsed.spent:
                    return False
        return False

    def hold_again(self, s: Session, amount: int) -> bool:
        """A hold of exactly ``amount`` for the call in progress (its next attempt, after one
        that may have been billed spent the last); False when the budget cannot cover it."""
        est_in, _ = self.requests.wanted_reservation(s)
        try:
            self._hold(s, amount, est_in)
        except BudgetExceeded:
            return False
        return True

    def _affordable_output(self, s: Session, est_in: int, available_micros: int) -> int:
        """The most output tokens a call of ``est_in`` input can be allowed on what is left of
        the money budget (negative: not even the input): exactly the most whose hold
        (``hold_micros``, which sizes the hold and a refusal's figures alike) fits, so a raise
        by a refusal's difference lets the call go."""
        price = self._price(s)
        if price is None or price.output_per_mtok <= 0:
            return 1 << 40
        if self.hold_micros(s, est_in, est_in) > available_micros:
            return -1

        def fits(out: int) -> bool:
            return self.hold_micros(s, est_in + out, est_in) <= available_micros

        scale = 2 if s.economy else 1  # a batched call costs half: twice the money goes as far
        out = max(0, int((available_micros * scale - price.hold_micros(est_in, 0)) / price.output_per_mtok))
        while out > 0 and not fits(out):
            out -= 1  # each part rounded up to the millionth: the estimate may be a token or two over
        while fits(out + 1):
            out += 1  # or under
        return out

    def _price(self, s: Session) -> ModelPrice | None:
        """The price a hold is sized on: the task's model's, or with fallbacks the dearest of
        its models' (any of them may answer the call the hold is for)."""
        sub = s.task.submission
        return self.prices.dearest([sub.model, *(f.model for f in sub.fallbacks)])

    def hold_micros(self, s: Session, amount: int, est_in: int) -> int:
        """The money a hold of ``amount`` tokens (``est_in`` of them input) takes: its call at
        the most it can cost."""
        price = self._price(s)
        if price is None:
            return 0
        est_in = min(est_in, amount)
        most = price.hold_micros(est_in, amount - est_in)
        return math.ceil(most * BATCH_PRICE_RATIO) if s.economy else most

    def _hold(
        self, s: Session, amount: int, est_in: int, *, money: int | None = None, until: float | None = None
    ) -> None:
        until = self.hold_until(s) if until is None else until
        money = self.hold_micros(s, amount, est_in) if money is None else money
        self.budgets.reserve(s.lease, s.task.budget_id, amount, s.next_step, until=until, micros=money)
        s.shortfall = None  # a refusal before it is not why anything ends now
        held = Reservation(amount=amount, epoch=s.lease.epoch, step=s.next_step, until=until, micros=money)
        s.task = s.task.model_copy(update={"inflight": held})

    def hold_until(self, s: Session) -> float:
        """The deadline of a hold taken now: its call starts within the slack, then runs at most
        the provider's maximum call time (a batched call: the batch's 24-hour window)."""
        window = BATCH_WINDOW_SECONDS if s.economy else 0.0
        return time.time() + CALL_START_SLACK_SECONDS + window + self.config.max_call_seconds

    def cover(self, s: Session, start: float) -> None:
        """Make sure the hold outlives an attempt starting at ``start``: if it started later
        than its reservation allowed for, move the deadline first (fenced: a zombie stops here)."""
        held = s.task.inflight
        if held and (held.until is None or start + self.config.max_call_seconds > held.until):
            new_until = start + CALL_START_SLACK_SECONDS + self.config.max_call_seconds
            self.budgets.extend_hold(
                s.lease, Reservation(held.amount, s.lease.epoch, held.step, micros=held.micros), new_until
            )
            s.task = s.task.model_copy(update={"inflight": held.moved_to(until=new_until)})

    def hand_back(self, s: Session) -> None:
        """The hold and the lease back: the run ends before its next call (a slice, a
        deferral), and both are known unspent, so neither waits for a deadline."""
        self.release(s)
        self.tasks.release(s.lease)

    def leave(self, s: Session) -> None:
        """The lease back after an error the run cannot go on from (the store failed a write:
        throttled past the retries, an outage; an error of no known kind from the call), and
        the hold given back only if its call never went out (``release_unsent``). A hold whose
        call was sent is not known unspent: the provider may have answered and billed it (an
        answer in hand was charged already: ``Answers.commit_failed``). Its call is over, so it
        is counted as spent now, its outcome unknown, its ticket kept for a report to correct
        it (a grade replayed from its record: ``spend``); a batch's stays as it is, for the
        next claim to adopt with the batch and read again. Where that write fails too (the
        store still down), the hold stays on META: the next claim sets it aside and counts it as
        spent at its deadline (``take_over``). Never returned."""
        try:
            self.give_up(s, keep_batch=True)
        finally:
            self.tasks.release(s.lease)

    def give_up(self, s: Session, *, keep_batch: bool = False) -> None:
        """The run stops on an error: the hold back if its call never went out
        (``release_unsent``), else counted as spent, its outcome unknown (``spend``). With
        ``keep_batch``, the hold of the batch the task waits on stays: the next claim adopts it
        and reads the batch again (``leave``); a task ended on a fault has no next claim."""
        held, batch = s.task.inflight, s.task.batch
        if held is None or held.epoch != s.lease.epoch or held.step != s.sent_hold_step:
            self.release_unsent(s)
        elif not (keep_batch and batch is not None and int(batch["step"]) == s.next_step):
            self.spend(s)
