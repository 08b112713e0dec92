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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn

from pydantic import Field, ValidationInfo, field_validator

from agentq.core.models import StrictModel

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
_RATE = re.compile(r"rate\(([0-9]{1,6}) (minute|minutes|hour|hours|day|days)\)")  # fullmatch, ASCII digits
_CRON = re.compile(r"cron\((.+)\)")
EXPRESSION_PATTERN = r"^(rate\([0-9]{1,6} (minute|minutes|hour|hours|day|days)\)|cron\([^()]+\))$"
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


STORED = "stored"  # the validation context of a spec read back from the store


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
    def _valid_expression(cls, expression: str, info: ValidationInfo) -> str:
        """Checked where a schedule is made or replaced; not where a stored one is read
        (``STORED``): one stored before the check grew stricter must still be listed, shown and
        deleted, and a fire of it is counted failed, naming what is wrong (``control.schedules``)."""
        if not (info.context or {}).get(STORED):
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
    croniter's five (day-of-week 0-6 from Sunday), each checked against EventBridge's grammar
    first (``_Field``): croniter reads more than EventBridge takes (a day of week 0 or 8, a step
    of 0, its random ``R`` and hashed ``H``, several '#' terms), and what EventBridge refuses
    must be refused here, or in AWS the schedule cannot be made and locally it fires on days
    nobody meant."""
    from croniter import croniter

    fields = body.upper().split()  # EventBridge, as Quartz, reads names in any case
    if len(fields) != 6:
        raise ValueError("cron(): six fields: minutes hours day-of-month month day-of-week year")
    minutes, hours, dom, month, dow, year = fields
    if year != "*":
        raise ValueError(f"cron(): the year must be '*' (a schedule here fires every year), not {year!r}")
    if (dom == "?") == (dow == "?"):
        raise ValueError("cron(): one of day-of-month and day-of-week must be '?', and only one")
    spec = " ".join([
        _MINUTES.croniter(minutes), _HOURS.croniter(hours), "*" if dom == "?" else _DAY_OF_MONTH.croniter(dom),
        _MONTH.croniter(month), "*" if dow == "?" else _DAY_OF_WEEK.croniter(dow),
    ])  # fmt: skip
    if not croniter.is_valid(spec):  # a backstop: the grammar above should leave nothing it refuses
        raise ValueError(f"cron(): not a valid expression: {body!r}")
    return spec


_NUMBER = re.compile(r"[0-9]{1,4}")  # ASCII digits only ('²' is a digit to str.isdigit)
_MONTHS = {m: i for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(), start=1)}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split(), start=1)}


@dataclass(frozen=True)
class _Field:
    """One field of EventBridge's cron grammar (docs: EventBridge, "Cron expressions
    reference"): a comma list of ``*``, a value, or a range ``a-b`` (low to high), each with an
    optional step ``/n`` (1 to the field's top) where the field takes ``/``; day-of-month also
    ``L`` (the last day) and ``nW`` (the weekday nearest the nth), day-of-week ``L`` (Saturday),
    ``dL`` (the month's last such day) and ``d#n`` (its nth, n 1-5), each the field's only term.
    ``shift``: what croniter's number is less than EventBridge's (day-of-week: 1, Sunday 1 there
    and 0 in croniter)."""

    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)
    steps: bool = True
    specials: str = ""  # of "LW#": the wildcards this field takes beyond ", - * /"
    shift: int = 0

    def croniter(self, text: str) -> str:
        """``text``, checked, as croniter's field; a ValueError naming the field and the term."""
        terms = text.split(",")
        if self.specials and any("#" in t or t.endswith(("L", "W")) for t in terms):  # no day's name ends so
            if len(terms) != 1:
                self._refuse(text, "'L', 'W' and '#' stand alone in a field, not in a list")
            return self._special(text)
        return ",".join(self._term(t) for t in terms)

    def _term(self, term: str) -> str:
        base, slash, step = term.partition("/")
        if slash and not self.steps:
            self._refuse(term, "this field takes no '/'")
        if slash and not (_NUMBER.fullmatch(step) and 1 <= int(step) <= self.high):
            self._refuse(term, f"a step is 1-{self.high}")
        low, dash, high = base.partition("-")
        if base == "*":
            out = "*"
        elif dash:
            first, last = self._value(term, low), self._value(term, high)
            if first > last:
                self._refuse(term, "a range runs from low to high")
            out = f"{first - self.shift}-{last - self.shift}"
        else:
            out = str(self._value(term, base) - self.shift)
        return f"{out}/{int(step)}" if slash else out

    def _special(self, term: str) -> str:
        if "L" in self.specials and term == "L":
            return "L" if self.name == "day-of-month" else "6"  # the week's last day: Saturday
        if "W" in self.specials and term.endswith("W"):
            return f"{self._value(term, term[:-1])}W"
        if "#" in self.specials and "#" in term:
            day, _, nth = term.partition("#")
            if not (_NUMBER.fullmatch(nth) and 1 <= int(nth) <= 5):
                self._refuse(term, "the n of 'd#n' is 1-5 (the nth such day of the month)")
            return f"{self._value(term, day) - self.shift}#{int(nth)}"
        if "L" in self.specials and term.endswith("L") and self.name == "day-of-week":
            return f"L{self._value(term, term[:-1]) - self.shift}"
        return self._refuse(term, "not a term of this field")

    def _value(self, term: str, text: str) -> int:
        value = int(text) if _NUMBER.fullmatch(text) else self.names.get(text)
        if value is None or not self.low <= value <= self.high:
            named = sorted(self.names, key=self.names.__getitem__)
            spelled = f" or {named[0]}-{named[-1]}" if named else ""
            first = f" ({self.low} is {named[0]})" if named and self.shift else ""  # 1 is SUN, not MON
            return self._refuse(term, f"a value is {self.low}-{self.high}{first}{spelled}")
        return value

    def _refuse(self, term: str, why: str) -> NoReturn:
        raise ValueError(f"cron(): {self.name} {term!r}: {why}")


_MINUTES = _Field("minutes", 0, 59)
_HOURS = _Field("hours", 0, 23)
_DAY_OF_MONTH = _Field("day-of-month", 1, 31, specials="LW")
_MONTH = _Field("month", 1, 12, _MONTHS)
_DAY_OF_WEEK = _Field("day-of-week", 1, 7, _DAYS, steps=False, specials="L#", shift=1)


def fire_task_id(tenant: str, name: str, fire_time: float) -> str:
    """The task a fire creates: the same for a repeated delivery of the same fire."""
    return hashlib.sha256(f"schedule/{tenant}/{name}/{int(fire_time)}".encode()).hexdigest()[:32]
