"""The budget's writes as patches: what each settlement, spend or correction adds to a META's
budget attributes, and the conditions that keep ``used <= cap`` (``storage.budgets`` has the
invariants and applies them; ``storage.steps`` and ``storage.spawns`` put them in their own
transactions). Pure functions of their arguments: no reads, no writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq.core.pricing import dollars
from agentq.core.records import BudgetDelta, Reservation
from agentq.storage import keys
from agentq.storage.budget_items import SETTLED
from agentq.storage.table import Patch, Update

BUDGET = "budget"  # the action name of a budget write in a transaction


def settle_and_reserve(budget_id: str, delta: BudgetDelta, reserve_next: int, reserve_next_micros: int = 0) -> Patch:
    """Settle a reservation (``reserved - est``, ``used + actual``, in tokens and in dollars)
    and optionally reserve anew, refused unless the budget can cover what the new hold adds
    beyond what the old one frees, in both."""
    used_micros = delta.used_micros
    update = Update(
        add={
            "reserved": reserve_next - delta.reserved,
            "used": delta.used,
            "available": delta.reserved - delta.used - reserve_next,
            "usd_reserved": reserve_next_micros - delta.reserved_micros,
            "usd_used": used_micros,
            "usd_available": delta.reserved_micros - used_micros - reserve_next_micros,
            "budget_cost_usd": delta.cost_usd,
            "budget_tokens_in": delta.tokens_in,
            "budget_tokens_out": delta.tokens_out,
        }
    )
    condition = None
    if reserve_next:
        condition = Attr("available").gte(reserve_next - (delta.reserved - delta.used)) & money_covers(
            reserve_next_micros - (delta.reserved_micros - used_micros)
        )
    return Patch(BUDGET, keys.meta_key(budget_id), update, condition)


def correction(delta: BudgetDelta, seen: Reservation | None = None) -> dict[str, Any]:
    """What turns a hold already counted in ``used`` (spent at its deadline, or folded into a
    parent) into the call's real usage: ``used`` takes ``actual - hold``, ``available`` the rest,
    and the hold leaves ``unknown``: its outcome is known now. ``seen``: the spent hold, with
    what was counted as known when it was spent (``Reservation.seen``), taken back out here."""
    seen_in, seen_out, seen_micros = (seen.seen_in, seen.seen_out, seen.seen_micros) if seen else (0, 0, 0)
    return {
        "used": delta.used - delta.reserved,
        "available": delta.reserved - delta.used,
        "unknown": -(delta.reserved - seen_in - seen_out),
        "usd_used": delta.used_micros - delta.reserved_micros,
        "usd_available": delta.reserved_micros - delta.used_micros,
        "usd_unknown": -(delta.reserved_micros - seen_micros),
        "budget_cost_usd": delta.cost_usd - dollars(seen_micros),
        "budget_tokens_in": delta.tokens_in - seen_in,
        "budget_tokens_out": delta.tokens_out - seen_out,
    }


def seen_as_known(held: Reservation) -> dict[str, Any]:
    """What a spent hold's call was seen to bill, moved from unknown to the tree's known spend."""
    return {
        "unknown": -held.seen,
        "usd_unknown": -held.seen_micros,
        "budget_tokens_in": held.seen_in,
        "budget_tokens_out": held.seen_out,
        "budget_cost_usd": dollars(held.seen_micros),
    }


def unless_folded(ticket: Patch) -> Patch:
    return Patch(ticket.name, ticket.key, ticket.update, both_conditions(ticket.condition, Attr(SETTLED).not_exists()))


def if_folded(ticket: Patch) -> Patch:
    return Patch(ticket.name, ticket.key, ticket.update, both_conditions(ticket.condition, Attr(SETTLED).exists()))


def summed(*adds: Mapping[str, Any]) -> dict[str, Any]:
    """ADD maps merged, amounts of one attribute summed."""
    out: dict[str, Any] = {}
    for add in adds:
        for name, amount in add.items():
            out[name] = out.get(name, 0) + amount
    return out


def money_covers(micros: int) -> Any:
    return Attr("usd_available").gte(micros) | Attr("usd_available").not_exists()


def both_conditions(condition: Any, more: Any) -> Any:
    return more if condition is None else condition & more
