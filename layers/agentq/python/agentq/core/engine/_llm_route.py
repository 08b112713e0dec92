"""Which model takes an LLM call: fleet flow control's admission before it (``core.flow``),
and a task's fallbacks after its model failed with an outage or an overload.

A ``Route`` is the answer, owned by the call it is for (``_llm_call.Call``): made before the
call, replaced by a fallback's, gone with the call. It reads the task and its steps (which
model the latest call step records) and writes nothing but flow control's counters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from agentq import observe
from agentq.core.engine.result import RunResult
from agentq.core.errors import ProviderError
from agentq.core.flow import Admission, flow_key
from agentq.core.models import CallStep, FallbackNote, ModelChoice, StepRecord, Task, TaskSubmission
from agentq.core.ports import FlowPort
from agentq.core.providers import LLMRequest

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


@dataclass(frozen=True)
class Route:
    """The model a call goes to and flow control's answer for it. The default, nothing
    admitted, is the submission's own model: a call flow control does not admit (``admitted``)."""

    admission: Admission | None = None  # flow control let the call through: its answer, settled after
    choice: ModelChoice | None = None  # the model the call goes to (its own, or a fallback)
    fallback: FallbackNote | None = None  # the call went to a fallback: from which model, why

    def key(self, sub: TaskSubmission) -> str:
        """The flow-control key of the call: the model it goes to."""
        choice = self.choice
        return flow_key(choice.provider, choice.model) if choice else flow_key(sub.provider, sub.model)

    def asked(self, request: LLMRequest) -> LLMRequest:
        """The request as it goes to the model chosen for it (a fallback's own model id)."""
        choice = self.choice
        return request if choice is None else request.model_copy(update={"model": choice.model})

    def submission(self, sub: TaskSubmission) -> TaskSubmission:
        """The submission a provider is made from: the chosen model's provider and model."""
        choice = self.choice
        if choice is not None and (choice.provider, choice.model) != (sub.provider, sub.model):
            sub = sub.model_copy(update={"provider": choice.provider, "model": choice.model})
        return sub

    def provider(self, sub: TaskSubmission) -> str:
        """The provider the call goes to (recorded on its step)."""
        return self.choice.provider if self.choice else sub.provider

    def model(self, sub: TaskSubmission) -> str:
        """The model the call goes to: what a policy rule checks (``Model::"<id>"``)."""
        return self.choice.model if self.choice else sub.model


def admitted(sub: TaskSubmission) -> bool:
    """Whether flow control admits the task's calls: not the scripted provider's (no provider to
    protect), nor a batch's (batches queue at the provider)."""
    return not (sub.provider == "scripted" or sub.constraints.economy)


def candidates(sub: TaskSubmission, steps: Sequence[StepRecord]) -> list[ModelChoice]:
    """The task's models in the order this call tries them: from the one its latest call
    step records (a resume and a fork go on with the model that answered), then the others
    in the order the task names them."""
    choices = sub.candidates()
    recorded = next((r.body for r in reversed(steps) if isinstance(r.body, CallStep) and r.body.provider), None)
    if recorded is None or len(choices) < 2:
        return choices
    same = [c for c in choices if c.provider == recorded.provider and recorded.model.startswith(c.model)]
    if not same:
        return choices
    start = choices.index(max(same, key=lambda c: len(c.model)))
    return choices[start:] + choices[:start]


class ModelRouter:
    def __init__(self, flow: FlowPort) -> None:
        self.flow = flow

    def admit(self, task: Task, steps: Sequence[StepRecord], demand: tuple[int, int]) -> Route | RunResult:
        """Fleet-wide flow control before the call (``core.flow``), asked for ``demand`` (the
        input estimate, the whole hold): the first of the task's models admitted takes the call.
        A circuit open, a 429's slow-down or an empty rate bucket defers the task instead (the
        turn gives its next call's hold back with the lease; the delayed message spends no
        receive toward the DLQ)."""
        est_in, wanted = demand
        order = candidates(task.submission, steps)
        refused: list[tuple[ModelChoice, Admission]] = []
        for choice in order:
            admission = self.flow.admit(flow_key(choice.provider, choice.model), est_in, wanted - est_in)
            if admission.ok:
                note = None
                if refused:
                    log.info("task %s: %s for %s/%s; its call goes to %s/%s", task.task_id, refused[0][1].reason,
                             refused[0][0].provider, refused[0][0].model, choice.provider, choice.model)  # fmt: skip
                    first = refused[0][0]
                    note = FallbackNote(provider=first.provider, model=first.model, reason=refused[-1][1].reason)
                return Route(admission, choice, note)
            refused.append((choice, admission))
            if admission.reason != "circuit_open":
                break  # a slow-down or a rate limit is waited for: it is not an outage
        choice, admission = refused[0]
        log.info("task %s deferred %.1fs: %s for %s", task.task_id, admission.wait, admission.reason, choice.model)
        known = DEFERRAL_MESSAGES.get(admission.reason)
        message = known.format(provider=choice.provider, model=choice.model) if known else admission.reason
        wait = min(a.wait for _, a in refused)
        return RunResult(
            task.task_id, "deferred",
            error={"code": admission.reason, "message": message, "retry_after": max(1.0, wait)},
        )  # fmt: skip

    def give_back(self, sub: TaskSubmission, route: Route) -> None:
        """The call ``route`` admitted does not go (a policy rule denied its model): the tokens
        flow control took for it go back to the buckets."""
        if route.admission is not None:
            self.flow.settle(route.key(sub), route.admission, 0, 0)

    def fall_over(
        self, task: Task, steps: Sequence[StepRecord], route: Route, exc: ProviderError, demand: tuple[int, int]
    ) -> Route | None:
        """After the model's call failed with an overload or an outage (its retries spent),
        the next of the task's models whose circuit lets it through takes the call (its route,
        None when none does): the failure counts toward the failed model's circuit, as any
        failed call does."""
        if not (exc.retryable and exc.code in FALLBACK_CODES and route.admission is not None and route.choice):
            return None
        failed = route.choice
        order = candidates(task.submission, steps)
        for choice in order[order.index(failed) + 1 :]:
            est_in, wanted = demand
            admission = self.flow.admit(flow_key(choice.provider, choice.model), est_in, wanted - est_in)
            if not admission.ok:
                continue
            key = flow_key(failed.provider, failed.model)
            if exc.status_code == 429 and exc.retry_after:
                self.flow.slow_down(key, exc.retry_after)
            self.flow.failed(key, route.admission)
            log.warning("task %s: %s/%s failed (%s); falling back to %s/%s", task.task_id, failed.provider,
                        failed.model, exc.code, choice.provider, choice.model)  # fmt: skip
            observe.otel.event("agentq.fallback", {"agentq.failed_model": f"{failed.provider}/{failed.model}",
                                                   "agentq.error_code": exc.code, "gen_ai.request.model": choice.model,
                                                   # the conventions' value ("aws.bedrock"), as on the chat span
                                                   "gen_ai.provider.name": observe.otel.genai_provider(choice.provider)})  # fmt: skip
            first = route.fallback or FallbackNote(provider=failed.provider, model=failed.model, reason=exc.code)
            return Route(admission, choice, first.model_copy(update={"reason": exc.code}))
        return None
