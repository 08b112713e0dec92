"""The protocol a recorded operation follows: side effects, approvals and spawns.

Each of them must happen at most once across worker crashes and takeovers, and a worker that
resumes must act on what an earlier one decided, never decide again. They share one shape
(aws-durable-execution-sdk-python's check, checkpoint, check again, execute):

1. ``check``: the record an earlier attempt left (a resume finds it here);
2. if there is none, ``create`` it with a write fenced by the lease (a zombie's fails, and a
   create that finds one already there answers with it);
3. the crash point after the create (``faults``), where the tests kill the worker;
4. ``check_again``: what is stored now is what is acted on (the same path a resume takes);
5. ``act`` on the record: run, replay, park, or turn it into the tool's result.

A create may settle the operation without a record (a spawn the limits refuse): it raises
``Settled`` with the result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from agentq.core.faults import crash_point

R = TypeVar("R")
A = TypeVar("A")


class Settled(Exception):
    """Raised by ``create`` when the operation ends without a record (its result: ``value``)."""

    def __init__(self, value: Any) -> None:
        super().__init__("settled without a record")
        self.value = value


class RecordedOperation(ABC, Generic[R, A]):
    after_create: ClassVar[str | None] = None  # the crash point between create and check again

    @abstractmethod
    def check(self) -> R | None:
        """The record an earlier attempt left, if it can be acted on."""

    @abstractmethod
    def create(self) -> None:
        """Write the record, fenced by the lease."""

    def check_again(self) -> R | None:
        return self.check()

    @abstractmethod
    def act(self, record: R | None) -> A:
        """Act on the stored record (None: nothing was stored that can be acted on yet)."""

    def run(self) -> A:
        record = self.check()
        if record is None:
            try:
                self.create()
            except Settled as settled:
                result: A = settled.value
                return result
            if self.after_create is not None:
                crash_point(self.after_create)
            record = self.check_again()
        return self.act(record)
