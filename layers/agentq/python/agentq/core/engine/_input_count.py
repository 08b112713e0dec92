"""A call near the cap, sized on its input as its provider counts it (ARCHITECTURE 4).

Every hold is sized on the input estimate (``conversation.estimate_input_tokens``: three
characters a token, and the hidden tool prompt). A request denser than that (digits, hashes,
base64) is billed more input than its estimate; with the hold's full output allowance that
stays within the room the budget had past it, but a hold the cap shrank (``BudgetHolds.reserve``:
the output allowance cut to what is left of the tokens or the money) has none, and a model
that writes all of its allowance passed ``cap`` by the difference.

So, only for such a call, when its provider can count its input exactly (``InputCounter``: the
Anthropic API's free ``count_tokens``; Bedrock and OpenAI-compatible servers cannot, and stay on
the estimate), the input is counted before the hold is taken, and the call sized on the larger
of the estimate and the count plus a margin (``sized``; the count is documented to differ from
the bill "by a small amount"): its output allowance is the hold less that input. Where that
leaves less than the shortest answer, the hold is refused as any other (``_holds``: the task
ends ``cost_exceeded``, or waits on calls of unknown outcome), its error naming the count. A
count that fails past its retries sends nothing on a guess: the turn fails as a model call that
failed unbilled does (``_llm_call.ModelCall.failed``). A call whose whole hold was taken counts
nothing: no request beyond the call.

A call that falls over to another model (``ModelCall.fall_back``) under a shrunk hold is counted
again by that model's provider where it can (another tokenizer may count more): ``refit``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from agentq import observe
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine.conversation import ESTIMATE_BASE_TOKENS
from agentq.core.models import TaskSubmission
from agentq.core.providers import LLMRequest, ProviderFactory
from agentq.core.providers.base import InputCounter, RemoteProvider

log = logging.getLogger("agentq.engine")

# The count is "an estimate" that "may differ by a small amount" from the bill (Anthropic's
# token counting docs): the call is sized on the count plus the estimate's base and 1 %.
COUNT_MARGIN_SHARE = 0.01


def margin(counted: int) -> int:
    """The tokens added to a count before a call is sized on it."""
    return ESTIMATE_BASE_TOKENS + math.ceil(counted * COUNT_MARGIN_SHARE)


class InputCount:
    """The input of one call's request as its provider counts it: asked at most once, and only
    when asked (``sized``), so a call whose hold is whole makes no request for it."""

    def __init__(
        self, providers: ProviderFactory, s: Session, submission: TaskSubmission, request: Callable[[int], LLMRequest]
    ) -> None:
        self.providers, self.submission, self._request = providers, submission, request
        self.task_id, self.step = s.task_id, s.next_step
        self.counted: int | None = None  # what the provider said
        self.uncountable = False  # its provider cannot count

    def sized(self, max_tokens: int) -> int | None:
        """The input to size the call on where its provider counts (the count and its
        ``margin``); None where it cannot. ``ProviderError`` when the count fails past its
        retries (or the provider cannot be made): the call must not go on a guess. The request
        counted asks ``max_tokens`` (the allowance the estimate leaves it): it decides whether
        the request thinks, as it will be sent (``RequestBuilder.request``)."""
        if self.counted is None and not self.uncountable:
            provider = self.providers(self.submission)
            if not isinstance(provider, InputCounter):
                self.uncountable = True
                return None
            request = self._request(max_tokens)
            endpoint = provider.endpoint if isinstance(provider, RemoteProvider) else None
            with observe.input_count(provider=self.submission.provider, model=request.model, task_id=self.task_id,
                                     step=self.step, endpoint=endpoint) as noted:  # fmt: skip
                self.counted = provider.count_input_tokens(request)
                noted.counted(self.counted)
            log.info("task %s: the call of step %d near the cap reads %d input tokens, as %s counts them",
                     self.task_id, self.step, self.counted, self.submission.provider)  # fmt: skip
        return None if self.counted is None else self.counted + margin(self.counted)

    def input_or(self, estimate: int) -> int:
        """The input the call is sized on: ``estimate``, or where the provider counted more
        (``sized`` was asked), that count and its margin. Asks for nothing."""
        return estimate if self.counted is None else max(estimate, self.counted + margin(self.counted))


def allowance(requests: RequestBuilder, s: Session, reserved: int, est_in: int) -> int:
    """The output allowance a hold of ``reserved`` leaves the next call taken to read ``est_in``
    tokens: what the hold leaves past all it may read (``BudgetHolds.least``), never more than
    the allowance the task asks."""
    full_out = requests.max_out(s)
    return min(full_out, reserved - (requests.demand(s, est_in)[1] - full_out))


def refit(providers: ProviderFactory, s: Session, submission: TaskSubmission, request: LLMRequest, sized: int) -> int:
    """The input a shrunk call sized on ``sized`` is taken to read once ``request`` goes to the
    model of ``submission`` (a fallback's): the larger of ``sized`` and that model's count, where
    its provider counts. ``ProviderError`` as ``InputCount.sized``."""
    counted = InputCount(providers, s, submission, lambda _: request).sized(request.max_tokens)
    return sized if counted is None else max(sized, counted)


def resized(request: LLMRequest, max_tokens: int) -> LLMRequest:
    """``request`` asking ``max_tokens`` of output, its thinking dropped where it would no longer
    fit (``RequestBuilder.request``: thinking goes only with more output than its budget)."""
    thinking = request.thinking_budget if request.thinking_budget and max_tokens > request.thinking_budget else None
    return request.model_copy(update={"max_tokens": max_tokens, "thinking_budget": thinking})
