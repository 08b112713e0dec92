"""The vault for people: write, list and delete a tenant's or a user's credentials
(``core.vault``), and wake the tasks that paused for one (``request_credential``).

A write seals the secret (``Cipher.seal``, the owner's identity as the encryption context) and
stores only that; nothing here returns a secret, and the write's answer is the listing's shape
(names, kind, hosts, dates). Once stored, every task that waits for the credential (the user's,
or any of the tenant's for a tenant-wide one) has its pause decided and is queued again.
"""

from __future__ import annotations

import contextlib
import json
import logging

from agentq.core.errors import IllegalTransition, TaskNotFound
from agentq.core.vault import Cipher, CredentialInfo, CredentialWrite, VaultUnavailable, context_for
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

log = logging.getLogger("agentq.vault")


class CredentialNotFound(TaskNotFound):
    """A 404 like an unknown task (another tenant's or user's credential is not found either)."""

    code = "credential_not_found"


def put(
    store: Storage, queues: TaskQueues, cipher: Cipher | None, tenant: str, name: str, write: CredentialWrite
) -> CredentialInfo:
    if cipher is None:
        raise VaultUnavailable(
            "this deployment has no vault key (AGENTQ_VAULT_KMS_KEY or AGENTQ_VAULT_KEY_FILE)", field="vault"
        )
    secret = {"value": write.value.get_secret_value(), **({"username": write.username} if write.username else {})}
    sealed = cipher.seal(json.dumps(secret).encode(), context_for(tenant, write.user, name))
    info = store.vault.put(tenant, write.user, name, kind=write.kind, hosts=write.hosts, header=write.header,
                           sealed=sealed)  # fmt: skip
    woken = wake(store, queues, tenant, write.user, name)
    if woken:
        log.info("credential %s added: %d waiting task(s) resumed", name, woken)
    return info


def wake(store: Storage, queues: TaskQueues, tenant: str, user: str | None, name: str) -> int:
    """Decide the pause of every task waiting for ``name`` (the user's, or every user's of the
    tenant for a tenant-wide credential) and queue it again; a pause decided already (declined,
    timed out, or the task woke itself) is only forgotten."""
    woken = 0
    for task_id, use_id in store.vault.waiters(tenant, user, name):
        try:
            store.approvals.decide(task_id, use_id, approved=True, note=f"credential {name!r} was added",
                                   by=f"user {user}" if user else "tenant")  # fmt: skip
            task = store.tasks.get(task_id)
            queues.send(task_id, task.submission.priority, tenant=task.tenant)
            woken += 1
        except (IllegalTransition, TaskNotFound):
            pass
        task_user = _task_user(store, task_id)
        for owner in {user, task_user, None}:
            with contextlib.suppress(Exception):
                store.vault.unwait(tenant, owner, name, task_id, use_id)
    return woken


def _task_user(store: Storage, task_id: str) -> str | None:
    try:
        return store.tasks.get(task_id).user
    except TaskNotFound:
        return None


def listing(store: Storage, tenant: str, user: str | None) -> list[CredentialInfo]:
    return store.vault.listing(tenant, user)


def delete(store: Storage, tenant: str, user: str | None, name: str) -> CredentialInfo:
    gone = store.vault.delete(tenant, user, name)
    if gone is None:
        who = f"user {user!r}" if user else "this tenant"
        raise CredentialNotFound(f"{who} has no credential {name!r}", field="name")
    return gone
