"""Memory stores in the task table: tenant-scoped, versioned documents (``core.memory``).

Items (``storage.keys``), all in the partition ``MEMSTORE#<tenant>#<name>``:

- ``STORE``: the store's settings, ``documents`` (how many it holds now), and
  ``gsi1pk = MEMSTORES#<tenant>`` so a tenant's stores are one index query;
- ``DOC#<path>``: a document's current content, its hash and version (a deleted document keeps
  this item as a tombstone, ``deleted = true``, so its version numbers go on and are never reused);
- ``VER#<path>#<version, 9 digits>``: one change (created, modified, deleted) with its content
  and author (the task, step and ``tool_use_id`` that made it, or the API key), written once,
  only if absent; redaction removes its content and stamps ``redacted_at``; ``expires_at``
  (the store's retention after it was written) lets DynamoDB's TTL drop it.

A write is one transaction: the lease check (a task's write: the worker still holds the task,
so a zombie writes nothing), the store (it exists; one more document only below its limit), the
document head moved from version ``n`` to ``n+1`` on the condition that it is still at ``n``,
and the new version put if absent. The precondition (``expected_sha256``) is checked against the
head read at ``n``: if another writer moved it since, the transaction is refused, the head is
read again, and a precondition that no longer holds is a ``MemoryConflict``: one writer wins,
the other learns it lost, nothing is lost.
"""

from __future__ import annotations

import time
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
    check_path,
    content_sha256,
)
from agentq.core.models import Lease
from agentq.storage import keys
from agentq.storage.leases import why_fenced
from agentq.storage.table import (
    Action,
    Check,
    ConditionFailed,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    fence,
    plain,
    present,
)

DAY_SECONDS = 86_400
ATTEMPTS = 8
LIST_PAGE = 100
MAX_SEARCH_HITS = 20
SNIPPET_CHARS = 240


class MemoryStores:
    """A tenant's memory stores, over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table, *, list_page: int = LIST_PAGE) -> None:
        self.table = table
        self.list_page = list_page

    # --- stores ---------------------------------------------------------------------------

    def create_store(self, tenant: str, spec: MemoryStoreSpec) -> MemoryStore:
        now = time.time()
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
        }
        try:
            self.table.put(item, condition=absent())
        except ConditionFailed as exc:
            raise MemoryConflict(f"a memory store named {spec.name!r} exists already", field="name") from exc
        return _store(item)

    def get_store(self, tenant: str, name: str) -> MemoryStore:
        item = self.table.get(_store_key(tenant, name))
        if item is None:
            raise MemoryStoreNotFound(f"no memory store {name!r}", field="store")
        return _store(item)

    def list_stores(self, tenant: str) -> list[MemoryStore]:
        """A tenant's stores by name."""
        from agentq.resources import GSI1

        heads: list[Item] = []
        start: Item | None = None
        while True:
            page = self.table.query_index(
                GSI1,
                ("gsi1pk", keys.tenant_memory_stores_pk(tenant)),
                descending=False,
                limit=self.list_page,
                start=start,
            )
            heads += page.items
            if page.last_key is None:
                break
            start = page.last_key
        found = self.table.batch_get([{"pk": item["pk"], "sk": keys.MEMORY_STORE} for item in heads])
        return sorted((_store(item) for item in found), key=lambda store: store.name)

    def update_store(self, tenant: str, name: str, update: MemoryStoreUpdate) -> MemoryStore:
        """Change a store's settings; a limit lowered below what it holds stops new documents only."""
        changes = update.model_dump(exclude_none=True)
        try:
            item = self.table.update(
                _store_key(tenant, name),
                Update(set={**changes, "updated_at": time.time()}),
                condition=present(),
                returns="ALL_NEW",
            )
        except ConditionFailed as exc:
            raise MemoryStoreNotFound(f"no memory store {name!r}", field="store") from exc
        assert item is not None
        return _store(item)

    def delete_store(self, tenant: str, name: str) -> None:
        """Delete a store with every document and version in it."""
        self.get_store(tenant, name)
        items = self.table.query(keys.memory_store_pk(tenant, name), keys_only=True)
        # The STORE item last: a store half deleted by a crash is still listed, and deleting it again finishes.
        ordered = sorted(items, key=lambda item: item["sk"] == keys.MEMORY_STORE)
        self.table.batch_delete([{"pk": item["pk"], "sk": item["sk"]} for item in ordered])

    # --- documents ------------------------------------------------------------------------

    def list_documents(self, tenant: str, store: str, prefix: str = "/") -> list[MemoryDocument]:
        """The store's documents whose path starts with ``prefix``, by path, without content."""
        _path(prefix, prefix=True)
        self.get_store(tenant, store)
        items = self.table.query(keys.memory_store_pk(tenant, store), prefix=keys.memory_doc_sk(prefix))
        return [_document(store, item, content=False) for item in items if not item.get("deleted")]

    def read(self, tenant: str, store: str, path: str) -> MemoryDocument:
        _path(path)
        head = self.table.get(_doc_key(tenant, store, path))
        if head is None or head.get("deleted"):
            self.get_store(tenant, store)  # a missing store says so, not "no document"
            raise MemoryDocumentNotFound(f"no document {path!r} in memory store {store!r}", field="path")
        return _document(store, head, content=True)

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
        _path(path)
        size = len(content.encode("utf-8"))
        digest = content_sha256(content)
        for _ in range(ATTEMPTS):
            settings = self.get_store(tenant, store)
            if size > settings.max_document_bytes:
                raise MemoryLimitExceeded(
                    f"content: {size:,} bytes; memory store {store!r} holds documents of at most "
                    f"{settings.max_document_bytes:,} bytes",
                    field="content",
                )
            head = self.table.get(_doc_key(tenant, store, path))
            live = head is not None and not head.get("deleted")
            current = str(head["content_sha256"]) if live and head is not None else None
            if not unconditional and current != expected_sha256:
                raise _conflict(store, path, expected_sha256, current)
            if current == digest:
                assert head is not None
                return _document(store, head, content=True), False
            version = int(head["version"]) + 1 if head is not None else 1
            operation: Operation = "modified" if live else "created"
            try:
                self._change(tenant, settings, path, head, version, operation, content, author, lease, adds=not live)
            except _Retry:
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
        _path(path)
        for _ in range(ATTEMPTS):
            settings = self.get_store(tenant, store)
            head = self.table.get(_doc_key(tenant, store, path))
            if head is None or head.get("deleted"):
                raise MemoryDocumentNotFound(f"no document {path!r} in memory store {store!r}", field="path")
            current = str(head["content_sha256"])
            if expected_sha256 is not None and current != expected_sha256:
                raise _conflict(store, path, expected_sha256, current)
            version = int(head["version"]) + 1
            try:
                self._change(tenant, settings, path, head, version, "deleted", None, author, lease, adds=False)
            except _Retry:
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
        """One transaction: lease, store, head from ``version - 1`` to ``version``, the version."""
        from boto3.dynamodb.conditions import Attr

        now = time.time()
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
            "expires_at": int(now + settings.version_retention_days * DAY_SECONDS),
            **({} if content is None else state),
        }  # fmt: skip
        store_key = _store_key(tenant, settings.name)
        if adds:
            store_action: Action = Patch(
                "store", store_key, Update(add={"documents": 1}),
                present() & Attr("documents").lt(settings.max_documents),
            )  # fmt: skip
        elif operation == "deleted":
            store_action = Patch("store", store_key, Update(add={"documents": -1}), present())
        else:
            store_action = Check("store", store_key, present())
        actions: list[Action] = []
        if lease is not None:
            actions.append(Check("lease", keys.meta_key(lease.task_id), fence(lease)))
        actions += [
            store_action,
            Put("doc", head_item, absent() if head is None else Attr("version").eq(int(head["version"]))),
            Put("version", version_item, absent()),
        ]
        try:
            self.table.transact(actions)
        except TransactionCancelled as exc:
            if "lease" in exc.failed and lease is not None:
                raise why_fenced(self.table, lease) from exc
            if "store" in exc.failed:
                now_store = self.table.get(store_key)
                if now_store is None:
                    raise MemoryStoreNotFound(f"no memory store {settings.name!r}", field="store") from exc
                if adds and int(now_store["documents"]) >= int(now_store["max_documents"]):
                    raise MemoryLimitExceeded(
                        f"memory store {settings.name!r} holds {int(now_store['documents'])} documents, its limit; "
                        "delete one or raise max_documents",
                        field="path",
                    ) from exc
            raise _Retry() from exc

    # --- versions -------------------------------------------------------------------------

    def versions(self, tenant: str, store: str, path: str) -> list[MemoryVersion]:
        """A document's retained versions, newest first (a deleted document's too)."""
        _path(path)
        self.get_store(tenant, store)
        items = self.table.query(
            keys.memory_store_pk(tenant, store), prefix=keys.memory_versions_prefix(path), descending=True
        )
        now = time.time()
        found = [_version(store, item) for item in items if not _expired(item, now)]
        if not found:
            raise MemoryDocumentNotFound(f"no versions of {path!r} in memory store {store!r}", field="path")
        return found

    def version(self, tenant: str, store: str, path: str, version: int) -> MemoryVersion:
        _path(path)
        item = self.table.get({"pk": keys.memory_store_pk(tenant, store), "sk": keys.memory_version_sk(path, version)})
        if item is None or _expired(item, time.time()):
            self.get_store(tenant, store)
            raise MemoryDocumentNotFound(f"no version {version} of {path!r} in memory store {store!r}", field="version")
        return _version(store, item)

    def redact(self, tenant: str, store: str, path: str, version: int) -> MemoryVersion:
        """Remove a past version's content for good (its author and time stay). The version
        that is the document's current content cannot be: overwrite or delete it first."""
        from boto3.dynamodb.conditions import Attr

        existing = self.version(tenant, store, path, version)
        head = self.table.get(_doc_key(tenant, store, path))
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
        return _version(store, item)

    # --- search ---------------------------------------------------------------------------

    def search(self, tenant: str, store: str, query: str, *, limit: int = 10) -> list[MemorySearchHit]:
        """Documents holding every word of ``query`` (case-insensitive) in their path or content,
        most occurrences first. It reads the whole store (one Query), which its document limit
        bounds; there is no index to keep in step with the writes."""
        words = [w for w in query.lower().split() if w]
        if not words:
            raise ValidationError("query: give at least one word", field="query")
        self.get_store(tenant, store)
        hits: list[MemorySearchHit] = []
        for item in self.table.query(keys.memory_store_pk(tenant, store), prefix=keys.MEMORY_DOC):
            if item.get("deleted"):
                continue
            path, content = str(item["path"]), str(item["content"])
            text = f"{path}\n{content}".lower()
            counts = [text.count(word) for word in words]
            if all(counts):
                hits.append(
                    MemorySearchHit(
                        path=path,
                        content_sha256=str(item["content_sha256"]),
                        matches=sum(counts),
                        snippet=_snippet(content, words[0]),
                    )
                )
        hits.sort(key=lambda hit: (-hit.matches, hit.path))
        return hits[: max(1, min(limit, MAX_SEARCH_HITS))]


class _Retry(Exception):
    """The head moved under the transaction: read it again."""


def _conflict(store: str, path: str, expected: str | None, current: str | None) -> MemoryConflict:
    said = f"there is no document {path!r}" if current is None else f"{path!r} has content_sha256 {current}"
    wanted = "no document there" if expected is None else f"content_sha256 {expected}"
    return MemoryConflict(
        f"memory store {store!r}: {said}, but the write expected {wanted}: it changed since it was read "
        "(read it again, then write with its content_sha256)",
        field="expected_sha256",
        current_sha256=current,
    )


def _snippet(content: str, word: str) -> str:
    at = content.lower().find(word)
    start = max(0, at - SNIPPET_CHARS // 3) if at >= 0 else 0
    piece = content[start : start + SNIPPET_CHARS]
    return ("…" if start > 0 else "") + piece + ("…" if start + SNIPPET_CHARS < len(content) else "")


def _path(path: str, *, prefix: bool = False) -> str:
    """``check_path``, its refusal a ``ValidationError`` naming the field (a 422, not a 500)."""
    try:
        return check_path(path, prefix=prefix)
    except ValueError as exc:
        raise ValidationError(
            f"{'path_prefix' if prefix else 'path'}: {exc}", field="path_prefix" if prefix else "path"
        ) from None


def _expired(item: Item, now: float) -> bool:
    """DynamoDB's TTL deletes within days of ``expires_at``, not at it: a read hides what is due."""
    return "expires_at" in item and float(item["expires_at"]) <= now


def _store_key(tenant: str, name: str) -> dict[str, str]:
    return {"pk": keys.memory_store_pk(tenant, name), "sk": keys.MEMORY_STORE}


def _doc_key(tenant: str, store: str, path: str) -> dict[str, str]:
    return {"pk": keys.memory_store_pk(tenant, store), "sk": keys.memory_doc_sk(path)}


def _store(item: Item) -> MemoryStore:
    data = plain(item)
    return MemoryStore.model_validate({name: data[name] for name in MemoryStore.model_fields if name in data})


def _document(store: str, item: Item, *, content: bool) -> MemoryDocument:
    data = plain(item)
    return MemoryDocument(
        store=store,
        path=data["path"],
        content=data["content"] if content else None,
        content_sha256=data["content_sha256"],
        content_size_bytes=data["content_size_bytes"],
        version=data["version"],
        created_at=data["created_at"],
        updated_at=data["updated_at"],
        updated_by=Author.model_validate(data["updated_by"]),
    )


def _version(store: str, item: Item) -> MemoryVersion:
    data = plain(item)
    return MemoryVersion(
        store=store,
        path=data["path"],
        version=data["version"],
        operation=data["operation"],
        content=data.get("content"),
        content_sha256=data.get("content_sha256"),
        content_size_bytes=data.get("content_size_bytes"),
        created_at=data["created_at"],
        created_by=Author.model_validate(data["created_by"]),
        redacted_at=data.get("redacted_at"),
        expires_at=data.get("expires_at"),
    )
