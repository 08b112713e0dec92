"""Sub-agent fan-out on the local stack: latency and AWS cost per child.

    python bench/fanout.py                      # N = 10, 50, 100 children, two-turn children
    python bench/fanout.py --sizes 10,100 --child-turns 1 --json

For each size N, a scripted parent (tools: spawn_subagents, note_read; max_fanout = N) spawns N
scripted children with max_concurrency = N in its first LLM turn, then answers once woken.
Each child is a two-turn agent (turn 1 calls the read-only ``note_read`` tool, turn 2 answers)
or, with ``--child-turns 1``, answers at once. The children run through the real fan-out path:
the SPAWN record, the Step Functions execution of ``asl/fanout.asl.json`` (moto executes it),
one ``sqs:sendMessage.waitForTaskToken`` per child, ``SendTaskSuccess`` from the worker that
ran the child, then ``WakeParent``.

Measured per size (every time comes from a record agentq itself wrote):

- spawn -> resume: the SPAWN record's ``created_at`` (``store.spawns.get(parent, spawn_id)``,
  spawn_id = the tool_use id of the parent's first LLM step) to the parent's second claim
  (``claims[1].at``); spawn -> finish: to the parent's ``finished_at``. Broken down into
  spawn -> execution start (``describe_execution().startDate``), the children's span (first
  child claim .. last child ``finished_at``), and last child done -> parent resumed (execution
  end, WakeParent's message, the wake and the re-claim).
- AWS calls, by service, counted inside each worker process: this file re-runs itself as the
  worker (``--as-worker``: ``agentq worker`` with botocore's ``_make_api_call`` wrapped, counts  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call
  dumped to ``$AGENTQ_BENCH_COUNTS/<pid>.json`` every 0.5 s and at exit), plus the parent's
  submit (counted in this process), plus the SQS SendMessage requests Step Functions makes on
  the workflow's behalf (one TaskScheduled event per child + WakeParent in the execution
  history; moto makes them in-process, so no worker sees them, but AWS bills them to the
  queue's owner). The window runs from just before the submit to every child and the parent
  being terminal and the execution ended; per child = total / N (the parent's own calls
  included). ReceiveMessage includes the workers' idle long polls during the window
  (2 workers x 3 tiers, ``poll_wait_seconds`` each, ``idle_poll_wait_seconds`` while the
  tier is idle): shown apart.
- Step Functions state transitions: the ``*StateEntered`` events of the execution history
  (TaskStateEntered, MapStateEntered, PassStateEntered, ...: each state an execution enters,
  Map iterations' states included, is one billed transition of a Standard workflow); all
  history events are shown too.
- $ per 1,000 children at us-east-1 list prices (formula printed with the table).

The first fan-out (N = 2) is a warm-up and is not reported. Wall times are moto-local (one
DynamoDB request at a time, 2 worker processes on this machine). Transition counts do not
depend on the machine; call counts do once the machine is overloaded: when a heartbeat round
takes longer than the lease (agentq's defaults: lease 3 s, heartbeat 1 s), children are
re-claimed (``claims/child`` > 1) and every re-claim costs calls. ``--lease 20 --heartbeat 5
--visibility 25`` shows the per-child cost without that.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import botocore.client

# ---------------------------------------------------------------------- counting (both sides)

_counts: Counter[str] = Counter()
_units: Counter[str] = Counter()  # "dynamodb:wru", "dynamodb:rru" (approximate, see ddb_units)
_lock = threading.Lock()
_local = threading.local()
_original_call = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call

DDB_WRITE_ONE = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
DDB_READ_ONE = frozenset({"GetItem", "Query", "Scan"})


def ddb_units(op: str, params: dict[str, Any]) -> tuple[int, int]:
    """(WRU, RRU) of one DynamoDB call, approximated: 1 unit per item read or written (items
    of <= 1 KB written, <= 4 KB read), 2 per item of a transaction (ConditionCheck included),
    1 per GetItem/Query/Scan call, 1 per key of BatchGetItem / entry of BatchWriteItem.
    Failed conditional writes are billed too, so every call counts."""
    if op == "TransactWriteItems":
        return 2 * len(params.get("TransactItems", [])), 0
    if op == "TransactGetItems":
        return 0, 2 * len(params.get("TransactItems", []))
    if op in DDB_WRITE_ONE:
        return 1, 0
    if op == "BatchWriteItem":
        return sum(len(v) for v in params.get("RequestItems", {}).values()), 0
    if op == "BatchGetItem":
        return 0, sum(len(v.get("Keys", [])) for v in params.get("RequestItems", {}).values())
    if op in DDB_READ_ONE:
        return 0, 1
    return 0, 0  # control plane (DescribeTable, ...): not request units


def _counted(client: Any, operation_name: str, api_params: dict) -> Any:  # type: ignore[type-arg]
    service = client.meta.service_model.service_name
    tag = getattr(_local, "tag", "")
    key = f"{tag}{service}:{operation_name}"
    if service == "sqs" and operation_name == "SendMessage":  # which kind: run, continue, safety_net, ...
        try:
            key += f"[{json.loads(api_params.get('MessageBody', '{}')).get('kind', '?')}]"
        except (ValueError, AttributeError):
            key += "[?]"
    wru, rru = ddb_units(operation_name, api_params) if service == "dynamodb" else (0, 0)
    with _lock:
        _counts[key] += 1
        if wru:
            _units[f"{tag}dynamodb:wru"] += wru
        if rru:
            _units[f"{tag}dynamodb:rru"] += rru
    return _original_call(client, operation_name, api_params)


def install_counter() -> None:
    botocore.client.BaseClient._make_api_call = _counted  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call


def snapshot(tag: str) -> tuple[Counter[str], Counter[str]]:
    """This process's calls and units made under ``tag`` (``tag_thread``)."""
    with _lock:
        calls = Counter({k[len(tag) :]: n for k, n in _counts.items() if k.startswith(tag)})
        units = Counter({k[len(tag) :]: n for k, n in _units.items() if k.startswith(tag)})
    return calls, units


def tag_thread(tag: str) -> None:
    _local.tag = tag


def _dump(path: str) -> None:
    with _lock:
        data = {"pid": os.getpid(), "counts": dict(_counts), "units": dict(_units)}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def worker_main(argv: list[str]) -> int:
    """``agentq worker`` (same argv) with every botocore call counted and dumped (atomic write)."""
    install_counter()
    out_dir = os.environ.get("AGENTQ_BENCH_COUNTS")
    if out_dir:
        path = os.path.join(out_dir, f"{os.getpid()}.json")
        stop = threading.Event()

        def dumper() -> None:
            while not stop.wait(0.5):
                with contextlib.suppress(OSError):
                    _dump(path)

        threading.Thread(target=dumper, name="bench-counts", daemon=True).start()

        def final_dump() -> None:
            stop.set()
            _dump(path)

        atexit.register(final_dump)
    from agentq.cli.main import main as agentq_main

    return agentq_main(argv)


if __name__ == "__main__" and sys.argv[1:2] == ["--as-worker"]:
    sys.exit(worker_main(sys.argv[2:]))


# ---------------------------------------------------------------------- the bench

from _benchlib import (  # noqa: E402
    MOTO_MODES_HELP,
    BenchStack,
    JsonOut,
    log,
    machine,
    queue_depth,
    settings_line,
    settings_of,
    table,
    worker_config,
)
from _plot import Panel, add_plot_args, plot_from_args  # noqa: E402
from _prices import as_json, quote, rate  # noqa: E402
from agentq.control.submit import submit  # noqa: E402
from agentq.core.models import LLMStep, Task, TaskSubmission  # noqa: E402
from agentq.resources import QueueSettings  # noqa: E402
from agentq.runtime import build_registry, client  # noqa: E402
from agentq.storage.container import Storage  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402
from agentq_dev.stack import LocalStack  # noqa: E402

THIS_FILE = Path(__file__).resolve()
SERVICES = ("dynamodb", "sqs", "stepfunctions", "s3")

PRICED = ("sfn_transition", "sqs_request", "dynamodb_wru", "dynamodb_rru")  # bench/_prices.py
COST_FORMULA = (
    "$/1k children = 1000 x [ transitions/child x $sfn_transition  +  SQS requests/child x $sqs_request"
    "  +  WRU/child x $dynamodb_wru  +  RRU/child x $dynamodb_rru ]"
)
UNITS_NOTE = (
    "WRU/RRU approximated from the calls: 1 per item written (<= 1 KB) or read (<= 4 KB, strongly consistent), "
    "2 per item of a TransactWriteItems, 1 per GetItem/Query call, 1 per BatchGetItem key; failed conditional "
    "writes billed like the rest. SQS requests = worker + submit calls (idle ReceiveMessage polls included) + "
    "the SendMessage calls Step Functions makes for the workflow. Lambda/Fargate compute, S3 and data transfer "
    "are not included (S3 calls are counted and shown)."
)


class FanoutStack(BenchStack):
    """BenchStack whose workers are this file in ``--as-worker`` mode (calls + request units)."""

    def worker_command(self) -> list[str]:
        cmd = LocalStack.worker_command(self)  # [python, -m, agentq, worker, ...]
        assert cmd[1:3] == ["-m", "agentq"], cmd
        return [cmd[0], str(THIS_FILE), "--as-worker", *cmd[3:]]

    def worker_totals(self) -> tuple[Counter[str], Counter[str]]:
        calls: Counter[str] = Counter()
        units: Counter[str] = Counter()
        for path in Path(self.counts_dir).glob("*.json"):
            try:
                data = json.loads(path.read_text())
                calls.update(data["counts"])
                units.update(data.get("units", {}))
            except (OSError, ValueError, KeyError):
                pass
        return calls, units


def child_spec(i: int, turns: int) -> dict[str, Any]:
    script: dict[str, Any]
    if turns == 1:
        script = {"turns": [{"text": f"child {i}: answer"}]}
    else:
        script = {
            "turns": [
                {
                    "text": f"child {i}: checking notes",
                    "tool_calls": [{"name": "note_read", "input": {"key": f"k{i}"}}],
                },
                {"text": f"child {i}: answer"},
            ]
        }
    return {"goal": f"fan-out bench child {i}", "tools": ["note_read"], "script": script}


def parent_submission(n: int, child_turns: int) -> TaskSubmission:
    spawn = {
        "name": "spawn_subagents",
        "input": {"subagents": [child_spec(i, child_turns) for i in range(n)], "max_concurrency": n},
    }
    # The spawn call is the parent's output: max_output_tokens must hold it (the scripted
    # provider counts ~4 chars a token; a cut-off turn loses its tool calls).
    max_out = len(json.dumps(spawn)) // 3 + 1024
    return TaskSubmission.model_validate(
        {
            "goal": f"fan-out bench: spawn {n} sub-agents, then summarise",
            "provider": "scripted",
            "script": {"turns": [{"text": f"spawning {n}", "tool_calls": [spawn]}, {"text": "parent summary"}]},
            "constraints": {
                "tools": ["spawn_subagents", "note_read"],
                "max_fanout": n,
                "max_tokens": 4 * max_out + 50_000 + 20_000 * n,  # the children's even split: >= 20k tokens each
                "max_steps": 5,
                "max_output_tokens": max_out,
                "timeout_seconds": 1800,
            },
        }
    )


def wait_task(store: Storage, task_id: str, timeout: float) -> Task:
    deadline = time.monotonic() + timeout
    last_note = time.monotonic()
    while True:
        task = store.tasks.get(task_id)
        if task.status.terminal or time.monotonic() > deadline:
            return task
        if time.monotonic() - last_note > 10:
            log(f"  ... parent {task.status.value}")
            last_note = time.monotonic()
        time.sleep(0.1)


def execution_history(sfn: Any, arn: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"executionArn": arn, "maxResults": 1000}
    while True:
        resp = sfn.get_execution_history(**kwargs)
        events += resp["events"]
        if not resp.get("nextToken"):
            return events
        kwargs["nextToken"] = resp["nextToken"]


def wait_execution(sfn: Any, arn: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        desc = sfn.describe_execution(executionArn=arn)
        if desc["status"] != "RUNNING" or time.monotonic() > deadline:
            return dict(desc)
        time.sleep(0.1)


def _ts(value: Any) -> float | None:
    return value.timestamp() if hasattr(value, "timestamp") else None


def run_size(stack: FanoutStack, n: int, child_turns: int, timeout: float) -> dict[str, Any]:
    assert stack.settings is not None
    store, queues = stack.store(), stack.queues()
    registry = build_registry(stack.settings)
    sfn = client(stack.settings, "stepfunctions")  # the bench's own reads: not counted as the system's
    queues.url("normal")

    time.sleep(1.2)  # every worker has dumped its counts since the last run
    w_calls0, w_units0 = stack.worker_totals()
    s_calls0, s_units0 = snapshot("submit|")
    log(f"[N={n}] submitting the parent ...")
    tag_thread("submit|")
    parent = submit(store, registry, parent_submission(n, child_turns), tenant="bench", queues=queues)
    tag_thread("")
    final = wait_task(store, parent.task_id, timeout)
    steps = store.steps.load(parent.task_id)
    first = steps[0].body
    assert isinstance(first, LLMStep), first
    spawn_id = next(u["id"] for u in first.tool_uses() if u["name"] == "spawn_subagents")
    record = store.spawns.get(parent.task_id, spawn_id)
    assert record is not None
    arn = record.execution_arn
    desc = wait_execution(sfn, arn, 60) if arn else {}
    children = store.tasks.get_many(list(record.children))
    deadline = time.monotonic() + 30
    while not all(c.status.terminal for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
        children = store.tasks.get_many(list(record.children))
    # Messages still to come (a safety net is sent with a delay of visibility_seconds) belong
    # to this fan-out: the window closes when the queue holds nothing, visible, in flight or delayed.
    drain_until = time.monotonic() + stack.worker_config.visibility_seconds + 30
    while queue_depth(queues, final.submission.priority) and time.monotonic() < drain_until:
        time.sleep(0.5)
    time.sleep(1.5)  # workers dump every 0.5 s: let the last calls of the window land
    w_calls1, w_units1 = stack.worker_totals()
    s_calls1, s_units1 = snapshot("submit|")
    worker_calls, worker_units = w_calls1 - w_calls0, w_units1 - w_units0
    submit_calls, submit_units = s_calls1 - s_calls0, s_units1 - s_units0

    events = execution_history(sfn, arn) if arn else []
    types = Counter(e["type"] for e in events)
    # History types are per state kind (TaskStateEntered, MapStateEntered, PassStateEntered, ...).
    transitions = sum(v for k, v in types.items() if k.endswith("StateEntered"))
    sfn_sqs_sends = sum(
        1
        for e in events
        if e["type"] == "TaskScheduled" and e.get("taskScheduledEventDetails", {}).get("resourceType") == "sqs"
    )

    spawn_at = float(record.created_at)
    resume_at = float(final.last_claimed_at or 0) if final.claim_count > 1 else None
    child_claims = [float(c.first_claimed_at) for c in children if c.first_claimed_at is not None]
    child_done = [float(c.finished_at) for c in children if c.finished_at]
    exec_start, exec_stop = _ts(desc.get("startDate")), _ts(desc.get("stopDate"))

    calls = worker_calls + submit_calls
    calls["sqs:SendMessage[by Step Functions]"] += sfn_sqs_sends
    units = worker_units + submit_units
    by_service = {s: sum(v for k, v in calls.items() if k.startswith(f"{s}:")) for s in SERVICES}
    receives = calls.get("sqs:ReceiveMessage", 0)
    wru, rru = units.get("dynamodb:wru", 0), units.get("dynamodb:rru", 0)
    per = {
        **{s: by_service[s] / n for s in SERVICES},
        "sqs_receive": receives / n,
        "sqs_other": (by_service["sqs"] - receives) / n,
        "ddb_wru": wru / n,
        "ddb_rru": rru / n,
        "transitions": transitions / n,
        "history_events": len(events) / n,
    }
    cost = {
        "stepfunctions": 1000 * per["transitions"] * rate("sfn_transition"),
        "sqs": 1000 * per["sqs"] * rate("sqs_request"),
        "sqs_excl_receive": 1000 * per["sqs_other"] * rate("sqs_request"),
        "dynamodb_write": 1000 * per["ddb_wru"] * rate("dynamodb_wru"),
        "dynamodb_read": 1000 * per["ddb_rru"] * rate("dynamodb_rru"),
    }
    cost["total"] = cost["stepfunctions"] + cost["sqs"] + cost["dynamodb_write"] + cost["dynamodb_read"]
    statuses = Counter(c.status.value for c in children)
    log(f"[N={n}] parent {final.status.value}; children {dict(statuses)}; execution {desc.get('status')}")
    return {
        "n": n,
        "child_turns": child_turns,
        "parent_id": parent.task_id,
        "parent_status": final.status.value,
        "parent_claims": final.claim_count,
        "children_statuses": dict(statuses),
        "children_succeeded": statuses.get("succeeded", 0),
        "child_claims": sum(c.claim_count for c in children),
        "children_claimed_more_than_once": sum(1 for c in children if c.claim_count > 1),
        "execution_arn": arn,
        "execution_status": desc.get("status"),
        "seconds": {
            "spawn_to_resume": resume_at - spawn_at if resume_at else None,
            "spawn_to_finish": (final.finished_at - spawn_at) if final.finished_at else None,
            "submit_to_spawn": spawn_at - final.created_at,
            "spawn_to_execution_start": exec_start - spawn_at if exec_start else None,
            "spawn_to_first_child_claim": min(child_claims) - spawn_at if child_claims else None,
            "children_span": max(child_done) - min(child_claims) if child_claims and child_done else None,
            "last_child_done_to_execution_end": exec_stop - max(child_done) if exec_stop and child_done else None,
            "last_child_done_to_resume": resume_at - max(child_done) if resume_at and child_done else None,
            "resume_to_finish": (final.finished_at - resume_at) if final.finished_at and resume_at else None,
        },
        "calls_total": dict(sorted(calls.items())),
        "calls_by_service_total": by_service,
        "dynamodb_units_total": {"wru": wru, "rru": rru},
        "worker_calls": dict(sorted(worker_calls.items())),
        "submit_calls": dict(sorted(submit_calls.items())),
        "sfn_sqs_sends": sfn_sqs_sends,
        "safety_net_messages": calls.get("sqs:SendMessage[safety_net]", 0),
        "repeated_child_reports": calls.get("stepfunctions:SendTaskSuccess", 0) - n,
        "state_transitions": transitions,
        "history_events": len(events),
        "history_event_types": dict(sorted(types.items())),
        "per_child": per,
        "cost_usd_per_1000_children": cost,
    }


def render(result: dict[str, Any]) -> str:
    m, s = result["machine"], result["settings"]
    runs = result["runs"]
    out = [
        "agentq sub-agent fan-out: local stack (moto server, real ASL executed by moto's Step Functions)",
        f"machine: {m['cpus']} CPUs, Python {m['python']}, moto {m['moto']}; load average at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}",
        f"settings: {settings_line(s)}",
        f"parent: 1 LLM turn spawning N children (max_concurrency = max_fanout = N), then 1 answer turn; "
        f"child: {result['child_turns']} turn(s)"
        + (" (note_read, then answer)" if result["child_turns"] == 2 else " (answer)"),
        "",
        "Latency (seconds, from agentq's own records: SPAWN.created_at, parent claims[1].at / finished_at, child META):",
    ]
    rows = []
    for r in runs:
        t = r["seconds"]
        rows.append([
            str(r["n"]), f"{r['children_succeeded']}/{r['n']}", r["parent_status"],
            t["spawn_to_resume"], t["spawn_to_finish"], t["spawn_to_execution_start"], t["spawn_to_first_child_claim"],
            t["children_span"], t["last_child_done_to_execution_end"], t["last_child_done_to_resume"],
            f"{r['parent_claims']}", f"{r['child_claims'] / r['n']:.2f}",
        ])  # fmt: skip
    out.append(table(
        ["N", "ok", "parent", "spawn->resume", "spawn->finish", "->exec start", "->1st child", "children span",
         "last child->exec end", "last child->resume", "parent claims", "claims/child"],
        rows,
    ))  # fmt: skip
    out.append("(->exec start, ->1st child: from the spawn; children span: first child claim to last child finished;")
    out.append(" claims/child > 1: a child's lease lapsed under load and another worker took it over)")
    out.append("")
    out.append(
        "AWS calls per child (total / N; parent's own calls, submit, idle polls and Step Functions' SQS sends included):"
    )
    rows = []
    for r in runs:
        p = r["per_child"]
        rows.append([
            str(r["n"]), p["dynamodb"], p["ddb_wru"], p["ddb_rru"], p["sqs_other"], p["sqs_receive"], p["stepfunctions"], p["s3"],
            p["dynamodb"] + p["sqs"] + p["stepfunctions"] + p["s3"], p["transitions"], f"{r['history_events']}",
            f"{r['safety_net_messages']}", f"{r['repeated_child_reports']}",
        ])  # fmt: skip
    out.append(table(
        ["N", "DynamoDB", "~WRU", "~RRU", "SQS (no recv)", "SQS recv", "StepFn", "S3", "all", "transitions",
         "hist events (all)", "safety nets (all)", "extra SendTaskSuccess (all)"],
        rows,
    ))  # fmt: skip
    out.append(
        "(safety nets = SendMessage kind=safety_net from the heartbeat hub; each comes back as a message for a task"
    )
    out.append(
        " already terminal, which repeats SendTaskSuccess (refused by Step Functions), reads META and deletes it)"
    )
    out.append("")
    out.append("$ per 1,000 children (us-east-1 list prices; Lambda/Fargate compute not included):")
    rows = []
    for r in runs:
        c = r["cost_usd_per_1000_children"]
        rows.append([
            str(r["n"]), f"{c['stepfunctions']:.4f}", f"{c['sqs']:.5f}", f"{c['dynamodb_write']:.5f}",
            f"{c['dynamodb_read']:.5f}", f"{c['total']:.4f}",
        ])  # fmt: skip
    out.append(table(["N", "Step Functions", "SQS", "DynamoDB write", "DynamoDB read", "total"], rows))
    out.append(COST_FORMULA)
    out.append(f"  ({quote(*PRICED)})")
    out.append(UNITS_NOTE)
    out.append("")
    for r in runs:
        ops = ", ".join(f"{op} {n / r['n']:.2f}" for op, n in r["calls_total"].items())
        out.append(f"N={r['n']} calls per child by operation: {ops}")
        ev = ", ".join(f"{k} {v}" for k, v in r["history_event_types"].items())
        out.append(f"N={r['n']} execution history ({r['history_events']} events): {ev}")
    out.append(f"total wall time {result['wall_seconds']:.1f}s")
    return "\n".join(out)


def panels(result: dict[str, Any]) -> list[Panel]:
    """Per fan-out size: time from the spawn, AWS calls per child, and dollars per 1,000 children."""
    runs = result["runs"]
    ns = [r["n"] for r in runs]
    return [
        Panel("line", "time from the spawn", "s", ns,
              {"to the parent's resume": [r["seconds"]["spawn_to_resume"] for r in runs],
               "to the parent's finish": [r["seconds"]["spawn_to_finish"] for r in runs],
               "children span": [r["seconds"]["children_span"] for r in runs]}, xlabel="children"),
        Panel("bar", "AWS calls per child", "calls", ns,
              {k: [r["per_child"][k] for r in runs] for k in ("dynamodb", "sqs_other", "sqs_receive", "stepfunctions")},
              xlabel="children"),
        Panel("bar", "$ per 1,000 children", "USD", ns,
              {k: [r["cost_usd_per_1000_children"][k] for r in runs]
               for k in ("stepfunctions", "sqs", "dynamodb_write", "dynamodb_read")}, xlabel="children"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,50,100", help="children per fan-out, comma-separated (each 1..100)")
    ap.add_argument("--child-turns", type=int, choices=[1, 2], default=2, help="LLM turns per child")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=128, help="tasks in flight per worker")
    ap.add_argument("--lease", type=float, default=WorkerConfig().lease_seconds, help="lease seconds (agentq default)")
    ap.add_argument(
        "--heartbeat", type=float, default=WorkerConfig().heartbeat_seconds, help="heartbeat seconds (agentq default)"
    )
    ap.add_argument(
        "--visibility",
        type=int,
        default=WorkerConfig().visibility_seconds,
        help="message visibility seconds (agentq default)",
    )
    ap.add_argument("--timeout", type=float, default=240, help="max seconds to wait for one fan-out")
    ap.add_argument("--moto", choices=["fast", "stock"], default="fast", help=MOTO_MODES_HELP)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "fanout")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if not sizes or any(not 1 <= n <= 100 for n in sizes):
        ap.error("--sizes: each size must be in 1..100 (max_fanout and max_concurrency are capped at 100)")

    started = time.time()
    config = worker_config(args)
    with JsonOut(args.json) as out:
        install_counter()
        stack = FanoutStack(
            prefix="bench-fanout",
            workers=args.workers,
            worker_config=config,
            queue_settings=QueueSettings(visibility_timeout=config.visibility_seconds),
            api=False,
            moto_mode=args.moto,
        )
        result: dict[str, Any] = {"bench": "fanout", "machine": machine(), "child_turns": args.child_turns}
        try:
            log("starting the local stack ...")
            stack.start()
            stack.wait_polling()
            result["settings"] = settings_of(stack)
            warm = run_size(stack, 2, args.child_turns, args.timeout)  # connections, imports: not reported
            log(f"[warm-up] parent {warm['parent_status']}")
            result["runs"] = [run_size(stack, n, args.child_turns, args.timeout) for n in sizes]
        finally:
            log("stopping the local stack ...")
            stack.stop()
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["wall_seconds"] = time.time() - started
        result["prices_usd"] = {
            **as_json(*PRICED),
            "formula": COST_FORMULA,
            "approximation": UNITS_NOTE,
        }
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    plot_from_args(args, "agentq sub-agent fan-out on the local stack", panels(result))
    ok = all(r["parent_status"] == "succeeded" and r["children_succeeded"] == r["n"] for r in result["runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
