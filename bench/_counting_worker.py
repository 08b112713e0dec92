"""``agentq worker`` with a count of its AWS calls: the benchmarks' worker process.

Runs exactly what ``python -m agentq worker ...`` runs (same argv after the script name), with
one addition: every botocore API call is counted by ``service:Operation`` (one count per
logical call; botocore's internal retries are not counted twice), and the counts are written
as JSON to ``$AGENTQ_BENCH_COUNTS/<pid>.json`` every 0.5 s and at exit, together with the
worker's own ``Worker.stats()`` (admission limit, tasks held, heartbeat rounds). The write is
atomic (tmp + rename), so a SIGKILLed worker leaves its counts up to its last dump.

With ``$AGENTQ_BENCH_WORKSPACE_TIMES`` set (a directory), each ``Workspaces.open`` (the restore
at a claim) and ``Workspaces.checkpoint`` is timed and appended as one JSON line to
``<dir>/<pid>.jsonl`` as soon as it returns (one ``write`` on an ``O_APPEND`` descriptor, so a
line written before a SIGKILL is whole): ``bench/workspace_cost.py`` reads the restore times.

Cost: one lock and one dict increment per AWS call, and one small file write per 0.5 s.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from typing import Any

import botocore.client

_counts: Counter[str] = Counter()
_lock = threading.Lock()
_dumping = threading.Lock()  # one dump at a time: the periodic one and the one at exit share the tmp file
_original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call
_workers: list[Any] = []  # the Worker this process runs, once started


def _counted(self: botocore.client.BaseClient, operation_name: str, api_params: dict) -> dict:  # type: ignore[type-arg]
    key = f"{self.meta.service_model.service_name}:{operation_name}"
    with _lock:
        _counts[key] += 1
    return _original(self, operation_name, api_params)  # type: ignore[no-any-return]


def _dump(path: str) -> None:
    with _lock:
        data = dict(_counts)
    stats = _workers[0].stats() if _workers else None
    tmp = f"{path}.tmp"
    with _dumping:
        with open(tmp, "w") as fh:
            json.dump({"pid": os.getpid(), "counts": data, "worker": stats}, fh)
        os.replace(tmp, path)


def _capture_worker() -> None:
    """Remember the Worker the CLI builds, so its stats can be dumped with the counts."""
    from agentq.worker import Worker

    start = Worker.start

    def recording_start(self: Worker) -> Worker:
        _workers.append(self)
        return start(self)

    Worker.start = recording_start  # type: ignore[method-assign]


def _time_workspaces(out_dir: str) -> None:
    """Time the restore and the checkpoint of every workspace this worker holds (see above)."""
    from agentq.core.engine._workspace import Workspaces

    fd = os.open(os.path.join(out_dir, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def timed(name: str, method: Any) -> Any:
        def wrapper(self: Workspaces, s: Any) -> Any:
            began, at = time.perf_counter(), time.time()
            out = method(self, s)
            ws = s.workspace
            state = (ws.pending or ws.committed) if ws is not None else None  # checkpointed, else restored
            line = {"op": name, "task": s.task_id, "pid": os.getpid(), "at": at,
                    "seconds": time.perf_counter() - began,
                    "files": state.files if state is not None else 0,
                    "bytes": state.total_bytes if state is not None else 0,
                    "directory": str(ws.directory) if ws is not None else None}  # fmt: skip
            os.write(fd, (json.dumps(line) + "\n").encode())
            return out

        return wrapper

    Workspaces.open = timed("open", Workspaces.open)  # type: ignore[method-assign]
    Workspaces.checkpoint = timed("checkpoint", Workspaces.checkpoint)  # type: ignore[method-assign]


def _dumper(path: str, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        with contextlib.suppress(OSError):
            _dump(path)


def main() -> int:
    botocore.client.BaseClient._make_api_call = _counted  # type: ignore[attr-defined]  # botocore-stubs omit the private _make_api_call
    out_dir = os.environ.get("AGENTQ_BENCH_COUNTS")
    if out_dir:
        _capture_worker()
        path = os.path.join(out_dir, f"{os.getpid()}.json")
        stop = threading.Event()
        threading.Thread(target=_dumper, args=(path, stop), name="bench-counts", daemon=True).start()

        def final_dump() -> None:
            stop.set()
            _dump(path)

        atexit.register(final_dump)
    if os.environ.get("AGENTQ_BENCH_WORKSPACE_TIMES"):
        _time_workspaces(os.environ["AGENTQ_BENCH_WORKSPACE_TIMES"])
    from agentq.cli.main import main as agentq_main

    return agentq_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
