"""Where a correction of a folded task's hold goes: up the folds.

``Budgets.settle_child`` folds a child's ``used + reserved`` into its parent, and the parent's
into its own when that one is folded in turn: a hold still out at a fold is counted, whole, in
every budget above it the folds reached. When its call is reported (or what it was seen to bill
is made known), the same correction is due at each of them, in the write that settles the
hold (``Budgets._up_the_folds``). Here: reading that line of ancestors, and its patches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq.core.models import MAX_DEPTH
from agentq.storage import keys
from agentq.storage.budget_items import SETTLED
from agentq.storage.table import Patch, Table, Update, plain, present

ANCESTOR = "ancestor"  # ``ancestor<i>``: the actions of a transaction correcting a folded task's ancestors


def folded_line(table: Table, parent_id: str) -> list[tuple[str, bool]]:
    """``parent_id`` and its ancestors, each with whether it was folded into its own parent, up
    to the first that was not (a root never is): one read each, at most ``MAX_DEPTH`` + 1. One
    purged is left out, and what is above it: there is no ledger left there to correct."""
    line: list[tuple[str, bool]] = []
    ancestor: str | None = parent_id
    while ancestor is not None and len(line) <= MAX_DEPTH:
        meta = plain(table.get(keys.meta_key(ancestor)) or {})
        if not meta:
            break
        folded = SETTLED in meta and meta.get("parent_id") is not None
        line.append((ancestor, folded))
        ancestor = str(meta["parent_id"]) if folded else None
    return line


def ancestor_fixes(line: list[tuple[str, bool]], add: Mapping[str, Any]) -> list[Patch]:
    """``add`` on each budget of ``line``, on a META still there, the last only while it is
    still not folded: a fold (or a purge) landing after the read fails the transaction
    (``ancestor<i>``), so the caller reads again."""
    return [
        Patch(f"{ANCESTOR}{i}", keys.meta_key(task_id), Update(add=dict(add)),
              present() if folded else present() & Attr(SETTLED).not_exists())
        for i, (task_id, folded) in enumerate(line)
    ]  # fmt: skip
