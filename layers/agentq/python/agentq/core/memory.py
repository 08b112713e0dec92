"""Memory stores: named, tenant-scoped stores of small text documents that outlive a task.

A task's notes (``NOTE#``) die with the task; a memory store is what an agent remembers across
tasks (a customer's earlier order, a repository's conventions). The shapes follow Claude Managed
Agents' memory stores where they can (a document is a ``path`` with ``content``, its
``content_sha256`` is the precondition of an update, every change is a ``version`` recording
who made it, a version can be redacted, an attachment is ``read_write`` or ``read_only``), with
agentq's own addressing: a store is named per tenant, like an agent.

Invariants the storage keeps (``storage.memory_stores``):

- a document is changed only through a version: each write adds one, numbered from 1 per path,
  never reused (a deleted document keeps its head as a tombstone so numbering goes on);
- a write with a precondition (``expected_sha256``) happens only if the document still has that
  content: of two writers that read the same content, one wins and the other gets
  ``MemoryConflict`` with the content that won, never a lost update;
- a version made by a task records the task, the step of its ``tool_use`` and the call's id,
  and is fenced by the task's lease (a zombie writes nothing).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentq.core.errors import AgentqError

MEMORY_STORE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
MAX_MEMORY_ATTACHMENTS = 8
MemoryAccessMode = Literal["read_write", "read_only"]
STORE_NAME_PATTERN = MEMORY_STORE_PATTERN
PATH_SEGMENT = re.compile(r"[A-Za-z0-9._@+-]{1,255}")  # fullmatch: `$` would pass "fx.md\n"
# DynamoDB's sort key holds at most 1,024 bytes, and a version's is ``VER#<path>#<9 digits>``
# (storage/keys.py): 14 of them are not the path's.
MAX_PATH_BYTES = 1010
MAX_PATH_SEGMENTS = 20
# ``check_path`` as a pattern, for the OpenAPI document (the check itself says what is wrong):
# segments may not be '.' or '..', and the path is in NFC, at most MAX_PATH_BYTES bytes.
PATH_PATTERN = r"^(/[A-Za-z0-9._@+-]{1,255}){1,20}$"
PATH_PREFIX_PATTERN = r"^/([A-Za-z0-9._@+-]{1,255}(/[A-Za-z0-9._@+-]{1,255}){0,19}/?)?$"
PATH_RULES = (
    "'/' then 1-20 segments of letters, digits, '.', '_', '-', '@' and '+' (not '.' or '..'), "
    f"at most {MAX_PATH_BYTES} bytes, in Unicode NFC"
)
MAX_DOCUMENT_BYTES = 102_400  # Claude Managed Agents' 100 kB; a version is one item, far under 400 KB
MAX_DOCUMENTS = 10_000  # the ceiling of a store's own limit: a search reads the whole store
DEFAULT_MAX_DOCUMENTS = 1_000
DEFAULT_RETENTION_DAYS = 30
# Different words a search takes: each is a scan of every document it reads (the whole store),
# so the words bound its cost; more is refused naming ``query`` (``storage.memory_items.query_words``).
MAX_QUERY_WORDS = 16
MAX_QUERY_CHARS = 500

Operation = Literal["created", "modified", "deleted"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryStoreNotFound(AgentqError):
    code = "memory_store_not_found"


class MemoryDocumentNotFound(AgentqError):
    code = "memory_document_not_found"


class MemoryConflict(AgentqError):
    """The document is not what the writer expected (its precondition failed), or the change
    would break a rule of the store's state (a store that exists, a current version redacted).
    ``current_sha256`` is the document's content hash now (None: absent), so a caller can read
    it again and decide."""

    code = "memory_conflict"

    def __init__(self, message: str, *, field: str | None = None, current_sha256: str | None = None) -> None:
        super().__init__(message, field=field)
        self.current_sha256 = current_sha256


class MemoryReadOnly(AgentqError):
    """A write to a store the task has attached ``read_only``."""

    code = "memory_read_only"


class MemoryLimitExceeded(AgentqError):
    """A store limit (documents, bytes per document) would be passed; nothing was written."""

    code = "memory_limit_exceeded"


def content_sha256(content: str) -> str:
    """Lowercase hex SHA-256 of the UTF-8 bytes, no normalisation: a client computes the same."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def check_path(path: str, *, prefix: bool = False) -> str:
    """A document path: ``/`` then 1-20 segments of letters, digits, ``. _ - @ +`` (no ``.``/``..``),
    at most 1,010 bytes. ``#`` can never appear, so a path's key prefix in the table
    (``VER#<path>#``) never matches another path's. ``prefix``: a listing prefix, which may end
    with ``/`` or be ``/`` alone."""
    if not path.startswith("/"):
        raise ValueError("a path starts with '/', e.g. /customers/42.md")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise ValueError(f"a path is at most {MAX_PATH_BYTES} bytes")
    if unicodedata.normalize("NFC", path) != path:
        raise ValueError("a path must be in Unicode normalization form C")
    body = path[1:]
    if prefix:
        if body == "":
            return path
        body = body[:-1] if body.endswith("/") else body
    segments = body.split("/")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise ValueError(f"a path has at most {MAX_PATH_SEGMENTS} segments")
    for segment in segments:
        if segment in ("", ".", "..") or not PATH_SEGMENT.fullmatch(segment):
            raise ValueError(
                f"path segment {segment!r}: letters, digits, '.', '_', '-', '@' and '+' only; not empty, '.' or '..'"
            )
    return path


class MemoryStoreSpec(StrictModel):
    """What ``POST /memory-stores`` takes: a store and its limits."""

    name: str = Field(pattern=STORE_NAME_PATTERN, description="lowercase letters, digits, '-' and '_'; 1-64")
    description: str = Field(
        default="", max_length=1024, description="what the store holds; shown to the model with the memory tools"
    )
    max_documents: int = Field(strict=True, default=DEFAULT_MAX_DOCUMENTS, ge=1, le=MAX_DOCUMENTS)
    max_document_bytes: int = Field(strict=True, default=MAX_DOCUMENT_BYTES, ge=1, le=MAX_DOCUMENT_BYTES)
    version_retention_days: int = Field(
        strict=True,
        default=DEFAULT_RETENTION_DAYS,
        ge=1,
        le=3650,
        description="each version is kept this long after it was written (the current content always stays)",
    )


class MemoryStoreUpdate(StrictModel):
    """``PATCH /memory-stores/{name}``: the settings that may change (limits apply to later writes)."""

    description: str | None = Field(default=None, max_length=1024)
    max_documents: int | None = Field(strict=True, default=None, ge=1, le=MAX_DOCUMENTS)
    max_document_bytes: int | None = Field(strict=True, default=None, ge=1, le=MAX_DOCUMENT_BYTES)
    version_retention_days: int | None = Field(strict=True, default=None, ge=1, le=3650)


class MemoryStore(MemoryStoreSpec):
    """A store as the API returns it."""

    documents: int = Field(description="documents it holds now")
    created_at: float
    updated_at: float


class Author(StrictModel):
    """Who made a version: a task's tool call (``task``) or a person through the API (``api``)."""

    type: Literal["task", "api"]
    task_id: str | None = None
    step: int | None = Field(default=None, description="the step whose tool_use made the write")
    tool_use_id: str | None = None
    key_id: str | None = Field(default=None, description="the API key of the request, when known")


class MemoryDocument(StrictModel):
    """A document as stored now. ``content`` is None in a listing."""

    store: str
    path: str
    content: str | None = None
    content_sha256: str
    content_size_bytes: int
    version: int = Field(description="the version holding this content")
    created_at: float
    updated_at: float
    updated_by: Author


class MemoryVersion(StrictModel):
    """One change of a document. Redacted: ``content``, ``content_sha256`` and
    ``content_size_bytes`` are None and ``redacted_at`` is set; the author stays."""

    store: str
    path: str
    version: int
    operation: Operation
    content: str | None = None
    content_sha256: str | None = None
    content_size_bytes: int | None = None
    created_at: float
    created_by: Author
    redacted_at: float | None = None
    expires_at: float | None = Field(default=None, description="when retention drops it")


class MemorySearchHit(StrictModel):
    path: str
    content_sha256: str
    matches: int = Field(description="occurrences of the query's words in path and content")
    snippet: str


@dataclass(frozen=True)
class SearchView:
    """A document as a search sees it (``storage.memory_items.search_hit``): its path and content
    through ``show``, which puts ``mark`` where it hides something. The memory tools search
    through ``observe.redaction.redact``, so a document as ``memory_read`` shows it: matched over
    the text as stored, a query word inside a credential found its document (the model confirmed
    its guesses, a piece at a time), and a snippet cut across one gave a piece of it too short
    for the result's redaction to find."""

    show: Callable[[str], str]
    mark: str

    def may_add(self, word: str) -> bool:
        """Whether ``word`` (lowercase) may be in a shown text without being in the stored one:
        only where an occurrence overlaps a mark (it starts inside one, holds one, or runs into
        one). Showing costs more than the search's scan (redacting 100 kB took 18 ms, lowercasing
        and finding a word in it 0.6), so a document lacking a word no mark can add is not shown."""
        mark = self.mark.lower()
        return word in mark or any(
            mark.endswith(word[:k]) or mark.startswith(word[k:]) or word[k:].startswith(mark)
            for k in range(1, len(word))
        )


class MemoryAttachment(BaseModel):
    """A memory store (``core.memory``) a task may use through the memory tools, as an agent
    version or a submission names it."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(pattern=MEMORY_STORE_PATTERN, description="a memory store of the tenant")
    access: MemoryAccessMode = Field(default="read_write", description="read_only: memory_write refuses")
    instructions: str | None = Field(
        default=None, max_length=4096, description="how to use this store; shown to the model"
    )


def unique_stores(attachments: list[MemoryAttachment]) -> list[MemoryAttachment]:
    seen: set[str] = set()
    for attachment in attachments:
        if attachment.store in seen:
            raise ValueError(f"memory store {attachment.store!r} is attached twice")
        seen.add(attachment.store)
    return attachments


def merged_attachments(agent: list[MemoryAttachment], own: list[MemoryAttachment]) -> list[MemoryAttachment]:
    """An agent version's attachments, then the submission's own; the submission's attachment of
    a store the agent attaches too replaces the agent's (its access and instructions)."""
    mine = {a.store: a for a in own}
    return [mine.pop(a.store, a) for a in agent] + list(mine.values())
