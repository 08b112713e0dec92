"""Request and response shapes of the memory-store routes (``api/routes/memory.py``), shared
with the client; the stores' own shapes are ``core.memory``'s."""

from __future__ import annotations

from pydantic import Field

from agentq.api.models import ApiModel
from agentq.core.memory import MAX_DOCUMENT_BYTES, MemoryDocument, MemorySearchHit, MemoryStore, MemoryVersion
from agentq.core.models import StrictModel

SHA256_PATTERN = r"^[0-9a-f]{64}$"
# Pages: a store is at most ~13 KB of JSON (a description of 1,024 characters, each escaped), a
# document head without content ~1.5 KB (a path is ASCII, at most 1,010 bytes): a page of either
# stays well under the 6 MB a Lambda may answer.
MAX_STORES_PAGE = 100
MAX_DOCUMENTS_PAGE = 1_000
DEFAULT_DOCUMENTS_PAGE = 100
# A documents cursor names the store and the last path (up to 1,010 bytes): longer than the others'.
MAX_DOCUMENTS_CURSOR_CHARS = 2_048


class MemoryWrite(StrictModel):
    """``PUT /memory-stores/{store}/document?path=...``: a document's whole new content."""

    # No max_length: the store's limit is in bytes and the store's own (at most MAX_DOCUMENT_BYTES);
    # a length bound here answered an over-size ASCII document with a generic validation_error.
    content: str = Field(
        description=f"UTF-8 text of at most the store's max_document_bytes (at most {MAX_DOCUMENT_BYTES:,} bytes); "
        "more is 422 memory_limit_exceeded"
    )
    expected_content_sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="write only if the document still has this content_sha256 (else 409, nothing written); "
        "omit to overwrite whatever is there",
    )


class MemoryStoreList(ApiModel):
    stores: list[MemoryStore] = Field(description="by name")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null at the end")


class MemoryDocumentList(ApiModel):
    store: str
    documents: list[MemoryDocument] = Field(description="by path, without content")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null at the end")


class MemoryWritten(ApiModel):
    written: bool = Field(description="false: the document already had this content, no version was made")
    document: MemoryDocument


class MemoryVersionList(ApiModel):
    store: str
    path: str
    versions: list[MemoryVersion] = Field(description="newest first, while retained")
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page; null at the end")


class MemorySearchResult(ApiModel):
    store: str
    query: str
    hits: list[MemorySearchHit]
