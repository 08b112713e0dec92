"""What one call of a remote A2A agent costs agentq: the AWS calls of each part of it, and the
worker time it holds while the remote works (docs/PROTOCOLS.md, "Calling remote A2A agents").

    .venv/bin/python bench/a2a_delegation.py [--looks 3] [--json]

An in-process engine on a moto server delegates one call to the ``a2a-sdk`` server of the tests
(tests/a2a_servers/desk.py, a process of its own on loopback), whose task works until released.
The parts, each one engine run (a worker's claim to its release), the botocore calls of each counted:

- ``send``: the LLM step with the call, the effect begun, the message sent, the remote task's id
  recorded, the task parked in ``waiting``;
- ``look`` (``--looks`` times, the remote still working): what a ``remote_poll`` message does: the
  task woken (its META read, ``waiting -> queued``), claimed, the remote task looked at, parked again;
- ``answer``: the same look once the remote ended: the effect finished, the tools step and the
  final answer committed.

SQS is not counted by the engine: each park adds one delayed ``SendMessage`` (the next look) and
each look one ``ReceiveMessage`` and one ``DeleteMessage``, shown as such. ``held ms`` is the
worker time of the part; between parts no worker holds the task (it is ``waiting``), so the
compute held while the remote works is the sum of the looks, whatever the remote takes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _benchlib import InProcessCounter
from _plot import Panel, add_plot_args, plot_from_args
from _prices import as_json, quote, rate
from agentq.core.engine import Engine
from agentq.core.models import TaskStatus
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.helpers import call, scripted, wait_for

ROOT = Path(__file__).resolve().parent.parent
PRICE_KEYS = ("dynamodb_wru", "dynamodb_rru", "sqs_request")
SQS_PER_PARK = {"sqs:SendMessage": 1}
SQS_PER_LOOK = {"sqs:ReceiveMessage": 1, "sqs:DeleteMessage": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--looks", type=int, default=3, help="looks while the remote still works")
    parser.add_argument("--json", action="store_true")
    add_plot_args(parser, "a2a_delegation")
    args = parser.parse_args()
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    ledger = Path(tempfile.mkdtemp(prefix="a2a-bench-")) / "received.jsonl"
    port = _free_port()
    os.environ["AGENTQ_A2A_ALLOW"] = f"127.0.0.1:{port}"
    desk = subprocess.Popen(
        [sys.executable, "-m", "tests.a2a_servers.desk", "--port", str(port)],
        env={**os.environ, "DESK_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(up, timeout=30, what="the a2a-sdk desk server")
        with MotoServer() as moto:
            rows, sent = run(moto.endpoint_url, port, args.looks, ledger)
    finally:
        desk.kill()
        desk.wait()
    usd = {name: _usd(row["calls"]) for name, row in rows.items()}
    labels = list(rows)
    plot_from_args(
        args,
        f"one call of a remote A2A agent, {args.looks} looks while it works",
        [Panel("bar", "worker time held per part", "ms", labels, {"held": [rows[n]["held_ms"] for n in labels]}),
         Panel("bar", "AWS calls per part", "calls", labels,
               {"calls": [sum(rows[n]["calls"].values()) for n in labels]})],
    )  # fmt: skip
    if args.json:
        print(json.dumps({"rows": rows, "usd": usd, "messages_received": sent, "prices": as_json(*PRICE_KEYS)}))
        return
    print(
        f"{'part':<8} {'held ms':>8} {'$':>10}  calls (one delegated call, {args.looks} looks while the remote works)"
    )
    for name, row in rows.items():
        calls = ", ".join(f"{op} {n:g}" for op, n in sorted(row["calls"].items()))
        print(f"{name:<8} {row['held_ms']:>8.1f} {usd[name]:>10.2e}  {calls}")
    print(f"the remote received {sent} message(s); prices: {quote(*PRICE_KEYS)}")


def run(endpoint: str, port: int, looks: int, ledger: Path) -> tuple[dict[str, Any], int]:
    names = ResourceNames.for_prefix(f"a2ab{uuid.uuid4().hex[:8]}")
    settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=endpoint)
    provision(session(settings), names, endpoint_url=endpoint)
    store = build_store(settings)
    ref = {"name": "desk", "card_url": f"http://127.0.0.1:{port}/.well-known/agent-card.json",
           "host": f"127.0.0.1:{port}"}  # fmt: skip
    sub = scripted([{"text": "", "tool_calls": [call("a2a__desk", message="report")]}, {"text": "done"}],
                   tools=["a2a__desk"])  # fmt: skip
    sub = type(sub).model_validate({**sub.model_dump(), "remote_agents": [ref], "agent": "boss@1"})
    task = store.tasks.create(sub, tenant="t")
    engine = Engine(store, worker_id="bench")
    counter = InProcessCounter().install()
    rows: dict[str, Any] = {}

    def part(name: str, wake: bool) -> Any:
        before = Counter({op: n for (_, op), n in counter.counts.items()})
        started = time.perf_counter()
        if wake:  # what queueing/dispatch/_remote_poll.py does before the run
            store.tasks.get(task.task_id)
            store.tasks.transition(task.task_id, TaskStatus.QUEUED)
        result = engine.run(task.task_id)
        held = (time.perf_counter() - started) * 1000
        calls = Counter({op: n for (_, op), n in counter.counts.items()}) - before
        extra = {**(SQS_PER_LOOK if wake else {}), **(SQS_PER_PARK if result.outcome == "waiting" else {})}
        rows[name] = {"held_ms": held, "calls": {**dict(calls), **extra}, "outcome": result.outcome}
        return result

    try:
        assert part("send", wake=False).outcome == "waiting"
        for i in range(looks):
            assert part(f"look {i + 1}", wake=True).outcome == "waiting"
        ledger.with_name(ledger.name + ".release").touch()
        time.sleep(0.3)  # the desk ends its task within 50 ms of the release
        final = part("answer", wake=True)
        assert final.status is TaskStatus.SUCCEEDED, final
    finally:
        counter.uninstall()
    sent = len(ledger.read_text().splitlines())
    return rows, sent


def _usd(calls: dict[str, float]) -> float:
    writes = sum(n for op, n in calls.items() if op.startswith("dynamodb:") and op.split(":")[1] in
                 ("PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"))  # fmt: skip
    reads = sum(n for op, n in calls.items() if op.startswith("dynamodb:")) - writes
    sqs = sum(n for op, n in calls.items() if op.startswith("sqs:"))
    # request counts priced at one unit each: a floor (a transaction bills twice, large items more)
    return writes * rate("dynamodb_wru") + reads * rate("dynamodb_rru") + sqs * rate("sqs_request")


if __name__ == "__main__":
    main()
