"""Economy: an LLM turn sent as a batch of one (Message Batches), the task parked in
``waiting`` until it ends, and its answer read by the run that claims the task then.

Invariant (ARCHITECTURE 4, "spend <= cap at every scope"): the batch's call keeps its hold on
the tenant's hour and on the scopes' caps (a ``CallHold``) from before the batch is sent until
its outcome is known, however long it runs: the park records the hold beside the batch
(``batch["windows"]``), and the one who learns the outcome settles that recorded hold, once:
to the usage, by the commit of the answer; given back, for a request that errored or expired
(known unbilled); counted as spent, its outcome unknown, for a batch the API no longer knows or
a task stopped while its batch runs. The park used to give the hold back, so while a batch ran
its windows held nothing for it, and a capped user's second batch went out too: both billed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentq import observe
from agentq.core.engine._caps import CallHold, spend_holds
from agentq.core.engine._llm_call import Call
from agentq.core.engine._session import Session
from agentq.core.engine.result import RunResult
from agentq.core.errors import ProviderError
from agentq.core.faults import crash_point
from agentq.core.models import TaskStatus
from agentq.core.ports import ScopeCapsPort, TaskLeases, TenantWindowsPort
from agentq.core.providers import LLMProvider, LLMResponse, ProviderFactory
from agentq.core.providers.base import BatchProvider, RemoteProvider, RetryNotice, reporting_retries
from agentq.core.status import LOOK_DUE

log = logging.getLogger("agentq.engine")


# Where a batch's record keeps its call's windows' hold (``CallHold.record``). A batch parked
# before it was kept has none: its windows' hold was given back at its park, and its answer is
# counted from a hold of 0 (``LLMTurn``).
RECORDED = "windows"


class Batches:
    def __init__(self, providers: ProviderFactory, tasks: TaskLeases) -> None:
        self.providers, self.tasks = providers, tasks

    def batched(
        self, s: Session, call: Call, batch: dict[str, Any] | None, retried: Callable[[RetryNotice], None]
    ) -> LLMResponse | RunResult:
        """Economy: the turn goes out as a batch of one and the task parks in ``waiting``,
        holding no compute and keeping its budget hold (deadline: the batch's 24-hour window)
        and its windows' hold (recorded with the batch, see the module);
        the run that claims it once the batch ended gets the answer here (``batch``: the one the
        task waited on; ``Call.started``: when it was sent), to commit as any.

        Creating a batch is a model call as far as the ledger goes: an attempt whose reply was
        cut may have made the batch, which then runs and is billed (creation is not idempotent),
        so each retry of it is told to ``retried`` (``ModelCall.note_retry``: such an attempt's
        hold is counted as spent, its outcome unknown, and the next attempt holds anew), and
        the error after the last says whether it may have been billed. Reading an ended batch's
        answer bills nothing: its retries are not told.

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
            call.may_be_billed = True  # the batch exists: it runs, and is billed, unless its result says otherwise
            try:
                response = provider.batch_result(str(batch["id"]), str(batch["custom_id"]))
            except ProviderError as exc:
                self.observed(s, call, provider, batch, exc)
                raise
            if response is None:  # looked at before it ended: wait again
                return self.park(s, batch)
            call.started = float(batch["submitted_at"])
            self.observed(s, call, provider, batch, response)
            return response
        custom_id = f"{s.task_id}-s{s.next_step}-e{s.lease.epoch}"[:64]
        record = {"custom_id": custom_id, "step": s.next_step, "epoch": s.lease.epoch, "submitted_at": time.time()}
        with reporting_retries(retried):
            record["id"] = provider.submit_batch(call.request, custom_id)
        call.may_be_billed = True  # the batch exists: it runs, and is billed, whatever becomes of this run
        crash_point("after_batch_submit")
        # The windows' hold of the attempt that made it (a retry's, after a cut one), kept with it.
        record[RECORDED] = call.window.record() if call.window is not None else {}
        return self.park(s, record)

    def observed(
        self, s: Session, call: Call, provider: LLMProvider, batch: dict[str, Any], outcome: LLMResponse | ProviderError
    ) -> None:
        """The batch's call in the telemetry, once its outcome is read (an answer, or the error
        its result says): a ``chat`` span from its submission to now, under the step that reads
        it, a point of each GenAI client metric, its tokens in the EMF metrics, as a call the
        run waited on. A look before the batch ended says nothing (the call is not over)."""
        with contextlib.suppress(ProviderError), observe.llm_call(
            provider=provider.name, model=call.request.model, max_tokens=call.max_out, task_id=s.task_id,
            step=s.next_step, endpoint=provider.endpoint if isinstance(provider, RemoteProvider) else None,
            since=float(batch["submitted_at"]),
        ) as made:  # fmt: skip
            if made.otel_span is not None:
                made.otel_span.set_attribute("agentq.batch_id", str(batch["id"]))
            if isinstance(outcome, ProviderError):
                raise outcome  # recorded as a failed call's (``error.type``), then dropped here: the caller raises it
            made.answered(outcome)

    def recorded(self, s: Session, batch: dict[str, Any]) -> CallHold | None:
        """The windows' hold that ``batch``'s park recorded, for its answer to settle; None when
        nothing capped its call, or when its settling was taken already (``Task.batch_settled``:
        an errored batch read again after a redrive, an answer discarded and read again)."""
        return None if s.task.batch_settled == batch["id"] else CallHold.recorded(batch[RECORDED])

    def park(self, s: Session, record: dict[str, Any]) -> RunResult:
        """The task waits for the batch ``record`` names, without a worker (a ``batch_poll``
        message looks at it), its holds kept: the budget's, and the windows' (recorded with
        it). When that look is due rides on the park, so a look lost with a worker that died
        before queueing it is found by the sweeper, and a stray look is told from the due one
        (``queueing.dispatch._looks``)."""
        seconds = batch_poll_seconds(record)
        self.tasks.transition(s.task_id, TaskStatus.WAITING, lease=s.lease,
                              extra={"batch": record, LOOK_DUE: time.time() + seconds})  # fmt: skip
        s.task = s.task.model_copy(update={"status": TaskStatus.WAITING, "batch": record})
        log.info("task %s: turn %s sent as batch %s", s.task_id, record["step"], record["id"])
        return RunResult(s.task_id, "waiting", status=TaskStatus.WAITING, batch_poll=seconds)


def count_batch_hold_as_spent(windows: TenantWindowsPort, caps: ScopeCapsPort, batch: Mapping[str, Any]) -> None:
    """Count the windows' hold recorded with ``batch`` as spent at its size, its outcome
    unknown (a cancel's or a stop's, once it took it: ``take_batch_hold_at_end``): the batch
    runs and is billed, and no run will read its answer. As the task's budget counts its hold
    (``count_as_spent``, at the hold's deadline)."""
    spend_holds(windows, caps, CallHold.recorded(batch.get(RECORDED) or {}))


def batch_poll_seconds(batch: dict[str, Any]) -> float:
    """When to look at a batch again: soon at first, then a quarter of its age (most end
    within minutes; none lasts past 24 hours), between ``AGENTQ_BATCH_POLL_SECONDS`` (30) and
    SQS's longest delay."""
    floor = float(os.environ.get("AGENTQ_BATCH_POLL_SECONDS", "30"))
    return min(900.0, max(floor, (time.time() - float(batch["submitted_at"])) / 4))
