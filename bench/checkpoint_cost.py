"""What one durable agent step costs to checkpoint: agentq vs. a full-state upsert vs. LangGraph.

One scripted conversation (default: 50 LLM turns, each calling a read-only tool that returns
~3 KB of deterministic text, then a final answer = 101 committed steps) is stored three ways:

1. agentq on moto server. botocore event handlers on the store's DynamoDB and S3 clients
   count AWS calls by operation, request-body bytes of DynamoDB writes, S3 PutObject bytes,
   and the write capacity units AWS would bill (per item: ceil(size / 1 KB), x2 in a
   transaction, an overwrite/update billed at the larger of before and after). Item sizes
   use DynamoDB's rule (name bytes + value bytes), probed around each write by an unmetered
   client and cross-checked against ``store.steps.raw_items``. WCU are also split by item
   (STEP, META, BUDGET, ...) and by step kind (LLM, tools), and priced with S3 PUTs at
   on-demand list prices (``--wru-usd-per-million``, ``--s3-put-usd-per-million``), because
   moving bytes from DynamoDB to S3 trades write units for PUT requests.
2. The common full-state upsert: one item per task holding the whole conversation JSON,
   PutItem'd every step (same moto server and client, same conversation). It reports the
   step at which the item passes DynamoDB's 400 KB limit, and moves the state to S3 after.
3. LangGraph's own checkpointers (SqliteSaver, InMemorySaver, and SqliteSaver with the beta
   DeltaChannel) over an ``add_messages`` state, each graph step appending the same content:
   ``put`` + ``put_writes`` calls and the bytes they serialize (wrapped ``dumps_typed``).

Why: rewriting the whole history makes step n cost O(n) (O(n^2) in total, then a hard stop
at the item limit); an append-only log of immutable steps keeps each step's cost flat.
Calls, bytes, WCU and tokens are machine-independent; wall times are moto-local.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import math
import os
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, TypedDict

from botocore.exceptions import ClientError
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import get_checkpoint_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from _benchlib import dynamo, s3_payloads
from _plot import add_plot_args
from _prices import READ_ON, dollars, per_million
from agentq.core.engine import Engine, EngineConfig, conversation
from agentq.core.models import StepRecord, TaskStatus, TaskSubmission
from agentq.core.tools import ToolSpec, tool
from agentq.resources import TABLE_KEY_SCHEMA, ResourceNames, provision
from agentq.runtime import Settings, build_registry, build_store, client, session
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.item_size import wire_item_size, write_units
from agentq.storage.serdes import DEFAULT_OFFLOAD_THRESHOLD
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

DDB_ITEM_LIMIT = 400 * 1024
SETUP = 0  # bucket of per-task work that is not a step (create, claim, rebuild)
FLAT_WINDOW = 10
LEASE_SECONDS = 600.0  # long enough that no heartbeat (time-based, every lease/3 s) fires
KEY_NAMES: tuple[str, ...] = tuple(k["AttributeName"] for k in TABLE_KEY_SCHEMA)
DDB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})

_WORDS = (
    "agent checkpoint durable lease epoch budget token step commit replay worker queue table item "
    "partition write capacity latency throughput conversation history message tool result payload "
    "offload bucket object stream retry backoff fence condition transaction ledger snapshot growth "
    "linear quadratic bounded invariant crash resume recovery effect idempotent schedule deadline"
).split()


# --------------------------------------------------------------------------- the conversation


def document_text(doc_id: str, size: int) -> str:
    """Deterministic pseudo-prose of exactly ``size`` characters for ``doc_id``."""
    words: list[str] = [f"[{doc_id}]"]
    length = len(words[0])
    counter = 0
    while length < size:
        digest = hashlib.sha256(f"{doc_id}:{counter}".encode()).digest()
        counter += 1
        for byte in digest:
            word = _WORDS[byte % len(_WORDS)]
            words.append(word)
            length += len(word) + 1
    return " ".join(words)[:size]


def make_read_doc(size: int) -> ToolSpec:
    """The read-only tool of the conversation; ``size`` characters of text per call."""

    @tool(name="read_doc")
    def read_doc(doc_id: str) -> str:
        """Read one document of the corpus (read-only, deterministic text)."""
        return document_text(doc_id, size)

    return read_doc


def script_turns(llm_turns: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {
            "text": f"Reading document {i} of {llm_turns} to extract its findings.",
            "tool_calls": [{"name": "read_doc", "input": {"doc_id": f"doc-{i:03d}"}}],
        }
        for i in range(1, llm_turns + 1)
    ]
    summary = " ".join(f"Document {i} supports finding {i % 7}." for i in range(1, llm_turns + 1))
    turns.append({"text": f"Summary of {llm_turns} documents: {summary}"})
    return turns


# ------------------------------------------------------------------ DynamoDB item-size rules


def item_size(item: dict[str, Any]) -> int:
    """DynamoDB item size (wire form): for each attribute, its name's UTF-8 bytes plus its value's."""
    return wire_item_size(item)


def wcu_for(size: int, *, transactional: bool) -> int:
    return write_units(size, transactional=transactional)


def item_kind(key: dict[str, Any]) -> str:
    """What a written item is, for the per-item breakdown: STEP, META, BUDGET, CLAIM, EFFECT, ..."""
    pk, sk = str(key.get("pk", {}).get("S", "")), str(key.get("sk", {}).get("S", ""))
    if pk.startswith("BUDGET#"):
        return "BUDGET"
    if sk.startswith("META#"):  # META#SUBMISSION: not the task's META
        return sk.partition("#")[2]
    return sk.partition("#")[0] or pk.partition("#")[0]


# -------------------------------------------------------------------------- AWS call metering


@dataclass
class Bucket:
    """What one step (or the per-task setup) cost."""

    calls: Counter[str] = field(default_factory=Counter)
    ddb_write_bytes: int = 0  # request bodies of DynamoDB writes
    ddb_other_bytes: int = 0  # request bodies of DynamoDB reads
    s3_put_bytes: int = 0  # PutObject bodies
    wcu: int = 0
    wcu_by_item: Counter[str] = field(default_factory=Counter)  # item_kind -> WCU
    items_written: int = 0
    failed: Counter[str] = field(default_factory=Counter)

    @property
    def n_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def bytes_written(self) -> int:
        return self.ddb_write_bytes + self.s3_put_bytes


def _refresh_read(op: str, request: dict[str, Any]) -> str | None:
    """Which cached copy a read refreshes ("circuit": a GetItem of ``FLOW#<circuit>``'s
    ``STATE``; "policies": a Query of the tenant's ``POLICY#HEAD#`` items), or None."""
    key = request.get("Key", {}) if op == "GetItem" else {}
    if str(key.get("pk", {}).get("S", "")).startswith("FLOW#") and key.get("sk", {}).get("S") == "STATE":
        return "circuit"
    values = request.get("ExpressionAttributeValues", {}) if op == "Query" else {}
    return "policies" if values.get(":prefix", {}).get("S") == keys.POLICY_HEAD_PREFIX else None


@dataclass
class _WriteTarget:
    table: str
    key: dict[str, Any]
    transactional: bool
    before: int = 0


class AwsMeter:
    """Counts calls, bytes and WCU of the clients it is attached to, into step buckets.

    ``bucket`` is the step the next call belongs to; ``on_call`` may move it (agentq's step
    clock). Item sizes before/after each write come from ``side_ddb``, an unmetered client.
    """

    def __init__(self, side_ddb: Any) -> None:
        self.side_ddb = side_ddb
        self.buckets: dict[int, Bucket] = {}
        self.bucket = SETUP
        self.paused = False
        self.on_call: Callable[[str, dict[str, Any]], None] | None = None
        self.on_done: Callable[[str, dict[str, Any], bool], None] | None = None
        self.item_wcu: list[tuple[str, int, bool]] = []  # (sort key, WCU, transactional) of every item written
        # The reads a worker repeats on a clock when its cached copy expires, not per step: a
        # circuit's state (``storage/flow.py``, at most once a second per circuit) and the
        # tenant's policies (``AGENTQ_POLICY_CACHE_SECONDS``, 5). Their count follows the run's
        # wall time, so they are kept apart by kind as the heartbeats are.
        self.refresh_reads: Counter[str] = Counter()
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.buckets = {}
            self.item_wcu = []
            self.bucket = SETUP
            self.refresh_reads = Counter()
            self.on_call = None
            self.on_done = None

    def attach(self, aws_client: Any) -> None:
        events = aws_client.meta.events
        events.register("before-call.*.*", self._before, unique_id=f"bench-before-{id(aws_client)}")
        events.register("after-call.*.*", self._after, unique_id=f"bench-after-{id(aws_client)}")

    def _get(self, number: int) -> Bucket:
        return self.buckets.setdefault(number, Bucket())

    def _before(self, model: Any, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if self.paused:
            return
        service = model.service_model.service_id.hyphenize()
        op = str(model.name)
        body = params.get("body", b"")
        size = _body_size(body)
        request: dict[str, Any] = {}
        if service == "dynamodb" and size:
            request = json.loads(body)
        with self._lock:
            refresh = _refresh_read(op, request) if self.bucket != SETUP else None
            if refresh is not None:
                self.refresh_reads[refresh] += 1
                return
            if self.on_call is not None:
                self.on_call(op, request)
            number = self.bucket
            bucket = self._get(number)
            bucket.calls[op] += 1
            if service == "dynamodb":
                if op in DDB_WRITES:
                    bucket.ddb_write_bytes += size
                else:
                    bucket.ddb_other_bytes += size
            elif service == "s3" and op == "PutObject":
                bucket.s3_put_bytes += size
        targets = _write_targets(op, request) if service == "dynamodb" else []
        for target in targets:
            target.before = self._size_now(target)
        context["bench"] = {"bucket": number, "op": op, "request": request, "targets": targets}

    def _after(self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        info = context.get("bench")
        if info is None:
            return
        ok = http_response.status_code < 300
        per_item: list[tuple[_WriteTarget, int]] = []
        if ok:
            for target in info["targets"]:
                after = self._size_now(target)
                units = wcu_for(max(target.before, after), transactional=target.transactional)
                per_item.append((target, units))
        with self._lock:
            bucket = self._get(info["bucket"])
            if ok:
                for target, units in per_item:
                    bucket.wcu += units
                    bucket.wcu_by_item[item_kind(target.key)] += units
                    self.item_wcu.append((str(target.key.get("sk", {}).get("S", "")), units, target.transactional))
                bucket.items_written += len(info["targets"])
            else:
                bucket.failed[info["op"]] += 1
            if self.on_done is not None:
                self.on_done(info["op"], info["request"], ok)

    def _size_now(self, target: _WriteTarget) -> int:
        resp = self.side_ddb.get_item(TableName=target.table, Key=target.key, ConsistentRead=True)
        return item_size(resp["Item"]) if "Item" in resp else 0


def _body_size(body: Any) -> int:
    if body is None:
        return 0
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    if isinstance(body, str):
        return len(body.encode())
    if hasattr(body, "seek") and hasattr(body, "tell"):
        here = body.tell()
        body.seek(0, os.SEEK_END)
        end = body.tell()
        body.seek(here)
        return int(end - here)
    return 0


def _write_targets(op: str, request: dict[str, Any]) -> list[_WriteTarget]:
    """The items a DynamoDB write touches, each with the key to measure it by."""

    def key_of(item: dict[str, Any]) -> dict[str, Any]:
        return {k: item[k] for k in KEY_NAMES}

    if op == "PutItem":
        return [_WriteTarget(request["TableName"], key_of(request["Item"]), False)]
    if op in ("UpdateItem", "DeleteItem"):
        return [_WriteTarget(request["TableName"], request["Key"], False)]
    if op == "TransactWriteItems":
        out: list[_WriteTarget] = []
        for entry in request["TransactItems"]:
            ((kind, spec),) = entry.items()
            key = key_of(spec["Item"]) if kind == "Put" else spec["Key"]
            # ConditionCheck is counted like a transactional write of its item (not used by
            # this conversation: only side-effecting tools and notes issue one).
            out.append(_WriteTarget(spec["TableName"], key, True))
        return out
    if op == "BatchWriteItem":
        out = []
        for table, entries in request["RequestItems"].items():
            for entry in entries:
                if "PutRequest" in entry:
                    out.append(_WriteTarget(table, key_of(entry["PutRequest"]["Item"]), False))
                else:
                    out.append(_WriteTarget(table, entry["DeleteRequest"]["Key"], False))
        return out
    return []


# ------------------------------------------------------------------------------ results


@dataclass
class DesignResult:
    name: str
    call_unit: str
    step_calls: list[int]
    step_bytes: list[int]
    setup_calls: int
    setup_bytes: int
    note: str
    wall_seconds: float
    step_wcu: list[int] | None = None
    setup_wcu: int = 0
    step_wcu_by_item: list[Counter[str]] | None = None  # per step: item kind -> WCU
    step_s3_puts: list[int] | None = None  # per step: S3 PutObject calls
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.step_bytes)

    @property
    def total_bytes(self) -> int:
        return self.setup_bytes + sum(self.step_bytes)

    def cumulative_bytes(self) -> list[int]:
        out: list[int] = []
        total = self.setup_bytes
        for b in self.step_bytes:
            total += b
            out.append(total)
        return out

    def wcu_by_item(self) -> dict[str, float] | None:
        """Average WCU per step by item kind (STEP, META, BUDGET, ...), largest first."""
        return None if self.step_wcu_by_item is None else wcu_by_item(self.step_wcu_by_item)

    def cost(self, prices: Prices) -> dict[str, float] | None:
        """Dollars per step: DynamoDB write request units plus S3 PUTs."""
        if self.step_wcu is None:
            return None
        return step_cost(self.step_wcu, self.step_s3_puts or [0] * self.steps, prices)

    def summary(self, prices: Prices) -> dict[str, Any]:
        first, last = self.step_bytes[:FLAT_WINDOW], self.step_bytes[-FLAT_WINDOW:]
        out: dict[str, Any] = {
            "name": self.name,
            "call_unit": self.call_unit,
            "steps": self.steps,
            "calls_per_step": _avg(self.step_calls),
            "calls_per_step_first10": _avg(self.step_calls[:FLAT_WINDOW]),
            "calls_per_step_last10": _avg(self.step_calls[-FLAT_WINDOW:]),
            "bytes_per_step_avg": _avg(self.step_bytes),
            "bytes_per_step_first10": _avg(first),
            "bytes_per_step_last10": _avg(last),
            "setup_calls": self.setup_calls,
            "setup_bytes": self.setup_bytes,
            "total_calls": self.setup_calls + sum(self.step_calls),
            "total_bytes": self.total_bytes,
            "wcu_per_step": _avg(self.step_wcu) if self.step_wcu is not None else None,
            "wcu_per_step_first10": _avg(self.step_wcu[:FLAT_WINDOW]) if self.step_wcu is not None else None,
            "wcu_per_step_last10": _avg(self.step_wcu[-FLAT_WINDOW:]) if self.step_wcu is not None else None,
            "total_wcu": (self.setup_wcu + sum(self.step_wcu)) if self.step_wcu is not None else None,
            "wcu_per_step_by_item": self.wcu_by_item(),
            "cost": self.cost(prices),
            "note": self.note,
            "wall_seconds_local": round(self.wall_seconds, 3),
            "bytes_per_step": self.step_bytes,
            "wcu_by_step": self.step_wcu,
        }
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Prices:
    """On-demand list prices in dollars per request (us-east-1 by default)."""

    wru_usd: float  # one DynamoDB write request unit (a transactional write of 1 KB is two)
    s3_put_usd: float  # one S3 Standard PUT

    def as_dict(self) -> dict[str, float]:
        return {"dynamodb_wru_usd_per_million": self.wru_usd * 1e6, "s3_put_usd_per_million": self.s3_put_usd * 1e6}


def wcu_by_item(per_step: Sequence[Counter[str]]) -> dict[str, float]:
    total: Counter[str] = Counter()
    for counts in per_step:
        total.update(counts)
    return {kind: round(units / len(per_step), 2) for kind, units in total.most_common()} if per_step else {}


def step_cost(wcu: Sequence[int], s3_puts: Sequence[int], prices: Prices) -> dict[str, float]:
    """Average dollars per step of these steps (WCU billed as write request units)."""
    n = max(1, len(wcu))
    ddb = sum(wcu) / n * prices.wru_usd
    s3 = sum(s3_puts) / n * prices.s3_put_usd
    return {
        "s3_puts_per_step": round(sum(s3_puts) / n, 3),
        "usd_per_step": ddb + s3,
        "usd_per_million_steps": round((ddb + s3) * 1e6, 3),
        "usd_per_million_steps_dynamodb": round(ddb * 1e6, 3),
        "usd_per_million_steps_s3": round(s3 * 1e6, 3),
    }


def _avg(values: Sequence[int] | Sequence[float]) -> float:
    return round(sum(values) / len(values), 2) if values else 0.0


# ----------------------------------------------------------------------------- 1. agentq


@dataclass
class AgentqRun:
    result: DesignResult
    goal: str
    steps: list[StepRecord]
    buckets: dict[int, Bucket]
    tokens: dict[str, Any]


class AgentqStepClock:
    """Puts each AWS call of the engine into the bucket of the step it works towards.

    Setup holds create_task, the claim (its UpdateItem and CLAIM# record) and the reads that
    rebuild the session; the first other call starts step 1. A step is committed when META's ``step`` moves to it: a write of META that sets
    ``step`` after the ``STEP#n`` item was put (in the same transaction or before it) moves
    the clock to step n + 1.
    """

    def __init__(self, meter: AwsMeter) -> None:
        self.meter = meter
        self.running = False
        self.prepared: int | None = None  # the STEP#n put, not yet committed
        self.heartbeats = 0  # lease extensions: META writes of heartbeat_at that are no claim or commit

    def on_call(self, op: str, request: dict[str, Any]) -> None:
        if self.meter.bucket != SETUP or not self.running:
            return
        is_claim = op == "UpdateItem" and "lease_owner" in _names(request)
        is_claim_record = op == "PutItem" and request["Item"]["sk"]["S"].startswith("CLAIM#")
        if not (is_claim or is_claim_record or op in ("Query", "GetItem")):  # claim and rebuild reads: setup
            self.meter.bucket = 1

    def on_done(self, op: str, request: dict[str, Any], ok: bool) -> None:
        if not ok:
            return
        if op in ("PutItem", "UpdateItem"):
            writes = [("Put" if op == "PutItem" else "Update", request)]
        elif op == "TransactWriteItems":
            writes = [next(iter(entry.items())) for entry in request["TransactItems"]]
        else:
            return
        for kind, spec in writes:
            sk = spec["Item"].get("sk", {}).get("S", "") if kind == "Put" else ""
            if sk.startswith("STEP#"):
                self.prepared = int(sk.removeprefix("STEP#"))
        for kind, spec in writes:
            is_meta = kind == "Update" and spec["Key"].get("sk", {}).get("S") == "META"
            if is_meta and "heartbeat_at" in _names(spec) and not _names(spec) & {"step", "lease_owner"}:
                self.heartbeats += 1
            if is_meta and "step" in _names(spec) and self.prepared is not None:
                self.meter.bucket = self.prepared + 1
                self.prepared = None


def _names(spec: dict[str, Any]) -> set[str]:
    """The attribute names a request's expressions use (behind their #placeholders)."""
    return set(spec.get("ExpressionAttributeNames", {}).values())


def run_agentq(
    settings: Settings, store: Storage, meter: AwsMeter, llm_turns: int, tool_bytes: int, workdir: Path
) -> AgentqRun:
    registry = build_registry(settings)
    registry.register(make_read_doc(tool_bytes))
    # The script lives in a file, as a real task's submission holds no script: META stays
    # the size of a production task's META instead of carrying 50 scripted turns.
    script_path = workdir / "script.json"
    script_path.write_text(json.dumps({"turns": script_turns(llm_turns)}))
    goal = f"Read the {llm_turns} documents of the corpus one by one, then summarise their findings."
    submission = TaskSubmission.model_validate(
        {
            "goal": goal,
            "provider": "scripted",
            "script": str(script_path),
            "constraints": {
                "tools": ["read_doc"],
                "max_steps": llm_turns + 1,
                "max_tokens": 500_000_000,
                "timeout_seconds": 3600,
            },
        }
    )
    meter.reset()
    clock = AgentqStepClock(meter)
    meter.on_call, meter.on_done = clock.on_call, clock.on_done
    started = time.perf_counter()
    task = store.tasks.create(submission, tenant="bench")
    clock.running = True
    engine = Engine(store, worker_id="bench-worker", tools=registry, config=EngineConfig(lease_seconds=LEASE_SECONDS))
    outcome = engine.run(task.task_id)
    wall = time.perf_counter() - started
    if outcome.status is not TaskStatus.SUCCEEDED:
        raise RuntimeError(f"agentq run ended {outcome.outcome}/{outcome.status}: {outcome.error}")
    buckets = dict(meter.buckets)
    meter.paused = True
    try:
        steps = store.steps.load(task.task_id)
        raw = store.steps.raw_items(task.task_id)
        final = store.tasks.get(task.task_id)
        budget = store.budgets.get(task.task_id)
    finally:
        meter.paused = False
    n = len(steps)
    extra_buckets = sorted(k for k in buckets if k > n)
    if extra_buckets:  # calls after the last commit (none expected): count them as setup
        for k in extra_buckets:
            _merge(buckets.setdefault(SETUP, Bucket()), buckets.pop(k))
    step_buckets = [buckets.get(i, Bucket()) for i in range(1, n + 1)]
    setup = buckets.get(SETUP, Bucket())
    step_items = [i for i in raw if i["sk"]["S"].startswith("STEP#")]
    assert len(step_items) == n, (len(step_items), n)
    sizes = {i["sk"]["S"]: item_size(i) for i in raw}
    # Cross-check: STEP items are written once here (no refused commit leaves one to overwrite),
    # so their WCU recomputed from the table afterwards (store.steps.raw_items, in or out of a
    # transaction as the meter saw them written) must equal what the meter probed at write time.
    step_writes = [(sk, units, tx) for sk, units, tx in meter.item_wcu if sk.startswith("STEP#")]
    in_transaction = {sk: tx for sk, _, tx in step_writes}
    step_wcu_metered = sum(units for _, units, _ in step_writes)
    step_wcu_table = sum(
        wcu_for(item_size(i), transactional=in_transaction.get(i["sk"]["S"], False)) for i in step_items
    )
    s3_puts = sum(b.calls["PutObject"] for b in step_buckets)
    result = DesignResult(
        name="agentq (DynamoDB step log)",
        call_unit="AWS calls",
        step_calls=[b.n_calls for b in step_buckets],
        step_bytes=[b.bytes_written for b in step_buckets],
        setup_calls=setup.n_calls,
        setup_bytes=setup.bytes_written,
        step_wcu=[b.wcu for b in step_buckets],
        setup_wcu=setup.wcu,
        step_wcu_by_item=[b.wcu_by_item for b in step_buckets],
        step_s3_puts=[b.calls["PutObject"] for b in step_buckets],
        wall_seconds=wall,
        note=(
            f"STEP PutItem, then META UpdateItem (budget on META); {s3_puts} S3 puts "
            f"(offload > {settings.offload_threshold:,} B)"
        ),
        extra={
            "max_item_bytes": max(sizes.values()),
            "meta_item_bytes": sizes["META"],
            "s3_put_bytes_per_step": _avg([b.s3_put_bytes for b in step_buckets]),
            "ddb_write_bytes_per_step": _avg([b.ddb_write_bytes for b in step_buckets]),
            "ddb_read_request_bytes_total": setup.ddb_other_bytes + sum(b.ddb_other_bytes for b in step_buckets),
            "step_item_wcu_check": {"metered": step_wcu_metered, "from_raw_items": step_wcu_table},
            "heartbeats": clock.heartbeats,
            "refresh_reads": dict(meter.refresh_reads),
        },
    )
    tokens = {
        "llm_calls": final.llm_steps,
        "tokens_in": final.tokens_in,
        "tokens_out": final.tokens_out,
        "budget_used": budget.used,
        "cost_usd": str(final.cost_usd),
    }
    return AgentqRun(result=result, goal=goal, steps=steps, buckets=buckets, tokens=tokens)


def _merge(into: Bucket, other: Bucket) -> None:
    into.calls.update(other.calls)
    into.failed.update(other.failed)
    into.ddb_write_bytes += other.ddb_write_bytes
    into.ddb_other_bytes += other.ddb_other_bytes
    into.s3_put_bytes += other.s3_put_bytes
    into.wcu += other.wcu
    into.wcu_by_item.update(other.wcu_by_item)
    into.items_written += other.items_written


# -------------------------------------------------------------------- 2. full-state upsert


def run_upsert(store: Storage, meter: AwsMeter, run: AgentqRun) -> DesignResult:
    """One item per task, the whole conversation JSON in it, PutItem'd after every step."""
    meter.reset()
    ddb, table = dynamo(store).client, store.table.name
    s3, bucket_name = s3_payloads(store).s3, s3_payloads(store).bucket
    conv_id = uuid.uuid4().hex
    pk = {"S": f"CONV#{conv_id}"}
    fails_at: int | None = None
    sizes: list[int] = []
    tokens_in = tokens_out = 0
    started = time.perf_counter()
    for n in range(1, len(run.steps) + 1):
        meter.bucket = n
        body = run.steps[n - 1].body
        if body.kind == "llm":
            tokens_in += body.usage.input_tokens
            tokens_out += body.usage.output_tokens
        state_json = json.dumps(conversation(run.goal, run.steps[:n]), separators=(",", ":"))
        last = n == len(run.steps)
        item: dict[str, Any] = {
            "pk": pk,
            "sk": {"S": "STATE"},
            "status": {"S": "succeeded" if last else "running"},
            "step": {"N": str(n)},
            "version": {"N": str(n)},
            "tokens_in": {"N": str(tokens_in)},
            "tokens_out": {"N": str(tokens_out)},
            "updated_at": {"N": repr(run.steps[n - 1].committed_at)},
        }
        condition = {
            "ConditionExpression": "attribute_not_exists(pk) OR version = :prev",
            "ExpressionAttributeValues": {":prev": {"N": str(n - 1)}},
        }
        if fails_at is None:
            try:
                ddb.put_item(TableName=table, Item={**item, "messages": {"S": state_json}}, **condition)
                sizes.append(item_size({**item, "messages": {"S": state_json}}))
                continue
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ValidationException":
                    raise
                fails_at = n  # the 400 KB item limit; from here on the state lives in S3
        key = f"conversations/{conv_id}/state.json"
        s3.put_object(Bucket=bucket_name, Key=key, Body=state_json.encode(), ContentType="application/json")
        ddb.put_item(TableName=table, Item={**item, "messages_ref": {"S": key}}, **condition)
        sizes.append(item_size({**item, "messages_ref": {"S": key}}))
    wall = time.perf_counter() - started
    buckets = [meter.buckets.get(i, Bucket()) for i in range(1, len(run.steps) + 1)]
    peak = max(sizes)
    projected: int | None = None
    if fails_at is None:
        # Growth per step over the last ten (five LLM and five tools steps), extrapolated.
        if len(sizes) > FLAT_WINDOW:
            growth = (sizes[-1] - sizes[-1 - FLAT_WINDOW]) / FLAT_WINDOW
        else:
            growth = sizes[-1] / len(sizes)
        projected = len(sizes) + math.ceil((DDB_ITEM_LIMIT - sizes[-1]) / growth) if growth > 0 else None
        limit_note = f"peak item {peak / 1024:.0f} KB, under 400 KB (passes it ~step {projected})"
    else:
        limit_note = f"FAILS at step {fails_at} (item > 400 KB), then S3 blob + pointer"
    return DesignResult(
        name="full-state upsert (1 item)",
        call_unit="AWS calls",
        step_calls=[b.n_calls for b in buckets],
        step_bytes=[b.bytes_written for b in buckets],
        setup_calls=0,
        setup_bytes=0,
        step_wcu=[b.wcu for b in buckets],
        step_wcu_by_item=[b.wcu_by_item for b in buckets],
        step_s3_puts=[b.calls["PutObject"] for b in buckets],
        wall_seconds=wall,
        note=f"PutItem of the whole history; {limit_note}",
        extra={
            "peak_item_bytes": peak,
            "fails_at_step": fails_at,
            "projected_limit_step": projected,
            "failed_calls": sum(sum(b.failed.values()) for b in buckets),
            "s3_put_bytes_total": sum(b.s3_put_bytes for b in buckets),
        },
    )


# ------------------------------------------------------------------------------ 3. LangGraph


class _Ledger:
    """Saver-side counters: calls and serialized bytes per graph step."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[int, str]] = Counter()
        self.bytes: Counter[int] = Counter()
        self.last_put_step = -2
        self.current = SETUP
        self.lock = threading.Lock()

    def add_bytes(self, n: int) -> None:
        with self.lock:
            self.bytes[self.current] += n


class _CountingSerde:
    """Delegates to the saver's serializer and adds every ``dumps_typed`` blob to the ledger."""

    def __init__(self, inner: Any, ledger: _Ledger) -> None:
        self.inner = inner
        self.ledger = ledger

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = self.inner.dumps_typed(obj)
        self.ledger.add_bytes(len(kind.encode()) + len(data))
        return kind, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.inner.loads_typed(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _metered_saver(base: type, ledger: _Ledger, *, json_metadata: bool) -> type:
    """A subclass of ``base`` whose put/put_writes set the step bucket and count the call.

    Graph step k's node writes (``put_writes``) go to bucket k, as does its checkpoint
    (``put`` with metadata step k); the input checkpoints (steps -1 and 0) are setup.
    """

    class Metered(base):  # type: ignore[misc, valid-type]
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            step = int(metadata.get("step", 0))
            with ledger.lock:
                ledger.last_put_step = step
                ledger.current = step if step >= 1 else SETUP
                ledger.calls[(ledger.current, "put")] += 1
            if json_metadata:  # SqliteSaver stores metadata as JSON, outside the serde
                meta = json.dumps(get_checkpoint_metadata(config, metadata), ensure_ascii=False)
                ledger.add_bytes(len(meta.encode("utf-8", "ignore")))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            with ledger.lock:
                nxt = ledger.last_put_step + 1
                ledger.current = nxt if nxt >= 1 else SETUP
                ledger.calls[(ledger.current, "put_writes")] += 1
            super().put_writes(config, writes, task_id, task_path)

    Metered.__name__ = f"Metered{base.__name__}"
    return Metered


def _lc_steps(run: AgentqRun) -> tuple[Any, list[list[Any]]]:
    """The goal and, per agentq step, the LangChain messages it appends."""
    messages = conversation(run.goal, run.steps)
    goal = HumanMessage(content=run.goal, id="m-0000")
    per_step: list[list[Any]] = []
    for n, msg in enumerate(messages[1:], start=1):
        if msg["role"] == "assistant":
            calls = [
                {"name": b["name"], "args": b["input"], "id": b["id"], "type": "tool_call"}
                for b in msg["content"]
                if b.get("type") == "tool_use"
            ]
            per_step.append([AIMessage(content=msg["content"], tool_calls=calls, id=f"m-{n:04d}")])
        else:
            per_step.append(
                [
                    ToolMessage(
                        content=r["content"],
                        tool_call_id=r["tool_use_id"],
                        status="error" if r["is_error"] else "success",
                        id=f"m-{n:04d}-{i}",
                    )
                    for i, r in enumerate(msg["content"])
                ]
            )
    return goal, per_step


def _fold_messages(state: list[Any], writes: Sequence[list[Any]]) -> list[Any]:
    """add_messages over a batch of writes: the reducer shape DeltaChannel wants."""
    for write in writes:
        state = add_messages(state, write)  # type: ignore[assignment]
    return state


class ChatState(TypedDict):
    """The usual LangGraph agent state: messages under the add_messages reducer."""

    messages: Annotated[list[AnyMessage], add_messages]
    step: int


class DeltaChatState(TypedDict):
    """The same state with the beta DeltaChannel: checkpoints keep writes, not the list."""

    messages: Annotated[list[AnyMessage], DeltaChannel(_fold_messages)]
    step: int


def run_langgraph(run: AgentqRun, saver_kind: str, workdir: Path, *, delta: bool = False) -> DesignResult:
    goal, per_step = _lc_steps(run)
    schema: type = DeltaChatState if delta else ChatState

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        n = state["step"] + 1
        return {"messages": per_step[n - 1], "step": n}

    def tools(state: dict[str, Any]) -> dict[str, Any]:
        n = state["step"] + 1
        return {"messages": per_step[n - 1], "step": n}

    def route(state: dict[str, Any]) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder: Any = StateGraph(schema)  # langgraph types nodes by the state schema, which is chosen at run time
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")

    ledger = _Ledger()
    conn: sqlite3.Connection | None = None
    db_path = workdir / f"langgraph-{saver_kind}{'-delta' if delta else ''}.sqlite"
    if saver_kind == "sqlite":
        conn = sqlite3.connect(str(db_path), check_same_thread=False)
        saver: Any = _metered_saver(SqliteSaver, ledger, json_metadata=True)(conn)
    else:
        saver = _metered_saver(InMemorySaver, ledger, json_metadata=False)()
    graph = builder.compile(checkpointer=saver)
    # compile() may clone the saver to attach a msgpack allowlist: wrap the serde it kept.
    live = graph.checkpointer
    live.serde = _CountingSerde(live.serde, ledger)  # type: ignore[union-attr]
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        final = graph.invoke(
            {"messages": [goal], "step": 0},
            {"configurable": {"thread_id": "bench"}, "recursion_limit": 10 * len(per_step) + 10},
            durability="sync",
        )
    wall = time.perf_counter() - started
    n = len(per_step)
    if final["step"] != n or len(final["messages"]) != 1 + sum(len(m) for m in per_step):
        raise RuntimeError(f"LangGraph run ended at step {final['step']} of {n}")
    file_bytes: int | None = None
    if conn is not None:
        conn.close()
        file_bytes = sum(p.stat().st_size for p in workdir.glob(db_path.name + "*"))
    step_calls = [ledger.calls[(i, "put")] + ledger.calls[(i, "put_writes")] for i in range(1, n + 1)]
    step_bytes = [ledger.bytes[i] for i in range(1, n + 1)]
    setup_calls = ledger.calls[(SETUP, "put")] + ledger.calls[(SETUP, "put_writes")]
    label = {"sqlite": "SqliteSaver", "memory": "InMemorySaver"}[saver_kind]
    name = f"LangGraph {label}" + (" +DeltaChannel" if delta else "")
    if delta:
        note = "beta: step writes only, full snapshot every 100 updates"
    elif saver_kind == "sqlite":
        note = "each checkpoint row holds the whole history"
    else:
        note = "whole messages channel re-serialized every step"
    if file_bytes is not None:
        note += f"; db file {file_bytes / 1024:,.0f} KB"
    return DesignResult(
        name=name,
        call_unit="saver calls",
        step_calls=step_calls,
        step_bytes=step_bytes,
        setup_calls=setup_calls,
        setup_bytes=ledger.bytes[SETUP],
        wall_seconds=wall,
        note=note,
        extra={"sqlite_file_bytes": file_bytes, "durability": "sync"},
    )


# ------------------------------------------------------------------------------ reporting


def _fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def _fmt_calls(x: float) -> str:
    return f"{x:.2f}"


def _render(headers: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


def render_table(results: list[DesignResult], prices: Prices) -> str:
    headers = [
        "design",
        "calls/step",
        "B/step avg",
        "first 10",
        "last 10",
        "total bytes",
        "WCU/step",
        "S3 PUT/step",
        "$/1M steps",
        "note",
    ]
    rows: list[list[str]] = []
    for r in results:
        s = r.summary(prices)
        cost = s["cost"]
        rows.append(
            [
                r.name,
                _fmt_calls(s["calls_per_step"]),
                _fmt_int(s["bytes_per_step_avg"]),
                _fmt_int(s["bytes_per_step_first10"]),
                _fmt_int(s["bytes_per_step_last10"]),
                _fmt_int(s["total_bytes"]),
                "n/a" if s["wcu_per_step"] is None else f"{s['wcu_per_step']:.1f}",
                "n/a" if cost is None else f"{cost['s3_puts_per_step']:.2f}",
                "n/a" if cost is None else f"{cost['usd_per_million_steps']:.2f}",
                r.note,
            ]
        )
    return _render(headers, rows, set(range(1, 9)))


ITEM_ORDER = ("STEP", "META", "BUDGET")


def render_items_table(rows_in: list[tuple[str, dict[str, float], dict[str, float]]]) -> str:
    """WCU per step by item, S3 PUTs and dollars: one row per (label, wcu_by_item, cost)."""
    kinds = [k for k in ITEM_ORDER if any(k in by for _, by, _ in rows_in)]
    kinds += sorted({k for _, by, _ in rows_in for k in by} - set(kinds))
    headers = ["WCU per step by item", *kinds, "WCU", "S3 PUTs", "$ DynamoDB", "$ S3", "$ total (per 1M steps)"]
    rows = []
    for label, by, cost in rows_in:
        rows.append(
            [
                label,
                *(f"{by.get(k, 0.0):.2f}" for k in kinds),
                f"{sum(by.values()):.2f}",
                f"{cost['s3_puts_per_step']:.2f}",
                f"{cost['usd_per_million_steps_dynamodb']:.2f}",
                f"{cost['usd_per_million_steps_s3']:.2f}",
                f"{cost['usd_per_million_steps']:.2f}",
            ]
        )
    return _render(headers, rows, set(range(1, len(headers))))


def agentq_detail(run: AgentqRun, prices: Prices) -> dict[str, Any]:
    r = run.result
    n = r.steps
    steps = [run.buckets.get(i, Bucket()) for i in range(1, n + 1)]
    setup = run.buckets.get(SETUP, Bucket())
    by_kind: dict[str, Any] = {}
    for kind in ("llm", "tools"):
        bs = [steps[i] for i, rec in enumerate(run.steps) if rec.body.kind == kind]
        by_kind[kind] = {
            "steps": len(bs),
            "wcu_per_step": _avg([b.wcu for b in bs]),
            "wcu_per_step_by_item": wcu_by_item([b.wcu_by_item for b in bs]),
            "cost": step_cost([b.wcu for b in bs], [b.calls["PutObject"] for b in bs], prices),
        }
    by_op: Counter[str] = Counter()
    for b in steps:
        by_op.update(b.calls)

    def window(bs: list[Bucket]) -> dict[str, float]:
        return {
            "calls": _avg([b.n_calls for b in bs]),
            "ddb_write_bytes": _avg([b.ddb_write_bytes for b in bs]),
            "s3_put_bytes": _avg([b.s3_put_bytes for b in bs]),
            "wcu": _avg([b.wcu for b in bs]),
        }

    first, last = window(steps[:FLAT_WINDOW]), window(steps[-FLAT_WINDOW:])
    ratio = round(last["ddb_write_bytes"] / first["ddb_write_bytes"], 3) if first["ddb_write_bytes"] else None
    wcu_ratio = round(last["wcu"] / first["wcu"], 3) if first["wcu"] else None
    # Like for like: step 1 also carries the first reservation and the last step the final
    # result, so the steady state compares steps 2-11 with the ten before the final answer
    # (both five LLM and five tools steps).
    early, late = window(steps[1 : 1 + FLAT_WINDOW]), window(steps[-1 - FLAT_WINDOW : -1])
    steady_ratio = round(late["ddb_write_bytes"] / early["ddb_write_bytes"], 3) if early["ddb_write_bytes"] else None
    return {
        "steps": n,
        "calls_by_operation_steps": dict(sorted(by_op.items())),
        "calls_by_operation_setup": dict(sorted(setup.calls.items())),
        "calls_per_step": _avg([b.n_calls for b in steps]),
        "ddb_write_bytes_per_step": _avg([b.ddb_write_bytes for b in steps]),
        "s3_put_bytes_per_step": _avg([b.s3_put_bytes for b in steps]),
        "wcu_per_step": _avg([b.wcu for b in steps]),
        "wcu_per_step_by_item": r.wcu_by_item(),
        "cost": r.cost(prices),
        "by_step_kind": by_kind,
        "totals": {
            "calls": setup.n_calls + sum(b.n_calls for b in steps),
            "ddb_write_bytes": setup.ddb_write_bytes + sum(b.ddb_write_bytes for b in steps),
            "s3_put_bytes": setup.s3_put_bytes + sum(b.s3_put_bytes for b in steps),
            "wcu": setup.wcu + sum(b.wcu for b in steps),
            "items_written": setup.items_written + sum(b.items_written for b in steps),
        },
        "setup": {
            "calls": setup.n_calls,
            "ddb_write_bytes": setup.ddb_write_bytes,
            "wcu": setup.wcu,
        },
        "flat": {
            "first10": first,
            "last10": last,
            "bytes_ratio_last_to_first": ratio,
            "wcu_ratio_last_to_first": wcu_ratio,
            "steady_early": {"steps": [2, 1 + FLAT_WINDOW], **early},
            "steady_late": {"steps": [n - FLAT_WINDOW, n - 1], **late},
            "steady_bytes_ratio": steady_ratio,
            "is_flat": ratio is not None and ratio <= 1.1 and (wcu_ratio or 1) <= 1.1,
        },
        "max_item_bytes": r.extra["max_item_bytes"],
        "meta_item_bytes": r.extra["meta_item_bytes"],
        "step_item_wcu_check": r.extra["step_item_wcu_check"],
    }


def render_agentq_detail(d: dict[str, Any]) -> str:
    ops = ", ".join(f"{op} {n}" for op, n in d["calls_by_operation_steps"].items())
    setup_ops = ", ".join(f"{op} {n}" for op, n in d["calls_by_operation_setup"].items())
    t, f = d["totals"], d["flat"]
    early, late = f["steady_early"], f["steady_late"]
    lines = [
        f"agentq, {d['steps']} steps:",
        f"  calls by operation (steps): {ops}",
        f"  per-task setup (create_task, claim, rebuild query; not in the per-step figures): {setup_ops}",
        f"  per step: {d['calls_per_step']:.2f} calls, {_fmt_int(d['ddb_write_bytes_per_step'])} B to DynamoDB, "
        f"{_fmt_int(d['s3_put_bytes_per_step'])} B to S3, {d['wcu_per_step']:.1f} WCU",
        f"  totals:   {t['calls']} calls, {_fmt_int(t['ddb_write_bytes'])} B to DynamoDB, "
        f"{_fmt_int(t['s3_put_bytes'])} B to S3, {t['wcu']} WCU, {t['items_written']} item writes",
        f"  largest item {_fmt_int(d['max_item_bytes'])} B (limit 409,600); META {_fmt_int(d['meta_item_bytes'])} B; "
        f"STEP-item WCU metered {d['step_item_wcu_check']['metered']} = from store.steps.raw_items "
        f"{d['step_item_wcu_check']['from_raw_items']}",
        f"  flat: first 10 steps {f['first10']['calls']:.2f} calls, {_fmt_int(f['first10']['ddb_write_bytes'])} B, "
        f"{f['first10']['wcu']:.1f} WCU/step; last 10 steps {f['last10']['calls']:.2f} calls, "
        f"{_fmt_int(f['last10']['ddb_write_bytes'])} B, {f['last10']['wcu']:.1f} WCU/step "
        f"(bytes x{f['bytes_ratio_last_to_first']}, WCU x{f['wcu_ratio_last_to_first']})",
        f"  like for like (step 1 also holds the first reservation, step {d['steps']} the final result): "
        f"steps {early['steps'][0]}-{early['steps'][1]} {_fmt_int(early['ddb_write_bytes'])} B/step, "
        f"steps {late['steps'][0]}-{late['steps'][1]} {_fmt_int(late['ddb_write_bytes'])} B/step "
        f"(x{f['steady_bytes_ratio']})",
    ]
    return "\n".join(lines)


def maybe_plot(results: list[DesignResult], out_png: Path | None) -> str | None:
    if out_png is None or importlib.util.find_spec("matplotlib") is None:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out_png.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for r in results:
            cum = r.cumulative_bytes()
            ax.plot(range(1, len(cum) + 1), [c / 1e6 for c in cum], label=r.name)
        ax.set_xlabel("step")
        ax.set_ylabel("cumulative bytes written (MB)")
        ax.set_title("Checkpoint bytes written vs. step (same conversation)")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_png, dpi=120)
        plt.close(fig)
        return str(out_png)
    except Exception:  # a broken matplotlib install must not fail the bench
        return None


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    parser.add_argument("--turns", type=int, default=50, help="LLM turns that call the tool (default 50)")
    parser.add_argument("--tool-bytes", type=int, default=3000, help="characters per tool result (default 3000)")
    parser.add_argument(
        "--offload-bytes",
        type=int,
        default=DEFAULT_OFFLOAD_THRESHOLD,
        help="payloads above this many bytes go to S3 (AGENTQ_OFFLOAD_BYTES; default 65536): "
        "lower it to see write units traded for S3 PUTs",
    )
    parser.add_argument(
        "--wru-usd-per-million",
        type=float,
        default=per_million("dynamodb_wru"),
        help=f"DynamoDB on-demand price per million write request units (default: bench/_prices.py, "
        f"{per_million('dynamodb_wru'):g})",
    )
    parser.add_argument(
        "--s3-put-usd-per-million",
        type=float,
        default=per_million("s3_put"),
        help=f"S3 Standard price per million PUTs (default: bench/_prices.py, {per_million('s3_put'):g})",
    )
    add_plot_args(parser, "checkpoint_cost")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)

    total_started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agentq-bench-") as tmp, MotoServer() as server:
        workdir = Path(tmp)
        names = ResourceNames.for_prefix(f"bench{uuid.uuid4().hex[:8]}")
        settings = Settings(
            table=names.table,
            bucket=names.bucket,
            endpoint_url=server.endpoint_url,
            offload_threshold=args.offload_bytes,
        )
        provision(session(settings), names, endpoint_url=settings.endpoint_url)
        store = build_store(settings)
        meter = AwsMeter(client(settings, "dynamodb"))
        meter.attach(dynamo(store).client)
        meter.attach(s3_payloads(store).s3)

        run = run_agentq(settings, store, meter, args.turns, args.tool_bytes, workdir)
        upsert = run_upsert(store, meter, run)
        results = [run.result, upsert]
        for kind, delta in (("sqlite", False), ("memory", False), ("sqlite", True)):
            results.append(run_langgraph(run, kind, workdir, delta=delta))
    prices = Prices(wru_usd=args.wru_usd_per_million / 1e6, s3_put_usd=args.s3_put_usd_per_million / 1e6)
    detail = agentq_detail(run, prices)
    plot = maybe_plot(results, None if args.no_plot else args.plot)
    elapsed = time.perf_counter() - total_started

    if args.json:
        payload = {
            "config": {
                "llm_turns_with_tool": args.turns,
                "tool_result_chars": args.tool_bytes,
                "steps": run.result.steps,
                "offload_threshold_bytes": settings.offload_threshold,
                "ddb_item_limit_bytes": DDB_ITEM_LIMIT,
            },
            "tokens": run.tokens,
            "prices": prices.as_dict(),
            "designs": [r.summary(prices) for r in results],
            "agentq": detail,
            "plot": plot,
            "wall_seconds_local_total": round(elapsed, 2),
        }
        print(json.dumps(payload, default=_json_default))
        return 0

    tok = run.tokens
    print(
        f"Same conversation for every design: {args.turns} LLM turns x 1 read-only tool "
        f"({args.tool_bytes:,} chars/result) + final answer = {run.result.steps} steps."
    )
    print(
        f"LLM tokens (scripted provider, identical for all designs): {tok['llm_calls']} calls, "
        f"{tok['tokens_in']:,} in, {tok['tokens_out']:,} out."
    )
    print("calls = AWS API calls (DynamoDB/S3 designs) or checkpointer put + put_writes (LangGraph).")
    print("bytes = DynamoDB write request bodies + S3 PutObject bodies, or serialized checkpoint/write blobs.")
    beats, refreshed = run.result.extra["heartbeats"], run.result.extra["refresh_reads"]
    print(
        f"(agentq's lease heartbeat, 1 UpdateItem per lease/3 s held, is time-based, not per step; "
        f"lease {LEASE_SECONDS:.0f} s here, {beats} heartbeats during the steps. So are the reads that refresh "
        f"a cached copy, not counted per step: the tool's circuit, a GetItem a second at most "
        f"({refreshed.get('circuit', 0)}), and the tenant's policies, a Query every 5 s "
        f"({refreshed.get('policies', 0)}), in this run's {run.result.wall_seconds:.1f} s.)"
    )
    print()
    print(render_table(results, prices))
    print()
    item_rows = [(r.name, r.wcu_by_item() or {}, r.cost(prices) or {}) for r in results if r.step_wcu is not None]
    for kind, label in (("tools", "tools"), ("llm", "LLM")):
        k = detail["by_step_kind"][kind]
        item_rows.insert(1, (f"  of which {label} steps ({k['steps']})", k["wcu_per_step_by_item"], k["cost"]))
    print(render_items_table(item_rows))
    print(
        f"(prices: {dollars(args.wru_usd_per_million)}/M DynamoDB write request units, a transactional write of "
        f"1 KB is two; {dollars(args.s3_put_usd_per_million)}/M S3 PUT requests; us-east-1 list prices read "
        f"{READ_ON}, bench/_prices.py)"
    )
    print()
    print(render_agentq_detail(detail))
    up = upsert.extra
    if up["fails_at_step"] is not None:
        print(f"full-state upsert: fails at step {up['fails_at_step']} (item over 400 KB); moved to S3 after.")
    else:
        print(
            f"full-state upsert: peak item {_fmt_int(up['peak_item_bytes'])} B at step {upsert.steps}; "
            f"below 400 KB in this run, passes it at about step {up['projected_limit_step']} at the current growth."
        )
    walls = ", ".join(f"{r.name} {r.wall_seconds:.2f}s" for r in results)
    print(
        f"wall time (moto-local / in-process, includes the bench's own item-size probes; not a headline "
        f"figure): {walls}; total {elapsed:.1f}s"
    )
    if plot:
        print(f"plot: {plot}")
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
