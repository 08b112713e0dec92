"""Memory stores (``core.memory``, docs/MEMORY.md) for people: create, list, change and delete
stores; list, read, write, delete and search documents; read and redact versions. Every read and
write is of the caller's own stores: another tenant's store is not found (404).

A document's path goes in the query (``?path=/customers/ann.md``), not the URL's path, since it
holds slashes of its own. A person's write is a version like a task's, its author the API key
when the authorizer names one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api.cursors import InvalidCursor, decode_cursor, encode_cursor, version_page
from agentq.api.errors import JSON, responses
from agentq.api.memory_models import (
    DEFAULT_DOCUMENTS_PAGE,
    MAX_DOCUMENTS_CURSOR_CHARS,
    MAX_DOCUMENTS_PAGE,
    MAX_STORES_PAGE,
    SHA256_PATTERN,
    MemoryDocumentList,
    MemorySearchResult,
    MemoryStoreList,
    MemoryVersionList,
    MemoryWrite,
    MemoryWritten,
)
from agentq.api.models import MAX_LISTING_PAGE
from agentq.api.routes.common import ApiDeps, ListingLimit, PageCursor, Router, page_cursor
from agentq.core.memory import (
    MAX_PATH_BYTES,
    MAX_QUERY_CHARS,
    MAX_QUERY_WORDS,
    MEMORY_STORE_PATTERN,
    PATH_PATTERN,
    PATH_PREFIX_PATTERN,
    PATH_RULES,
    Author,
    MemoryConflict,
    MemoryDocument,
    MemoryStore,
    MemoryStoreSpec,
    MemoryStoreUpdate,
    MemoryVersion,
    check_path,
)
from agentq.storage.memory_stores import MemoryStores

StoreName = Annotated[str, Path(pattern=MEMORY_STORE_PATTERN, description="a memory store's name")]
DocPath = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_PATH_BYTES,
        description=f"the document's path, e.g. /customers/ann.md: {PATH_RULES} (else 422 naming path)",
        json_schema_extra={"pattern": PATH_PATTERN},  # documented; check_path refuses with the reason
    ),
]
Sha256 = Annotated[str | None, Query(pattern=SHA256_PATTERN, description="only if it still has this content_sha256")]
TAGS = ["memory"]
PRECONDITION = "expected_content_sha256"  # what the API calls the precondition (the store: expected_sha256)
STORES_CURSOR, DOCUMENTS_CURSOR, VERSIONS_CURSOR = "memory_stores", "memory_documents", "memory_versions"
_STORE_NAME = re.compile(MEMORY_STORE_PATTERN)


@contextmanager
def _api_field_names() -> Iterator[None]:
    """A failed precondition (409) names the field the caller sent, ``expected_content_sha256``;
    the store names its own argument (``expected_sha256``, also the memory tool's)."""
    try:
        yield
    except MemoryConflict as exc:
        if exc.field != "expected_sha256":
            raise
        raise MemoryConflict(
            exc.message.replace("expected_sha256", PRECONDITION), field=PRECONDITION, current_sha256=exc.current_sha256
        ) from None


def _store_after(cursor: str) -> str:
    """The store name a ``GET /memory-stores`` cursor goes on after."""
    name = decode_cursor(STORES_CURSOR, cursor)
    if not isinstance(name, str) or not _STORE_NAME.fullmatch(name):
        raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    return str(name)


def _document_after(cursor: str, store: str, prefix: str) -> str:
    """The path a documents cursor goes on after: one of this store's listing under this prefix
    (another's is 400, not a page of something else)."""
    value = decode_cursor(DOCUMENTS_CURSOR, cursor, max_chars=MAX_DOCUMENTS_CURSOR_CHARS)
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    named, path = str(value[0]), str(value[1])
    try:
        check_path(path)
    except ValueError:
        raise InvalidCursor(
            "cursor is not one this API issued; pass next_cursor back unchanged", field="cursor"
        ) from None
    if named != store or not path.startswith(prefix):
        raise InvalidCursor(
            f"cursor does not belong to this listing (memory store {store!r}, path_prefix {prefix!r})", field="cursor"
        )
    return path


def router(deps: ApiDeps) -> Router:
    routes = Router()
    tenant = deps.tenant

    def stores() -> MemoryStores:
        return deps.store.memory_stores

    def person() -> Author:
        ctx: Any = (routes.current_event.raw_event.get("requestContext") or {}).get("authorizer") or {}
        key_id = ctx.get("key_id") if isinstance(ctx, dict) else None
        return Author(type="api", key_id=str(key_id) if key_id else None)

    @routes.post("/memory-stores", summary="Create a memory store", operation_id="createMemoryStore", tags=TAGS,
                 responses=responses(201, MemoryStore, 400, 409, 413, 415, 422, description="Created"))  # fmt: skip
    def create(spec: Annotated[MemoryStoreSpec, Body(description="the store and its limits")]) -> Response[MemoryStore]:
        made = stores().create_store(tenant(), spec)
        headers = {"Location": f"/memory-stores/{made.name}"}
        return Response(status_code=201, content_type=JSON, body=made, headers=headers)

    @routes.get("/memory-stores", summary="List memory stores, by name", operation_id="listMemoryStores", tags=TAGS,
                responses=responses(200, MemoryStoreList, 400, 422))  # fmt: skip
    def list_stores(
        limit: Annotated[
            int,
            Query(
                ge=1, le=MAX_STORES_PAGE, description=f"stores per page, at most {MAX_STORES_PAGE}: follow next_cursor"
            ),
        ] = MAX_STORES_PAGE,
        cursor: PageCursor = None,
    ) -> MemoryStoreList:
        found, last = stores().stores_page(tenant(), limit=limit, after=_store_after(cursor) if cursor else None)
        return MemoryStoreList(stores=found, next_cursor=encode_cursor(STORES_CURSOR, last) if last else None)

    @routes.get("/memory-stores/<name>", summary="A memory store", operation_id="getMemoryStore", tags=TAGS,
                responses=responses(200, MemoryStore, 404, 422))  # fmt: skip
    def get_store(name: StoreName) -> MemoryStore:
        return stores().get_store(tenant(), name)

    @routes.patch(
        "/memory-stores/<name>",
        summary="Change a memory store's settings",
        description="A limit lowered below what the store holds stops new documents only; a shorter retention "
        "applies to versions written from now on.",
        operation_id="updateMemoryStore",
        tags=TAGS,
        responses=responses(200, MemoryStore, 400, 404, 415, 422),
    )
    def update_store(name: StoreName, update: Annotated[MemoryStoreUpdate, Body()]) -> MemoryStore:
        return stores().update_store(tenant(), name, update)

    @routes.delete(
        "/memory-stores/<name>",
        summary="Delete a memory store, its documents and versions",
        description="A deletion cut short (a timeout) leaves the store unlisted and unwritable: deleting it again "
        "finishes it (as does creating a store of that name). 409 while another request deletes it too.",
        operation_id="deleteMemoryStore",
        tags=TAGS,
        responses=responses(200, MemoryStore, 404, 409, 422),
    )
    def delete_store(name: StoreName) -> MemoryStore:
        return stores().delete_store(tenant(), name)

    @routes.get("/memory-stores/<name>/documents", summary="List a store's documents by path (no content)",
                operation_id="listMemoryDocuments", tags=TAGS,
                responses=responses(200, MemoryDocumentList, 400, 404, 422))  # fmt: skip
    def list_documents(
        name: StoreName,
        path_prefix: Annotated[
            str,
            Query(
                max_length=MAX_PATH_BYTES,
                description="only paths starting with this: '/' alone, or a path, which may end with '/'",
                json_schema_extra={"pattern": PATH_PREFIX_PATTERN},
            ),
        ] = "/",
        limit: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_DOCUMENTS_PAGE,
                description=f"documents read per page, at most {MAX_DOCUMENTS_PAGE} (deleted ones are read and left "
                "out, so a page may hold fewer): follow next_cursor",
            ),
        ] = DEFAULT_DOCUMENTS_PAGE,
        cursor: Annotated[str | None, page_cursor(MAX_DOCUMENTS_CURSOR_CHARS)] = None,
    ) -> MemoryDocumentList:
        after = _document_after(cursor, name, path_prefix) if cursor else None
        docs, last = stores().documents_page(tenant(), name, path_prefix, limit=limit, after=after)
        next_cursor = encode_cursor(DOCUMENTS_CURSOR, [name, last]) if last else None
        return MemoryDocumentList(store=name, documents=docs, next_cursor=next_cursor)

    @routes.get("/memory-stores/<name>/document", summary="Read a document", operation_id="getMemoryDocument",
                tags=TAGS, responses=responses(200, MemoryDocument, 404, 422))  # fmt: skip
    def read(name: StoreName, path: DocPath) -> MemoryDocument:
        return stores().read(tenant(), name, path)

    @routes.put(
        "/memory-stores/<name>/document",
        summary="Write a document (a new version)",
        description="With expected_content_sha256, only if the document still has that content: else 409 "
        "memory_conflict and nothing is written. The same content as now makes no version (written: false).",
        operation_id="putMemoryDocument",
        tags=TAGS,
        responses=responses(200, MemoryWritten, 400, 404, 409, 413, 415, 422),
    )
    def write(name: StoreName, path: DocPath, body: Annotated[MemoryWrite, Body()]) -> MemoryWritten:
        with _api_field_names():
            doc, written = stores().write(
                tenant(), name, path, body.content, author=person(),
                expected_sha256=body.expected_content_sha256, unconditional=body.expected_content_sha256 is None,
            )  # fmt: skip
        return MemoryWritten(written=written, document=doc)

    @routes.delete("/memory-stores/<name>/document", summary="Delete a document (its versions stay)",
                   operation_id="deleteMemoryDocument", tags=TAGS,
                   responses=responses(200, MemoryVersion, 404, 409, 422))  # fmt: skip
    def delete_document(name: StoreName, path: DocPath, expected_content_sha256: Sha256 = None) -> MemoryVersion:
        with _api_field_names():
            return stores().delete_document(
                tenant(), name, path, author=person(), expected_sha256=expected_content_sha256
            )

    @routes.get(
        "/memory-stores/<name>/versions",
        summary="A document's versions with their content, newest first, a page at a time",
        description="A page holds fewer than `limit` versions once they pass 2 MB as JSON (never none): follow "
        "`next_cursor`.",
        operation_id="listMemoryVersions",
        tags=TAGS,
        responses=responses(200, MemoryVersionList, 400, 404, 422),
    )
    def versions(
        name: StoreName,
        path: DocPath,
        limit: ListingLimit = MAX_LISTING_PAGE,
        cursor: Annotated[str | None, page_cursor(MAX_DOCUMENTS_CURSOR_CHARS)] = None,
    ) -> MemoryVersionList:
        page, next_cursor = version_page(
            VERSIONS_CURSOR, [name, path], cursor,
            lambda before: stores().versions_page(tenant(), name, path, limit=limit, before=before),
            max_chars=MAX_DOCUMENTS_CURSOR_CHARS,
        )  # fmt: skip
        return MemoryVersionList(store=name, path=path, versions=page, next_cursor=next_cursor)

    @routes.post(
        "/memory-stores/<name>/versions/<version>/redact",
        summary="Redact a past version: its content is removed for good",
        description="The author and time stay. The document's current version cannot be redacted (409): "
        "overwrite or delete the document first.",
        operation_id="redactMemoryVersion",
        tags=TAGS,
        responses=responses(200, MemoryVersion, 404, 409, 422),
    )
    def redact(name: StoreName, version: Annotated[int, Path(ge=1, le=999_999_999)], path: DocPath) -> MemoryVersion:
        return stores().redact(tenant(), name, path, version)

    @routes.get("/memory-stores/<name>/search", summary="Find documents holding every word of a query",
                operation_id="searchMemory", tags=TAGS, responses=responses(200, MemorySearchResult, 404, 422))  # fmt: skip
    def search(
        name: StoreName,
        query: Annotated[
            str,
            Query(
                min_length=1,
                max_length=MAX_QUERY_CHARS,
                description="words to find, case-insensitive, every one in a document; at most "
                f"{MAX_QUERY_WORDS} different words (else 422 naming query)",
            ),
        ],
        limit: Annotated[int, Query(ge=1, le=20)] = 10,
    ) -> MemorySearchResult:
        return MemorySearchResult(store=name, query=query, hits=stores().search(tenant(), name, query, limit=limit))

    return routes
