"""The vault's items: one partition per tenant and user (``keys.vault_pk``), ``CRED#<name>`` for a
credential (its name, kind, hosts and dates in the clear, its secret only sealed:
``core.vault_crypto``) and ``WAIT#<name>#<task>#<call>`` for a task paused until the user adds
that credential (``request_credential``; ``control.vault.put`` wakes it).

No method here returns a secret in the clear: ``get`` gives the sealed bytes, which only a
worker with the key can open."""

from __future__ import annotations

import base64
import contextlib
import time
from decimal import Decimal

from agentq.core.models import Lease
from agentq.core.vault import CredentialInfo, Sealed, StoredCredential
from agentq.storage import keys
from agentq.storage.leases import refused
from agentq.storage.table import ConditionFailed, Item, Table, fence_holds, plain

CREDENTIAL = "CRED#"
WAITER = "WAIT#"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _info(d: Item) -> CredentialInfo:
    return CredentialInfo(
        name=d["name"], user=d.get("user") or None, kind=d["kind"], hosts=list(d["hosts"]), header=d.get("header"),
        created_at=float(d["created_at"]), updated_at=float(d["updated_at"]),
    )  # fmt: skip


def _stored(raw: Item) -> StoredCredential:
    d = plain(raw)
    sealed = Sealed(
        ciphertext=base64.b64decode(d["ciphertext"]), nonce=base64.b64decode(d["nonce"]),
        wrapped_key=base64.b64decode(d["wrapped_key"]), key_id=str(d["key_id"]),
    )  # fmt: skip
    return StoredCredential(_info(d), sealed)


class Vault:
    def __init__(self, table: Table) -> None:
        self.table = table

    @staticmethod
    def _key(tenant: str, user: str | None, name: str) -> dict[str, str]:
        return {"pk": keys.vault_pk(tenant, user), "sk": f"{CREDENTIAL}{name}"}

    def put(
        self, tenant: str, user: str | None, name: str, *, kind: str, hosts: list[str], header: str | None,
        sealed: Sealed,
    ) -> CredentialInfo:  # fmt: skip
        """Write (or replace) a credential; a replacement keeps its ``created_at``."""
        now = time.time()
        old = self.table.get(self._key(tenant, user, name))
        created = float(plain(old)["created_at"]) if old is not None else now
        item = {
            **self._key(tenant, user, name), "tenant": tenant, "name": name, "kind": kind, "hosts": hosts,
            "created_at": Decimal(repr(created)), "updated_at": Decimal(repr(now)),
            "ciphertext": _b64(sealed.ciphertext), "nonce": _b64(sealed.nonce),
            "wrapped_key": _b64(sealed.wrapped_key), "key_id": sealed.key_id,
        }  # fmt: skip
        if user is not None:
            item["user"] = user
        if header is not None:
            item["header"] = header
        self.table.put(item)
        return _info(plain(item))

    def get(self, tenant: str, user: str | None, name: str) -> StoredCredential | None:
        raw = self.table.get(self._key(tenant, user, name))
        return _stored(raw) if raw is not None else None

    def get_running(self, tenant: str, user: str | None, name: str, lease: Lease) -> StoredCredential | None:
        """The credential (as ``get``) only while ``lease``'s task runs under it: its META is read
        in the same BatchGetItem, strongly consistent as every read here, and one that fails the
        lease fence (``table.fence_holds``: another epoch, a status but ``running``, a stop's
        mark) raises ``LeaseLost`` naming why (``leases.refused``), the credential's item
        dropped unread by the caller. One round trip as ``get``'s GetItem, one item more (META):
        each use of a credential by a run is also its check that a stop has not come."""
        wanted, meta_key = self._key(tenant, user, name), keys.meta_key(lease.task_id)
        found = {(i["pk"], i["sk"]): i for i in self.table.batch_get([wanted, meta_key])}
        meta = found.get((meta_key["pk"], meta_key["sk"]))
        if not fence_holds(meta, lease):
            raise refused(lease, meta)
        raw = found.get((wanted["pk"], wanted["sk"]))
        return _stored(raw) if raw is not None else None

    def listing(self, tenant: str, user: str | None) -> list[CredentialInfo]:
        """Names, kinds, hosts and dates of the tenant's (``user`` None) or one user's credentials."""
        return [_info(plain(i)) for i in self.table.query(keys.vault_pk(tenant, user), prefix=CREDENTIAL)]

    def delete(self, tenant: str, user: str | None, name: str) -> CredentialInfo | None:
        old = self.table.delete(self._key(tenant, user, name))
        return _info(plain(old)) if old is not None else None

    # --- tasks waiting for a credential -------------------------------------------------------

    def wait(self, tenant: str, user: str | None, name: str, task_id: str, use_id: str) -> None:
        """Note that ``task_id`` pauses (call ``use_id``) until this credential is added."""
        sk = f"{WAITER}{name}#{task_id}#{use_id}"
        with contextlib.suppress(ConditionFailed):
            self.table.put({"pk": keys.vault_pk(tenant, user), "sk": sk, "task_id": task_id, "use_id": use_id,
                            "asked_at": Decimal(repr(time.time()))})  # fmt: skip

    def waiters(self, tenant: str, user: str | None, name: str) -> list[tuple[str, str]]:
        """(task, call) of every task waiting for this credential."""
        items = self.table.query(keys.vault_pk(tenant, user), prefix=f"{WAITER}{name}#")
        return [(str(i["task_id"]), str(i["use_id"])) for i in map(plain, items)]

    def unwait(self, tenant: str, user: str | None, name: str, task_id: str, use_id: str) -> None:
        self.table.delete({"pk": keys.vault_pk(tenant, user), "sk": f"{WAITER}{name}#{task_id}#{use_id}"})
