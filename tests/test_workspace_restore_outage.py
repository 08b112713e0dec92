"""A restore that meets an outage gives the task back, it does not fail it (core.workspace_restore).

A restore fails its task for good (``workspace_restore_failed``, a deterministic fault) only for
what running it again would meet again: content or a manifest that is not what was stored, a
missing object, a path the disk cannot make. Before, any ``OSError`` it met did too, and two of
them are no fault of the task's: a read of the bucket that stalls (botocore's ``ReadTimeoutError``
is an ``OSError``), and a disk that a command of any task on the worker filled for a while (the
quota is checked after a call: docs/SANDBOX.md). Either failed the task, whoever's it was, at a
claim or at a refused turn's revert. Now the run gives its lease back and raises the outage, and
the redelivery's claim restores the workspace once the fault is over.

Real parts: moto server's S3 and DynamoDB, a relay in front of its S3 that holds one answer
half-sent (boto3 reads it with its own timeout), a tmpfs filled by another file (root only), the
engine with the scripted provider and the workspace tools in bubblewrap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from agentq.control.conversations import send_message
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, ToolsStep
from agentq.core.tools import default_registry
from agentq.runtime import Settings
from agentq.storage.container import Storage
from agentq.storage.serdes import PayloadStore

from tests.helpers import call, scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


class _Queues:
    def send(self, *_: Any, **__: Any) -> None:
        pass


def _run(store: Storage, root: Path, task_id: str, worker: str) -> Any:
    engine = Engine(store, worker_id=worker, tools=default_registry(), config=EngineConfig(workspace_root=str(root)))
    return engine.run(task_id)


def _answered_then_asked_again(store: Storage, root: Path, first: list[dict[str, Any]], tools: list[str]) -> str:
    """A task whose first exchange wrote files and committed them, asked to go on: its next claim
    restores that workspace."""
    follow_up = [{"text": "2", "tool_calls": [call("list_files")]}, {"text": "done again"}]
    task = store.tasks.create(
        scripted([*first, {"text": "done"}, *follow_up], tools=[*tools, "list_files"]), tenant="t"
    )
    assert _run(store, root, task.task_id, "w1").status is TaskStatus.SUCCEEDED
    assert send_message(store, _Queues(), task.task_id, "go on", tenant="t").reopened  # type: ignore[arg-type]
    return task.task_id


def _last_listing(store: Storage, task_id: str) -> str:
    """What the follow-up's ``list_files`` saw: the restored workspace."""
    results = [s.body.results for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep)]
    return results[-1][0].content


class _StallingS3:
    """A relay to moto server's S3 that holds the first answer to a GetObject of a workspace blob
    after its head and 16 bytes of its body, for ``hold`` seconds, then drops the connection: a
    read of the bucket that stalls, as boto3 meets it (its read timeout, then ``ReadTimeoutError``).
    Every other request and answer passes as it is."""

    def __init__(self, upstream: str, hold: float = 4.0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.hold = hold
        self.stalled = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        stall = threading.Event()  # the answer to come is a blob's, and no answer stalled yet

        def requests() -> None:
            with contextlib.suppress(OSError):
                while data := conn.recv(65536):
                    line = data.split(b"\r\n", 1)[0]
                    if line.startswith(b"GET ") and b"/workspace/blobs/" in line and not self.stalled.is_set():
                        stall.set()
                    up.sendall(data)

        threading.Thread(target=requests, daemon=True).start()
        head = b""
        with contextlib.suppress(OSError):
            while data := up.recv(65536):
                if stall.is_set() and not self.stalled.is_set():
                    head += data
                    if (end := head.find(b"\r\n\r\n")) >= 0:
                        conn.sendall(head[: end + 4 + 16])
                        self.stalled.set()
                        time.sleep(self.hold)
                        break
                    continue
                conn.sendall(data)
        for s in (conn, up):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def stalling_store(settings: Settings, store: Storage) -> Iterator[tuple[Storage, _StallingS3]]:
    """``store``'s table and bucket, its S3 reached through ``_StallingS3`` by a client that waits
    one second for a read (the deployment's waits 60)."""
    assert settings.endpoint_url is not None
    relay = _StallingS3(settings.endpoint_url)
    s3 = boto3.client("s3", endpoint_url=relay.url, region_name=settings.region,
                      config=Config(read_timeout=1, connect_timeout=2, retries={"max_attempts": 1}))  # fmt: skip
    try:
        yield Storage(store.table, PayloadStore(s3, settings.bucket)), relay
    finally:
        relay.close()


def test_a_read_of_the_bucket_that_stalls_during_a_restore_gives_the_task_back_and_the_next_claim_restores_it(
    store: Storage, stalling_store: tuple[Storage, _StallingS3], tmp_path: Path
) -> None:
    task_id = _answered_then_asked_again(
        store, tmp_path / "w1", [{"text": "1", "tool_calls": [call("shell", command="seq 1000 > kept.txt")]}], ["shell"]
    )
    stalling, relay = stalling_store
    with pytest.raises(ReadTimeoutError):  # the outage, raised: the lease was given back
        _run(stalling, tmp_path / "w2", task_id, "w2")
    assert relay.stalled.is_set()
    # was: failed, workspace_restore_failed "the workspace could not be written: Read timeout on endpoint URL"
    given_back = store.tasks.get(task_id)
    assert given_back.status is TaskStatus.RUNNING and given_back.error is None, given_back.error
    assert _run(stalling, tmp_path / "w3", task_id, "w3").status is TaskStatus.SUCCEEDED  # the bucket answers again
    done = store.tasks.get(task_id)
    assert done.result == "done again"
    assert "kept.txt" in _last_listing(store, task_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs to fill, which needs root")
def test_a_disk_another_task_filled_for_a_while_gives_the_task_back_and_the_next_claim_restores_it(
    store: Storage, tmp_path: Path
) -> None:
    task_id = _answered_then_asked_again(
        store,
        tmp_path / "w1",
        [{"text": "1", "tool_calls": [call("shell", command="head -c 1000000 /dev/urandom > data.bin")]}],
        ["shell"],
    )
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        with open(small / "another-tasks-file", "wb") as f, contextlib.suppress(OSError):
            while True:  # another task's command fills the worker's disk
                f.write(bytes(65536))
        with pytest.raises(OSError) as full:  # the outage, raised: the lease was given back
            _run(store, small / "root", task_id, "w2")
        assert full.value.errno == errno.ENOSPC, full.value
        # was: failed, workspace_restore_failed "the workspace could not be written: [Errno 28] No space left on device"
        given_back = store.tasks.get(task_id)
        assert given_back.status is TaskStatus.RUNNING and given_back.error is None, given_back.error
        (small / "another-tasks-file").unlink()  # that task's files are removed with its run
        assert _run(store, small / "root", task_id, "w3").status is TaskStatus.SUCCEEDED
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
    assert "data.bin" in _last_listing(store, task_id)
