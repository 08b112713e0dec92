"""What a worker holds in memory to checkpoint and restore a workspace (core.workspace_stream):
a bounded part of its files, whatever their apparent size. A sparse file costs a process a few KB
of disk for up to the quota's apparent size, and a worker runs many tenants' tasks: one that held
files whole held about the quota per task (ten sparse 100 MB files: 1.1 GB at the checkpoint, as
much at the restore; one of 1,000 MB: 2 and 3 GB). Measured as the worker process's peak resident
set (Linux ``VmHWM``, reset before each) against a real S3 API in another process (a moto server
of the test's own), so that what boto3 buffers of a streamed body counts too."""

from __future__ import annotations

import os
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.engine._session import LeaseState, Session
from agentq.core.engine._workspace import Workspaces
from agentq.core.workspace import WorkspaceQuota, WorkspaceTooLarge
from agentq.core.workspace_disk import scan, wipe
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.helpers import scripted

MIB = 1 << 20
BOUND = 64 * MIB  # what a checkpoint or a restore may add to the worker's peak: PARALLEL chunks and boto3's buffers


@pytest.fixture
def bucket_store() -> Iterator[Storage]:
    """A table and a bucket on a moto server of the test's own (the objects are dropped with it)."""
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with MotoServer() as server:
        names = ResourceNames.for_prefix(f"m{uuid.uuid4().hex[:10]}")
        settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=server.endpoint_url)
        provision(session(settings), names, endpoint_url=settings.endpoint_url)
        yield build_store(settings)


def _peak_above(start: int) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 - start
    raise AssertionError("no VmHWM in /proc/self/status")


def _resident() -> int:
    """The process's resident set now, its peak reset to it."""
    Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _claim(store: Storage, task_id: str) -> Session:
    claimed = store.tasks.claim(task_id, "w1", 300)
    assert claimed is not None
    lease, held = claimed
    return Session(held=LeaseState(lease=lease, tenant="t"), task=held, steps=[], messages=[], deadline=None)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="measures Linux's VmHWM")
@pytest.mark.parametrize(("files", "size"), [(8, 48 * MIB), (1, 384 * MIB)], ids=["8 files of 48 MiB", "1 of 384 MiB"])
def test_a_checkpoint_and_a_restore_of_sparse_files_hold_a_bounded_part_of_them_in_the_workers_memory(
    bucket_store: Storage, tmp_path: Path, files: int, size: int
) -> None:
    """384 MB of apparent size, a few KB on disk, as many files (more than one window of them) or
    one: the checkpoint stores them all, hash-checked, and a takeover restores them exactly, each
    adding less than ``BOUND`` to the worker's peak memory."""
    store = bucket_store
    workspaces = Workspaces(store.workspaces, worker_id="w1", root=str(tmp_path / "root"), quota=WorkspaceQuota())
    task = store.tasks.create(scripted([{"text": "done"}], tools=["shell"]), tenant="t")
    s = _claim(store, task.task_id)
    workspaces.open(s)
    for i in range(files):
        with open(s.workspace.directory / f"f{i}", "wb") as f:  # what `truncate -s` and an append make
            f.truncate(size - 8)
            f.seek(0, os.SEEK_END)
            f.write(b"%08d" % i)
    start = _resident()
    ref = workspaces.checkpoint(s)
    checkpoint = _peak_above(start)
    assert ref is not None and ref.uploaded_bytes == files * size
    workspaces.committed(s)
    workspaces.close(s)
    s.task = s.task.model_copy(update={"workspace": ref})
    start = _resident()
    workspaces.open(s)  # the takeover's restore, checked against the manifest
    restore = _peak_above(start)
    try:
        assert (s.workspace.directory / f"f{files - 1}").stat().st_size == size
    finally:
        workspaces.close(s)
    assert (checkpoint < BOUND, restore < BOUND) == (True, True), (checkpoint // MIB, restore // MIB)


def test_a_directory_of_many_names_costs_the_scan_no_more_than_the_quota_counts_and_its_removal_a_bounded_part(
    tmp_path: Path,
) -> None:
    """A command may make millions of empty files in one directory during a call (1M took 107 s
    here; a call may last 10 minutes), whatever the quota, which is checked after it. The scan
    listed and sorted the whole directory before it counted one entry against ``max_files``, and
    the removal (the revert's restore, the run's end) listed it whole too: 135 MB of the shared
    worker per million names, twice. Now the scan reads no more names than the quota lets it
    count, and the removal removes each entry as it reads it. Measured with tracemalloc, which
    sees every name Python holds: 200,000 names were 15 MB to each before, the 30,000 here some
    2.2 MB (the test made them in 60-95 s; these take a tenth of it)."""
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    for i in range(30_000):
        os.close(os.open(root / "d" / f"f{i:09d}", os.O_CREAT | os.O_WRONLY, 0o644))
    tracemalloc.start()
    try:
        with pytest.raises(WorkspaceTooLarge, match="more than its limit of 1000 entries"):
            scan(root, quota=WorkspaceQuota(max_files=1000))
        _, scanned = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        wipe(root)
        _, removed = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not root.exists()
    assert (scanned < MIB // 2, removed < MIB // 2) == (True, True), (scanned // 1024, removed // 1024)  # KiB
