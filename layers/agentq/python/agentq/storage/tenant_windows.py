"""Per-tenant hourly token windows: a hard cap that refuses new reservations, and a soft cap
(80% by default) that emits a metric and an event when a tenant crosses it.

A window is one item per tenant and clock hour (``TENANT#t`` / ``HOUR#2026112207``) holding
the tokens reserved or used in that hour. A hold is taken before each LLM call and settled to
the provider-reported usage after it, so the window counts exactly what was spent. A hold
left by a crashed worker stays until the hour rolls over: the window errs on refusing, never
on overspending. Tenants without limits cost one read per claim and nothing per call.

A money cap (``hourly_usd``) is the same window in millionths of a dollar (``held_usd``,
``used_usd``): the hold is the most the call can cost (the task's own money hold), settled to
its priced cost. Either cap refuses the hold.
"""

from __future__ import annotations

import time
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq import observe
from agentq.core.pricing import micros as to_micros
from agentq.core.tenancy import TenantCapReached, TenantLimits, WindowHold
from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Table, Update, plain

WINDOW_TTL_SECONDS = 3 * 24 * 3600


def hour_key(now: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(now))


def seconds_to_next_hour(now: float) -> int:
    return 3600 - int(now) % 3600 + 1


class TenantWindows:
    def __init__(self, table: Table, default: TenantLimits | None = None) -> None:
        """``default`` applies to tenants with no LIMITS item of their own (the deployment's
        ``budget_defaults.tenant_hourly_tokens``); None leaves them uncapped."""
        self.table = table
        self.default = default

    def with_default(self, default: TenantLimits | None) -> TenantWindows:
        return TenantWindows(self.table, default)

    def limits(self, tenant: str) -> TenantLimits | None:
        item = self.table.get({"pk": keys.tenant_pk(tenant), "sk": keys.LIMITS})
        if item is None:
            return self.default
        data = plain(item, keep_decimal=frozenset({"hourly_usd"}))
        return TenantLimits(
            hourly_tokens=data.get("hourly_tokens"), hourly_usd=data.get("hourly_usd"),
            soft_ratio=data.get("soft_ratio", 0.8),
        )  # fmt: skip

    def set_limits(self, tenant: str, limits: TenantLimits) -> None:
        self.table.put({"pk": keys.tenant_pk(tenant), "sk": keys.LIMITS, **limits.model_dump(exclude_none=True)})

    def _key(self, tenant: str, hour: str) -> dict[str, str]:
        return {"pk": keys.tenant_pk(tenant), "sk": keys.hour_sk(hour)}

    def usage(self, tenant: str, now: float | None = None) -> dict[str, int]:
        data = plain(self.table.get(self._key(tenant, hour_key(now or time.time()))) or {})
        return {"held": int(data.get("held", 0)), "used": int(data.get("used", 0))}

    def money_usage(self, tenant: str, now: float | None = None) -> dict[str, int]:
        """This hour's money window, in millionths of a dollar."""
        data = plain(self.table.get(self._key(tenant, hour_key(now or time.time()))) or {})
        return {"held": int(data.get("held_usd", 0)), "used": int(data.get("used_usd", 0))}

    def hold(
        self, tenant: str, limits: TenantLimits, amount: int, now: float | None = None, *, micros: int = 0
    ) -> WindowHold:
        now = now or time.time()
        hour = hour_key(now)
        condition: Any = None
        if limits.hourly_tokens is not None:
            condition = Attr("held").not_exists() | Attr("held").lte(limits.hourly_tokens - amount)
        if limits.hourly_usd is not None:
            money = Attr("held_usd").not_exists() | Attr("held_usd").lte(to_micros(limits.hourly_usd) - micros)
            condition = money if condition is None else condition & money
        try:
            new = self.table.update(
                self._key(tenant, hour),
                Update(add={"held": amount, "held_usd": micros}, set={"expires_at": int(now) + WINDOW_TTL_SECONDS}),
                condition=condition,
                returns="UPDATED_NEW",
            )
        except ConditionFailed:
            observe.record_budget_refusal("tenant")
            caps = [f"{limits.hourly_tokens} tokens" if limits.hourly_tokens is not None else "",
                    f"${limits.hourly_usd}" if limits.hourly_usd is not None else ""]  # fmt: skip
            raise TenantCapReached(
                f"tenant {tenant!r} reached its hourly cap of {' and '.join(c for c in caps if c)}",
                seconds_to_next_hour(now),
            ) from None
        held = int((new or {})["held"])
        if limits.hourly_tokens is None:
            return WindowHold(tenant, hour, amount, micros)
        soft = limits.hourly_tokens * limits.soft_ratio
        if held >= soft and self._first_crossing(tenant, hour):
            observe.tenant_soft_cap_crossed(tenant, held, limits.hourly_tokens)
        return WindowHold(tenant, hour, amount, micros)

    def _first_crossing(self, tenant: str, hour: str) -> bool:
        """Holds go up and settle down, so the line may be crossed many times: report once an hour."""
        try:
            self.table.update(
                self._key(tenant, hour),
                Update(set={"soft_reported": True}),
                condition=Attr("soft_reported").not_exists(),
            )
            return True
        except ConditionFailed:
            return False

    def settle(self, hold: WindowHold, used: int, used_micros: int = 0) -> None:
        """Replace the hold by the provider-reported usage and its priced cost (release it all
        with ``used=0``)."""
        self.table.update(
            self._key(hold.tenant, hold.hour),
            Update(add={
                "held": used - hold.amount, "used": used,
                "held_usd": used_micros - hold.micros, "used_usd": used_micros,
            }),
        )  # fmt: skip
