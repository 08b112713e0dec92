"""Which model takes an LLM call: fleet flow control's admission before it (``core.flow``),
and a task's fallbacks after its model failed with an outage or an overload."""

from __future__ import annotations

import logging

from agentq import observe
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine.result import RunResult
from agentq.core.errors import ProviderError
from agentq.core.flow import Admission, flow_key
from agentq.core.models import CallStep, FallbackNote, ModelChoice
from agentq.core.ports import FlowPort

log = logging.getLogger("agentq.engine")

# A call that still fails with one of these after its retries is an outage or an overload of its
# model: a task with fallbacks sends it to the next (``ModelRouter.fall_over``).
FALLBACK_CODES = frozenset(
    {"overloaded", "rate_limited", "provider_server_error", "provider_unreachable", "provider_timeout"}
)

DEFERRAL_MESSAGES = {
    "circuit_open": "the circuit for {provider}/{model} is open after repeated failures",
    "slowed_down": "{provider} asked the fleet to slow down for {model} (429)",
    "rate_limited": "the fleet's rate limit for {provider}/{model} is spent",
}


class ModelRouter:
    def __init__(self, flow: FlowPort, requests: RequestBuilder, holds: BudgetHolds) -> None:
        self.flow, self.requests, self.holds = flow, requests, holds

    def admit(self, s: Session) -> RunResult | None:
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
        order = self.candidates(s)
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

    def fall_over(self, s: Session, exc: ProviderError) -> bool:
        """After the model's call failed with an overload or an outage (its retries spent),
        the next of the task's models whose circuit lets it through takes the call: the
        failure counts toward the failed model's circuit, as any failed call does."""
        if not (exc.retryable and exc.code in FALLBACK_CODES and s.admission is not None and s.model_choice):
            return False
        failed = s.model_choice
        order = self.candidates(s)
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

    def candidates(self, s: Session) -> list[ModelChoice]:
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

    def key(self, s: Session) -> str:
        """The flow-control key of the call in progress: the model it goes to."""
        choice = s.model_choice
        sub = s.task.submission
        return flow_key(choice.provider, choice.model) if choice else flow_key(sub.provider, sub.model)
