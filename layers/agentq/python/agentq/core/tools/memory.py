"""The memory tools: a task's window on the memory stores attached to it (``core.memory``).

They are made per task from its attachments (``memory_tools``), like ``final_answer`` from an
output schema: their descriptions name the stores the task may use, with each attachment's
access and instructions, so the model is told what it can remember and how, and a task with no
store attached is offered none of them. ``memory_write`` is offered only when some store is
attached ``read_write``, and refuses a ``read_only`` one by name.

``memory_write`` is declared ``side_effects=True``: the engine records its effect before it
runs (ARCHITECTURE invariant 3), so a resumed task never writes twice; the version it makes
records the task, the step of its ``tool_use`` and the call's id. It needs the content hash the
model last read (``expected_sha256``; none for a new document): when another task changed the
document since, the write is refused with the current hash, an error the model can act on (read
again, merge, write again), never a silent lost update.

A tool's result is cut at ``MAX_RESULT_CHARS``, and a document the store accepts (100 kB) can
be longer than that as JSON (escaping a newline doubles it). So ``memory_read`` answers a page
(``offset``, ``length`` in characters; ``truncated`` and ``next_offset`` say whether there is
more), its hash and version before its content, sized so that its result is never cut; and
``memory_list`` a page of documents with a ``cursor`` to go on. A page after the first names the
hash its reader began with (``expected_sha256``) and is refused if the document changed since, so
the pages a model joins are one version; the hash is the whole document's, as ``memory_write``
replaces the whole document (its description says to read every page before writing).

Search is a text match (every word, case-insensitive, in the path or content; most occurrences
first): it reads the store, which its document limit bounds, and needs no index to keep in step
with the writes. Semantic search would add an embedding per version, written with it. It matches,
counts and cuts its snippets over each document as ``memory_read`` shows it, redacted: over the
stored text, a word inside a credential was an oracle for it and a snippet could end inside one.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from agentq.core.errors import ValidationError
from agentq.core.memory import (
    MAX_DOCUMENT_BYTES,
    MAX_PATH_BYTES,
    MAX_QUERY_CHARS,
    MAX_QUERY_WORDS,
    MEMORY_STORE_PATTERN,
    MemoryAttachment,
    MemoryConflict,
    MemoryDocument,
    MemoryReadOnly,
    SearchView,
    check_path,
)
from agentq.core.tools._context import MemoryAccess, ToolContext
from agentq.core.tools._core import MAX_RESULT_CHARS, ToolSpec, tool
from agentq.observe.redaction import REDACTED, redact

MEMORY_LIST, MEMORY_READ, MEMORY_WRITE, MEMORY_SEARCH = "memory_list", "memory_read", "memory_write", "memory_search"
MEMORY_TOOLS = (MEMORY_LIST, MEMORY_READ, MEMORY_WRITE, MEMORY_SEARCH)

StoreName = Annotated[str, Field(pattern=MEMORY_STORE_PATTERN, description="an attached memory store")]
Path = Annotated[
    str,
    Field(min_length=2, max_length=MAX_PATH_BYTES, description="the document's path, e.g. /customers/42.md"),
    AfterValidator(check_path),
]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# A page of memory_read: at most this many characters (two pages hold a 100 kB document of
# ASCII text), and at most PAGE_JSON_CHARS of them as JSON, where a character may take up to 6
# ("\u0001"): a result is cut at MAX_RESULT_CHARS, and the rest of it (path, hash, author) and
# redaction's markers need room too.
READ_PAGE_CHARS = MAX_DOCUMENT_BYTES // 2
PAGE_JSON_CHARS = MAX_RESULT_CHARS * 8 // 10
# A page of memory_list: documents read (deleted ones too, left out), and at most PAGE_JSON_CHARS
# of them as JSON (a path may be 1,010 characters).
DEFAULT_LIST_PAGE, MAX_LIST_PAGE = 100, 200
# What memory_search matches, counts and cuts its snippets from: each document as memory_read
# shows it, redacted (``core.memory.SearchView``).
SHOWN = SearchView(show=redact, mark=REDACTED)


def _json_chars(text: str) -> int:
    """Characters ``text`` takes inside a JSON string (``json.dumps(ensure_ascii=False)``, as the
    registry serialises a result)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def _page(content: str, offset: int, length: int) -> str:
    """Up to ``length`` characters of ``content`` from ``offset``, fewer where their JSON would
    pass ``PAGE_JSON_CHARS``."""
    page = content[offset : offset + length]
    if _json_chars(page) <= PAGE_JSON_CHARS:
        return page
    fits = sum(1 for used in accumulate(_json_chars(ch) for ch in page) if used <= PAGE_JSON_CHARS)
    return page[:fits]


def _listed(doc: MemoryDocument) -> dict[str, Any]:
    return {
        "path": doc.path,
        "content_sha256": doc.content_sha256,
        "content_size_bytes": doc.content_size_bytes,
        "version": doc.version,
    }


def _is_path(path: str) -> bool:
    try:
        check_path(path)
    except ValueError:
        return False
    return True


def offered_memory_tools(attachments: list[MemoryAttachment]) -> list[str]:
    """The memory tools a task with these attachments is offered (none without one)."""
    if not attachments:
        return []
    writable = any(a.access == "read_write" for a in attachments)
    return [MEMORY_LIST, MEMORY_READ, *([MEMORY_WRITE] if writable else []), MEMORY_SEARCH]


def memory_tools(attachments: list[MemoryAttachment]) -> list[ToolSpec]:
    """The memory tools of a task with these attachments (deterministic in them, so a resumed
    task shows the model the same tools and keeps its prompt cache)."""
    if not attachments:
        return []
    attached = {a.store: a for a in attachments}
    stores = "; ".join(
        f"{a.store} ({a.access.replace('_', '-')})" + (f": {a.instructions}" if a.instructions else "")
        for a in attachments
    )

    def store_of(store: str, ctx: ToolContext | None, *, write: bool = False) -> MemoryAccess:
        attachment = attached.get(store)
        if attachment is None:
            raise LookupError(f"memory store {store!r} is not attached to this task; attached: {', '.join(attached)}")
        if write and attachment.access != "read_write":
            raise MemoryReadOnly(f"memory store {store!r} is attached read-only: memory_write refuses it")
        if ctx is None or ctx.memory is None:
            raise RuntimeError("memory stores are not available to this worker")
        return ctx.memory

    @tool(
        name=MEMORY_LIST,
        description=f"List the documents of a memory store by path (path, content_sha256, size, version; no "
        "content), optionally under a path prefix, a page at a time: while next_cursor is not null, call again "
        "with cursor=next_cursor for the rest. Memory stores outlive this task: what earlier tasks wrote is "
        f"there. Attached: {stores}",
    )
    def memory_list(
        store: StoreName,
        path_prefix: Annotated[
            str, Field(max_length=MAX_PATH_BYTES, description="only paths starting with this")
        ] = "/",
        limit: Annotated[
            int,
            Field(
                ge=1, le=MAX_LIST_PAGE, description="documents a page reads (fewer may be listed); follow next_cursor"
            ),
        ] = DEFAULT_LIST_PAGE,
        cursor: Annotated[
            str | None,
            Field(max_length=MAX_PATH_BYTES, description="next_cursor of the page before; omit for the first"),
        ] = None,
        ctx: ToolContext | None = None,
    ) -> dict[str, Any]:
        """Listing without content keeps the answer small; read a document to see it. A page is
        cut where its JSON would pass ``PAGE_JSON_CHARS``, and goes on after its last path."""
        if cursor is not None and not (cursor.startswith(path_prefix) and _is_path(cursor)):
            raise ValidationError(
                f"cursor: {cursor[:80]!r} is not a next_cursor of a listing under {path_prefix!r}; pass it back "
                "unchanged with the same path_prefix",
                field="cursor",
            )
        docs, after = store_of(store, ctx).documents_page(store, path_prefix, limit, cursor)
        listed = [_listed(d) for d in docs]
        sizes = accumulate(len(json.dumps(d, ensure_ascii=False)) + 2 for d in listed)
        fits = max(1, sum(1 for used in sizes if used <= PAGE_JSON_CHARS))
        if fits < len(listed):
            listed, after = listed[:fits], listed[fits - 1]["path"]
        return {"documents": listed, "next_cursor": after}

    @tool(
        name=MEMORY_READ,
        description="Read a document of a memory store: its content_sha256 (pass it to memory_write when you "
        "change it), version and size, and its content a page at a time: up to `length` characters from "
        f"`offset` (at most {READ_PAGE_CHARS:,}; fewer where escaping makes a page long). While `truncated` is "
        "true, call again with offset=next_offset and expected_sha256=content_sha256 until it is false: "
        "memory_write replaces the whole document, so never write back a document you have not read to its "
        f"end. Attached: {stores}",
    )
    def memory_read(
        store: StoreName,
        path: Path,
        offset: Annotated[
            int,
            Field(ge=0, description="the first character to read; next_offset of the page before"),
        ] = 0,
        length: Annotated[
            int, Field(ge=1, le=READ_PAGE_CHARS, description="at most this many characters")
        ] = READ_PAGE_CHARS,
        expected_sha256: Annotated[
            Sha256 | None,
            Field(
                description="with offset > 0: the content_sha256 of the pages before; if the document changed "
                "since, nothing is read and the error gives its content_sha256 now: read it again from offset 0"
            ),
        ] = None,
        ctx: ToolContext | None = None,
    ) -> dict[str, Any]:
        """A page, its hash and version first: a page after the first is refused if the document
        changed since the first (``expected_sha256``), so the pages joined are one version.
        ``content_chars``, ``offset`` and ``next_offset`` count the content as shown (redacted)."""
        if offset > 0 and expected_sha256 is None:
            raise ValidationError(
                "expected_sha256: give the content_sha256 of the pages before to read on from an offset",
                field="expected_sha256",
            )
        doc = store_of(store, ctx).read(store, path)
        # Redacted whole before it is paged, as the registry redacts a result before its cut: a
        # credential across a page's end would leave in two pieces, each too short to be found,
        # and the model chooses where a page ends. Offsets are of the text as shown.
        content = redact(doc.content or "")
        if expected_sha256 is not None and doc.content_sha256 != expected_sha256:
            raise MemoryConflict(
                f"memory store {store!r}: {path!r} has content_sha256 {doc.content_sha256}, not {expected_sha256}: "
                "it changed since the pages before were read; read it again from offset 0",
                field="expected_sha256",
                current_sha256=doc.content_sha256,
            )
        if offset > len(content):
            raise ValidationError(f"offset: {offset}, past the document's {len(content)} characters", field="offset")
        page = _page(content, offset, length)
        end = offset + len(page)
        return {
            "path": doc.path,
            "content_sha256": doc.content_sha256,
            "version": doc.version,
            "content_chars": len(content),
            "content_size_bytes": doc.content_size_bytes,
            "offset": offset,
            "next_offset": end if end < len(content) else None,
            "truncated": end < len(content),
            "updated_by": doc.updated_by.model_dump(exclude_none=True),
            "content": page,
        }

    @tool(
        name=MEMORY_WRITE,
        side_effects=True,
        description="Write a document of a memory store (its whole content, which replaces all of it; at most "
        "100 kB), so later tasks remember it: to change a document memory_read showed truncated, read every "
        "page first, or what you did not read is lost. Pass expected_sha256, the content_sha256 memory_read "
        "gave you, to change a document; leave it out to create one. If the document changed since you read it, nothing is written and the error gives "
        f"its content_sha256 now: read it again and merge. Attached: {stores}",
    )
    def memory_write(
        store: StoreName,
        path: Path,
        content: Annotated[str, Field(max_length=MAX_DOCUMENT_BYTES, description="the document's whole new text")],
        expected_sha256: Annotated[
            Sha256 | None, Field(description="content_sha256 of the document as you read it; omit for a new one")
        ] = None,
        ctx: ToolContext | None = None,
    ) -> dict[str, Any]:
        doc, written = store_of(store, ctx, write=True).write(store, path, content, expected_sha256)
        return {
            "path": doc.path,
            "version": doc.version,
            "content_sha256": doc.content_sha256,
            "written": written,  # False: the content was already this, no version was made
        }

    @tool(
        name=MEMORY_SEARCH,
        description="Find documents of a memory store holding every word of a query (case-insensitive, in path "
        f"or content; at most {MAX_QUERY_WORDS} different words), most matches first, each with a snippet. "
        f"Attached: {stores}",
    )
    def memory_search(
        store: StoreName,
        query: Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_QUERY_CHARS,
                description=f"words to find, every one in a document; at most {MAX_QUERY_WORDS} different words",
            ),
        ],
        limit: Annotated[int, Field(ge=1, le=20, description="at most this many documents")] = 10,
        ctx: ToolContext | None = None,
    ) -> list[dict[str, Any]]:
        """Over each document as ``memory_read`` shows it (``SHOWN``): a query word inside a
        credential finds nothing, and no snippet is cut inside one."""
        return [hit.model_dump() for hit in store_of(store, ctx).search(store, query, limit, SHOWN)]

    offered = offered_memory_tools(attachments)
    return [spec for spec in (memory_list, memory_read, memory_write, memory_search) if spec.name in offered]
