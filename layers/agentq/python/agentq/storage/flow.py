"""The shared state of fleet-wide flow control (``core.flow``), one partition per provider and
model (``FLOW#anthropic/claude-sonnet-4-6``): the circuit breaker and the slow-down on
``STATE``, one token bucket per limit on ``BUCKET#rpm|itpm|otpm`` (level ``tokens`` as of ``at``,
and a version ``v`` every write bumps).

Every executor reads ``STATE`` before a call (one GetItem, kept for ``CACHE_SECONDS`` while the
circuit is closed and nothing slows it: a fleet learns of an opening within that) and writes it
only when something changes: a failure counted, the circuit opened, a probe taken, the circuit
closed, a 429's slow-down. The moves are conditional writes on what was read, so two executors that see the
circuit open together take no more probes than allowed, and one opening is recorded once.
A bucket is refilled and taken in one write conditional on the version read; an answered call
gives back what it did not use with an atomic ADD that bumps the version too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq import observe
from agentq.core.flow import ADMITTED, Admission, FlowSettings, RateLimits
from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Table, Update, plain

log = logging.getLogger("agentq.flow")

MINUTE = 60.0
CACHE_SECONDS = 1.0


def _listed(key: str) -> dict[str, str]:
    """The ``gsi1`` keys that list a STATE item (``FlowControl.breakers``), set if absent."""
    return {"gsi1pk": keys.FLOWS_INDEX_PK, "gsi1sk": key}


def _state_key(key: str) -> dict[str, str]:
    return {"pk": f"FLOW#{key}", "sk": "STATE"}


def _bucket_key(key: str, dimension: str) -> dict[str, str]:
    return {"pk": f"FLOW#{key}", "sk": f"BUCKET#{dimension}"}


class FlowControl:
    def __init__(self, table: Table, settings: FlowSettings | None = None) -> None:
        self.table = table
        self.settings = settings or FlowSettings.from_env()
        self._seen: dict[str, tuple[float, dict[str, Any]]] = {}  # key -> (when read, a healthy STATE)
        self._lock = threading.Lock()

    @property
    def cooldown_seconds(self) -> float:
        """How long an open circuit waits before its probe: what a deferred task waits."""
        return self.settings.breaker.cooldown_seconds

    def _state(self, key: str) -> dict[str, Any]:
        """``STATE``, from this process's copy when it was healthy and is under a second old."""
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
        if seen is not None and now - seen[0] < CACHE_SECONDS:
            return seen[1]
        state = plain(self.table.get(_state_key(key)) or {})
        healthy = state.get("state", "closed") == "closed" and not state.get("failures") and not state.get("slow_until")
        with self._lock:
            if healthy:
                self._seen[key] = (now, state)
            else:
                self._seen.pop(key, None)
        return state

    def _forget(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)

    # -------------------------------------------------------------- admission

    def admit(self, key: str, input_tokens: int, output_tokens: int, now: float | None = None) -> Admission:
        """Whether a call to ``key`` may go now (see ``core.flow``)."""
        now = time.time() if now is None else now
        state = self._state(key)
        slow_until = float(state.get("slow_until", 0))
        if now < slow_until:
            return Admission(ok=False, wait=slow_until - now, reason="slowed_down")
        breaker = self.settings.breaker
        status = state.get("state", "closed")
        if status == "open":
            reopen = float(state["opened_at"]) + breaker.cooldown_seconds
            if now < reopen:
                return Admission(ok=False, wait=reopen - now, reason="circuit_open")
            return self._probe(key, state, now, first=True)
        if status == "half_open":
            return self._probe(key, state, now, first=False)
        limits = self.settings.limits_for(key)
        taken: dict[str, int] = {}
        if limits is not None:
            wait, taken = self._take(key, limits, input_tokens, output_tokens, now)
            if wait > 0:
                return Admission(ok=False, wait=wait, reason="rate_limited")
        if not taken and not state.get("failures"):
            return ADMITTED
        return Admission(
            ok=True,
            reason="failures" if state.get("failures") else "",
            taken_input=taken.get("itpm", 0),
            taken_output=taken.get("otpm", 0),
        )

    def _probe(self, key: str, state: dict[str, Any], now: float, *, first: bool) -> Admission:
        """Half-open: take one of the probes, if one is left (or the last round's probes went
        silent for a cooldown: their workers died)."""
        breaker = self.settings.breaker
        if first:
            condition = Attr("state").eq("open") & Attr("opened_at").eq(state["opened_at"])
            update = Update(set={"state": "half_open", "probes": 1, "probing_since": now}, set_if_absent=_listed(key))
        else:
            stale = now - breaker.cooldown_seconds
            condition = Attr("state").eq("half_open") & (
                Attr("probes").lt(breaker.probes) | Attr("probing_since").lt(stale)
            )
            fresh = float(state.get("probing_since", 0)) < stale
            update = (
                Update(set={"probes": 1, "probing_since": now}, set_if_absent=_listed(key))
                if fresh
                else Update(add={"probes": 1}, set_if_absent=_listed(key))
            )
        try:
            self.table.update(_state_key(key), update, condition=condition)
        except ConditionFailed:
            return Admission(ok=False, wait=min(breaker.cooldown_seconds, 5.0), reason="circuit_open")
        log.info("circuit %s half-open: a probe goes through", key)
        return Admission(ok=True, reason="probe", probe=True)

    def _take(
        self, key: str, limits: RateLimits, input_tokens: int, output_tokens: int, now: float
    ) -> tuple[float, dict[str, int]]:
        """Take from each bucket: (0, what was taken per bucket), or the seconds to wait when one
        cannot give (what the buckets before it gave is given back: the call does not go)."""
        taken: dict[str, int] = {}
        for dimension, per_minute, wanted in (
            ("rpm", limits.rpm, 1),
            ("itpm", limits.itpm, input_tokens),
            ("otpm", limits.otpm, output_tokens),
        ):
            if per_minute is None:
                continue
            amount = min(wanted, per_minute)
            wait = self._take_one(key, dimension, per_minute, amount, now)
            if wait > 0:
                for given, back in taken.items():
                    self._give_back(key, given, back)
                return wait, {}
            taken[dimension] = amount
        return 0.0, taken

    def _take_one(self, key: str, dimension: str, per_minute: int, amount: int, now: float) -> float:
        rate = per_minute / MINUTE
        for _ in range(8):  # another executor took from it between the read and the write: read again
            item = plain(self.table.get(_bucket_key(key, dimension)) or {})
            at = item.get("at")
            level = per_minute if at is None else min(per_minute, float(item["tokens"]) + (now - float(at)) * rate)
            if level < amount:
                return (amount - level) / rate
            # Conditional on the version read: any write since (a take, a give-back) makes it fail
            # and read again, so no update is lost even when two executors' clocks give one `at`.
            version = int(item.get("v", 0))
            condition = (
                Attr("at").not_exists()
                if at is None
                else Attr("v").eq(version) | (Attr("v").not_exists() & Attr("at").eq(item["at"]))
            )
            try:
                self.table.update(
                    _bucket_key(key, dimension),
                    Update(
                        set={"tokens": _dec(level - amount), "at": _dec(max(now, float(at or 0))), "v": version + 1}
                    ),
                    condition=condition,
                )
                return 0.0
            except ConditionFailed:
                continue
        return 1.0

    def _give_back(self, key: str, dimension: str, amount: int) -> None:
        """Put ``amount`` back into a bucket (one atomic ADD; the next take caps the level at
        the limit, so a bucket given back while full holds no more than a full minute)."""
        if amount <= 0:
            return
        with contextlib.suppress(ConditionFailed):  # never taken from: nothing to give back
            self.table.update(
                _bucket_key(key, dimension), Update(add={"tokens": amount, "v": 1}), condition=Attr("at").exists()
            )

    def settle(self, key: str, admission: Admission, input_tokens: int, output_tokens: int) -> None:
        """An answered call gives back what it took and did not use: ``input_tokens`` and
        ``output_tokens`` as the provider counts them against its limits."""
        self._give_back(key, "itpm", admission.taken_input - input_tokens)
        self._give_back(key, "otpm", admission.taken_output - output_tokens)

    # -------------------------------------------------------------- outcomes

    def succeeded(self, key: str, admission: Admission) -> None:
        """A call went through: a probe closes the circuit; counted failures are forgotten."""
        if not (admission.probe or admission.reason == "failures"):
            return  # the common case: nothing to write
        self._forget(key)
        try:
            self.table.update(
                _state_key(key),
                Update(
                    set={"state": "closed", "failures": 0},
                    remove=["probes", "probing_since", "opened_at"],
                    set_if_absent=_listed(key),
                ),
                condition=Attr("state").ne("closed") | Attr("failures").gt(0),
            )
        except ConditionFailed:
            return
        if admission.probe:
            log.warning("circuit %s closed: a probe succeeded", key)
            observe.circuit_changed(key, "closed", {})

    def failed(self, key: str, admission: Admission, now: float | None = None) -> bool:
        """A call failed after its retries: counted; the circuit opens at the threshold (or at
        once, for a probe). Returns whether the circuit is open now."""
        now = time.time() if now is None else now
        breaker = self.settings.breaker
        self._forget(key)
        if admission.probe:
            self.table.update(
                _state_key(key),
                Update(set={"state": "open", "opened_at": _dec(now)}, remove=["probes"], set_if_absent=_listed(key)),
            )
            log.warning("circuit %s open again: a probe failed", key)
            observe.circuit_changed(key, "open", {"reason": "probe failed"})
            return True
        state = plain(self.table.get(_state_key(key)) or {})
        if state.get("state", "closed") != "closed":
            return True
        started = float(state.get("window_start", 0))
        try:
            if now - started > breaker.window_seconds:
                condition = Attr("window_start").not_exists() | Attr("window_start").eq(state.get("window_start"))
                self.table.update(
                    _state_key(key),
                    Update(set={"failures": 1, "window_start": _dec(now), "state": "closed"}, set_if_absent=_listed(key)),
                    condition=condition,
                )  # fmt: skip
                count = 1
            else:
                new = self.table.update(
                    _state_key(key), Update(add={"failures": 1}, set_if_absent=_listed(key)), returns="UPDATED_NEW"
                )
                count = int((new or {}).get("failures", 0))
        except ConditionFailed:
            return False  # another executor started the window: this failure is one of many
        if count < breaker.failures:
            return False
        try:
            self.table.update(
                _state_key(key),
                Update(set={"state": "open", "opened_at": _dec(now)}, set_if_absent=_listed(key)),
                condition=Attr("state").not_exists() | Attr("state").eq("closed"),
            )
        except ConditionFailed:
            return True  # opened by another executor
        log.warning("circuit %s open: %d failures within %.0fs", key, count, breaker.window_seconds)
        observe.circuit_changed(key, "open", {"failures": count, "window_seconds": breaker.window_seconds})
        return True

    def slow_down(self, key: str, seconds: float, now: float | None = None) -> None:
        """A 429 said when to come back: the whole fleet waits that long for this model."""
        self._forget(key)
        until = (time.time() if now is None else now) + seconds
        with contextlib.suppress(ConditionFailed):  # a later slow-down is already set
            self.table.update(
                _state_key(key),
                Update(set={"slow_until": _dec(until)}, set_if_absent=_listed(key)),
                condition=Attr("slow_until").not_exists() | Attr("slow_until").lt(_dec(until)),
            )

    def state(self, key: str) -> dict[str, Any]:
        return plain(self.table.get(_state_key(key)) or {})

    def breakers(self, *, page: int = 100) -> list[Breaker]:
        """Every provider/model whose flow state was ever written (a failure counted, a slow-down,
        a circuit opened or closed), by key: a Query of ``gsi1`` (each STATE write sets its
        ``gsi1pk = FLOWS`` if absent, at no extra write) and a BatchGetItem per ``page``, never
        a Scan. A model that never failed has no STATE and is not listed: its circuit is closed."""
        from agentq.resources import GSI1

        found: list[str] = []
        start: dict[str, Any] | None = None
        while True:
            listed = self.table.query_index(GSI1, ("gsi1pk", keys.FLOWS_INDEX_PK), descending=False, limit=page,
                                            start=start)  # fmt: skip
            found += [str(item["gsi1sk"]) for item in listed.items]
            if listed.last_key is None:
                break
            start = listed.last_key
        states: dict[str, dict[str, Any]] = {}
        for i in range(0, len(found), page):
            for item in self.table.batch_get([_state_key(k) for k in found[i : i + page]]):
                states[str(item["pk"]).removeprefix("FLOW#")] = plain(item)
        return [self._breaker(k, states.get(k, {})) for k in found]

    def _breaker(self, key: str, state: dict[str, Any]) -> Breaker:
        """What one STATE says, with what its times mean now under this deployment's settings."""
        status = str(state.get("state", "closed"))
        opened = float(state["opened_at"]) if state.get("opened_at") is not None else None
        slow = float(state.get("slow_until") or 0)
        window = state.get("window_start")
        return Breaker(
            key=key,
            state=status,
            failures=int(state.get("failures") or 0),
            window_started_at=float(window) if window is not None else None,
            opened_at=opened,
            probe_after=opened + self.settings.breaker.cooldown_seconds if opened is not None else None,
            slowed_until=slow or None,
        )


@dataclass(frozen=True)
class Breaker:
    """One model's circuit as the fleet shares it (``core.flow``): ``closed`` (with the failures
    counted in the current window), ``open`` (calls deferred until ``probe_after``) or
    ``half_open`` (a probe is out); ``slowed_until``: a 429's slow-down."""

    key: str  # provider/model
    state: str
    failures: int
    window_started_at: float | None
    opened_at: float | None
    probe_after: float | None
    slowed_until: float | None


def _dec(value: float) -> Any:
    from decimal import Decimal

    return Decimal(repr(round(value, 6)))
