"""A memory store's items (``storage.memory_stores``) as ``core.memory``'s models, their keys,
and what the store's reads and writes share: the path check, the precondition's refusal, a
version past its retention, a store being deleted and its deletion carried out, a search hit,
a write's attempt found applied (``landed``) and tried again (``Retry``).

Apart from ``memory_stores`` so that each module stays a size one reads whole."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentq.core.errors import ValidationError
from agentq.core.memory import (
    MAX_QUERY_WORDS,
    Author,
    MemoryConflict,
    MemoryDocument,
    MemorySearchHit,
    MemoryStore,
    MemoryVersion,
    SearchView,
    check_path,
)
from agentq.storage import keys
from agentq.storage.table import (
    MAX_TRANSACTION_ACTIONS,
    Check,
    ConditionFailed,
    Delete,
    Item,
    Key,
    Table,
    TransactionCancelled,
    TransactionConflict,
    plain,
    present,
    transact_through_conflicts,
)

if TYPE_CHECKING:
    from boto3.dynamodb.conditions import ConditionBase

SNIPPET_CHARS = 240
CONFLICT_BACKOFF_SECONDS = 0.02  # the first wait's ceiling after a TransactionConflict; doubles, up to 0.5 s
# The attempt that wrote a version, or created a store (``storage.memory_stores``' docstring): a
# resent request refused finds its own id in place and counts as done.
WRITE_ID = "write_id"
# The STORE item's mark of a deletion under way (a token): from it on, the store is not found,
# no write passes, and the name stays taken until the deletion removes the STORE item, last.
DELETING = "deleting"
# What a listing reads of a document head: everything but its content (up to 100 kB each).
LISTED = (
    "path", "content_sha256", "content_size_bytes", "version", "created_at", "updated_at", "updated_by", "deleted",
)  # fmt: skip


def live() -> ConditionBase:
    """The store exists and no deletion has marked it: the condition of every write to it."""
    from boto3.dynamodb.conditions import Attr

    return present() & Attr(DELETING).not_exists()


def is_live(item: Item | None) -> bool:
    """``live`` on a STORE item as read."""
    return item is not None and DELETING not in item


def conflict(store: str, path: str, expected: str | None, current: str | None) -> MemoryConflict:
    said = f"there is no document {path!r}" if current is None else f"{path!r} has content_sha256 {current}"
    wanted = "no document there" if expected is None else f"content_sha256 {expected}"
    return MemoryConflict(
        f"memory store {store!r}: {said}, but the write expected {wanted}: it changed since it was read "
        "(read it again, then write with its content_sha256)",
        field="expected_sha256",
        current_sha256=current,
    )


def snippet(content: str, word: str) -> str:
    at = content.lower().find(word)
    start = max(0, at - SNIPPET_CHARS // 3) if at >= 0 else 0
    piece = content[start : start + SNIPPET_CHARS]
    return ("…" if start > 0 else "") + piece + ("…" if start + SNIPPET_CHARS < len(content) else "")


def checked_path(path: str, *, prefix: bool = False, field: str | None = None) -> str:
    """``check_path``, its refusal a ``ValidationError`` naming the field (a 422, not a 500)."""
    name = field or ("path_prefix" if prefix else "path")
    try:
        return check_path(path, prefix=prefix)
    except ValueError as exc:
        raise ValidationError(f"{name}: {exc}", field=name) from None


def expired(item: Item, now: float) -> bool:
    """DynamoDB's TTL deletes within days of ``expires_at``, not at it: a read hides what is due."""
    return "expires_at" in item and float(item["expires_at"]) <= now


def landed(table: Table, version_item: Item, write: str) -> bool:
    """Whether the attempt ``write`` was applied: the version it puts holds its id (a version is
    written once, only if absent, so no later write replaces it)."""
    found = table.get({"pk": version_item["pk"], "sk": version_item["sk"]})
    return found is not None and found.get(WRITE_ID) == write


def store_key(tenant: str, name: str) -> dict[str, str]:
    return {"pk": keys.memory_store_pk(tenant, name), "sk": keys.MEMORY_STORE}


def doc_key(tenant: str, store: str, path: str) -> dict[str, str]:
    return {"pk": keys.memory_store_pk(tenant, store), "sk": keys.memory_doc_sk(path)}


def store_of(item: Item) -> MemoryStore:
    data = plain(item)
    return MemoryStore.model_validate({name: data[name] for name in MemoryStore.model_fields if name in data})


def document_of(store: str, item: Item, *, content: bool) -> MemoryDocument:
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


def version_of(store: str, item: Item) -> MemoryVersion:
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


def finish_deletion(table: Table, tenant: str, name: str, mark: str) -> None:
    """Delete the partition of the store marked ``mark``, its STORE item last.

    After the mark no write commits, so one listing holds every other item. Each delete of
    them is a transaction that checks the mark: a deleter that lost the race to another
    (a retried delete, a create finishing it) deletes nothing once the STORE item is gone,
    not even the documents of a store made again under the name since."""
    from boto3.dynamodb.conditions import Attr

    key = store_key(tenant, name)
    marked = Check("store", key, Attr(DELETING).eq(mark))
    rest: list[Key] = [
        {"pk": item["pk"], "sk": item["sk"]}
        for item in table.query(keys.memory_store_pk(tenant, name), keys_only=True)
        if item["sk"] != keys.MEMORY_STORE
    ]
    size = MAX_TRANSACTION_ACTIONS - 1
    for at in range(0, len(rest), size):
        deletes = [Delete(f"item{i}", k) for i, k in enumerate(rest[at : at + size])]
        try:
            transact_through_conflicts(table, [marked, *deletes])
        except TransactionCancelled:
            return  # another deleter finished it
        except TransactionConflict as exc:
            raise MemoryConflict(
                f"memory store {name!r} is being deleted by another request too; try again", field="name"
            ) from exc
    with contextlib.suppress(ConditionFailed):  # failed: another deleter finished it
        table.delete(key, condition=Attr(DELETING).eq(mark))


def query_words(query: str) -> list[str]:
    """A search's words: lowercase, each once, in the query's order; at most ``MAX_QUERY_WORDS``.
    Each word is a scan of every document the search reads (the whole store, up to 10,000 of
    100 kB): 250 words of one letter on 1,000 documents of 100 kB took 57 s holding the GIL.
    More is refused naming ``query``, not cut silently: a search needs every word, so dropping
    some would answer documents the caller did not ask for."""
    words = list(dict.fromkeys(query.lower().split()))
    if not words:
        raise ValidationError("query: give at least one word", field="query")
    if len(words) > MAX_QUERY_WORDS:
        raise ValidationError(
            f"query: {len(words)} different words; a search takes at most {MAX_QUERY_WORDS} "
            "(a document must hold every one)",
            field="query",
        )
    return words


def search_hit(item: Item, words: list[str], view: SearchView | None = None) -> MemorySearchHit | None:
    """A document head as a search hit, if its path and content hold every word (``query_words``):
    the text lowercased once, and no word counted before every one is found (a scan that stops at
    the first occurrence), so a document missing a word costs at most one scan per word.

    With a ``view`` (the memory tools': redacted), the path and content are matched, counted and
    cut into the snippet as it shows them; they are shown only once the stored text holds every
    word the view could not add (``SearchView.may_add``), so a document missing one costs what
    it did. The hit keeps the stored path, which names the document (the registry redacts the
    result whole, as it does ``memory_list``'s)."""
    path, content = str(item["path"]), str(item["content"])
    text = f"{path}\n{content}".lower()
    if view is not None:
        if not all(word in text or view.may_add(word) for word in words):
            return None
        content = view.show(content)
        text = f"{view.show(path)}\n{content}".lower()
    if not all(word in text for word in words):
        return None
    counts = [text.count(word) for word in words]
    return MemorySearchHit(
        path=path, content_sha256=str(item["content_sha256"]), matches=sum(counts), snippet=snippet(content, words[0])
    )


def ranked(items: Iterable[Item], words: list[str], view: SearchView | None = None) -> list[MemorySearchHit]:
    """The hits among the document heads ``items`` (``search_hit``; deleted ones left out), most
    occurrences first, then by path as ``view`` shows it: by the stored path, hits of as many
    occurrences would place a path holding a hidden value among the model's own paths."""
    hits = [hit for item in items if not item.get("deleted") and (hit := search_hit(item, words, view)) is not None]
    shown = view.show if view is not None else str
    return sorted(hits, key=lambda hit: (-hit.matches, shown(hit.path), hit.path))


class Retry(Exception):
    """The head moved under the transaction: read it again. ``busy``: the transaction met another
    on the store's item (TransactionConflict) and wrote nothing: wait a little first, as the
    other writers of that hot item would all try again at once."""

    def __init__(self, *, busy: bool = False) -> None:
        super().__init__("try the write again")
        self.busy = busy

    def wait(self, attempt: int) -> None:
        if self.busy:
            time.sleep(random.uniform(0, min(0.5, CONFLICT_BACKOFF_SECONDS * 2**attempt)))
