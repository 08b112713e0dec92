"""The exceptions agentq raises. Each one says what went wrong in words a caller can act on."""

from __future__ import annotations

from typing import Any


class AgentqError(Exception):
    """Base class: ``code`` is stable for scripts and APIs, ``field`` names bad input."""

    code = "agentq_error"

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


class ValidationError(AgentqError):
    code = "validation_error"


class TaskNotFound(AgentqError):
    code = "task_not_found"


class IllegalTransition(AgentqError):
    code = "illegal_transition"


class IdempotencyConflict(AgentqError):
    """An idempotency key reused with a different request."""

    code = "idempotency_conflict"


class MessageRefused(AgentqError):
    """A message a task cannot take: it ended without an answer to continue from, its
    conversation is closed, it is busy and refuses double texts, or it took the most it may."""

    code = "message_refused"


class ConversationMoved(AgentqError):
    """A step commit that would have ended the turn found a person's message waiting or an
    interrupt asked for (``storage.messages``): the engine hears them before it stops."""

    code = "conversation_moved"

    def __init__(self, message: str, *, received: int, interrupt_at: float | None) -> None:
        super().__init__(message)
        self.received = received
        self.interrupt_at = interrupt_at


class LeaseLost(AgentqError):
    """The worker's lease epoch is no longer current: it must stop writing at once."""

    code = "lease_lost"


class BudgetExceeded(AgentqError):
    code = "budget_exceeded"


class ProviderError(AgentqError):
    """An LLM provider failed after the retries allowed; ``retryable`` tells the queue layer
    whether the message should come back later (overload) or the task should fail (bad request).
    ``code`` names the failure precisely (``invalid_api_key``, ``model_not_found``, ``overloaded``,
    ...): it is what the task's ``error.code`` says."""

    code = "provider_error"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        attempts: int = 1,
        code: str | None = None,
        retry_after: float | None = None,
        maybe_billed: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        # Whether an attempt of the failed call may have been billed (its last one failed after
        # the request went out: a reply cut midway, a timeout after sending, a 2xx that is not
        # a reply, a gateway's 502/504). False when the failure is known to have cost nothing
        # (an error status, no connection, a request never sent): ARCHITECTURE 4.
        self.maybe_billed = maybe_billed
        self.status_code = status_code
        self.attempts = attempts
        self.retry_after = retry_after  # the server's retry-after on the last attempt, if it gave one
        if code is not None:
            self.code = code


class CallCut(AgentqError):
    """The model call in flight was cut before it answered: its task's timeout passed
    (``core.providers.base.cutting_at``). Not a provider failure: nothing is retried, and the
    call's hold is counted as spent, its outcome unknown (ARCHITECTURE 4); ``sent=False``: the
    deadline passed before the call started, so nothing went out and the hold goes back."""

    code = "call_cut"

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


# Faults that running the same task again would meet again: bad data (a submission or step that
# no longer validates, a script that cannot be loaded) or a bug on a code path the task always
# takes. A task that hits one ends ``failed`` with it at once instead of being retried until SQS
# dead-letters its message while its status still says running (and its parent waits forever).
# Outages (network, throttling: botocore's own exception classes) are not among them.
DETERMINISTIC_FAULTS: tuple[type[Exception], ...] = (
    ValueError,  # pydantic's ValidationError, JSONDecodeError, UnicodeError among them
    TypeError,
    LookupError,
    AttributeError,
    AssertionError,
)


def fault_error(exc: BaseException, code: str = "processing_failed") -> dict[str, str]:
    """A task's ``error`` for an exception that was not an ``AgentqError`` (message cut to 500)."""
    if isinstance(exc, AgentqError):
        return {"code": exc.code, "message": exc.message[:500]}
    return {"code": code, "message": f"{type(exc).__name__}: {exc}"[:500]}
