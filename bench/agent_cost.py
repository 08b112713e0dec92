"""What a long agent conversation costs in input tokens and dollars, with and without prompt caching.

    python bench/agent_cost.py                           # 50 and 1,000 turns, every mode
    python bench/agent_cost.py --turns 50 --modes off,cache,economy --json

The same conversation as ``bench/checkpoint_cost.py`` (each turn calls a read-only tool that
returns ~3 KB of text, then a final answer) runs through the real engine and the real
``anthropic`` SDK (``AnthropicProvider``) against a local Messages API server that bills as
the API does, prompt cache included (tests/prompt_cache_server.py: prefix match up to a
breakpoint with the 20-block lookback, writes and reads, TTLs on a simulated clock, the
1,024-token minimum, a 200,000-token context window). Modes: ``off`` (``AGENTQ_PROMPT_CACHE=off``:
every turn re-sends and pays for the whole conversation); ``cache`` (the default breakpoints;
old tool results are cleared past 70% of the window, so a long run stays under it);
``economy`` (caching, and every turn through the Message Batches API at half price: the task
parks while each batch runs and is resumed by a new claim, as the poll message does); and
``compact`` (caching with clearing kept off, ``keep_tool_results`` = all, so only the
summarising compaction keeps the conversation under the threshold).

Figures per run (machine-independent): LLM calls; input tokens billed as plain input, cache
writes and cache reads; input dollars at Sonnet list prices ($3/M input, writes 1.25x, reads
0.1x); the cache hit ratio (reads / all input tokens); the peak input of one call; whether
the run ended or hit the context window (without compaction a long enough conversation
cannot go on: issue 14.1); steps a resume reads (all of them, without compaction); and
whether the budget's ``used`` equals what the provider reported. Input dollars of a batched
call are half the list price, as the ledger charges them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import JsonOut, log, machine, table  # noqa: E402
from _plot import Panel, add_plot_args, plot_from_args  # noqa: E402
from agentq.core.context import COMPACT_INSTRUCTION  # noqa: E402
from agentq.core.engine import Engine, EngineConfig  # noqa: E402
from agentq.core.models import TaskStatus, TaskSubmission  # noqa: E402
from agentq.core.pricing import load_price_table  # noqa: E402
from agentq.core.providers.anthropic_provider import AnthropicProvider  # noqa: E402
from agentq.core.providers.base import BATCH_PRICE_RATIO  # noqa: E402
from agentq.core.tools import ToolRegistry, tool  # noqa: E402
from agentq.storage.container import memory_storage  # noqa: E402

from tests.fake_messages_api import FakeMessagesAPI  # noqa: E402
from tests.prompt_cache_server import CacheAccounting, responder  # noqa: E402

MODEL = "claude-sonnet-4-6"
OUTPUT_TOKENS = 60
SYSTEM = (
    "You are a research agent. Read every document of the corpus with read_doc, one per turn, "
    "note what each one supports, and finish with a summary that cites each document. "
) * 12  # a realistic agent prompt: ~2 KB
WORDS = "evidence survey cohort signal market churn retention growth pricing region quarter model".split()


def document_text(doc_id: str, size: int) -> str:
    words, counter = [f"[{doc_id}]"], 0
    while sum(len(w) + 1 for w in words) < size:
        digest = hashlib.sha256(f"{doc_id}:{counter}".encode()).digest()
        counter += 1
        words += [WORDS[b % len(WORDS)] for b in digest]
    return " ".join(words)[:size]


def plan_for(turns: int) -> Any:
    """The model's side: read document n+1 until ``turns`` are read, then summarise. Asked to
    compact, it writes a summary that says how many documents it read, and counts on from it."""

    def plan(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, int]:
        first = body["messages"][0]["content"]
        earlier = re.search(r"documents 1 to (\d+) read", first if isinstance(first, str) else json.dumps(first), re.I)
        done = (int(earlier.group(1)) if earlier else 0) + sum(
            1 for m in body["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"
        )  # fmt: skip
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and last[-1].get("text") == COMPACT_INSTRUCTION:
            summary = f"Documents 1 to {done} read; each supports the survey's findings. Next: document {done + 1}."
            return [{"type": "text", "text": summary}], "end_turn", 400
        if done < turns:
            use = {"type": "tool_use", "id": f"toolu_{done + 1:05d}", "name": "read_doc",
                   "input": {"doc_id": f"doc-{done + 1:04d}"}}  # fmt: skip
            text = {"type": "text", "text": f"Reading document {done + 1} of {turns}."}
            return [text, use], "tool_use", OUTPUT_TOKENS
        return [{"type": "text", "text": f"Summary of {turns} documents."}], "end_turn", OUTPUT_TOKENS

    return plan


def run(turns: int, mode: str, doc_bytes: int) -> dict[str, Any]:
    os.environ["AGENTQ_PROMPT_CACHE"] = "off" if mode == "off" else "on"
    extra: dict[str, Any] = {"economy": True} if mode == "economy" else {}
    if mode == "compact":
        extra["keep_tool_results"] = 1000  # clearing off: only compaction keeps the context in

    @tool(name="read_doc")
    def read_doc(doc_id: str) -> str:
        """Read one document of the corpus."""
        return document_text(doc_id, doc_bytes)

    accounting = CacheAccounting()
    store = memory_storage()
    with FakeMessagesAPI(responder=responder(accounting, plan_for(turns)), batch_seconds=0) as api:
        submission = TaskSubmission.model_validate(
            {"goal": f"Summarise the {turns} documents of the corpus.", "provider": "anthropic", "model": MODEL,
             "system": SYSTEM, "constraints": {"tools": ["read_doc"], "max_tokens": 1_000_000_000,
                                               "max_steps": turns + 5, "timeout_seconds": 86_400, **extra}}
        )  # fmt: skip
        task = store.tasks.create(submission, tenant="bench")
        engine = Engine(
            store, worker_id="bench", tools=ToolRegistry([read_doc]), config=EngineConfig(lease_seconds=60),
            providers=lambda _: AnthropicProvider(api_key="bench", base_url=api.base_url),
        )  # fmt: skip
        started = time.perf_counter()
        result = engine.run(task.task_id)
        claims = 1
        while result.outcome == "waiting":  # economy: parked on a batch, which has ended: queue and claim again
            store.tasks.transition(task.task_id, TaskStatus.QUEUED)
            result = engine.run(task.task_id)
            claims += 1
        wall = time.perf_counter() - started
        steps = store.steps.load(task.task_id)
        answered = sum(1 for step in steps if step.body.kind in ("llm", "compact"))
        deadline = time.monotonic() + 10
        while len(api.delivered_usage) < answered and time.monotonic() < deadline:
            time.sleep(0.01)  # the server notes a reply just after sending it
        delivered = list(api.delivered_usage)
    final = store.tasks.get(task.task_id)
    plain = sum(u["input_tokens"] for u in delivered)
    writes = sum(u.get("cache_creation_input_tokens") or 0 for u in delivered)
    reads = sum(u.get("cache_read_input_tokens") or 0 for u in delivered)
    per_call = [u["input_tokens"] + (u.get("cache_creation_input_tokens") or 0)
                + (u.get("cache_read_input_tokens") or 0) for u in delivered]  # fmt: skip
    price = load_price_table().price_for(MODEL)
    assert price is not None
    million = Decimal(1_000_000)
    input_usd = (plain * price.input_per_mtok + writes * price.input_per_mtok * Decimal("1.25")
                 + reads * price.input_per_mtok * Decimal("0.1")) / million  # fmt: skip
    if mode == "economy":
        input_usd *= BATCH_PRICE_RATIO
    provider_total = sum(per_call) + sum(u["output_tokens"] for u in delivered)
    budget = store.budgets.get(task.task_id)
    return {
        "turns": turns,
        "mode": mode,
        "llm_calls": len(delivered),
        "status": final.status.value,
        "ended": _ended(final.status.value, final.error, len(delivered)),
        "input_tokens": sum(per_call),
        "uncached_input": plain,
        "cache_writes": writes,
        "cache_reads": reads,
        "input_usd": float(round(input_usd, 4)),
        "hit_ratio": round(reads / sum(per_call), 3) if per_call else 0.0,
        "peak_input": max(per_call, default=0),
        "per_call_input": per_call,
        "compactions": sum(1 for step in steps if step.body.kind == "compact"),
        "steps_read_on_resume": len([step for step in steps if step.number >= max(final.compacted_at, 1)]),
        "claims": claims,
        "ledger_equals_provider": budget.used == provider_total,
        "wall_seconds": round(wall, 1),
        "outcome": result.outcome,
    }


def _ended(status: str, error: dict[str, Any] | None, calls: int) -> str:
    if status == "succeeded":
        return "finished"
    if "too long" in str((error or {}).get("message", "")):
        return f"context full at call {calls}"
    return f"{status}: {(error or {}).get('code', '')}"


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    fifty = [r for r in rows if r["turns"] == min(r["turns"] for r in rows)]
    bars = Panel(
        kind="bar", title=f"input $ for {fifty[0]['turns']} turns", ylabel="USD (Sonnet list prices)",
        x=[r["mode"] for r in fifty], series={"input $": [r["input_usd"] for r in fifty]},
    )  # fmt: skip
    longest = max(r["turns"] for r in rows)
    lines = Panel(
        kind="line", title=f"input tokens per call ({longest} turns)", ylabel="tokens", xlabel="call",
        x=list(range(1, max(len(r["per_call_input"]) for r in rows if r["turns"] == longest) + 1)),
        series={r["mode"]: r["per_call_input"] for r in rows if r["turns"] == longest},
        hlines={"context window": 200_000},
    )  # fmt: skip
    return [bars, lines]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="50,1000", help="conversation lengths, comma-separated")
    ap.add_argument("--modes", default="off,cache,economy,compact")
    ap.add_argument("--doc-bytes", type=int, default=3000, help="characters each read_doc returns")
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "agent_cost")
    args = ap.parse_args(argv)
    rows = []
    with JsonOut(args.json) as out:
        for turns in [int(t) for t in args.turns.split(",")]:
            for mode in args.modes.split(","):
                log(f"{turns} turns, caching {mode} ...")
                rows.append(run(turns, mode, args.doc_bytes))
        by = {(r["turns"], r["mode"]): r for r in rows}
        for r in rows:
            off = by.get((r["turns"], "off"))
            r["cheaper_than_off"] = round(off["input_usd"] / r["input_usd"], 2) if off and r["input_usd"] else None
        result = {"rows": rows, "machine": machine()}
        if args.json:
            out.emit(result)
        else:
            print(table(
                ["turns", "mode", "calls", "ended", "input tokens", "uncached", "cache writes", "cache reads",
                 "input $", "x cheaper", "hit ratio", "peak input", "compactions", "resume reads", "used = provider"],
                [[r["turns"], r["mode"], r["llm_calls"], r["ended"], r["input_tokens"], r["uncached_input"],
                  r["cache_writes"], r["cache_reads"], f"{r['input_usd']:.4f}", r["cheaper_than_off"],
                  r["hit_ratio"], r["peak_input"], r["compactions"], r["steps_read_on_resume"],
                  r["ledger_equals_provider"]]
                 for r in rows],
            ))  # fmt: skip
    plot_from_args(args, "agentq: input cost of a long conversation", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
