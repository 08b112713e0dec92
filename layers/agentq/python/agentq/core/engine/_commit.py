"""Committing a step: the one write that makes a turn durable, renews the lease and (for a
tools step) holds the budget for the next call, or ends the task."""

from __future__ import annotations

import logging
import time
from typing import Any

from agentq import observe
from agentq.core.engine._session import Session
from agentq.core.engine.config import EngineConfig
from agentq.core.models import CompactStep, GradeStep, LLMStep, MessageStep, StepRecord
from agentq.core.ports import StepLog
from agentq.core.records import Inbox

log = logging.getLogger("agentq.engine")


class StepWriter:
    def __init__(self, steps: StepLog, config: EngineConfig) -> None:
        self.steps = steps
        self.config = config

    def commit(self, s: Session, body: Any, **kwargs: Any) -> StepRecord:
        """Commit ``body`` as the next step; unless it ends the task, the same write renews
        the lease, and the session learns the new expiry. While it is on the wire the
        heartbeat may leave the lease alone: the commit renews it or ends the task. The
        session also learns what the write found of a person's messages (``_messages``)."""
        s.held.commit_sent_at = time.time()
        until = None if kwargs.get("finish") else s.held.commit_sent_at + self.config.lease_seconds
        try:
            record = self.steps.commit(
                s.lease, s.next_step, body, root_id=s.task.budget_id, lease_until=until,
                delivered=s.inbox.delivered, **kwargs,
            )  # fmt: skip
        finally:
            s.held.commit_sent_at = None
        delivered = body.messages[-1].seq if isinstance(body, MessageStep) else s.inbox.delivered
        if record.messages_received is not None:
            s.inbox = Inbox(received=record.messages_received, delivered=delivered, interrupt_at=record.interrupt_at)
        if until is not None:
            s.held.lease = s.lease.model_copy(update={"expires_at": until})
        finish = kwargs.get("finish")
        if finish is not None:
            error = kwargs.get("error") or {}
            observe.task_status_changed(
                s.task_id, s.task.tenant, finish.value, **({"error": error["code"]} if error else {})
            )
        return record

    def committed(self, s: Session, record: StepRecord, messages: list[dict[str, Any]]) -> None:
        """The session after a commit: the step appended, the conversation it makes."""
        s.steps.append(record)
        s.messages = messages
        s.committed += 1
        body = record.body
        if isinstance(body, LLMStep | CompactStep):
            log.debug(
                f"{body.kind} step committed",
                extra={"kind": body.kind, "model": body.model, "stop_reason": body.stop_reason,
                       "tokens_in": body.usage.input_total, "tokens_out": body.usage.output_tokens},
            )  # fmt: skip
        elif isinstance(body, MessageStep):
            log.debug("message step committed", extra={"kind": "message", "messages": len(body.messages)})
        elif isinstance(body, GradeStep):
            log.debug("grade step committed", extra={"kind": "grade", "score": body.score, "passed": body.passed})
        else:
            log.debug(
                "tools step committed", extra={"kind": "tools", "tool_errors": sum(r.is_error for r in body.results)}
            )
