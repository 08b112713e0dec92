"""What resolving an agent reference costs a submission: ``name@N``, ``name`` (the latest),
``name@alias`` (with the version cache cold and warm) and a canary split.

    .venv/bin/python bench/alias_cost.py [--runs 200] [--json] [--plot out.png]

On a moto server (the DynamoDB of the local stack), each row (``inline``: no agent;
``@2``: ``support@2``; ``latest``: ``support``; ``@prod cold``/``warm``: ``support@prod`` with the
version cache emptied before each call, or kept; ``@canary 90/10``: a split alias) times
``control.submit.prepare_submission`` (the resolution and every check of a submission, nothing written; p50/p99
nearest rank, after two warm-up calls) and counts the botocore calls it made. An alias is read
every time (strongly consistent: a move is in effect for the next submission, in every process);
the version it picks is cached per process (``storage.agent_aliases``: versions are immutable),
so a warm alias costs one GetItem, as ``name@N`` does, and a cold one two, as ``name`` does. Prices:
``bench/_prices.py``, the one table (a strongly consistent read of an item under 4 KB is one
read request unit; these items are).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _benchlib import InProcessCounter
from _plot import Panel, add_plot_args, plot_from_args
from _prices import as_json, quote, rate
from _report import time_cases
from agentq.control.submit import prepare_submission
from agentq.control.validation import parse_submission
from agentq.core.agents import AgentSpec
from agentq.core.aliases import AliasSpec, AliasTarget
from agentq.core.tools.builtin import default_registry
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

PRICE_KEYS = ("dynamodb_rru",)
READ_USD = rate("dynamodb_rru")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    add_plot_args(parser, "alias_cost")
    args = parser.parse_args()
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    tools = default_registry()
    with MotoServer() as moto:
        names = ResourceNames.for_prefix(f"alias{uuid.uuid4().hex[:8]}")
        settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=moto.endpoint_url)
        provision(session(settings), names, endpoint_url=moto.endpoint_url)
        store = build_store(settings)
        for i in (1, 2):
            spec = AgentSpec(name="support", provider="scripted", script="research", system=f"version {i}")
            store.agents.create("t", spec)
        store.aliases.set("t", "support", "prod", AliasSpec(versions=[AliasTarget(version=2, weight=100)]))
        split = [AliasTarget(version=1, weight=90), AliasTarget(version=2, weight=10)]
        store.aliases.set("t", "support", "canary", AliasSpec(versions=split))

        def resolve(agent: str | None, *, cold: bool = False) -> Callable[[], None]:
            body = {"goal": "g", **({"agent": agent} if agent else {"provider": "scripted", "script": "research"})}

            def call() -> None:
                if cold:
                    store.aliases.forget()
                prepare_submission(store, tools, parse_submission(body), tenant="t", task_id=uuid.uuid4().hex)

            return call

        cases: dict[str, Callable[[], None]] = {
            "inline": resolve(None),
            "@2": resolve("support@2"),
            "latest": resolve("support"),
            "@prod cold": resolve("support@prod", cold=True),
            "@prod warm": resolve("support@prod"),
            "@canary 90/10": resolve("support@canary"),
        }
        counter = InProcessCounter().install()
        rows: dict[str, dict[str, Any]] = {}
        for name, timing in time_cases(cases, args.runs, counter).items():
            reads = sum(timing.calls_per_run.values())
            rows[name] = {"p50_ms": timing.p50_ms, "p99_ms": timing.p99_ms, "calls_per_submission": timing.calls_per_run,
                          "reads_per_submission": reads, "usd_per_million": reads * READ_USD * 1e6}  # fmt: skip
        counter.uninstall()
    base = rows["@2"]["reads_per_submission"]
    for row in rows.values():
        row["extra_reads_vs_pinned"] = row["reads_per_submission"] - base

    labels = list(rows)
    plot_from_args(
        args,
        f"resolving an agent reference at submission, {args.runs} runs each (moto DynamoDB)",
        [Panel("bar", "latency of prepare_submission", "ms", labels,
               {q: [rows[n][f"{q}_ms"] for n in labels] for q in ("p50", "p99")}),
         Panel("bar", "DynamoDB reads per submission", "reads", labels,
               {"reads": [rows[n]["reads_per_submission"] for n in labels]})],
    )  # fmt: skip
    if args.json:
        print(json.dumps({"runs": args.runs, "rows": rows, "prices": as_json(*PRICE_KEYS)}))
        return
    print(f"{'reference':<30} {'p50 ms':>8} {'p99 ms':>8} {'reads':>6} {'+reads':>7} {'$/1M subs':>10}"
          f"   ({args.runs} runs, vs support@2)")  # fmt: skip
    for name, row in rows.items():
        print(f"{name:<30} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['reads_per_submission']:>6.2f} "
              f"{row['extra_reads_vs_pinned']:>+7.2f} {row['usd_per_million']:>10.4f}")  # fmt: skip
    print(f"prices: {quote(*PRICE_KEYS)}")


if __name__ == "__main__":
    main()
