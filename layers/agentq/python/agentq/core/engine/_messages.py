"""A person's messages and interrupts, heard at turn boundaries (``storage.messages``).

A turn boundary is a point where the conversation may take a user turn: before the first call,
after a tools step, after an answer. Not between an LLM step that asked for tools and their
results: the calls the model asked for before the message (or the interrupt) run and are
recorded first, so no side effect is cut in half and none runs twice.

Delivering is one step commit (a ``MessageStep``): its META write moves ``messages_delivered``,
so the delivery happens exactly when the step is committed. An interrupt with nothing to deliver
moves the task to ``idle``, where it holds no lease, no hold and no queue message until the next
message reopens it; with messages waiting (the ``interrupt`` double-texting policy sends one with
it) the agent goes on with them instead.
"""

from __future__ import annotations

import dataclasses
import logging

from agentq import observe
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._session import Session
from agentq.core.engine.conversation import said
from agentq.core.engine.result import RunResult
from agentq.core.faults import crash_point
from agentq.core.models import LLMStep, MessageStep, TaskStatus
from agentq.core.ports import MessageBox
from agentq.core.records import Inbox

log = logging.getLogger("agentq.engine")


def at_boundary(s: Session) -> bool:
    """Whether the conversation may take a user turn now (see the module)."""
    last = s.steps[-1].body if s.steps else None
    return not (isinstance(last, LLMStep) and last.tool_uses())


class MessageTurn:
    def __init__(self, messages: MessageBox, holds: BudgetHolds, writer: StepWriter) -> None:
        self.messages, self.holds, self.writer = messages, holds, writer

    def due(self, s: Session) -> bool:
        """A message or an interrupt waits, and the conversation may take it: at a turn
        boundary, and not while the turn's batch is out (its answer, which the provider bills,
        is read first: delivered before it, a message moved the conversation past the batch's
        step, and the answer was never read nor charged)."""
        batch = s.task.batch
        if batch is not None and int(batch["step"]) == s.next_step:
            return False
        return (s.inbox.waiting > 0 or s.inbox.interrupt_at is not None) and at_boundary(s)

    def run(self, s: Session) -> RunResult | None:
        """Deliver what waits (None: the loop goes on), or stop for an interrupt."""
        if s.inbox.waiting > 0:
            self._deliver(s)
            return None
        return self._go_idle(s)

    def _deliver(self, s: Session) -> None:
        waiting = self.messages.waiting(s.task_id, after=s.inbox.delivered, upto=s.inbox.received)
        body = MessageStep(messages=waiting)
        record = self.writer.commit(s, body)
        self.writer.committed(s, record, said(s.messages, body))
        crash_point("after_message_commit")
        log.info("task %s: %d message(s) delivered at step %d", s.task_id, len(waiting), record.number)

    def _go_idle(self, s: Session) -> RunResult | None:
        """Interrupted with nothing to say: the hold goes back and the task waits, ``idle``."""
        self.holds.release(s)
        s.task = s.task.model_copy(update={"inflight": None})
        waiting = self.messages.go_idle(s.lease, delivered=s.inbox.delivered)
        if waiting is not None:  # a message came in meanwhile: the agent goes on with it
            s.inbox = dataclasses.replace(s.inbox, received=waiting.received)
            return None
        s.inbox = Inbox(received=s.inbox.delivered, delivered=s.inbox.delivered)
        s.task = s.task.model_copy(update={"status": TaskStatus.IDLE})
        observe.task_status_changed(s.task_id, s.task.tenant, TaskStatus.IDLE.value)
        log.info("task %s interrupted: idle until the next message", s.task_id)
        return RunResult(s.task_id, "waiting", status=TaskStatus.IDLE)
