"""The task's timeout cuts the model call in flight (issue 39: a 3 s timeout used to wait for a
35 s call, and the answer it waited for was even committed).

Two halves. The providers stop the call themselves where their SDK lets them
(``core.providers.base.cutting_at``): no attempt starts after the deadline, a retry's wait ends
at it, an HTTP attempt of the Anthropic and OpenAI SDKs times out at it (httpx closes the
connection), a stream is closed at its next event, the scripted provider's latency ends. But
one read cannot be cut: botocore's ``converse`` waits for the whole reply with the read timeout
its client was made with (``AGENTQ_MAX_CALL_SECONDS``). So the engine also waits for the call
on a thread of its own (``call_until``) and stops waiting at the deadline: the task ends on
time whatever the SDK does.

A Python thread cannot be killed. A call that answers after it was cut (botocore's, or one whose
reply raced the cut) hands its answer to ``late``: the engine settles it as an orphan
(``settle_late``), which corrects the hold the cut counted as spent to what the call used, once
(``settle_orphan`` finds ``spent_<epoch>``; ARCHITECTURE 4), and keeps the call in the trace.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from agentq.core.errors import CallCut
from agentq.core.models import Lease, LLMStep
from agentq.core.ports import BudgetLedger, StepLog
from agentq.core.providers.base import Cut, cutting_at
from agentq.core.records import BudgetDelta
from agentq.core.reservation import Reservation

log = logging.getLogger("agentq.engine")

T = TypeVar("T")


class _InFlight(Generic[T]):
    """One call on its thread: its outcome goes to the waiting thread, or, once that thread
    has cut it, to ``late`` (an answer) or the log (a failure). A lock decides which, once."""

    def __init__(self, call: Callable[[], T], late: Callable[[T], None]) -> None:
        self._call = call
        self._late = late
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._outcome: tuple[T | None, BaseException | None] | None = None
        self._cut = False

    def run(self) -> None:
        outcome: tuple[T | None, BaseException | None]
        try:
            outcome = (self._call(), None)
        except BaseException as exc:  # raised again in the waiting thread, as if called there
            outcome = (None, exc)
        with self._lock:
            if not self._cut:
                self._outcome = outcome
                self._done.set()
                return
        answer, failure = outcome
        if failure is None:
            try:
                self._late(answer)  # type: ignore[arg-type]  # no failure: the call returned its T
            except Exception:
                log.exception("could not settle the answer of a call cut at its task's timeout")
        elif not isinstance(failure, CallCut):
            log.info("a call cut at its task's timeout ended with %s", type(failure).__name__)

    def wait(self, cut: Cut) -> T:
        self._done.wait(max(0.0, cut.deadline - time.time()))
        with self._lock:
            if self._outcome is None:
                self._cut = True
                cut.now.set()  # the provider's own waits end, and no attempt starts
                raise CallCut("the task's timeout passed before the model answered")
            answer, failure = self._outcome
        if failure is not None:
            raise failure
        return answer  # type: ignore[return-value]  # no failure: the call returned its T


def call_until(deadline: float, call: Callable[[], T], late: Callable[[T], None]) -> T:
    """``call()`` on a thread of its own, in this context plus the cut at ``deadline``; its
    result, or ``CallCut`` once the deadline passes without one (``late`` gets an answer that
    comes after; ``sent=False``: it had passed before the call started). The thread is a daemon: an abandoned call never holds up the process's exit."""
    if time.time() >= deadline:  # it passed while the call was prepared (a provider's SDK imported, ...)
        raise CallCut("the task's timeout passed before the model call started", sent=False)
    cut = Cut(deadline, threading.Event())
    flight = _InFlight(call, late)
    context = contextvars.copy_context()  # the task's log fields, the retry and text listeners

    def in_cut() -> None:
        with cutting_at(cut):
            flight.run()

    threading.Thread(target=context.run, args=(in_cut,), name="model-call", daemon=True).start()
    return flight.wait(cut)


@dataclass(frozen=True)
class CutCall:
    """What settling a cut call's late answer needs, taken when the call started: the session
    moves on (and ends the task) without it."""

    task_id: str
    budget_id: str
    parent_id: str | None
    lease: Lease
    step: int
    hold: Reservation | None


def settle_late(budgets: BudgetLedger, steps: StepLog, cut: CutCall, step: LLMStep) -> None:
    """A call cut at its task's timeout answered after all: its usage settles the hold (counted
    as spent by the cut: corrected to this usage, once), and the call stays in the trace as an
    orphan, as any answer that could not be committed."""
    hold = cut.hold
    delta = BudgetDelta(
        reserved=hold.amount if hold else 0,
        used=step.usage.total,
        cost_usd=step.cost_usd,
        tokens_in=step.usage.input_total,
        tokens_out=step.usage.output_tokens,
        reserved_micros=hold.micros if hold else 0,
    )
    budgets.settle_orphan(
        cut.task_id, cut.budget_id, delta, inflight_epoch=cut.lease.epoch if hold else None, parent_id=cut.parent_id
    )
    steps.record_orphan(cut.lease, cut.step, step, reason="timed_out")
    log.warning(
        "task %s: the call of step %d cut at the task's timeout answered after all (%d tokens); charged as an orphan",
        cut.task_id, cut.step, step.usage.total,
    )  # fmt: skip
