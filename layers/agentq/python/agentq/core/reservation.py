"""A budget hold: the tokens (and dollars) held on the root budget for one LLM call.

One type for it wherever it goes: the engine takes it before a call, storage records it on META
(as ``inflight``, or as ``lapsed_<epoch>`` once a successor set it aside), and ``Task`` carries it.
The stored map names its dollars ``usd`` (millionths of a dollar); ``from_ticket`` reads that map,
so no code outside storage ever reads a hold's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Reservation:
    """Tokens held on the root budget for one LLM call, recorded on META as ``inflight``."""

    amount: int
    epoch: int
    step: int
    until: float | None = None  # the hold's deadline: its call cannot complete after it
    micros: int = 0  # dollars held, in millionths (the most the call can cost)

    @classmethod
    def from_ticket(cls, raw: Mapping[str, Any], *, epoch: int | None = None) -> Reservation:
        """A hold from its stored map (``amount``, ``epoch``, ``step``, ``until``, ``usd``);
        ``epoch`` when the map is keyed by it (``lapsed_<epoch>``)."""
        until = raw.get("until")
        return cls(
            amount=int(raw["amount"]),
            epoch=int(raw["epoch"]) if epoch is None else epoch,
            step=int(raw["step"]),
            until=None if until is None else float(until),
            micros=int(raw.get("usd", 0)),
        )

    def lapsed_by(self, now: float) -> bool:
        """Its call can no longer complete (or it never had a deadline): safe to return."""
        return self.until is None or self.until <= now

    def moved_to(self, *, epoch: int | None = None, until: float | None = None) -> Reservation:
        return replace(self, epoch=self.epoch if epoch is None else epoch, until=self.until if until is None else until)
