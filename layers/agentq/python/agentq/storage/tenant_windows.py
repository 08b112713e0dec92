"""Per-tenant hourly token windows: a hard cap that refuses new reservations, and a soft cap
(80% by default) that emits a metric and an event when a tenant crosses it.

A window is one item per tenant and clock hour (``TENANT#t`` / ``HOUR#2026112207``) holding
the tokens reserved or used in that hour. A hold is taken before each LLM call and settled to
the provider-reported usage after it, so the window counts exactly what was spent. A hold
left by a crashed worker stays until the hour rolls over: the window errs on refusing, never
on overspending. Tenants without limits cost one read per claim and nothing per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from agentq import observe
from agentq.core.errors import AgentqError
from agentq.storage.serdes import from_item, to_item, to_values

WINDOW_TTL_SECONDS = 3 * 24 * 3600


class TenantLimits(BaseModel):
    hourly_tokens: int = Field(ge=1)
    soft_ratio: float = Field(default=0.8, gt=0, le=1)


class TenantCapReached(AgentqError):
    code = "tenant_hourly_cap"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class WindowHold:
    tenant: str
    hour: str
    amount: int


def hour_key(now: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(now))


def seconds_to_next_hour(now: float) -> int:
    return 3600 - int(now) % 3600 + 1


class TenantWindows:
    def __init__(self, ddb: Any, table: str, default: TenantLimits | None = None) -> None:
        """``default`` applies to tenants with no LIMITS item of their own (the deployment's
        ``budget_defaults.tenant_hourly_tokens``); None leaves them uncapped."""
        self.ddb = ddb
        self.table = table
        self.default = default

    def limits(self, tenant: str) -> TenantLimits | None:
        resp = self.ddb.get_item(TableName=self.table, Key=to_item({"pk": f"TENANT#{tenant}", "sk": "LIMITS"}))
        if "Item" not in resp:
            return self.default
        data = from_item(resp["Item"])
        return TenantLimits(hourly_tokens=data["hourly_tokens"], soft_ratio=data.get("soft_ratio", 0.8))

    def set_limits(self, tenant: str, limits: TenantLimits) -> None:
        self.ddb.put_item(
            TableName=self.table,
            Item=to_item({"pk": f"TENANT#{tenant}", "sk": "LIMITS", **limits.model_dump()}),
        )

    def usage(self, tenant: str, now: float | None = None) -> dict[str, int]:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": f"TENANT#{tenant}", "sk": f"HOUR#{hour_key(now or time.time())}"}), ConsistentRead=True
        )
        data = from_item(resp.get("Item", {}))
        return {"held": int(data.get("held", 0)), "used": int(data.get("used", 0))}

    def hold(self, tenant: str, limits: TenantLimits, amount: int, now: float | None = None) -> WindowHold:
        now = now or time.time()
        hour = hour_key(now)
        try:
            resp = self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": f"TENANT#{tenant}", "sk": f"HOUR#{hour}"}),
                UpdateExpression="SET held = if_not_exists(held, :zero) + :amount, expires_at = :ttl",
                ConditionExpression="attribute_not_exists(held) OR held <= :limit",
                ExpressionAttributeValues=to_values(
                    {":zero": 0, ":amount": amount, ":limit": limits.hourly_tokens - amount, ":ttl": int(now) + WINDOW_TTL_SECONDS}
                ),
                ReturnValues="UPDATED_NEW",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            observe.record_budget_refusal("tenant")
            raise TenantCapReached(
                f"tenant {tenant!r} reached its hourly cap of {limits.hourly_tokens} tokens", seconds_to_next_hour(now)
            ) from None
        held = int(from_item(resp["Attributes"])["held"])
        soft = limits.hourly_tokens * limits.soft_ratio
        if held >= soft and self._first_crossing(tenant, hour):
            observe.tenant_soft_cap_crossed(tenant, held, limits.hourly_tokens)
        return WindowHold(tenant, hour, amount)

    def _first_crossing(self, tenant: str, hour: str) -> bool:
        """Holds go up and settle down, so the line may be crossed many times: report once an hour."""
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": f"TENANT#{tenant}", "sk": f"HOUR#{hour}"}),
                UpdateExpression="SET soft_reported = :true",
                ConditionExpression="attribute_not_exists(soft_reported)",
                ExpressionAttributeValues=to_values({":true": True}),
            )
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise

    def settle(self, hold: WindowHold, used: int) -> None:
        """Replace the hold by the provider-reported usage (release it all with ``used=0``)."""
        self.ddb.update_item(
            TableName=self.table,
            Key=to_item({"pk": f"TENANT#{hold.tenant}", "sk": f"HOUR#{hold.hour}"}),
            UpdateExpression="SET held = held - :back, used = if_not_exists(used, :zero) + :used",
            ExpressionAttributeValues=to_values({":back": hold.amount - used, ":used": used, ":zero": 0}),
        )
