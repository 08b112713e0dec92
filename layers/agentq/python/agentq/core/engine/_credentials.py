"""A task's credentials, as its tools reach them: the vault of the task's tenant and user, opened
on this worker, each value handed to the redactor the moment it is opened (into the run's own
hold, ``observe.redaction.run_scope``), and held there until the run ends (``close``).

A user's credential of a name wins over the tenant's of the same name. Opening is lazy (a task
that never uses a credential never decrypts one). Each use reads the credential's item again,
one GetItem (two for the tenant's, when the user has none of that name): a credential deleted
while the run goes on is unavailable to its next call, one rebound is sent only where it is bound
now, one written again is opened again; an unchanged one is not (at most one KMS call per
credential per run, and the cipher caches data keys across runs). A run is hours long, and a
user who revokes a token means its next request, not the run's end.

A use is also a check that the task still runs under the run's lease (``held``): the first item
is read with the task's META in one BatchGetItem (``VaultBook.get_running``; the same round trips
as without it, one item more), and a task a stop marked, cancelled, or another worker took gets
no credential: ``LeaseLost`` naming why, nothing opened, and the run is told (``LeaseState.lose``),
which kills its sandbox. So once a stop has returned, no request of the stopped task's carries a
credential, whatever its shell still tries (ARCHITECTURE invariant 17).
"""

from __future__ import annotations

import json
import threading
import weakref

from agentq.core.engine._session import LeaseState
from agentq.core.errors import LeaseLost
from agentq.core.ports import VaultBook
from agentq.core.vault import (
    Cipher,
    Credential,
    CredentialInfo,
    CredentialRefused,
    CredentialUnavailable,
    HostBinding,
    StoredCredential,
    context_for,
    unavailable,
    valid_name,
)
from agentq.observe.redaction import REDACTOR, run_hold


class TaskCredentials:
    """``core.vault.CredentialSource`` for one run of one task."""

    def __init__(
        self, vault: VaultBook, cipher: Cipher | None, tenant: str, user: str | None, held: LeaseState | None = None
    ) -> None:
        """``held``: the run's lease (``credentials_for`` gives it); each use then reads the task's
        META with the credential, and a task no longer running under it gets none (see the module)."""
        self.vault, self.cipher, self.tenant, self.user = vault, cipher, tenant, user
        self.held = held
        # each credential opened, with the owner and item it was opened from
        self._opened: dict[str, tuple[tuple[str | None, StoredCredential], Credential]] = {}
        self._infos: list[CredentialInfo] | None = None
        self._lock = threading.Lock()
        # The run's values stay in the redactor while it runs, whatever other runs add; the
        # engine releases them when the run ends (``close``), or its collection does. Inside a
        # run (``Engine.run``'s ``run_scope``) they go into the run's hold, by which its results
        # and files are redacted (``observe.redaction.current``): of its own values only.
        self._hold = run_hold() or REDACTOR.hold()
        weakref.finalize(self, self._hold.release_later)  # never the lock from inside the collector

    def close(self) -> None:
        """The run is over: its values are no longer held (they stay among the recent ones)."""
        self._hold.release()

    def get(self, name: str, host: str | None = None, *, to: tuple[str, int] | None = None) -> Credential:
        """The credential ``name`` of the task's user (else its tenant's), or ``CredentialUnavailable``;
        ``to`` (host, port): ``CredentialRefused`` if it is not bound there, read before it is opened.
        Read from the table on every call (see the module): what this run opened before is used
        again only while its item is as it was then."""
        if not valid_name(name):
            raise unavailable(name, self.user, host)
        owner = self.user
        stored = self._first(owner, name)
        if stored is None and owner is not None:
            owner = None
            stored = self.vault.get(self.tenant, None, name)
        if stored is None or self.cipher is None:
            raise unavailable(name, self.user, host)
        if to is not None and not any(HostBinding.parse(h).matches(*to) for h in stored.info.hosts):
            where = ", ".join(stored.info.hosts)
            raise CredentialRefused(
                f"credential {name!r} is bound to {where}, not {to[0]}:{to[1]}: not sent", field="credential"
            )
        with self._lock:
            kept = self._opened.get(name)
        if kept is not None and kept[0] == (owner, stored):
            return kept[1]
        secret = json.loads(self.cipher.open(stored.sealed, context_for(self.tenant, owner, name)))
        credential = Credential(
            name=name,
            kind=stored.info.kind,
            hosts=tuple(HostBinding.parse(h) for h in stored.info.hosts),
            secret=secret["value"],
            username=secret.get("username"),
            header_name=stored.info.header,
        )
        self._hold.add(*credential.secret_forms())
        with self._lock:
            self._opened[name] = ((owner, stored), credential)
        return credential

    def _first(self, owner: str | None, name: str) -> StoredCredential | None:
        """The first item a use reads (the user's, else the tenant's), with the task's META when
        the run's lease is known: a run that knows already its task is no longer its own reads
        nothing, one that learns it here is told (``LeaseState.lose``: its sandbox is killed, its
        next check ends it as the store said) and gets ``LeaseLost``, nothing opened."""
        held = self.held
        if held is None:
            return self.vault.get(self.tenant, owner, name)
        held.check()
        try:
            return self.vault.get_running(self.tenant, owner, name, held.lease)
        except LeaseLost as exc:
            held.lose(exc)
            raise

    @property
    def opened(self) -> bool:
        """Whether this run has opened any credential, or read a deployment secret
        (``core.secrets.held`` adds it to the run's hold): its workspace's files may hold a value
        the redactor has, and are scrubbed of it (``core.engine._workspace``)."""
        return bool(self._opened) or bool(self._hold.values)

    def for_host(self, host: str, port: int) -> Credential | None:
        """The credential the egress proxy adds for ``host:port``: the user's (then the tenant's)
        one bound there, an exact binding before a pattern, then by name; None if none is. The
        listing is read once, and says which; that one is read again before it is used (``get``),
        and if it is gone or bound elsewhere since, the listing is read again. A credential
        added, or first bound to the host, while the run goes on is added from the next run."""
        if self.cipher is None:
            return None
        if self._infos is None:
            self._infos = self._listing()
        name = _bound(self._infos, host, port)
        try:
            return self.get(name, host, to=(host, port)) if name is not None else None
        except (CredentialUnavailable, CredentialRefused):
            self._infos = self._listing()  # changed since it was read
            name = _bound(self._infos, host, port)
            return self.get(name, host, to=(host, port)) if name is not None else None

    def bound_to(self, host: str, port: int) -> str | None:
        """The name of the credential bound to ``host:port`` by the run's listing (read once),
        no item read and nothing opened: what a ``CONNECT`` tunnel, which never carries one,
        names in its note. A GetItem per tunnel would cost each https connection a strongly
        consistent read (two for the tenant's credential) for a note."""
        if self.cipher is None:
            return None
        if self._infos is None:
            self._infos = self._listing()
        return _bound(self._infos, host, port)

    def _listing(self) -> list[CredentialInfo]:
        mine = self.vault.listing(self.tenant, self.user) if self.user is not None else []
        names = {i.name for i in mine}
        return [*mine, *(i for i in self.vault.listing(self.tenant, None) if i.name not in names)]

    def has(self, name: str) -> bool:
        """Whether the task's user (or tenant) has ``name`` now, read afresh (no decryption)."""
        if self.user is not None and self.vault.get(self.tenant, self.user, name) is not None:
            return True
        return self.vault.get(self.tenant, None, name) is not None


def _bound(infos: list[CredentialInfo], host: str, port: int) -> str | None:
    """The name of the credential ``infos`` bind to ``host:port``: an exact binding before a
    pattern, then by name."""
    bound = []
    for info in infos:
        hits = [b for b in (HostBinding.parse(h) for h in info.hosts) if b.matches(host, port)]
        if hits:
            bound.append((min(b.wildcard for b in hits), info.name))
    return min(bound)[1] if bound else None
