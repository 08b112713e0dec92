"""Memory stores in the task table: tenant-scoped, versioned documents (``core.memory``).

Items (``storage.keys``), all in the partition ``MEMSTORE#<tenant>#<name>``:

- ``STORE``: the store's settings, ``documents`` (how many it holds now), and
  ``gsi1pk = MEMSTORES#<tenant>`` so a tenant's stores are one index query;
- ``DOC#<path>``: a document's current content, its hash and version (a deleted document keeps
  this item as a tombstone, ``deleted = true``, so its version numbers go on and are never reused);
- ``VER#<path>#<version, 9 digits>``: one change (created, modified, deleted) with its content
  and author (the task, step and ``tool_use_id`` that made it, or the API key), written once,
  only if absent; redaction removes its content and stamps ``redacted_at``; ``expires_at``
  (the store's retention after it was written) lets DynamoDB's TTL drop it; ``write_id``: the
  attempt that wrote it (below).

A write is one transaction: the lease check (a task's write: the worker still holds the task,
so a zombie writes nothing), the store (it exists; one more document only below its limit), the
document head moved from version ``n`` to ``n+1`` on the condition that it is still at ``n``,
and the new version put if absent. The precondition (``expected_sha256``) is checked against the
head read at ``n``: if another writer moved it since, the transaction is refused, the head is
read again, and a precondition that no longer holds is a ``MemoryConflict``: one writer wins,
the other learns it lost, nothing is lost. Every write of a store transacts on its one STORE
item, so two writers of any two of its documents may meet there (DynamoDB's
``TransactionConflict``: nothing written): the write is tried again after a jittered wait.

Each attempt is applied once, though its answer is lost after DynamoDB applied it (a 500, a
connection reset, a read timeout) and botocore sends it again: the attempt's id is its
``ClientRequestToken`` (DynamoDB answers the resent request as the write it applied) and the
``write_id`` of the version it puts; a resend refused where the token is not honoured (moto)
finds that version in its place and returns as the attempt would have. Else the writer's own
committed write would come back as a conflict with its own content. A store's creation keeps
its ``write_id`` on the STORE item likewise (a ``PutItem`` takes no token): a resent create
that finds it answers the store it made, not 409.

A store is deleted in steps, each safe to repeat: the STORE item is marked ``deleting`` (from
then on no write passes, the store is not found, and the name stays taken), the partition's
other items are deleted, then the STORE item. Interrupted, the mark stays: deleting the store
again, or creating one under its name, finishes the deletion.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from agentq.core.errors import ValidationError
from agentq.core.memory import (
    Author,
    MemoryConflict,
    MemoryDocument,
    MemoryDocumentNotFound,
    MemoryLimitExceeded,
    MemorySearchHit,
    MemoryStore,
    MemoryStoreNotFound,
    MemoryStoreSpec,
    MemoryStoreUpdate,
    MemoryVersion,
    Operation,
    SearchView,
    content_sha256,
)
from agentq.core.models import Lease
from agentq.storage import keys
from agentq.storage.leases import why_fenced
from agentq.storage.memory_items import (
    DELETING,
    LISTED,
    WRITE_ID,
    Retry,
    checked_path,
    conflict,
    doc_key,
    document_of,
    expired,
    finish_deletion,
    is_live,
    landed,
    live,
    query_words,
    ranked,
    store_key,
    store_of,
    version_of,
)
from agentq.storage.table import (
    Action,
    Check,
    ConditionFailed,
    Item,
    Key,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    TransactionConflict,
    Update,
    absent,
    fence,
    present,
)

DAY_SECONDS = 86_400
ATTEMPTS = 8
LIST_PAGE = 100
MAX_SEARCH_HITS = 20


class MemoryStores:
    """A tenant's memory stores, over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table, *, list_page: int = LIST_PAGE) -> None:
        self.table = table
        self.list_page = list_page

    # --- stores ---------------------------------------------------------------------------

    def create_store(self, tenant: str, spec: MemoryStoreSpec) -> MemoryStore:
        """A new store; its name taken by one whose deletion was interrupted, that deletion is
        finished first (so a name is never kept by a deletion that will not go on)."""
        now = time.time()
        write = uuid.uuid4().hex  # this creation, however often botocore sends it
        item = {
            "pk": keys.memory_store_pk(tenant, spec.name),
            "sk": keys.MEMORY_STORE,
            "tenant": tenant,
            **spec.model_dump(),
            "documents": 0,
            "created_at": now,
            "updated_at": now,
            "gsi1pk": keys.tenant_memory_stores_pk(tenant),
            "gsi1sk": spec.name,
            WRITE_ID: write,
        }
        for _ in range(ATTEMPTS):
            try:
                self.table.put(item, condition=absent())
                return store_of(item)
            except ConditionFailed as exc:
                old = exc.old if exc.old is not None else self.table.get(store_key(tenant, spec.name))
            if is_live(old) and old is not None and old.get(WRITE_ID) == write:
                return store_of(old)  # this creation went through; its answer was lost and its resend refused
            if is_live(old):
                raise MemoryConflict(f"a memory store named {spec.name!r} exists already", field="name")
            if old is not None:
                finish_deletion(self.table, tenant, spec.name, str(old[DELETING]))
        raise MemoryConflict(f"memory store {spec.name!r} is being deleted and made again by others; try again",
                             field="name")  # fmt: skip

    def get_store(self, tenant: str, name: str) -> MemoryStore:
        """A store; one being deleted is not found (nothing may be written to it any more)."""
        item = self.table.get(store_key(tenant, name))
        if not is_live(item):
            raise MemoryStoreNotFound(f"no memory store {name!r}", field="store")
        assert item is not None
        return store_of(item)

    def list_stores(self, tenant: str) -> list[MemoryStore]:
        """Every store of a tenant by name, page after page (for a caller that needs them all)."""
        found, after = self.stores_page(tenant, limit=self.list_page)
        while after is not None:
            more, after = self.stores_page(tenant, limit=self.list_page, after=after)
            found += more
        return found

    def stores_page(self, tenant: str, *, limit: int, after: str | None = None) -> tuple[list[MemoryStore], str | None]:
        """Up to ``limit`` of a tenant's stores by name, after the store named ``after``; and the
        name to go on after, None at the end. A store being deleted is left out (so a page may
        hold fewer than ``limit``)."""
        from agentq.resources import GSI1

        partition = keys.tenant_memory_stores_pk(tenant)
        start = None
        if after is not None:
            start = {**store_key(tenant, after), "gsi1pk": partition, "gsi1sk": after}
        # One more than the page: whether it is the last page is known without a call that finds nothing.
        page = self.table.query_index(GSI1, ("gsi1pk", partition), descending=False, limit=limit + 1, start=start)
        heads = page.items[:limit]
        more = len(page.items) > limit or page.last_key is not None  # (the latter: a 1 MB read cut it short)
        found = self.table.batch_get([{"pk": item["pk"], "sk": keys.MEMORY_STORE} for item in heads])
        stores = sorted((store_of(item) for item in found if is_live(item)), key=lambda store: store.name)
        return stores, (str(heads[-1]["gsi1sk"]) if more and heads else None)

    def update_store(self, tenant: str, name: str, update: MemoryStoreUpdate) -> MemoryStore:
        """Change a store's settings; a limit lowered below what it holds stops new documents only."""
        changes = update.model_dump(exclude_none=True)
        try:
            item = self.table.update(
                store_key(tenant, name),
                Update(set={**changes, "updated_at": time.time()}),
                condition=live(),
                returns="ALL_NEW",
            )
        except ConditionFailed as exc:
            raise MemoryStoreNotFound(f"no memory store {name!r}", field="store") from exc
        assert item is not None
        return store_of(item)

    def delete_store(self, tenant: str, name: str) -> MemoryStore:
        """Delete a store with every document and version in it; answers it as it was. A store
        whose deletion was interrupted is not found by the other reads, but is here: deleting it
        again finishes it."""
        try:
            item = self.table.update(
                store_key(tenant, name),
                Update(set_if_absent={DELETING: uuid.uuid4().hex}),  # a second deleter joins the first's
                condition=present(),
                returns="ALL_NEW",
            )
        except ConditionFailed as exc:
            raise MemoryStoreNotFound(f"no memory store {name!r}", field="store") from exc
        assert item is not None
        finish_deletion(self.table, tenant, name, str(item[DELETING]))
        return store_of(item)

    # --- documents ------------------------------------------------------------------------

    def list_documents(self, tenant: str, store: str, prefix: str = "/") -> list[MemoryDocument]:
        """The store's documents whose path starts with ``prefix``, by path, without content
        (which is not read: a projection), all of them (the memory tool's listing)."""
        checked_path(prefix, prefix=True)
        self.get_store(tenant, store)
        items = self.table.query(
            keys.memory_store_pk(tenant, store), prefix=keys.memory_doc_sk(prefix), attributes=LISTED
        )
        return [document_of(store, item, content=False) for item in items if not item.get("deleted")]

    def documents_page(
        self, tenant: str, store: str, prefix: str = "/", *, limit: int, after: str | None = None
    ) -> tuple[list[MemoryDocument], str | None]:
        """Up to ``limit`` heads of the store's documents under ``prefix``, by path, after the path
        ``after``, without content; and the path to go on after, None at the end. ``limit``
        counts the heads read, deleted documents' too (they are left out): a page's reads are
        bounded, and it may hold fewer than ``limit``."""
        checked_path(prefix, prefix=True)
        if after is not None and not (after.startswith(prefix) and checked_path(after, field="after")):
            raise ValidationError(f"after: {after!r} is not a path under path_prefix {prefix!r}", field="after")
        self.get_store(tenant, store)
        items = self.table.query(
            keys.memory_store_pk(tenant, store),
            prefix=keys.memory_doc_sk(prefix),
            after=keys.memory_doc_sk(after) if after is not None else None,
            limit=limit + 1,  # one more: whether this is the last page is known without another call
            attributes=LISTED,
        )
        page = items[:limit]
        docs = [document_of(store, item, content=False) for item in page if not item.get("deleted")]
        return docs, (str(page[-1]["path"]) if len(items) > limit else None)

    def read(self, tenant: str, store: str, path: str) -> MemoryDocument:
        checked_path(path)
        head = self._in_store(tenant, store, doc_key(tenant, store, path))
        if head is None or head.get("deleted"):
            raise MemoryDocumentNotFound(f"no document {path!r} in memory store {store!r}", field="path")
        return document_of(store, head, content=True)

    def _in_store(self, tenant: str, store: str, key: Key) -> Item | None:
        """The item at ``key`` of a store, read with the STORE item in one request: a store
        missing or being deleted is not found, rather than answering what is left of it."""
        found = {str(item["sk"]): item for item in self.table.batch_get([store_key(tenant, store), key])}
        if not is_live(found.get(keys.MEMORY_STORE)):
            raise MemoryStoreNotFound(f"no memory store {store!r}", field="store")
        return found.get(key["sk"])

    def write(
        self,
        tenant: str,
        store: str,
        path: str,
        content: str,
        *,
        author: Author,
        expected_sha256: str | None = None,
        unconditional: bool = False,
        lease: Lease | None = None,
    ) -> tuple[MemoryDocument, bool]:
        """Write ``content`` at ``path`` as a new version; answers the document and whether a
        version was made (content equal to the current one makes none).

        ``expected_sha256``: the content hash the writer last read; None means the writer
        expects no document there. ``unconditional`` (a person's overwrite) skips both.
        ``lease``: a task's write, fenced by its lease."""
        checked_path(path)
        size = len(content.encode("utf-8"))
        digest = content_sha256(content)
        for attempt in range(ATTEMPTS):
            settings = self.get_store(tenant, store)
            if size > settings.max_document_bytes:
                raise MemoryLimitExceeded(
                    f"content: {size:,} bytes; memory store {store!r} holds documents of at most "
                    f"{settings.max_document_bytes:,} bytes",
                    field="content",
                )
            head = self.table.get(doc_key(tenant, store, path))
            exists = head is not None and not head.get("deleted")
            current = str(head["content_sha256"]) if exists and head is not None else None
            if not unconditional and current != expected_sha256:
                raise conflict(store, path, expected_sha256, current)
            if current == digest:
                assert head is not None
                return document_of(store, head, content=True), False
            version = int(head["version"]) + 1 if head is not None else 1
            operation: Operation = "modified" if exists else "created"
            try:
                self._change(tenant, settings, path, head, version, operation, content, author, lease, adds=not exists)
            except Retry as retry:
                retry.wait(attempt)
                continue
            return self.read(tenant, store, path), True
        raise MemoryConflict(f"document {path!r} is being changed by others; try again", field="path")

    def delete_document(
        self,
        tenant: str,
        store: str,
        path: str,
        *,
        author: Author,
        expected_sha256: str | None = None,
        lease: Lease | None = None,
    ) -> MemoryVersion:
        """Delete a document (its versions stay, until retention drops them); with
        ``expected_sha256``, only if it still has that content."""
        checked_path(path)
        for attempt in range(ATTEMPTS):
            settings = self.get_store(tenant, store)
            head = self.table.get(doc_key(tenant, store, path))
            if head is None or head.get("deleted"):
                raise MemoryDocumentNotFound(f"no document {path!r} in memory store {store!r}", field="path")
            current = str(head["content_sha256"])
            if expected_sha256 is not None and current != expected_sha256:
                raise conflict(store, path, expected_sha256, current)
            version = int(head["version"]) + 1
            try:
                self._change(tenant, settings, path, head, version, "deleted", None, author, lease, adds=False)
            except Retry as retry:
                retry.wait(attempt)
                continue
            return self.version(tenant, store, path, version)
        raise MemoryConflict(f"document {path!r} is being changed by others; try again", field="path")

    def _change(
        self,
        tenant: str,
        settings: MemoryStore,
        path: str,
        head: Item | None,
        version: int,
        operation: Operation,
        content: str | None,
        author: Author,
        lease: Lease | None,
        *,
        adds: bool,
    ) -> None:
        """One transaction: lease, store (present, not being deleted), head from ``version - 1``
        to ``version``, the version. ``Retry`` when the head moved or the store item was busy;
        returns when this attempt is found applied (its resend refused: the module's docstring)."""
        from boto3.dynamodb.conditions import Attr

        now = time.time()
        write = uuid.uuid4().hex  # this attempt, one request however often botocore sends it
        pk = keys.memory_store_pk(tenant, settings.name)
        by = author.model_dump(exclude_none=True)
        state: dict[str, Any] = (
            {"deleted": True}
            if content is None
            else {
                "content": content,
                "content_sha256": content_sha256(content),
                "content_size_bytes": len(content.encode("utf-8")),
            }
        )
        created_at = float(head["created_at"]) if head is not None and not head.get("deleted") else now
        head_item = {
            "pk": pk, "sk": keys.memory_doc_sk(path), "path": path, "version": version,
            "created_at": created_at, "updated_at": now, "updated_by": by, **state,
        }  # fmt: skip
        version_item = {
            "pk": pk, "sk": keys.memory_version_sk(path, version), "path": path, "version": version,
            "operation": operation, "created_at": now, "created_by": by,
            "expires_at": int(now + settings.version_retention_days * DAY_SECONDS), WRITE_ID: write,
            **({} if content is None else state),
        }  # fmt: skip
        at = store_key(tenant, settings.name)
        if adds:
            store_action: Action = Patch(
                "store", at, Update(add={"documents": 1}), live() & Attr("documents").lt(settings.max_documents)
            )
        elif operation == "deleted":
            store_action = Patch("store", at, Update(add={"documents": -1}), live())
        else:
            store_action = Check("store", at, live())
        actions: list[Action] = []
        if lease is not None:
            actions.append(Check("lease", keys.meta_key(lease.task_id), fence(lease)))
        actions += [
            store_action,
            Put("doc", head_item, absent() if head is None else Attr("version").eq(int(head["version"]))),
            Put("version", version_item, absent()),
        ]
        try:
            self.table.transact(actions, token=write)
        except TransactionConflict as exc:
            if landed(self.table, version_item, write):
                return
            raise Retry(busy=True) from exc  # another write of this store's STORE item, at the same moment
        except TransactionCancelled as exc:
            if landed(self.table, version_item, write):
                return  # this attempt went through; its answer was lost and its resend refused
            if "lease" in exc.failed and lease is not None:
                raise why_fenced(self.table, lease) from exc
            if "store" in exc.failed:
                now_store = self.table.get(at)
                if not is_live(now_store):
                    raise MemoryStoreNotFound(f"no memory store {settings.name!r}", field="store") from exc
                assert now_store is not None
                if adds and int(now_store["documents"]) >= int(now_store["max_documents"]):
                    raise MemoryLimitExceeded(
                        f"memory store {settings.name!r} holds {int(now_store['documents'])} documents, its limit; "
                        "delete one or raise max_documents",
                        field="path",
                    ) from exc
            raise Retry() from exc

    # --- versions -------------------------------------------------------------------------

    def versions(self, tenant: str, store: str, path: str) -> list[MemoryVersion]:
        """A document's retained versions, newest first (a deleted document's too)."""
        return self.versions_page(tenant, store, path, limit=None)[0]

    def versions_page(
        self, tenant: str, store: str, path: str, *, limit: int | None, before: int | None = None
    ) -> tuple[list[MemoryVersion], bool]:
        """Up to ``limit`` (None: all) of them, older than ``before`` (a page's last version); and
        whether there are more. ``limit`` counts expired versions read (left out)."""
        checked_path(path)
        self.get_store(tenant, store)
        after = keys.memory_version_sk(path, before) if before is not None else None
        items = self.table.query(keys.memory_store_pk(tenant, store), prefix=keys.memory_versions_prefix(path),
                                 descending=True, limit=limit + 1 if limit else None, after=after)  # fmt: skip
        now = time.time()
        found = [version_of(store, item) for item in items[:limit] if not expired(item, now)]
        if not found and before is None:
            raise MemoryDocumentNotFound(f"no versions of {path!r} in memory store {store!r}", field="path")
        return found, limit is not None and len(items) > limit

    def version(self, tenant: str, store: str, path: str, version: int) -> MemoryVersion:
        checked_path(path)
        key = {"pk": keys.memory_store_pk(tenant, store), "sk": keys.memory_version_sk(path, version)}
        item = self._in_store(tenant, store, key)
        if item is None or expired(item, time.time()):
            raise MemoryDocumentNotFound(f"no version {version} of {path!r} in memory store {store!r}", field="version")
        return version_of(store, item)

    def redact(self, tenant: str, store: str, path: str, version: int) -> MemoryVersion:
        """Remove a past version's content for good (its author and time stay). The version
        that is the document's current content cannot be: overwrite or delete it first."""
        from boto3.dynamodb.conditions import Attr

        existing = self.version(tenant, store, path, version)
        head = self.table.get(doc_key(tenant, store, path))
        if head is not None and not head.get("deleted") and int(head["version"]) == version:
            raise MemoryConflict(
                f"version {version} is the current content of {path!r}: overwrite or delete the document first",
                field="version",
                current_sha256=str(head["content_sha256"]),
            )
        if existing.redacted_at is not None:
            return existing
        try:
            item = self.table.update(
                {"pk": keys.memory_store_pk(tenant, store), "sk": keys.memory_version_sk(path, version)},
                Update(set={"redacted_at": time.time()}, remove=["content", "content_sha256", "content_size_bytes"]),
                condition=present() & Attr("redacted_at").not_exists(),
                returns="ALL_NEW",
            )
        except ConditionFailed:
            return self.version(tenant, store, path, version)
        assert item is not None
        return version_of(store, item)

    # --- search ---------------------------------------------------------------------------

    def search(
        self, tenant: str, store: str, query: str, *, limit: int = 10, view: SearchView | None = None
    ) -> list[MemorySearchHit]:
        """Documents holding every word of ``query`` (case-insensitive; each word once, at most
        ``MAX_QUERY_WORDS``: ``query_words``) in their path or content, most occurrences first;
        with ``view``, as it shows them (the memory tools': redacted; ``memory_items.search_hit``).
        It reads the whole store (one Query), which its document limit bounds; there is no index
        to keep in step with the writes."""
        words = query_words(query)
        self.get_store(tenant, store)
        items = self.table.query(keys.memory_store_pk(tenant, store), prefix=keys.MEMORY_DOC)
        return ranked(items, words, view)[: max(1, min(limit, MAX_SEARCH_HITS))]
