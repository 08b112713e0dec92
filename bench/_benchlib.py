"""Shared plumbing of the local-stack benchmarks (latency, resume, concurrency).

- ``BenchStack``: ``LocalStack`` whose workers run ``bench/_counting_worker.py`` (the same
  ``agentq worker`` with a per-process count of AWS calls), without the HTTP API.
- ``JsonOut``: with ``--json`` only one JSON object reaches stdout. fd 1 is pointed at stderr
  for the whole run (so worker processes, which inherit it, cannot write to stdout either)
  and the JSON is written to the saved original stdout at the end.
- figures: nearest-rank percentiles, /proc sampling, batched META reads, queue depth.

Every latency here is computed from times recorded in the task's META item (``created_at``
at submit, ``claims[i].at`` at each claim, ``finished_at``): measured, not inferred.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.client

from agentq.storage.container import Storage
from agentq.storage.dynamodb import DynamoTable
from agentq.storage.keys import META, task_pk
from agentq.storage.serdes import PayloadStore, to_item
from agentq.worker import WorkerConfig
from agentq_dev.moto_server import MotoServer
from agentq_dev.stack import LocalStack

BENCH_DIR = Path(__file__).resolve().parent
COUNTING_WORKER = BENCH_DIR / "_counting_worker.py"
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "cost_exceeded", "timed_out"})


def log(msg: str) -> None:
    """Progress goes to stderr, never stdout."""
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "min": min(values) if values else None,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
        "mean": sum(values) / len(values) if values else None,
    }


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------- output


class JsonOut:
    """Keeps stdout clean for one JSON object when ``enabled``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._saved: int | None = None

    def __enter__(self) -> JsonOut:
        if self.enabled:
            sys.stdout.flush()
            self._saved = os.dup(1)
            os.dup2(2, 1)  # children inherit fd 1 = stderr
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            sys.stdout.flush()
            os.dup2(self._saved, 1)
            os.close(self._saved)
            self._saved = None

    def emit(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, default=_json_default, sort_keys=False) + "\n").encode()
        if self._saved is not None:
            os.write(self._saved, data)
        else:
            sys.stdout.write(data.decode())
            sys.stdout.flush()


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


# ---------------------------------------------------------------------- AWS call counting


class InProcessCounter:
    """Counts this process's botocore calls, tagged per thread (e.g. "submit", "monitor")."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call

    def install(self) -> InProcessCounter:
        counter = self
        original = self._original

        def counted(client: Any, operation_name: str, api_params: dict) -> Any:  # type: ignore[type-arg]
            key = (
                getattr(counter._local, "tag", "other"),
                f"{client.meta.service_model.service_name}:{operation_name}",
            )
            with counter._lock:
                counter.counts[key] += 1
            return original(client, operation_name, api_params)

        botocore.client.BaseClient._make_api_call = counted  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call
        return self

    def uninstall(self) -> None:
        botocore.client.BaseClient._make_api_call = self._original  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call

    def tag(self, name: str) -> None:
        self._local.tag = name

    def snapshot(self, tag: str) -> Counter[str]:
        with self._lock:
            return Counter({op: n for (t, op), n in self.counts.items() if t == tag})


# ---------------------------------------------------------------------- the stack


MOTO_APPS = {
    "stock": ["-m", "agentq_dev.moto_app"],  # what LocalStack runs
    "fast": [str(BENCH_DIR / "_moto_app.py")],  # the same, SQS ReceiveMessage O(messages returned)
}
MOTO_MODES_HELP = (
    "moto server: 'fast' (default) = agentq's moto_app with SQS ReceiveMessage not rescanning the queue per "
    "message (bench/_moto_app.py); 'stock' = agentq's moto_app unchanged, whose receives cost grows with the "
    "queue's depth"
)


@dataclass
class MotoAppServer(MotoServer):
    """agentq's moto_app with some of its changes off, to measure them: ``main_kwargs`` are
    keyword arguments of ``agentq_dev.moto_app.main`` (e.g. ``"patch_moto=False"``); empty,
    the app as the local stack runs it."""

    main_kwargs: str = ""

    def command(self) -> list[str]:
        if not self.main_kwargs:
            return super().command()
        return [
            sys.executable,
            "-c",
            f"import sys; from agentq_dev.moto_app import main; main(sys.argv[1:], {self.main_kwargs})",
        ]


@dataclass
class BenchMotoServer(MotoServer):
    """``MotoServer`` started from a chosen app (see MOTO_APPS)."""

    mode: str = "fast"

    def command(self) -> list[str]:
        return [sys.executable, *MOTO_APPS[self.mode]]


@dataclass
class BenchStack(LocalStack):
    """The local stack with counting workers, a selectable moto app and no HTTP API.

    Worker stdout goes to stderr: the powertools EMF buffer prints itself to stdout once a
    metric holds 100 values, even with AGENTQ_EMF unset (see agentq/observe/emf.py).
    """

    moto_mode: str = "fast"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.moto = BenchMotoServer(mode=self.moto_mode)
        self.counts_dir = tempfile.mkdtemp(prefix="agentq-bench-counts-")
        self.extra_env = {**self.extra_env, "AGENTQ_BENCH_COUNTS": self.counts_dir}

    def spawn_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        # Started as the stack's own workers are: forked warm where the environment names a fork
        # server (the test suite's; a bench's figures come from `make bench`, which has none).
        proc = self._start(self.worker_command(), self.env(**extra_env), stdout=2)
        self.processes.append(proc)
        return proc

    def worker_command(self) -> list[str]:
        cmd = super().worker_command()
        assert cmd[1:3] == ["-m", "agentq"], cmd
        return [cmd[0], str(COUNTING_WORKER), *cmd[3:]]

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.processes if p.poll() is None]

    def worker_calls(self) -> Counter[str]:
        """AWS calls made so far by every worker this stack started (dead ones: to their last dump)."""
        total: Counter[str] = Counter()
        for path in Path(self.counts_dir).glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                total.update(json.loads(path.read_text())["counts"])
        return total

    def worker_stats(self) -> dict[int, dict[str, Any]]:
        """Each worker's last ``Worker.stats()`` (admission limit, tasks held, heartbeats), by pid."""
        out: dict[int, dict[str, Any]] = {}
        for path in Path(self.counts_dir).glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("worker"):
                out[int(data["pid"])] = data["worker"]
        return out

    def polling(self, proc: subprocess.Popen[bytes]) -> bool:
        """Has this worker started long-polling its queues?"""
        path = Path(self.counts_dir) / f"{proc.pid}.json"
        try:
            return bool(json.loads(path.read_text())["counts"].get("sqs:ReceiveMessage", 0) > 0)
        except (OSError, ValueError, KeyError):
            return False

    def wait_polling(self, procs: Iterable[subprocess.Popen[bytes]] | None = None, timeout: float = 60.0) -> None:
        procs = list(procs if procs is not None else self.alive())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.pid for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"worker(s) {dead} exited during start-up")
            if all(self.polling(p) for p in procs):
                return
            time.sleep(0.1)
        raise TimeoutError(f"workers did not start polling within {timeout}s")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the workers (they drain), SIGKILL what is left after ``grace``, stop moto."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.processes = [p for p in self.processes if p.poll() is None]
        super().stop()
        shutil.rmtree(self.counts_dir, ignore_errors=True)


def patient_clients(stack: LocalStack, pool: int = 64, read_timeout: float = 900.0) -> tuple[Storage, Any]:
    """A Storage and TaskQueues for the bench's own submissions, with a long read timeout.

    Under saturation a call can wait minutes in moto's DynamoDB queue; botocore's default 60 s
    read timeout then retries a TransactWriteItems that moto still executes, and the retry of
    ``create_task`` fails with ConditionalCheckFailed although the task exists (unqueued).
    """
    import boto3
    from botocore.config import Config

    from agentq.queueing.queues import TaskQueues
    from agentq.storage.serdes import PayloadStore

    settings = stack.settings
    assert settings is not None
    config = Config(
        retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=pool, read_timeout=read_timeout
    )
    sess = boto3.session.Session(region_name=settings.region)

    def make(service: str) -> Any:
        # Any service by name: the stubs type Session.client by one overload per literal service name.
        new_client: Callable[..., Any] = sess.client
        return new_client(service, endpoint_url=settings.endpoint_url, config=config)

    store = Storage(
        DynamoTable(make("dynamodb"), settings.table),
        PayloadStore(make("s3"), settings.bucket, settings.offload_threshold),
    )
    return store, TaskQueues(make("sqs"), settings.names)


def worker_config(args: Any) -> WorkerConfig:
    """The worker settings every bench takes from --concurrency/--lease/--heartbeat/--visibility."""
    return WorkerConfig(
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        heartbeat_seconds=args.heartbeat,
        visibility_seconds=args.visibility,
    )


def settings_of(stack: LocalStack) -> dict[str, Any]:
    c = stack.worker_config
    return {
        "moto": getattr(stack, "moto_mode", "stock"),
        "workers": stack.workers,
        "concurrency_per_worker": c.concurrency,
        "lease_seconds": c.lease_seconds,
        "heartbeat_seconds": c.heartbeat_seconds,
        "visibility_seconds": c.visibility_seconds,
        "queue_visibility_timeout": stack.queue_settings.visibility_timeout,
        "poll_wait_seconds": c.poll_wait_seconds,
        "idle_poll_wait_seconds": c.idle_poll_wait_seconds,
        "max_receive_count": stack.queue_settings.max_receive_count,
    }


def settings_line(s: dict[str, Any]) -> str:
    return (
        f"workers {s['workers']} x concurrency {s['concurrency_per_worker']}; lease {s['lease_seconds']:g}s, "
        f"heartbeat {s['heartbeat_seconds']:g}s, visibility {s['visibility_seconds']}s "
        f"(queue default {s['queue_visibility_timeout']}s), long poll {s['poll_wait_seconds']}s "
        f"(idle {s['idle_poll_wait_seconds']}s); moto app: {s['moto']}"
    )


def machine() -> dict[str, Any]:
    try:
        import moto

        moto_version = moto.__version__
    except Exception:  # pragma: no cover
        moto_version = "?"

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    dirty = git("status", "--porcelain", "--", "layers")
    return {
        "git_head": git("rev-parse", "--short", "HEAD"),
        "core_uncommitted_files": len(dirty.splitlines()) if dirty != "?" else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "moto": moto_version,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, float] | None:
    """RSS (MB) and thread count of a process, from /proc/<pid>/status."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            out["rss_mb"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    return out


# ---------------------------------------------------------------------- reading tasks


def batch_get_meta(
    store: Storage, task_ids: Sequence[str], projection: Sequence[str] | None = None, parallel: int = 1
) -> dict[str, dict[str, Any]]:
    """META items of many tasks, 100 keys a BatchGetItem (strongly consistent): raw items by id.

    ``parallel`` > 1 sends the batches from that many threads (each call waits its turn in
    moto's DynamoDB lock, so sequential batches of 1,000 items can take 10 x the queue wait).
    """
    chunks = [list(task_ids[i : i + 100]) for i in range(0, len(task_ids), 100)]

    def one(chunk: list[str]) -> dict[str, dict[str, Any]]:
        got: dict[str, dict[str, Any]] = {}
        request: dict[str, Any] = {
            "Keys": [to_item({"pk": task_pk(t), "sk": META}) for t in chunk],
            "ConsistentRead": True,
        }
        if projection:
            names = {f"#a{j}": name for j, name in enumerate(["task_id", *projection])}
            request["ProjectionExpression"] = ", ".join(names)
            request["ExpressionAttributeNames"] = names
        pending: dict[str, Any] = {store.table.name: request}
        for _ in range(20):
            resp = dynamo(store).client.batch_get_item(RequestItems=pending)
            for item in resp.get("Responses", {}).get(store.table.name, []):
                got[item["task_id"]["S"]] = item
            pending = resp.get("UnprocessedKeys") or {}
            if not pending:
                break
            time.sleep(0.05)
        return got

    out: dict[str, dict[str, Any]] = {}
    if parallel > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=min(parallel, len(chunks))) as pool:
            for got in pool.map(one, chunks):
                out.update(got)
    else:
        for chunk in chunks:
            out.update(one(chunk))
    return out


def num(item: dict[str, Any], name: str, default: float = 0.0) -> float:
    value = item.get(name)
    if value is None or "N" not in value:
        return default
    return float(value["N"])


def text(item: dict[str, Any], name: str) -> str | None:
    value = item.get(name)
    return value.get("S") if value else None


def queue_depth(queues: Any, tier: str = "normal") -> int:
    """Messages in the tier queue that are visible, in flight or delayed (0: all deleted)."""
    attrs = queues.sqs.get_queue_attributes(
        QueueUrl=queues.url(tier),
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(v) for v in attrs.values())


def queue_in_flight(queues: Any, tier: str = "normal") -> int:
    attrs = queues.sqs.get_queue_attributes(
        QueueUrl=queues.url(tier), AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"])


def wait_terminal(
    stack: LocalStack,
    store: Storage,
    task_ids: Sequence[str],
    *,
    timeout: float,
    tier: str = "normal",
    progress_every: float = 5.0,
) -> dict[str, dict[str, Any]]:
    """Wait (bounded) until every task is terminal; return their full META items.

    While the queue holds many messages only its depth is polled (SQS is cheap; moto
    serialises DynamoDB, so polling 1,000 META items would steal throughput from the
    workers). Once few are left (a message can also sit out a retry delay after its task
    ended), the unfinished tasks' META items are read in batches until none is left.
    """
    deadline = time.monotonic() + timeout
    queues = stack.queues()
    last_note = time.monotonic()
    items: dict[str, dict[str, Any]] = {}
    pending = list(task_ids)
    few = max(20, min(100, len(task_ids) // 10))
    while pending and time.monotonic() < deadline:
        depth = queue_depth(queues, tier)
        if depth <= few:
            items.update(batch_get_meta(store, pending))
            pending = [t for t in pending if text(items.get(t, {}), "status") not in TERMINAL]
            if not pending:
                break
        if time.monotonic() - last_note > progress_every:
            log(f"  ... {depth} message(s) in the {tier} queue, {len(pending)} task(s) not known to be terminal")
            last_note = time.monotonic()
        time.sleep(0.5 if depth > few else 1.0)
    if pending:
        items.update(batch_get_meta(store, pending))
        pending = [t for t in pending if text(items.get(t, {}), "status") not in TERMINAL]
    if pending:
        log(f"  !! {len(pending)} task(s) not terminal after the {timeout:.0f}s limit")
    return items


def dynamo(store: Storage) -> DynamoTable:
    """The DynamoDB table under a store from ``build_store``, for benches that meter or write the
    table around the repositories (``Storage.table`` is typed by its protocol)."""
    assert isinstance(store.table, DynamoTable), type(store.table)
    return store.table


def s3_payloads(store: Storage) -> PayloadStore:
    """The S3 payload store under a store from ``build_store`` (its client and bucket)."""
    assert isinstance(store.payloads, PayloadStore), type(store.payloads)
    return store.payloads
