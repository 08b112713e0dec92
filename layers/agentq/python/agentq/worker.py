"""Running one task to its end (or to a lost lease) in this process: what a local worker
process and the crash tests run. Queue-fed workers arrive with the executor issue."""

from __future__ import annotations

import os
import socket
import time

from agentq.engine import Engine, EngineConfig, RunResult
from agentq.runtime import Settings, build_registry, build_store


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_task(
    task_id: str,
    *,
    settings: Settings | None = None,
    lease_seconds: float = 30.0,
    wait_seconds: float = 0.0,
    poll_seconds: float = 0.1,
) -> RunResult:
    """Run ``task_id``; if another worker's lease is still live, retry the claim for up to
    ``wait_seconds`` (that is how a replacement worker picks up a dead one's task)."""
    settings = settings or Settings.from_env()
    store = build_store(settings)
    engine = Engine(
        store,
        worker_id=worker_id(),
        tools=build_registry(settings),
        config=EngineConfig(lease_seconds=lease_seconds),
    )
    give_up = time.monotonic() + wait_seconds
    while True:
        result = engine.run(task_id)
        if result.outcome != "not_claimed":
            return result
        status = store.get_task(task_id).status
        if status.terminal:
            result.status = status  # nothing left to do: a queue consumer deletes the message
            return result
        if time.monotonic() >= give_up:
            return result
        time.sleep(poll_seconds)
