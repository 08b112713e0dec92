"""Schedules: a submission run on a cron or rate expression, as EventBridge Scheduler writes
them (``cron(0 9 ? * MON-FRI *)``, ``rate(15 minutes)``), so the same definition works in AWS
(a Scheduler schedule the API creates) and in ``agentq dev`` (a thread that fires what is due).

One task per fire time: its id is derived from the schedule and the fire time, so a fire that is
delivered twice (a retried message, two local loops) creates it once. The overlap policy decides
what a fire does while the previous run is live: ``skip`` (the default) or ``allow``.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from agentq.core.models import StrictModel

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
_RATE = re.compile(r"rate\(([0-9]{1,6}) (minute|minutes|hour|hours|day|days)\)")  # fullmatch, ASCII digits
_CRON = re.compile(r"cron\((.+)\)")
EXPRESSION_PATTERN = r"^(rate\([0-9]{1,6} (minute|minutes|hour|hours|day|days)\)|cron\([^()]+\))$"
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


class ScheduleSpec(StrictModel):
    name: str = Field(pattern=NAME_PATTERN, description="unique among the tenant's schedules")
    expression: str = Field(
        max_length=256,
        # Documented, not validated here: next_fire refuses with what is wrong (a field, a count).
        json_schema_extra={"pattern": EXPRESSION_PATTERN},
        description="cron(min hour day-of-month month day-of-week year) or rate(N minutes|hours|days), UTC",
    )
    submission: dict[str, Any] = Field(description="the task each fire submits (a POST /tasks body)")
    overlap: Literal["skip", "allow"] = Field(
        default="skip", description="skip: no new task while the previous one is live; allow: always submit"
    )

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, expression: str) -> str:
        next_fire(expression, 0.0)  # raises ValueError naming what is wrong
        return expression


def next_fire(expression: str, after: float) -> float:
    """The first fire time strictly after ``after`` (seconds since the epoch, UTC)."""
    rate = _RATE.fullmatch(expression)
    if rate is not None:
        count, unit = int(rate[1]), rate[2].rstrip("s")
        if count < 1:
            raise ValueError("rate(): the value must be at least 1")
        if (count != 1 and not rate[2].endswith("s")) or (count == 1 and rate[2].endswith("s")):
            raise ValueError(f"rate(): say 'rate(1 {unit})' or 'rate(N {unit}s)'")
        period = count * _UNIT_SECONDS[unit]
        return (int(after // period) + 1) * period
    cron = _CRON.fullmatch(expression)
    if cron is None:
        raise ValueError("expected cron(...) or rate(N minutes|hours|days)")
    from croniter import CroniterBadDateError, croniter

    spec = _croniter_fields(cron[1])
    start = datetime.fromtimestamp(after, UTC)
    try:
        return float(croniter(spec, start).get_next(float))
    except CroniterBadDateError:  # croniter's own words: "failed to find next date"
        raise ValueError(
            f"cron(): no date matches {cron[1]!r} (such as the 31st of February): it never fires"
        ) from None


def last_fire(expression: str, at: float) -> float:
    """The latest fire time at or before ``at``: the fire time that stands for every one a
    backlog holds up to ``at`` (``control.schedules.fire`` coalesces them into it)."""
    following = next_fire(expression, at)
    rate = _RATE.fullmatch(expression)
    if rate is not None:
        return following - int(rate[1]) * _UNIT_SECONDS[rate[2].rstrip("s")]
    from croniter import croniter

    cron = _CRON.fullmatch(expression)
    assert cron is not None  # next_fire refused anything else
    return float(croniter(_croniter_fields(cron[1]), datetime.fromtimestamp(following, UTC)).get_prev(float))


def _croniter_fields(body: str) -> str:
    """EventBridge's six fields (with ``?`` and a year, day-of-week 1-7 from Sunday) as
    croniter's five (day-of-week 0-6 from Sunday)."""
    from croniter import croniter

    fields = body.split()
    if len(fields) != 6:
        raise ValueError("cron(): six fields: minutes hours day-of-month month day-of-week year")
    minutes, hours, dom, month, dow, year = fields
    if year not in ("*", "?"):
        raise ValueError(f"cron(): the year must be '*' (a schedule here fires every year), not {year!r}")
    if "?" not in (dom, dow):
        raise ValueError("cron(): one of day-of-month and day-of-week must be '?'")
    # Every day number moves down one; the count after '#' (``3#2``: the second Tuesday) is no day.
    dow = re.sub(r"(?<![#\d])\d+", lambda m: str((int(m[0]) - 1) % 7), dow.replace("?", "*"))
    spec = " ".join([minutes, hours, dom.replace("?", "*"), month, dow])
    if not croniter.is_valid(spec):
        raise ValueError(f"cron(): not a valid expression: {body!r}")
    return spec


def fire_task_id(tenant: str, name: str, fire_time: float) -> str:
    """The task a fire creates: the same for a repeated delivery of the same fire."""
    return hashlib.sha256(f"schedule/{tenant}/{name}/{int(fire_time)}".encode()).hexdigest()[:32]
