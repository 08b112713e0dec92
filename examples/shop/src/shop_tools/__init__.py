"""A shop's tools for agentq: ``lookup_order`` reads, ``refund_order`` changes the world.

The module convention (docs/TOOLS.md): ``@tool`` functions, listed in ``TOOLS``. agentq builds
each input schema from the type hints and runs a side-effecting tool at most once per call.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from pydantic import Field

from agentq import ToolContext, tool

# A stand-in for the shop's order database.
ORDERS: dict[str, dict[str, Any]] = {
    "17": {"customer": "ada@example.com", "total_cents": 4200, "status": "delivered"},
    "18": {"customer": "grace@example.com", "total_cents": 1999, "status": "shipped"},
}


@tool
def lookup_order(
    order_id: Annotated[str, Field(pattern=r"^[0-9]{1,10}$", description="the order number")],
) -> dict[str, Any]:
    """An order's customer, total (in cents) and status."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ValueError(f"no order {order_id}")
    return {"order_id": order_id, **order}


@tool(side_effects=True, timeout_seconds=20)
def refund_order(
    order_id: Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
    amount_cents: Annotated[int, Field(ge=1, le=1_000_000)],
    reason: Annotated[str, Field(max_length=500)],
    ctx: ToolContext,
) -> str:
    """Refund (part of) an order to the customer's card. Each call refunds once."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ValueError(f"no order {order_id}")
    if amount_cents > order["total_cents"]:
        raise ValueError(f"order {order_id} totals {order['total_cents']} cents; refund at most that")
    # The payments API key: Secrets Manager in AWS, $AGENTQ_SECRET_SHOP_API_KEY locally; the
    # model never sees it. A real shop sends ctx.idempotency_key as the Idempotency-Key, so a
    # retry by a person after an unknown outcome cannot refund twice.
    api_key = ctx.secret("shop-api-key")
    ledger = os.environ.get("SHOP_REFUND_LEDGER")  # where this example records its refunds
    if ledger:
        with open(ledger, "a") as out:
            record = {"order_id": order_id, "amount_cents": amount_cents, "key": ctx.idempotency_key}
            out.write(json.dumps({**record, "authenticated": bool(api_key)}) + "\n")
    return f"refunded {amount_cents} cents on order {order_id} to {order['customer']} (ref {ctx.idempotency_key[:12]})"


TOOLS = [lookup_order, refund_order]
