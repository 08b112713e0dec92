"""The chaos run's ledger check: what the model servers billed, tree by tree, against what
agentq's budgets charged (bench/chaos.py; ARCHITECTURE invariant 4).

The servers bill two things: replies sent whole (``delivered``: what a client reads, so its
usage is known) and replies cut after their headers (``cut``: generated, so a provider bills
them, but the client cannot know their usage). A fault before a reply (an error status, a
reset or a stall before any byte) is billed nothing, nor is a 200 that is not JSON. Each request the servers see is logged
with its task, its turn and what it got, so a hold the ledger counted in full can be traced to
what became of its call.

Per tree: delivered and cut tokens and dollars, the ledger's charge (``used``, ``usd_used``),
the difference, the holds counted as spent at their deadline and never corrected
(``spent_<epoch>`` tickets still on a META: each one is a whole hold in ``used``), and the
``cost_exceeded`` endings the billed usage would not have caused (``false_cost_exceeded``:
the cap less everything billed to the task's tree still covered its next call's smallest hold,
``least_hold``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentq.core.models import CompactStep, LLMStep, TaskStatus, Usage
from agentq.core.pricing import load_price_table, micros
from agentq.core.providers.hidden_input import TOOL_PROMPT_TOKENS
from agentq.storage import keys
from agentq.storage.budget_items import SPENT_PREFIX

# The engine's input estimate (conversation.estimate_input_tokens: the JSON at 3 characters a
# token, 16 more, and the hidden tool-use prompt of a request with tools) and the shortest
# answer it still holds for (_holds.MIN_OUTPUT_TOKENS): a call that cannot get both ends the task.
CHARS_PER_TOKEN = 3
MIN_OUTPUT_TOKENS = 16

ANSWERED = "answered"  # a reply sent whole (slow or not)


@dataclass
class Seen:
    """One request a model server answered: when (wall clock, as the workers' deadlines), for
    which task (plan tag) and turn (assistant turns before it), and how (``ANSWERED`` or the
    fault's kind)."""

    at: float
    tag: str
    turn: int
    kind: str
    est_in: int  # the engine's own estimate of the request's input, from its size


@dataclass
class ProviderLedger:
    """What the model servers billed, per task tag, in tokens and in millionths of a dollar."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    delivered: Counter[str] = field(default_factory=Counter)
    delivered_micros: Counter[str] = field(default_factory=Counter)
    cut: Counter[str] = field(default_factory=Counter)
    cut_micros: Counter[str] = field(default_factory=Counter)
    # Of the cut replies, what a stream's first event told the client (its input tokens and the
    # one output token message_start carries): what a worker can count as known of them.
    told: Counter[str] = field(default_factory=Counter)
    seen: list[Seen] = field(default_factory=list)

    def saw(self, tag: str, messages: list[dict[str, Any]], kind: str, body: Any) -> None:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        est_in = math.ceil(len(json.dumps(body, separators=(",", ":"), default=str)) / CHARS_PER_TOKEN) + 16
        if isinstance(body, dict) and (body.get("tools") or body.get("toolConfig")):  # Converse's
            est_in += TOOL_PROMPT_TOKENS
        with self.lock:
            self.seen.append(Seen(time.time(), tag, turn, kind, est_in))

    def billed(self, tag: str, model: str, input_tokens: int, output_tokens: int, *, whole: bool) -> None:
        cost = micros(load_price_table().cost(model, Usage(input_tokens=input_tokens, output_tokens=output_tokens)))
        with self.lock:
            (self.delivered if whole else self.cut)[tag] += input_tokens + output_tokens
            (self.delivered_micros if whole else self.cut_micros)[tag] += cost

    def of_tree(self, tree: str) -> dict[str, int]:
        """The tree's billed usage (its root's tag and every ``<tree>.`` tag)."""

        def total(counter: Counter[str]) -> int:
            return sum(n for tag, n in counter.items() if tag == tree or tag.startswith(tree + "."))

        return {
            "delivered": total(self.delivered),
            "delivered_micros": total(self.delivered_micros),
            "cut": total(self.cut),
            "cut_micros": total(self.cut_micros),
            "told": total(self.told),
        }

    def next_hold(self, tag: str) -> int:
        """The smallest hold the task's next call would have needed: the input estimate of its
        last request grown by as much as its last turn grew it, and the shortest answer."""
        sizes = sorted({s.est_in for s in self.seen if s.tag == tag})
        if not sizes:
            return 0
        grown = sizes[-1] + (sizes[-1] - sizes[-2] if len(sizes) > 1 else 0)
        return grown + MIN_OUTPUT_TOKENS

    def turn_of(self, tag: str, turn: int) -> list[str]:
        """What every request of ``tag``'s turn ``turn`` got, whoever sent it: a zombie's and
        its successor's calls of one turn are the same request, so they cannot be told apart."""
        return [s.kind for s in self.seen if s.tag == tag and s.turn == turn]


def least_hold(task: Any, tag: str, billed: ProviderLedger) -> int:
    """The smallest hold the next call of ``task`` (plan ``tag``) needed when it ended
    ``cost_exceeded``: what its error says the engine could not hold (``needed_tokens``, from
    the engine's own estimate of its request: the wire's body, which ``next_hold`` sizes, is
    50 to 70 tokens shorter here), else (a turn cut at the allowance a near cap shrank it to,
    which names no next call) the estimate from the bodies the servers saw."""
    needed = (task.error or {}).get("needed_tokens")
    return int(needed) if needed is not None else billed.next_hold(tag)


def spent_tickets(store: Any, task_id: str) -> list[dict[str, Any]]:
    """The holds counted as spent at their deadline and never corrected, on a task's META."""
    item = store.table.get(keys.meta_key(task_id)) or {}
    return [
        {"epoch": int(name.removeprefix(SPENT_PREFIX)), **{k: float(v) for k, v in value.items()}}
        for name, value in item.items()
        if name.startswith(SPENT_PREFIX) and isinstance(value, dict)
    ]


def _turn_of(store: Any, task_id: str, step: int) -> int:
    """The model turn a hold for ``step`` was for: the LLM steps committed before it."""
    return sum(1 for r in store.steps.load(task_id) if r.number < step and isinstance(r.body, (LLMStep, CompactStep)))


def what_became(kinds: list[str]) -> str:
    """What the server did with the turn a spent hold was for: never asked, or the faults it
    met (a reply cut mid-reply is billed, its usage unknown to the client; the others bill
    nothing), or none (every request of it answered whole)."""
    if not kinds:
        return "turn never sent"
    faults = sorted({k for k in kinds if k != ANSWERED})
    return f"turn met {'+'.join(faults)}" if faults else "turn met no fault"


def ledger_by_tree(
    store: Any, every: list[Any], tag_of: Any, billed: ProviderLedger
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, int]]]:
    """Per tree (root tag): what was billed, what the ledger charged, the holds counted in full,
    and the false ``cost_exceeded`` endings; and the spent holds by what became of their call:
    how many, and the unknown tokens they leave (each hold less what its stream told)."""
    tasks_of: dict[str, list[Any]] = defaultdict(list)
    for t in every:
        tasks_of[tag_of(t).split(".", 1)[0]].append(t)
    became: dict[str, dict[str, int]] = defaultdict(lambda: {"holds": 0, "unknown_tokens": 0})
    trees: dict[str, dict[str, Any]] = {}
    for tree, tasks in sorted(tasks_of.items(), key=lambda kv: _tag_key(kv[0])):
        root = next(t for t in tasks if t.parent_id is None)
        budget = store.budgets.get(root.task_id)
        sums = billed.of_tree(tree)
        spent = 0
        held = 0
        for t in tasks:
            for ticket in spent_tickets(store, t.task_id):
                spent += 1
                held += int(ticket["amount"])
                what = what_became(billed.turn_of(tag_of(t), _turn_of(store, t.task_id, int(ticket["step"]))))
                became[what]["holds"] += 1
                became[what]["unknown_tokens"] += int(
                    ticket["amount"] - ticket.get("seen_in", 0) - ticket.get("seen_out", 0)
                )
        false_ends = []
        for t in tasks:
            if t.status is not TaskStatus.COST_EXCEEDED:
                continue
            own = billed.of_tree(tag_of(t))
            cap = store.budgets.get(t.task_id).cap
            if cap - own["delivered"] - own["cut"] >= least_hold(t, tag_of(t), billed):
                false_ends.append(tag_of(t))
        trees[tree] = {
            "task_id": root.task_id,
            "status": root.status.value,
            "cap": budget.cap,
            "delivered_tokens": sums["delivered"],
            "delivered_usd": sums["delivered_micros"] / 1e6,
            "cut_tokens": sums["cut"],
            "cut_usd": sums["cut_micros"] / 1e6,
            "ledger_tokens": budget.used,
            "ledger_usd": budget.used_micros / 1e6,
            "told_tokens": sums["told"],
            "known_tokens": budget.known,
            "unknown_tokens": budget.unknown,
            "known_usd": budget.known_micros / 1e6,
            "unknown_usd": budget.unknown_micros / 1e6,
            "over_tokens": budget.used - sums["delivered"],
            "over_usd": round((budget.used_micros - sums["delivered_micros"]) / 1e6, 6),
            "holds_spent_uncorrected": spent,
            "holds_spent_tokens": held,
            "false_cost_exceeded": false_ends,
        }
    return trees, dict(became)


def _tag_key(tag: str) -> tuple[int, str]:
    digits = tag.lstrip("t")
    return (int(digits), tag) if digits.isdigit() else (1 << 30, tag)


def usd(value: float) -> str:
    return f"{Decimal(str(value)):.4f}"


def tree_rows(trees: dict[str, dict[str, Any]], every_tree: bool) -> list[list[Any]]:
    """The table's rows: every tree (a small run), else those whose ledger differs from what
    was delivered, and the total."""
    rows = []
    for tree, row in trees.items():
        if every_tree or row["over_tokens"] or row["false_cost_exceeded"]:
            rows.append([
                tree, row["status"], row["cap"], row["delivered_tokens"], row["cut_tokens"], row["ledger_tokens"],
                row["known_tokens"], row["unknown_tokens"],
                row["over_tokens"], usd(row["delivered_usd"]), usd(row["ledger_usd"]), usd(row["over_usd"]),
                f"{row['holds_spent_uncorrected']} ({row['holds_spent_tokens']})",
                ",".join(row["false_cost_exceeded"]) or "-",
            ])  # fmt: skip
    total = {k: sum(r[k] for r in trees.values()) for k in (
        "delivered_tokens", "cut_tokens", "ledger_tokens", "known_tokens", "unknown_tokens", "over_tokens",
        "delivered_usd", "ledger_usd", "over_usd",
        "holds_spent_uncorrected", "holds_spent_tokens")}  # fmt: skip
    false_ends = sum(len(r["false_cost_exceeded"]) for r in trees.values())
    rows.append([
        f"all {len(trees)}", "", "", total["delivered_tokens"], total["cut_tokens"], total["ledger_tokens"],
        total["known_tokens"], total["unknown_tokens"], total["over_tokens"], usd(total["delivered_usd"]), usd(total["ledger_usd"]), usd(total["over_usd"]),
        f"{total['holds_spent_uncorrected']} ({total['holds_spent_tokens']})", false_ends,
    ])  # fmt: skip
    return rows


TREE_HEADERS = [
    "tree", "status", "cap", "delivered", "cut", "ledger", "known", "unknown", "over", "delivered $", "ledger $",
    "over $",
    "holds spent (tokens)", "false cost_exceeded",
]  # fmt: skip
