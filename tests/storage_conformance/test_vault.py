"""The vault's items (``storage.vault.Vault``) on every backend: a tenant's and each user's
credentials apart, a replacement keeping its creation time, sealed bytes back as written, the
notes of waiting tasks found by credential name only, and a run's read of a credential refused
once its task no longer runs under its lease."""

from __future__ import annotations

import pytest

from agentq.core.errors import LeaseLost
from agentq.core.models import TaskStatus
from agentq.core.vault import Sealed
from agentq.storage.container import Storage

from ._builders import claimed

SEALED = Sealed(ciphertext=b"\x00\x01ct", nonce=b"n" * 12, wrapped_key=b"\xffwrapped", key_id="k")


def test_credentials_are_kept_per_tenant_and_user_and_a_replacement_keeps_its_creation(backend: Storage) -> None:
    vault = backend.vault
    first = vault.put("t", "ann", "github", kind="bearer", hosts=["api.github.com"], header=None, sealed=SEALED)
    vault.put("t", None, "github", kind="api_key", hosts=["*.example.com"], header="X-Key", sealed=SEALED)
    vault.put("u", "ann", "github", kind="bearer", hosts=["x.example.com"], header=None, sealed=SEALED)
    again = vault.put("t", "ann", "github", kind="bearer", hosts=["api.github.com:8443"], header=None, sealed=SEALED)
    assert again.created_at == first.created_at and again.updated_at >= first.updated_at
    assert [(c.name, c.hosts) for c in vault.listing("t", "ann")] == [("github", ["api.github.com:8443"])]
    assert [(c.user, c.header) for c in vault.listing("t", None)] == [(None, "X-Key")]
    assert vault.listing("t", "bob") == [] and [c.hosts for c in vault.listing("u", "ann")] == [["x.example.com"]]
    stored = vault.get("t", "ann", "github")
    assert stored is not None and stored.sealed == SEALED
    assert vault.get("t", "bob", "github") is None
    assert vault.delete("t", "ann", "github") is not None and vault.get("t", "ann", "github") is None
    assert vault.delete("t", "ann", "github") is None


def test_waiting_tasks_are_found_by_the_credential_they_wait_for(backend: Storage) -> None:
    vault = backend.vault
    vault.wait("t", "ann", "github", "task1", "call1")
    vault.wait("t", "ann", "github", "task2", "call9")
    vault.wait("t", "ann", "githubx", "task3", "call1")
    vault.wait("t", "ann", "github", "task1", "call1")  # twice: one note
    assert sorted(vault.waiters("t", "ann", "github")) == [("task1", "call1"), ("task2", "call9")]
    assert vault.waiters("t", "bob", "github") == [] and vault.listing("t", "ann") == []  # notes are not credentials
    vault.unwait("t", "ann", "github", "task1", "call1")
    assert vault.waiters("t", "ann", "github") == [("task2", "call9")]


def test_a_credential_read_for_a_run_comes_only_while_its_task_runs_under_its_lease(backend: Storage) -> None:
    """``get_running``: the credential and the task's META in one read; a task a stop marked,
    one cancelled, one another worker claimed gets ``LeaseLost`` naming why, as a fenced write
    would (ARCHITECTURE invariant 17), and none of the credential."""
    vault = backend.vault
    vault.put("t", "ann", "github", kind="bearer", hosts=["api.github.com"], header=None, sealed=SEALED)
    marked, cancelled, taken = claimed(backend), claimed(backend), claimed(backend)
    got = vault.get_running("t", "ann", "github", marked)
    assert got is not None and got.sealed == SEALED
    assert vault.get_running("t", "bob", "github", marked) is None  # none of that name: None, as ``get``
    backend.tasks.mark_stopping([marked.task_id], "user 'ann'")
    backend.tasks.transition(cancelled.task_id, TaskStatus.CANCELLED, error={"code": "cancelled", "message": "x"})
    backend.tasks.release(taken)
    assert backend.tasks.claim(taken.task_id, "w2", 30) is not None
    refusals = {}
    for lease in (marked, cancelled, taken):
        with pytest.raises(LeaseLost) as lost:
            vault.get_running("t", "ann", "github", lease)
        refusals[lease.task_id] = (lost.value.message, lost.value.details)
    assert refusals[marked.task_id] == (
        f"task {marked.task_id} is being stopped (user 'ann'); the worker lets it go",
        {"stopping": "user 'ann'"},
    )
    assert refusals[cancelled.task_id][1] == {"status": TaskStatus.CANCELLED}
    assert "superseded by" in refusals[taken.task_id][0]
    # The heartbeat's look at many tasks at once (``fenced_out``) finds the same, and only those.
    running = claimed(backend)
    fenced = backend.tasks.fenced_out([marked, cancelled, taken, running])
    assert sorted(fenced) == sorted([marked.task_id, cancelled.task_id, taken.task_id])
    assert {k: (v.message, v.details) for k, v in fenced.items()} == refusals
