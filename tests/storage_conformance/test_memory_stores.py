"""Memory stores on every backend: tenant-scoped, each write a version with its author, the
content-hash precondition (one of two writers wins, the other is told), limits that write
nothing, redaction, retention, a zombie that writes nothing."""

from __future__ import annotations

import threading
import time

import pytest

from agentq.core.errors import LeaseLost, ValidationError
from agentq.core.memory import (
    Author,
    MemoryConflict,
    MemoryDocumentNotFound,
    MemoryLimitExceeded,
    MemoryStoreNotFound,
    MemoryStoreSpec,
    MemoryStoreUpdate,
    SearchView,
    content_sha256,
)
from agentq.storage import keys
from agentq.storage.container import Storage

from tests.storage_conformance._builders import claimed

PERSON = Author(type="api", key_id="k1")


def _store(backend: Storage, name: str = "shop", tenant: str = "t", **limits: int) -> None:
    backend.memory_stores.create_store(tenant, MemoryStoreSpec(name=name, description="customers", **limits))


def test_the_longest_path_is_written_and_versioned_and_one_byte_more_is_refused_naming_it(backend: Storage) -> None:
    # A version's sort key is VER#<path>#<9 digits>: a 1,024-byte path made DynamoDB refuse the
    # write (a 500 through the API) while the in-memory table took it.
    _store(backend)
    longest = "/" + "/".join(["a" * 200] * 5) + "/bbbb"
    assert len(longest.encode()) == 1010
    backend.memory_stores.write("t", "shop", longest, "one", author=PERSON)
    backend.memory_stores.write("t", "shop", longest, "two", author=PERSON, expected_sha256=content_sha256("one"))
    assert [v.version for v in backend.memory_stores.versions("t", "shop", longest)] == [2, 1]
    assert backend.memory_stores.read("t", "shop", longest).content == "two"
    with pytest.raises(ValidationError) as refused:
        backend.memory_stores.write("t", "shop", longest + "b", "three", author=PERSON)
    assert refused.value.field == "path" and "1010 bytes" in str(refused.value)
    assert [d.path for d in backend.memory_stores.list_documents("t", "shop")] == [longest]


def test_a_store_is_seen_only_by_its_tenant(backend: Storage) -> None:
    _store(backend)
    _store(backend, tenant="u")
    backend.memory_stores.write("t", "shop", "/a.md", "t's", author=PERSON)
    assert [s.name for s in backend.memory_stores.list_stores("t")] == ["shop"]
    with pytest.raises(MemoryDocumentNotFound):
        backend.memory_stores.read("u", "shop", "/a.md")
    with pytest.raises(MemoryStoreNotFound):
        backend.memory_stores.read("v", "shop", "/a.md")
    with pytest.raises(MemoryConflict, match="exists already"):
        _store(backend)


def test_each_write_is_a_version_with_its_author_and_equal_content_makes_none(backend: Storage) -> None:
    _store(backend)
    first, made = backend.memory_stores.write("t", "shop", "/c/42.md", "ordered a lamp", author=PERSON)
    assert made and first.version == 1 and first.content_sha256 == content_sha256("ordered a lamp")
    by_task = Author(type="task", task_id="task1", step=3, tool_use_id="tu1")
    second, made = backend.memory_stores.write(
        "t", "shop", "/c/42.md", "ordered a lamp, then a shade", author=by_task, expected_sha256=first.content_sha256
    )
    assert made and second.version == 2 and second.updated_by == by_task
    same, made = backend.memory_stores.write(
        "t", "shop", "/c/42.md", "ordered a lamp, then a shade", author=PERSON, expected_sha256=second.content_sha256
    )
    assert not made and same.version == 2
    versions = backend.memory_stores.versions("t", "shop", "/c/42.md")
    assert [(v.version, v.operation, v.created_by.step) for v in versions] == [(2, "modified", 3), (1, "created", None)]
    assert [d.path for d in backend.memory_stores.list_documents("t", "shop", "/c/")] == ["/c/42.md"]
    assert backend.memory_stores.get_store("t", "shop").documents == 1


def test_a_stale_precondition_is_a_conflict_naming_the_current_hash_and_writes_nothing(backend: Storage) -> None:
    _store(backend)
    doc, _ = backend.memory_stores.write("t", "shop", "/x", "one", author=PERSON)
    with pytest.raises(MemoryConflict) as absent_expected:
        backend.memory_stores.write("t", "shop", "/x", "two", author=PERSON)  # expects no document
    assert absent_expected.value.current_sha256 == doc.content_sha256
    with pytest.raises(MemoryConflict, match="no document"):
        backend.memory_stores.write("t", "shop", "/y", "two", author=PERSON, expected_sha256=doc.content_sha256)
    assert backend.memory_stores.read("t", "shop", "/x").content == "one"
    assert len(backend.memory_stores.versions("t", "shop", "/x")) == 1


def test_two_writers_of_one_read_one_wins_and_the_other_gets_the_conflict(backend: Storage) -> None:
    _store(backend)
    doc, _ = backend.memory_stores.write("t", "shop", "/x", "base", author=PERSON)
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def writer(text: str) -> None:
        start.wait()
        try:
            backend.memory_stores.write("t", "shop", "/x", text, author=PERSON, expected_sha256=doc.content_sha256)
            outcomes.append(f"wrote {text}")
        except MemoryConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=writer, args=(t,)) for t in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o == "conflict" for o in outcomes) == [False, True]
    winner = next(o for o in outcomes if o != "conflict").removeprefix("wrote ")
    assert backend.memory_stores.read("t", "shop", "/x").content == winner
    assert [v.version for v in backend.memory_stores.versions("t", "shop", "/x")] == [2, 1]


def test_limits_refuse_with_the_field_and_write_nothing(backend: Storage) -> None:
    _store(backend, max_documents=1, max_document_bytes=10)
    backend.memory_stores.write("t", "shop", "/a", "0123456789", author=PERSON)
    with pytest.raises(MemoryLimitExceeded) as too_big:
        backend.memory_stores.write("t", "shop", "/b", "0123456789x", author=PERSON)
    assert too_big.value.field == "content"
    with pytest.raises(MemoryLimitExceeded, match="1 documents, its limit"):
        backend.memory_stores.write("t", "shop", "/b", "small", author=PERSON)
    assert [d.path for d in backend.memory_stores.list_documents("t", "shop")] == ["/a"]
    with pytest.raises(MemoryDocumentNotFound):
        backend.memory_stores.versions("t", "shop", "/b")
    backend.memory_stores.update_store("t", "shop", MemoryStoreUpdate(max_documents=2))
    backend.memory_stores.write("t", "shop", "/b", "small", author=PERSON)
    assert backend.memory_stores.get_store("t", "shop").documents == 2


def test_a_deleted_document_keeps_its_versions_and_numbering_goes_on(backend: Storage) -> None:
    _store(backend)
    doc, _ = backend.memory_stores.write("t", "shop", "/x", "one", author=PERSON)
    with pytest.raises(MemoryConflict):
        backend.memory_stores.delete_document("t", "shop", "/x", author=PERSON, expected_sha256="0" * 64)
    gone = backend.memory_stores.delete_document("t", "shop", "/x", author=PERSON, expected_sha256=doc.content_sha256)
    assert gone.operation == "deleted" and gone.version == 2 and gone.content is None
    assert backend.memory_stores.list_documents("t", "shop") == []
    assert backend.memory_stores.get_store("t", "shop").documents == 0
    again, _ = backend.memory_stores.write("t", "shop", "/x", "two", author=PERSON)
    assert again.version == 3
    assert [v.operation for v in backend.memory_stores.versions("t", "shop", "/x")] == ["created", "deleted", "created"]


def test_a_past_version_can_be_redacted_but_not_the_current_one(backend: Storage) -> None:
    _store(backend)
    doc, _ = backend.memory_stores.write("t", "shop", "/x", "card 4242", author=PERSON)
    backend.memory_stores.write("t", "shop", "/x", "card on file", author=PERSON, expected_sha256=doc.content_sha256)
    with pytest.raises(MemoryConflict, match="current content"):
        backend.memory_stores.redact("t", "shop", "/x", 2)
    redacted = backend.memory_stores.redact("t", "shop", "/x", 1)
    assert redacted.redacted_at is not None and redacted.content is None and redacted.content_sha256 is None
    assert redacted.created_by == PERSON
    assert backend.memory_stores.version("t", "shop", "/x", 1).content is None


def test_a_version_past_its_retention_is_not_read(backend: Storage) -> None:
    _store(backend)
    backend.memory_stores.write("t", "shop", "/x", "one", author=PERSON)
    item = backend.table.get({"pk": keys.memory_store_pk("t", "shop"), "sk": keys.memory_version_sk("/x", 1)})
    assert item is not None and float(item["expires_at"]) > time.time() + 29 * 86_400
    backend.table.put({**item, "expires_at": int(time.time()) - 1})
    with pytest.raises(MemoryDocumentNotFound):
        backend.memory_stores.versions("t", "shop", "/x")
    assert backend.memory_stores.read("t", "shop", "/x").content == "one"  # the current content stays


def test_search_finds_documents_holding_every_word_most_matches_first(backend: Storage) -> None:
    _store(backend)
    backend.memory_stores.write("t", "shop", "/c/1.md", "Lamp ordered. Lamp returned.", author=PERSON)
    backend.memory_stores.write("t", "shop", "/c/2.md", "ordered a lamp shade", author=PERSON)
    backend.memory_stores.write("t", "shop", "/c/3.md", "asked about shipping", author=PERSON)
    hits = backend.memory_stores.search("t", "shop", "LAMP ordered")
    assert [h.path for h in hits] == ["/c/1.md", "/c/2.md"] and hits[0].matches == 3


def test_a_search_through_a_view_matches_as_shown_and_shows_only_documents_holding_the_words_no_mark_adds(
    backend: Storage,
) -> None:
    # The memory tools search through redaction (core.tools.memory.SHOWN), which costs some 30
    # scans of a document: a document lacking a word is not shown, unless the word may come of
    # the mark (here "<hidden>"), which only a shown text holds.
    _store(backend)
    backend.memory_stores.write("t", "shop", "/c/key.md", "lamp key: sk-0123456789", author=PERSON)
    backend.memory_stores.write("t", "shop", "/c/sk-0123456789.md", "lamp", author=PERSON)
    backend.memory_stores.write("t", "shop", "/c/other.md", "a shade", author=PERSON)
    shown: list[str] = []

    def show(text: str) -> str:
        shown.append(text)
        return text.replace("sk-0123456789", "<hidden>")

    view = SearchView(show=show, mark="<hidden>")

    def search(query: str) -> list[tuple[str, int, str]]:
        shown.clear()
        return [(h.path, h.matches, h.snippet) for h in backend.memory_stores.search("t", "shop", query, view=view)]

    assert search("0123456789") == [] and search("sk-0123") == []
    assert "a shade" not in shown  # lacking the word: never shown
    # Ranked by the path as shown ("/c/<hidden>.md" first), not as stored ("/c/sk-..." last).
    assert search("lamp") == [("/c/sk-0123456789.md", 1, "lamp"), ("/c/key.md", 1, "lamp key: <hidden>")]
    assert search("n> key") == [("/c/key.md", 3, "lamp key: <hidden>")]  # "n>" ends the mark; "key" twice
    assert "a shade" not in shown
    assert [p for p, _, _ in search("hidden")] == ["/c/sk-0123456789.md", "/c/key.md"]
    assert "a shade" in shown  # "hidden" may come of the mark: every document is shown
    assert [h.path for h in backend.memory_stores.search("t", "shop", "0123456789")] == [
        "/c/key.md", "/c/sk-0123456789.md"
    ]  # fmt: skip  # without a view (the API: the tenant's own store), as stored


def test_a_search_takes_each_word_once_and_refuses_more_than_16_different_words_naming_query(
    backend: Storage,
) -> None:
    # Each word is a scan of every document a search reads (the whole store): a query's words
    # bound its cost. Repeated, a word was scanned for (and counted) again; 250 words of one
    # letter on 1,000 documents of 100 kB took 57 s holding the GIL.
    _store(backend)
    backend.memory_stores.write("t", "shop", "/c/1.md", "Lamp ordered. Lamp returned.", author=PERSON)
    repeated = " ".join(["lamp", "LAMP", "ordered"] * 50)  # 2 different words, within the 500 characters
    [hit] = backend.memory_stores.search("t", "shop", repeated)
    assert hit.matches == 3  # as "lamp ordered": each word counted once
    sixteen = ["lamp", "ordered", *(f"w{i}" for i in range(14))]
    backend.memory_stores.write("t", "shop", "/c/all.md", " ".join(sixteen), author=PERSON)
    assert [h.path for h in backend.memory_stores.search("t", "shop", " ".join(sixteen))] == ["/c/all.md"]
    with pytest.raises(ValidationError) as refused:
        backend.memory_stores.search("t", "shop", " ".join([*sixteen, "w14"]))
    assert refused.value.field == "query" and "17 different words" in refused.value.message
    assert "at most 16" in refused.value.message


def test_a_zombie_writes_no_memory(backend: Storage) -> None:
    _store(backend)
    lease = claimed(backend)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    author = Author(type="task", task_id=lease.task_id, step=1, tool_use_id="tu1")
    with pytest.raises(LeaseLost):
        backend.memory_stores.write("t", "shop", "/x", "late", author=author, lease=lease)
    assert backend.memory_stores.list_documents("t", "shop") == []


def test_deleting_a_store_deletes_its_documents(backend: Storage) -> None:
    _store(backend)
    backend.memory_stores.write("t", "shop", "/x", "one", author=PERSON)
    backend.memory_stores.delete_store("t", "shop")
    assert backend.memory_stores.list_stores("t") == []
    assert backend.table.query(keys.memory_store_pk("t", "shop")) == []


class _Killed(Exception):
    """The deleting process dies here."""


def _partition(backend: Storage, name: str = "shop") -> list[str]:
    return [str(item["sk"]) for item in backend.table.query(keys.memory_store_pk("t", name))]


def test_a_write_racing_a_store_deletion_leaves_nothing_for_a_store_made_again_under_its_name(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer (a task, a person) comes between the deletion's listing of the store's
    items and their deletion. Were its store check passed (the STORE item is still there), its
    document would outlive the deletion and show in a store made again under the name, one the
    store does not count (deleting it would take the count below 0, past max_documents)."""
    mem = backend.memory_stores
    _store(backend)
    mem.write("t", "shop", "/old.md", "kept before", author=PERSON)
    listing = backend.table.query
    racer: list[str] = []

    def listed_then_written(pk: str, **kw: object) -> object:
        items = listing(pk, **kw)  # type: ignore[arg-type]
        if kw.get("keys_only") and pk == keys.memory_store_pk("t", "shop") and not racer:
            try:
                mem.write("t", "shop", "/ann.md", "card 4242", author=PERSON)
                racer.append("written")
            except MemoryStoreNotFound:
                racer.append("store not found")
        return items

    monkeypatch.setattr(backend.table, "query", listed_then_written)
    mem.delete_store("t", "shop")
    monkeypatch.undo()
    assert (_partition(backend), racer) == ([], ["store not found"])
    _store(backend)
    assert (mem.list_documents("t", "shop"), mem.get_store("t", "shop").documents) == ([], 0)


@pytest.mark.parametrize("finished_by", ["deleting it again", "creating it again"])
def test_a_deletion_cut_short_hides_the_store_and_deleting_or_creating_it_again_finishes_it(
    backend: Storage, monkeypatch: pytest.MonkeyPatch, finished_by: str
) -> None:
    """The process deleting a store is killed before it deletes anything but the mark: the store
    is not found (not listed, read or written: it is half gone), and its name is not kept for
    ever by a deletion that will not go on."""
    mem = backend.memory_stores
    _store(backend)
    _store(backend, name="other")
    mem.write("t", "shop", "/ann.md", "card 4242", author=PERSON)

    def killed(*args: object, **kw: object) -> None:
        raise _Killed()

    monkeypatch.setattr(backend.table, "transact", killed)
    monkeypatch.setattr(backend.table, "batch_delete", killed)
    with pytest.raises(_Killed):
        mem.delete_store("t", "shop")
    monkeypatch.undo()
    assert "DOC#/ann.md" in _partition(backend)
    assert [s.name for s in mem.list_stores("t")] == ["other"]
    for refused in (
        lambda: mem.get_store("t", "shop"),
        lambda: mem.read("t", "shop", "/ann.md"),
        lambda: mem.version("t", "shop", "/ann.md", 1),
        lambda: mem.write("t", "shop", "/bob.md", "new", author=PERSON),
        lambda: mem.update_store("t", "shop", MemoryStoreUpdate(description="x")),
    ):
        with pytest.raises(MemoryStoreNotFound):
            refused()
    if finished_by == "deleting it again":
        assert mem.delete_store("t", "shop").documents == 1  # the store as it was
        assert _partition(backend) == []
        with pytest.raises(MemoryStoreNotFound):
            mem.delete_store("t", "shop")
    else:
        made = mem.create_store("t", MemoryStoreSpec(name="shop", max_documents=1))
        assert made.documents == 0 and _partition(backend) == ["STORE"]
        mem.write("t", "shop", "/bob.md", "new", author=PERSON)  # its one document: nothing was left over
    assert [s.name for s in mem.list_stores("t")] == (
        ["other"] if finished_by == "deleting it again" else ["other", "shop"]
    )


def test_a_deleter_that_lost_its_turn_deletes_nothing_of_the_store_made_again(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deletions of one store (a retry after a timeout, a create finishing it): the one that
    listed the items first and stalls is overtaken, the store is made again and written, and the
    stalled one's deletes, of keys the new store's documents have too, must not land."""
    mem = backend.memory_stores
    _store(backend)
    mem.write("t", "shop", "/ann.md", "old", author=PERSON)
    listing = backend.table.query
    overtaken: list[bool] = []

    def stalls_after_listing(pk: str, **kw: object) -> object:
        items = listing(pk, **kw)  # type: ignore[arg-type]
        if kw.get("keys_only") and not overtaken:
            overtaken.append(True)
            mem.create_store("t", MemoryStoreSpec(name="shop"))  # finishes the deletion, then makes it again
            mem.write("t", "shop", "/ann.md", "new", author=PERSON)
        return items

    monkeypatch.setattr(backend.table, "query", stalls_after_listing)
    mem.delete_store("t", "shop")
    monkeypatch.undo()
    assert mem.read("t", "shop", "/ann.md").content == "new"
    assert [v.version for v in mem.versions("t", "shop", "/ann.md")] == [1]
    assert mem.get_store("t", "shop").documents == 1


class _Busy:
    """The table, its first ``conflicts`` transactions cancelled as DynamoDB cancels one that meets
    another on one of its items (``TransactionConflict``: nothing written). Every memory write
    transacts on its store's one STORE item, so writers of any two documents of a store meet
    there; neither moto nor the memory twin ever answers it."""

    def __init__(self, table: object, conflicts: float) -> None:
        self.table, self.conflicts, self.met = table, conflicts, 0

    def transact(self, actions: object, **kw: object) -> None:
        from agentq.storage.table import TransactionConflict

        if self.met < self.conflicts:
            self.met += 1
            raise TransactionConflict("Transaction is ongoing for the item")
        self.table.transact(actions, **kw)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.table, name)


def test_a_write_that_meets_a_transaction_conflict_on_the_store_item_is_tried_again(backend: Storage) -> None:
    from agentq.storage.memory_stores import MemoryStores

    _store(backend)
    busy = _Busy(backend.table, conflicts=2)
    mem = MemoryStores(busy)  # type: ignore[arg-type]
    doc, written = mem.write("t", "shop", "/ann.md", "card 4242", author=PERSON)
    assert written and doc.version == 1 and busy.met == 2
    busy.conflicts += 2
    gone = mem.delete_document("t", "shop", "/ann.md", author=PERSON, expected_sha256=doc.content_sha256)
    assert gone.version == 2 and busy.met == 4


def test_a_store_item_busy_past_the_retries_is_a_conflict_to_try_again_and_nothing_is_written(
    backend: Storage,
) -> None:
    """Not an unexpected error (a 500 through the API, a raw error for the memory tool)."""
    from agentq.storage.memory_stores import MemoryStores

    _store(backend)
    mem = MemoryStores(_Busy(backend.table, conflicts=float("inf")))  # type: ignore[arg-type]
    with pytest.raises(MemoryConflict, match="try again") as busy:
        mem.write("t", "shop", "/ann.md", "card 4242", author=PERSON)
    assert busy.value.field == "path"
    assert backend.memory_stores.get_store("t", "shop").documents == 0 and _partition(backend) == ["STORE"]


def test_documents_and_stores_are_listed_a_page_at_a_time_without_reading_content(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing of documents read every head with its content (up to 100 kB each, 1 GB for a
    full store) to answer paths; and answered them all at once."""
    mem = backend.memory_stores
    for name in ("a-store", "b-store", "c-store", "shop"):
        _store(backend, name=name)
    for path in ("/c/1.md", "/c/2.md", "/c/3.md", "/d.md", "/c/4.md"):
        mem.write("t", "shop", path, "x" * 100, author=PERSON)
    mem.delete_document("t", "shop", "/c/2.md", author=PERSON)
    query, read = backend.table.query, []

    def recorded(pk: str, **kw: object) -> object:
        items = query(pk, **kw)  # type: ignore[arg-type]
        read.extend(items)
        return items

    monkeypatch.setattr(backend.table, "query", recorded)
    assert [d.path for d in mem.list_documents("t", "shop", "/c/")] == ["/c/1.md", "/c/3.md", "/c/4.md"]
    pages, after = [], None
    while True:
        docs, after = mem.documents_page("t", "shop", "/c/", limit=2, after=after)
        pages.append([(d.path, d.content) for d in docs])
        if after is None:
            break
    # A deleted document's head is read and left out: the page holding it is short.
    assert pages == [[("/c/1.md", None)], [("/c/3.md", None), ("/c/4.md", None)]]
    assert read and not [item for item in read if "content" in item]
    with pytest.raises(ValidationError) as outside:
        mem.documents_page("t", "shop", "/c/", limit=2, after="/d.md")
    assert outside.value.field == "after"
    mem.delete_store("t", "b-store")
    first, after = mem.stores_page("t", limit=2)
    assert [s.name for s in first] == ["a-store", "c-store"] and after == "c-store"
    rest, end = mem.stores_page("t", limit=2, after=after)
    assert ([s.name for s in rest], end) == (["shop"], None)
