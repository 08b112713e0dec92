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

Search is a text match (every word, case-insensitive, in the path or content; most occurrences
first): it reads the store, which its document limit bounds, and needs no index to keep in step
with the writes. Semantic search would add an embedding per version, written with it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from agentq.core.memory import (
    MAX_DOCUMENT_BYTES,
    MAX_PATH_BYTES,
    MAX_QUERY_CHARS,
    MAX_QUERY_WORDS,
    MEMORY_STORE_PATTERN,
    MemoryAttachment,
    MemoryReadOnly,
    check_path,
)
from agentq.core.tools._context import MemoryAccess, ToolContext
from agentq.core.tools._core import ToolSpec, tool

MEMORY_LIST, MEMORY_READ, MEMORY_WRITE, MEMORY_SEARCH = "memory_list", "memory_read", "memory_write", "memory_search"
MEMORY_TOOLS = (MEMORY_LIST, MEMORY_READ, MEMORY_WRITE, MEMORY_SEARCH)

StoreName = Annotated[str, Field(pattern=MEMORY_STORE_PATTERN, description="an attached memory store")]
Path = Annotated[
    str,
    Field(min_length=2, max_length=MAX_PATH_BYTES, description="the document's path, e.g. /customers/42.md"),
    AfterValidator(check_path),
]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


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
        description=f"List the documents of a memory store (path, content_sha256, size, version), optionally "
        f"under a path prefix. Memory stores outlive this task: what earlier tasks wrote is there. Attached: {stores}",
    )
    def memory_list(
        store: StoreName,
        path_prefix: Annotated[
            str, Field(max_length=MAX_PATH_BYTES, description="only paths starting with this")
        ] = "/",
        ctx: ToolContext | None = None,
    ) -> list[dict[str, Any]]:
        """Listing without content keeps the answer small; read a document to see it."""
        docs = store_of(store, ctx).list_documents(store, path_prefix)
        return [
            {
                "path": d.path,
                "content_sha256": d.content_sha256,
                "content_size_bytes": d.content_size_bytes,
                "version": d.version,
            }
            for d in docs
        ]

    @tool(
        name=MEMORY_READ,
        description="Read a document of a memory store: its content, and the content_sha256 to pass to "
        f"memory_write when you change it. Attached: {stores}",
    )
    def memory_read(store: StoreName, path: Path, ctx: ToolContext | None = None) -> dict[str, Any]:
        doc = store_of(store, ctx).read(store, path)
        return {
            "path": doc.path,
            "content": doc.content,
            "content_sha256": doc.content_sha256,
            "version": doc.version,
            "updated_by": doc.updated_by.model_dump(exclude_none=True),
        }

    @tool(
        name=MEMORY_WRITE,
        side_effects=True,
        description="Write a document of a memory store (the whole content; at most 100 kB), so later tasks "
        "remember it. Pass expected_sha256, the content_sha256 memory_read gave you, to change a document; leave "
        "it out to create one. If the document changed since you read it, nothing is written and the error gives "
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
        return [hit.model_dump() for hit in store_of(store, ctx).search(store, query, limit)]

    offered = offered_memory_tools(attachments)
    return [spec for spec in (memory_list, memory_read, memory_write, memory_search) if spec.name in offered]
