"""The caps of a tenant's scopes (``core.caps``) and the windows that enforce them.

A cap is one item, ``TENANT#t`` / ``CAP#<scope>#<name>``. What a scope spent is one item a UTC
day, ``TENANT#t`` / ``CAPUSE#<scope>#<name>#<YYYYMMDD>``, holding the day's counters
(``d_tokens``, ``d_usd``: held and spent, in tokens and millionths of a dollar; ``d_used``,
``d_used_usd``: settled) and each clock hour's beside them (``h07_tokens``, ...). An hour lies
within its day, so one conditional ``UpdateItem`` holds a call on both windows of a scope at
once, atomically: the condition is ``counter <= cap - need`` for every capped window (DynamoDB
conditions do no arithmetic, so the right side is computed here; an absent counter is 0).
That is the tenant windows' mechanism (``storage.tenant_windows``), kept exact: concurrent
holds are serialised by DynamoDB on the item, so no number of workers and sub-agents can take
the window past its cap, and the hold is settled to the provider-reported usage after the call
(by whoever learns it: a zombie's late answer settles its own hold). A hold left by a worker
that died mid-call stays counted until its window rolls over: the window errs on refusing.

A task spends against up to three scopes (its user, its agent, its key): one update each, in
that order; a refusal by a later one gives back the earlier ones' holds. A soft threshold is
the same condition at the soft line until the task was approved past it for that window
(``approved``).

A refusal's message says what the window holds ("at N tokens") only to whom that spend is their
own: the task's end user's token reads it (its view, events, A2A, MCP), and a window it shares
(its agent's, its key's) holds the other users' spend, which ``GET /usage`` keeps from a token.
So for a task of a user (``hold``'s ``user``) only its own user window's message names N.
"""

from __future__ import annotations

import time
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq import observe
from agentq.core.caps import (
    ALERT_RATIO,
    CapHold,
    CapLimits,
    CapLine,
    CapReached,
    Scope,
    ScopeCap,
    SoftCapReached,
    approval_id,
    day_key,
    hour_of_day,
    seconds_to_next,
)
from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Table, Update, plain

USE_TTL_SECONDS = 3 * 86400
HOLD_ATTEMPTS = 5  # a refusal whose snapshot shows room (a settle raced it) is tried again


def counter(window: str, metric: str, hour: str, *, used: bool = False) -> str:
    """The attribute of a window's counter: held and spent (``used=False``) or settled only."""
    where = "d" if window == "day" else f"h{hour}"
    return f"{where}_used" + ("_usd" if metric == "usd" else "") if used else f"{where}_{metric}"


class ScopeCaps:
    def __init__(self, table: Table) -> None:
        self.table = table

    # ------------------------------------------------------------------ the caps

    def put(self, tenant: str, scope: Scope, name: str, limits: CapLimits) -> None:
        item = {**keys.cap_key(tenant, scope, name), "scope": scope, "name": name, "updated_at": time.time()}
        self.table.put({**item, **limits.model_dump(exclude_none=True)})

    def delete(self, tenant: str, scope: Scope, name: str) -> bool:
        return self.table.delete(keys.cap_key(tenant, scope, name)) is not None

    def get(self, tenant: str, scope: Scope, name: str) -> ScopeCap | None:
        item = self.table.get(keys.cap_key(tenant, scope, name))
        return _cap(tenant, item) if item is not None else None

    def of_tenant(self, tenant: str) -> list[ScopeCap]:
        """Every cap of the tenant, by scope and name."""
        return [_cap(tenant, i) for i in self.table.query(keys.tenant_pk(tenant), prefix=keys.CAP)]

    def applicable(self, tenant: str, scopes: dict[Scope, str]) -> list[ScopeCap]:
        """The caps of ``scopes`` (a task's user, agent and key) that exist: one BatchGetItem,
        none without a scope. In the order user, agent, key (the order holds are taken in)."""
        if not scopes:
            return []
        found = {(i["scope"], i["name"]): _cap(tenant, i) for i in
                 self.table.batch_get([keys.cap_key(tenant, s, n) for s, n in scopes.items()])}  # fmt: skip
        return [found[(s, n)] for s, n in scopes.items() if (s, n) in found]

    # --------------------------------------------------------------- the windows

    def usage(self, tenant: str, scope: Scope, name: str, now: float | None = None) -> dict[str, int]:
        """This hour's and today's counters of a scope (held and spent; settled), in tokens and
        millionths of a dollar: ``hour_tokens``, ``hour_used``, ``day_usd``, ..."""
        now = time.time() if now is None else now
        hour = hour_of_day(now)
        data = plain(self.table.get(keys.cap_use_key(tenant, scope, name, day_key(now))) or {})
        out = {}
        for window in ("hour", "day"):
            for metric in ("tokens", "usd"):
                out[f"{window}_{metric}"] = int(data.get(counter(window, metric, hour), 0))
                out[f"{window}_used_{metric}"] = int(data.get(counter(window, metric, hour, used=True), 0))
        return out

    def hold(
        self,
        caps: list[ScopeCap],
        amount: int,
        *,
        micros: int = 0,
        approved: frozenset[str] = frozenset(),
        now: float | None = None,
        user: str | None = None,
    ) -> CapHold:
        """Hold ``amount`` tokens and ``micros`` on every window of ``caps``, or none of them:
        ``CapReached`` when a cap would be passed, ``SoftCapReached`` when a soft threshold
        would (unless its approval id is in ``approved``). ``user``: the end user the task acts
        for, who reads the refusal: a window of another scope is not measured in it."""
        now = time.time() if now is None else now
        day, hour = day_key(now), hour_of_day(now)
        taken: list[ScopeCap] = []
        try:
            for cap in caps:
                shown = user is None or (cap.scope, cap.name) == ("user", user)
                self._hold_one(cap, amount, micros, day, hour, approved, now, shown)
                taken.append(cap)
        except (CapReached, SoftCapReached):
            for cap in taken:  # give back what the earlier scopes held: the call does not go
                self._add(cap.tenant, cap.scope, cap.name, day, hour, -amount, -micros, 0, 0)
            raise
        tenant = caps[0].tenant if caps else ""
        return CapHold(tenant, tuple((c.scope, c.name) for c in caps), day, hour, amount, micros)

    def settle(self, hold: CapHold, used: int, used_micros: int = 0) -> None:
        """Replace the hold by what its call used (``used=0``: give it all back), on each scope."""
        for scope, name in hold.scopes:
            self._add(hold.tenant, scope, name, hold.day, hold.hour, used - hold.amount,
                      used_micros - hold.micros, used, used_micros)  # fmt: skip

    def _add(
        self, tenant: str, scope: str, name: str, day: str, hour: str, tokens: int, micros: int, used: int,
        used_micros: int,
    ) -> None:  # fmt: skip
        add: dict[str, int] = {}
        for window in ("hour", "day"):
            add[counter(window, "tokens", hour)] = tokens
            add[counter(window, "usd", hour)] = micros
            if used or used_micros:
                add[counter(window, "tokens", hour, used=True)] = used
                add[counter(window, "usd", hour, used=True)] = used_micros
        self.table.update(keys.cap_use_key(tenant, scope, name, day), Update(add=add))

    def _hold_one(
        self, cap: ScopeCap, amount: int, micros: int, day: str, hour: str, approved: frozenset[str], now: float,
        shown: bool,
    ) -> None:  # fmt: skip
        need = {"tokens": amount, "usd": micros}
        lines = cap.limits.lines()
        period = {"hour": day + hour, "day": day}

        def soft_active(line: CapLine) -> bool:
            return line.soft is not None and approval_id(cap.scope, line.window, period[line.window]) not in approved

        condition: Any = None
        for line in lines:
            limit = line.cap if line.soft is None or not soft_active(line) else line.soft
            if need[line.metric] > limit:  # not even an empty window takes it
                self._refuse(cap, line, 0 if shown else None, need[line.metric], soft_active(line), period, now)
            name = counter(line.window, line.metric, hour)
            fits = Attr(name).not_exists() | Attr(name).lte(limit - need[line.metric])
            condition = fits if condition is None else condition & fits
        update = Update(
            add={counter(w, m, hour): need[m] for w in ("hour", "day") for m in ("tokens", "usd")},
            set={"expires_at": int(now) + USE_TTL_SECONDS},
        )
        key = keys.cap_use_key(cap.tenant, cap.scope, cap.name, day)
        for _ in range(HOLD_ATTEMPTS):
            try:
                new = plain(self.table.update(key, update, condition=condition, returns="UPDATED_NEW") or {})
            except ConditionFailed as exc:
                old = plain(exc.old or {})
                for soft in (False, True):  # a cap before its soft threshold: no point asking
                    for line in lines:
                        if soft and not soft_active(line):
                            continue
                        limit = line.cap if not soft or line.soft is None else line.soft
                        was = int(old.get(counter(line.window, line.metric, hour), 0))
                        if was + need[line.metric] > limit:
                            self._refuse(cap, line, was if shown else None, need[line.metric], soft, period, now)
                continue  # a settle freed room since the refusal: try again
            self._alert(cap, lines, new, hour, day)
            return
        raise CapReached(f"{cap.scope} {cap.name!r}: its window is too busy to hold on", 1, cap.scope, "hour")

    def _refuse(
        self, cap: ScopeCap, line: CapLine, was: int | None, need: int, soft: bool, period: dict[str, str], now: float
    ) -> None:
        """Raise the refusal; ``was`` (what the window holds) None: not said (the module says why)."""

        def unit(v: int) -> str:
            return f"${v / 1_000_000:.6f}" if line.metric == "usd" else f"{v} tokens"

        per = "an hour" if line.window == "hour" else "a day"
        at = f"at {unit(was)}, " if was is not None else ""
        if soft:
            assert line.soft is not None
            raise SoftCapReached(
                f"{cap.scope} {cap.name!r} would pass its soft threshold of {unit(line.soft)} {per} "
                f"({at}this call holds {unit(need)}): a person's approval lets it go on",
                cap.scope, line.window, period[line.window],
            )  # fmt: skip
        observe.record_budget_refusal("cap")
        if need > line.cap:  # no roll-over lets it through: say so, or it waits in silence for ever
            raise CapReached(
                f"{cap.scope} {cap.name!r}: this call holds {unit(need)}, more than its cap of {unit(line.cap)} "
                f"{per}: it can never run under it (raise the cap, or lower the task's max_output_tokens); "
                "it waits for a raise",
                seconds_to_next(line.window, now), cap.scope, line.window,
            )  # fmt: skip
        raise CapReached(
            f"{cap.scope} {cap.name!r} reached its cap of {unit(line.cap)} {per} ({at}this call holds {unit(need)})",
            seconds_to_next(line.window, now), cap.scope, line.window,
        )  # fmt: skip

    def _alert(self, cap: ScopeCap, lines: list[CapLine], new: dict[str, Any], hour: str, day: str) -> None:
        """Tell the metrics once a window when it crosses ``ALERT_RATIO`` of a cap."""
        for line in lines:
            value = int(new.get(counter(line.window, line.metric, hour), 0))
            if line.cap <= 0 or value < ALERT_RATIO * line.cap:
                continue
            flag = f"alerted_{line.window}_{line.metric}" + (f"_{hour}" if line.window == "hour" else "")
            try:
                self.table.update(
                    keys.cap_use_key(cap.tenant, cap.scope, cap.name, day),
                    Update(set={flag: True}),
                    condition=Attr(flag).not_exists(),
                )
            except ConditionFailed:
                continue  # told already this window
            observe.scope_cap_crossed(cap.tenant, cap.scope, cap.name, line.window, line.metric, value, line.cap)


def _cap(tenant: str, item: dict[str, Any]) -> ScopeCap:
    data = plain(item, keep_decimal=frozenset({"hourly_usd", "daily_usd", "soft_hourly_usd", "soft_daily_usd"}))
    limits = CapLimits.model_validate({k: v for k, v in data.items() if k in CapLimits.model_fields})
    return ScopeCap(tenant, data["scope"], data["name"], limits)
