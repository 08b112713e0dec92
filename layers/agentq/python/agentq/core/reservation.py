"""A budget hold: the tokens (and dollars) held on the root budget for one LLM call.

One type for it wherever it goes: the engine takes it before a call, storage records it on META
(as ``inflight``, or as ``lapsed_<epoch>`` once a successor set it aside), and ``Task`` carries it.
The stored map names its dollars ``usd`` (millionths of a dollar); ``from_ticket`` reads that map,
so no code outside storage ever reads a hold's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class Reservation:
    """Tokens held on the root budget for one LLM call, recorded on META as ``inflight``."""

    amount: int
    epoch: int
    step: int
    until: float | None = None  # the hold's deadline: its call cannot complete after it
    micros: int = 0  # dollars held, in millionths (the most the call can cost)
    # What the worker saw its call bill before it was lost (``Seen``): known usage inside the
    # hold, so only the rest of the hold is unknown when it is counted as spent.
    seen_in: int = 0
    seen_out: int = 0
    seen_micros: int = 0

    @property
    def seen(self) -> int:
        return self.seen_in + self.seen_out

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
            seen_in=int(raw.get("seen_in", 0)),
            seen_out=int(raw.get("seen_out", 0)),
            seen_micros=int(raw.get("seen_usd", 0)),
        )

    def lapsed_by(self, now: float) -> bool:
        """Its call can no longer complete (or it never had a deadline): safe to return."""
        return self.until is None or self.until <= now

    def moved_to(self, *, epoch: int | None = None, until: float | None = None) -> Reservation:
        return replace(self, epoch=self.epoch if epoch is None else epoch, until=self.until if until is None else until)

    def with_seen(self, seen: Seen | None) -> Reservation:
        """This hold with what its call was seen to bill, when ``seen`` is this hold's: of its
        epoch and step, noted under its deadline (a retry under a new hold of the same step has
        another), never more than the hold, and never less than this hold already knew."""
        if seen is None or not seen.of(self) or seen.tokens <= self.seen:
            return self
        seen_in = min(seen.tokens_in, self.amount)
        return replace(
            self, seen_in=seen_in, seen_out=min(seen.tokens_out, self.amount - seen_in),
            seen_micros=min(seen.micros, self.micros),
        )  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """What a streamed call in flight has billed so far, as its stream said (the input tokens
    at its start, the output tokens when the provider reports them): known usage, even if the
    call is never reported whole. The worker publishes it on META (``seen``) with the heartbeat,
    so a successor that counts the call's hold as spent counts this part as known and only the
    rest as unknown (ARCHITECTURE 4)."""

    epoch: int
    step: int
    until: float | None  # the deadline of the hold it was noted under: that hold's own mark
    tokens_in: int
    tokens_out: int = 0
    micros: int = 0  # its price, in millionths of a dollar (rounded up)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def of(self, held: Reservation) -> bool:
        """Noted under ``held`` (a deadline stored to the millisecond compares within one)."""
        if (self.epoch, self.step) != (held.epoch, held.step):
            return False
        if self.until is None or held.until is None:
            return self.until is held.until
        return abs(self.until - held.until) < 0.002

    def to_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"epoch": self.epoch, "step": self.step, "in": self.tokens_in,
                                "out": self.tokens_out, "usd": self.micros}  # fmt: skip
        if self.until is not None:
            item["until"] = Decimal(str(round(self.until, 3)))
        return item

    @classmethod
    def from_item(cls, raw: Mapping[str, Any]) -> Seen:
        until = raw.get("until")
        return cls(int(raw["epoch"]), int(raw["step"]), None if until is None else float(until),
                   int(raw.get("in", 0)), int(raw.get("out", 0)), int(raw.get("usd", 0)))  # fmt: skip
