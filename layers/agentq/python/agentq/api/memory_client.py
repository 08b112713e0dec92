"""``client.memory``: the memory-store routes from Python (``api/routes/memory.py``), typed with
the server's models; errors are the client's (``NotFound``, ``Conflict`` for a stale
``expected_content_sha256``, ``InvalidRequest`` naming the field).

    doc = client.memory.read("shop", "/customers/ann.md")
    client.memory.write("shop", "/customers/ann.md", doc.content + "\\nreturned the lamp",
                        expected_content_sha256=doc.content_sha256)
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from agentq.api.client_pages import pages
from agentq.api.memory_models import (
    MAX_DOCUMENTS_PAGE,
    MAX_STORES_PAGE,
    MemoryDocumentList,
    MemorySearchResult,
    MemoryStoreList,
    MemoryVersionList,
    MemoryWritten,
)
from agentq.core.memory import (
    MemoryDocument,
    MemorySearchHit,
    MemoryStore,
    MemoryStoreSpec,
    MemoryStoreUpdate,
    MemoryVersion,
)

M = TypeVar("M", bound=BaseModel)


class Transport(Protocol):
    """``agentq.api.client.Client.call``: one API call, its answer read as a model (one of another
    shape is the client's ``UnexpectedAnswer``), errors raised."""

    def call(
        self,
        model: type[M],
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry: bool | None = None,
    ) -> M: ...


class MemoryStoresClient:
    def __init__(self, client: Transport) -> None:
        self.client = client

    def _store(self, name: str) -> str:
        return f"/memory-stores/{urllib.parse.quote(name, safe='')}"

    def create_store(self, name: str, **settings: Any) -> MemoryStore:
        """A new store: ``description``, ``max_documents``, ``max_document_bytes``, ``version_retention_days``."""
        body = MemoryStoreSpec.model_validate({"name": name, **settings}).model_dump()
        return self.client.call(MemoryStore, "POST", "/memory-stores", body)

    def list_stores(self, *, page_size: int = MAX_STORES_PAGE) -> list[MemoryStore]:
        """Every store, by name, following the pages (``page_size`` stores a call, at most 100)."""
        found: list[MemoryStore] = []
        cursor = None
        while True:
            query = {"limit": page_size, "cursor": cursor}
            page = self.client.call(MemoryStoreList, "GET", "/memory-stores", query=query)
            found += page.stores
            if not page.next_cursor:
                return found
            cursor = page.next_cursor

    def get_store(self, name: str) -> MemoryStore:
        return self.client.call(MemoryStore, "GET", self._store(name))

    def update_store(self, name: str, **settings: Any) -> MemoryStore:
        body = MemoryStoreUpdate.model_validate(settings).model_dump(exclude_none=True)
        return self.client.call(MemoryStore, "PATCH", self._store(name), body)

    def delete_store(self, name: str) -> MemoryStore:
        return self.client.call(MemoryStore, "DELETE", self._store(name))

    def documents(
        self, store: str, path_prefix: str = "/", *, page_size: int = MAX_DOCUMENTS_PAGE
    ) -> list[MemoryDocument]:
        """Every document under ``path_prefix`` (without content), by path, following the pages
        (``page_size`` read a call, at most 1,000)."""

        def read(cursor: str | None) -> MemoryDocumentList:
            query = {"path_prefix": path_prefix, "limit": page_size, "cursor": cursor}
            return self.client.call(MemoryDocumentList, "GET", f"{self._store(store)}/documents", query=query)

        return [doc for page in pages(read) for doc in page.documents]

    def read(self, store: str, path: str) -> MemoryDocument:
        return self.client.call(MemoryDocument, "GET", f"{self._store(store)}/document", query={"path": path})

    def write(
        self, store: str, path: str, content: str, *, expected_content_sha256: str | None = None
    ) -> MemoryWritten:
        """Write a document; with ``expected_content_sha256``, only if it still has that content."""
        body = {"content": content, "expected_content_sha256": expected_content_sha256}
        return self.client.call(MemoryWritten, "PUT", f"{self._store(store)}/document", body, query={"path": path})

    def delete(self, store: str, path: str, *, expected_content_sha256: str | None = None) -> MemoryVersion:
        query = {"path": path, "expected_content_sha256": expected_content_sha256}
        return self.client.call(MemoryVersion, "DELETE", f"{self._store(store)}/document", query=query)

    def versions(self, store: str, path: str) -> list[MemoryVersion]:
        """Every retained version of a document, newest first (following the pages: one holds at
        most 2 MB)."""

        def read(cursor: str | None) -> MemoryVersionList:
            query = {"path": path, "limit": 100, "cursor": cursor}
            return self.client.call(MemoryVersionList, "GET", f"{self._store(store)}/versions", query=query)

        return [version for page in pages(read) for version in page.versions]

    def redact(self, store: str, path: str, version: int) -> MemoryVersion:
        path_ = f"{self._store(store)}/versions/{version}/redact"
        return self.client.call(MemoryVersion, "POST", path_, query={"path": path})

    def search(self, store: str, query: str, *, limit: int = 10) -> list[MemorySearchHit]:
        asked = {"query": query, "limit": limit}
        return self.client.call(MemorySearchResult, "GET", f"{self._store(store)}/search", query=asked).hits
