"""Flow control shared by the whole fleet, per provider and model: the settings and the
answer every call asks for first (``storage.flow`` keeps the shared state).

- **Circuit breaker.** ``failures`` failed calls (each after its own retries) within
  ``window_seconds`` open the circuit; while open, tasks are deferred (a delayed message, no
  receive spent toward the DLQ), not failed. After ``cooldown_seconds`` up to ``probes`` calls
  go through (half-open); one success closes it, a failure opens it again. The provider sees
  only the probes during an outage.
- **Slow-down.** A 429 with ``retry-after`` makes the whole fleet wait that long for that model.
- **Rate limits.** Token buckets (requests, input tokens, output tokens per minute: the shape
  providers enforce per organisation), taken before each call; an empty bucket defers the task.
  A call takes what it may use at the most (its input estimate, its whole output allowance),
  so no burst can go past a limit; once answered it gives back what it did not use (input as
  the provider counts it against the limit: uncached and cache-write tokens, not cache reads),
  so the fleet is not held to the allowance when the answers are short.

Settings: ``AGENTQ_BREAKER`` (JSON: failures, window_seconds, cooldown_seconds, probes) and
``AGENTQ_RATE_LIMITS`` (JSON: ``{"anthropic/claude-sonnet-4": {"rpm": 50, "itpm": 30000,
"otpm": 8000}}``, the longest matching ``provider/model`` prefix).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pydantic
from pydantic import BaseModel, ConfigDict, Field


class BreakerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    failures: int = Field(default=5, ge=1, le=10_000, description="failed calls within the window that open it")
    window_seconds: float = Field(default=60, gt=0, le=86_400)
    cooldown_seconds: float = Field(default=30, gt=0, le=86_400, description="open this long before probing")
    probes: int = Field(default=1, ge=1, le=100, description="calls let through while half-open")


class RateLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, gt=0, description="requests per minute")
    itpm: int | None = Field(default=None, gt=0, description="input tokens per minute")
    otpm: int | None = Field(default=None, gt=0, description="output tokens per minute")


class FlowSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    limits: dict[str, RateLimits] = Field(default_factory=dict)

    @classmethod
    def from_env(cls) -> FlowSettings:
        """``AGENTQ_BREAKER`` and ``AGENTQ_RATE_LIMITS``; a bad one is a ValueError naming it."""
        values: dict[str, object] = {}
        for variable, field in (("AGENTQ_BREAKER", "breaker"), ("AGENTQ_RATE_LIMITS", "limits")):
            raw = os.environ.get(variable, "").strip()
            if not raw:
                continue
            try:
                values[field] = json.loads(raw)
                cls.model_validate({field: values[field]})
            except pydantic.ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"][1:])
                raise ValueError(
                    f"{variable}: {where + ': ' if where else ''}{first['msg']} (got {raw[:200]!r})"
                ) from None
            except ValueError as exc:
                raise ValueError(f"{variable}: not JSON: {exc} (got {raw[:200]!r})") from None
        return cls.model_validate(values)

    def limits_for(self, key: str) -> RateLimits | None:
        best = max((k for k in self.limits if key.startswith(k)), key=len, default=None)
        return self.limits[best] if best is not None else None


def flow_key(provider: str, model: str) -> str:
    return f"{provider}/{model}"


@dataclass(frozen=True)
class Admission:
    """May the call go now? If not, ``wait`` seconds and ``reason`` (circuit_open,
    rate_limited, slowed_down). ``probe``: it goes as a half-open probe."""

    ok: bool
    wait: float = 0.0
    reason: str = ""
    probe: bool = False
    taken_input: int = 0  # taken from the input-token bucket (0: none is configured)
    taken_output: int = 0  # taken from the output-token bucket


ADMITTED = Admission(ok=True)
