"""What caps per end user, agent and API key cost in DynamoDB calls, per LLM call and per claim,
and what a policy rule reading the user's spend today adds (``history.user_spend_today_micros``).

    python bench/cap_calls.py                 # 0 to 3 capped scopes, 6 calls a task; then the rule's rows
    python bench/cap_calls.py --turns 3 --json

Each scenario runs the engine (``core.engine``) on one scripted task against DynamoDB on moto
server and counts every DynamoDB call it makes (botocore's ``before-call`` events on the store's
client), keeps those that touch a cap's items: what the caps add
(``storage.scope_caps``, ARCHITECTURE 4 "spend <= cap at every scope"). A capped scope costs one
conditional ``UpdateItem`` before each call (its hour and day at once) and one ``UpdateItem``
after it (the settle), and the claim one ``BatchGetItem`` for the task's scopes' caps (none for a
task with no user, agent or key). A count, not a timing: it does not depend on the machine. The
dollars are the write and read units those calls take at the list prices of
``bench/_prices.py``; the window item grows by four counters an hour, so after a busy day each
write takes the units of its size (measured here on an item written every hour of a day).

The last two rows add a tenant rule that reads ``history.user_spend_today_micros``, the user
uncapped then capped: the user's day item is then counted for an uncapped user too (a hold and a
settle a call, as a cap's), and every check of the task (each model call and each tool call)
reads it once (a GetItem): the rule's cost, which a rule set that does not name the attribute
never pays.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import uuid
from typing import Any

from _benchlib import JsonOut, log, machine, table
from _plot import Panel, add_plot_args, plot_from_args
from _prices import as_json, quote, rate
from agentq.core.caps import CapLimits, day_key
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.policies import check
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_registry, build_store, session
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

SCOPES = (("user", "u1"), ("agent", "a1"), ("key", "k1"))
GENEROUS = CapLimits(hourly_tokens=10**9, daily_usd=1000, soft_daily_usd=999)  # type: ignore[arg-type]
USER_SPEND_RULE = (
    '@id("spent-today") forbid(principal, action == Action::"tool", resource == Tool::"lookup") '
    "when { context.history has user_spend_today_micros && context.history.user_spend_today_micros > 1000000000 };"
)


class Calls:
    """The DynamoDB calls of the client it is attached to that touch a cap's items (``CAP#``,
    ``CAPUSE#``), by operation: the heartbeat's and the policy cache's calls, which depend on
    timing, are not the caps' and are left out."""

    def __init__(self, client: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        client.meta.events.register("before-call.*.*", self._count, unique_id=f"cap-calls-{id(client)}")

    def _count(self, model: Any, params: Any = None, **_: Any) -> None:
        wire = json.dumps(params, default=str)
        if keys.CAP in wire or keys.CAP_USE in wire:
            self.counts[model.name] += 1

    def take(self) -> dict[str, int]:
        taken = dict(sorted(self.counts.items()))
        self.counts.clear()
        return taken


def submission(turns: int) -> TaskSubmission:
    script = [{"text": f"t{i}", "tool_calls": [{"name": "lookup", "input": {"query": str(i)}}]} for i in range(turns)]
    return TaskSubmission.model_validate(
        {
            "goal": "count",
            "provider": "scripted",
            "script": {"turns": [*script, {"text": "done"}]},
            "user": "u1",
            "agent": "a1",
            "constraints": {"tools": ["lookup"], "max_output_tokens": 200},
        }
    )


def run(
    store: Storage, engine: Engine, calls: Calls, tenant: str, capped: int, turns: int, rule: bool = False
) -> dict[str, int]:
    for scope, name in SCOPES[:capped]:
        store.caps.put(tenant, scope, name, GENEROUS)  # type: ignore[arg-type]
    if rule:
        store.policies.put(tenant, "tenant", USER_SPEND_RULE, check(USER_SPEND_RULE).digest)
    task = store.tasks.create(submission(turns), tenant=tenant, key_id="k1")
    calls.take()
    result = engine.run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, result
    return calls.take()


def _label(row: dict[str, Any]) -> str:
    return f"{row['capped_scopes']}{' + rule' if row['user_spend_rule'] else ''}"


def day_item_units(store: Storage) -> dict[str, int]:
    """The write units of one scope's day item once every hour of a day held and settled on it."""
    tenant = f"day-{uuid.uuid4().hex[:6]}"
    store.caps.put(tenant, "user", "u1", GENEROUS)
    (cap,) = store.caps.applicable(tenant, {"user": "u1"})
    start = 86400 * 20_000
    for hour in range(24):
        held = store.caps.hold([cap], 5_000, micros=70_000, now=start + hour * 3600 + 1)
        store.caps.settle(held, 4_321, 61_234)
    item = store.table.get(keys.cap_use_key(tenant, "user", "u1", day_key(start + 1)))
    assert item is not None
    size = sum(len(k) + len(str(v)) for k, v in item.items())  # DynamoDB's size: names + values (about)
    return {"first_hour_units": 1, "end_of_day_bytes": size, "end_of_day_units": math.ceil(size / 1024)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5, help="tool turns of the task (its LLM calls: turns + 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "cap_calls")
    args = parser.parse_args()
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with JsonOut(args.json) as out, MotoServer() as server:
        settings = Settings.for_prefix(f"bcaps{uuid.uuid4().hex[:8]}", server.endpoint_url)
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        store = build_store(settings)
        calls = Calls(store.table.client)  # type: ignore[attr-defined]
        engine = Engine(store, worker_id="bench", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        llm_calls = args.turns + 1
        checks = llm_calls + args.turns  # a policy check before each model call and each tool call
        rows = []
        for capped, rule in [(0, False), (1, False), (2, False), (3, False), (0, True), (1, True)]:
            log(f"[{capped} capped scope(s){', a rule reads the user spend' if rule else ''}] ...")
            extra = run(store, engine, calls, f"t-{uuid.uuid4().hex[:6]}", capped, args.turns, rule)
            writes = extra.get("UpdateItem", 0)
            reads = extra.get("BatchGetItem", 0)
            per_call = writes / llm_calls
            gets = extra.get("GetItem", 0) / checks
            # a write: 1 write unit; a read of the day item (strongly consistent, under 4 KB): 1 read unit
            usd = per_call * rate("dynamodb_wru") + extra.get("GetItem", 0) / llm_calls * rate("dynamodb_rru")
            rows.append({
                "capped_scopes": capped, "user_spend_rule": rule, "llm_calls": llm_calls, "checks": checks,
                "extra_calls": extra, "extra_writes_per_llm_call": per_call, "extra_batch_gets_per_claim": reads,
                "extra_gets_per_check": gets, "usd_per_million_llm_calls": usd * 1e6,
            })  # fmt: skip
        units = day_item_units(store)
        result = {"machine": machine(), "turns": args.turns, "rows": rows,
                  "day_item": units, "prices": as_json("dynamodb_wru", "dynamodb_rru")}  # fmt: skip
        plot_from_args(
            args,
            "agentq caps: DynamoDB calls a capped LLM call adds",
            [Panel("bar", "extra calls per LLM call", "calls", [_label(r) for r in rows],
                   {"UpdateItem": [r["extra_writes_per_llm_call"] for r in rows]}, xlabel="capped scopes")],
        )  # fmt: skip
        if args.json:
            out.emit(result)
        else:
            m = result["machine"]
            cells = [[_label(r), ", ".join(f"{op} {n}" for op, n in r["extra_calls"].items()) or "-",
                      f"{r['extra_writes_per_llm_call']:.2f}", r["extra_batch_gets_per_claim"],
                      f"{r['extra_gets_per_check']:.2f}", f"${r['usd_per_million_llm_calls']:.2f}"]
                     for r in rows]  # fmt: skip
            print("\n".join([
                f"agentq caps: DynamoDB calls added by caps per end user / agent / key; one task of {llm_calls} LLM "
                f"calls and {args.turns} tool calls ({checks} policy checks; a user, an agent and a key) on moto "
                "server; only calls on a cap's items counted; '+ rule': a tenant rule reads the user's spend today",
                f"code: git {m['git_head']} + {m['core_uncommitted_files']} uncommitted file(s) under layers/",
                "",
                table(["capped scopes", "cap calls (whole task)", "UpdateItem per LLM call", "BatchGetItem per claim",
                       "GetItem per check", "$ per million LLM calls"], cells),
                f"a scope's day item after 24 busy hours: {units['end_of_day_bytes']} bytes, "
                f"{units['end_of_day_units']} write unit(s) a write (1 in its first hours)",
                f"prices: {quote('dynamodb_wru', 'dynamodb_rru')}; the $ column at 1 write unit a write and 1 read "
                "unit a read",
            ]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
