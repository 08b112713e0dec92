"""Tools for tests: a side-effecting tool whose every execution leaves a line in a file, so a
test can count how many times an effect really happened across killed processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentq.core.tools import ToolContext, tool


def ledger_path() -> Path:
    return Path(os.environ.get("AGENTQ_TEST_LEDGER", "/tmp/agentq-test-ledger.jsonl"))


@tool(side_effects=True, timeout_seconds=10)
def charge_card(amount_cents: int, memo: str, ctx: ToolContext) -> str:
    """Charge a card (test double with a real, countable effect)."""
    with ledger_path().open("a") as f:
        f.write(json.dumps({"key": ctx.idempotency_key, "tool_use_id": ctx.tool_use_id, "amount": amount_cents}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return f"charged {amount_cents} cents ({memo}); receipt {ctx.idempotency_key[:12]}"


@tool
def lookup(query: str, size: int = 200) -> str:
    """Read-only lookup returning deterministic text of the requested size."""
    base = f"result for {query}: "
    return (base + "x" * size)[: max(size, len(base))]


TOOLS = [charge_card, lookup]
