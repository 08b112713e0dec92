"""The page cursors of the API's listings (``GET /tasks``, a trace, a memory store's documents, an
agent's or a document's versions, the schedules, a policy history): opaque base64url JSON that
names its listing, and ``InvalidCursor`` (400) for any cursor this API did not issue; and
``fitting`` and ``within_budget``, how much of a page fits one answer."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from agentq.api.models import (
    CURSOR_PATTERN,
    LISTING_PAGE_BYTES,
    MAX_CURSOR_CHARS,
)
from agentq.core.errors import ValidationError


class InvalidCursor(ValidationError):
    """A pagination cursor this API did not issue (or issued for another listing)."""

    code = "invalid_cursor"


# ------------------------------------------------------------------ cursors


def fitting(sizes: Iterable[int], budget: int) -> int:
    """How many of a page's items, in order, whose JSON sizes are ``sizes`` (read lazily, until
    the cut), fit ``budget`` bytes together, and never none: one item may pass it alone. A
    Lambda's answer may not pass 6 MB, so a listing of long texts stops at its byte budget."""
    kept = total = 0
    for size in sizes:
        total += size
        if kept and total > budget:
            break
        kept += 1
    return kept


class _Answered(Protocol):
    """An item of a listing: a model whose JSON the answer writes."""

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


M = TypeVar("M", bound=_Answered)


def within_budget(found: Sequence[M], more: bool, budget: int = LISTING_PAGE_BYTES) -> tuple[list[M], bool]:
    """Of a page read (``found``; ``more``: the listing goes on past it), the items that fit
    ``budget`` bytes as JSON (escaped, as the answer writes them), and whether the listing goes on
    past those: a listing of whole long items (agent definitions, documents, rules) is paged by
    size as well as by ``limit``, so no page passes what a Lambda may answer."""
    kept = list(found[: fitting((len(json.dumps(m.model_dump(mode="json"))) for m in found), budget)])
    return kept, more or len(kept) < len(found)


def encode_cursor(kind: str, value: Any) -> str:
    raw = json.dumps({"k": kind, "v": value}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_CURSOR = re.compile(CURSOR_PATTERN)


def decode_cursor(kind: str, cursor: str, *, max_chars: int = MAX_CURSOR_CHARS) -> Any:
    """The value ``encode_cursor`` put in ``cursor``, or ``InvalidCursor`` (400): a cursor that is
    too long (``max_chars``: a listing whose cursor names a long key allows more), not base64url
    (which ``b64decode`` would silently skip), not JSON, or of another listing."""
    if len(cursor) > max_chars or not _CURSOR.fullmatch(cursor):
        raise InvalidCursor(
            f"cursor is not one this API issued (base64url, at most {max_chars} characters); "
            "pass next_cursor back unchanged",
            field="cursor",
        )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor(
            "cursor is not one this API issued; pass next_cursor back unchanged", field="cursor"
        ) from None
    if not isinstance(data, dict) or data.get("k") != kind or "v" not in data:
        raise InvalidCursor(f"cursor does not belong to this listing ({kind})", field="cursor")
    return data["v"]


def version_after(kind: str, cursor: str, listing: list[str], *, max_chars: int = MAX_CURSOR_CHARS) -> int:
    """The version a cursor of ``kind`` issued for this ``listing`` (the route's names: an agent,
    a store and path, a scope) goes on after. A cursor of another listing, even of the same kind
    (another agent's versions), is ``InvalidCursor``."""
    value = decode_cursor(kind, cursor, max_chars=max_chars)
    if not isinstance(value, list) or len(value) != len(listing) + 1 or value[:-1] != listing:
        raise InvalidCursor(f"cursor does not belong to this listing ({kind} of {listing})", field="cursor")
    if not (type(value[-1]) is int and 1 <= value[-1] < 1_000_000_000):
        raise InvalidCursor("cursor is not one this API issued; pass next_cursor back unchanged", field="cursor")
    return value[-1]


class _Versioned(_Answered, Protocol):
    @property
    def version(self) -> int: ...


V = TypeVar("V", bound=_Versioned)


def version_page(
    kind: str,
    listing: list[str],
    cursor: str | None,
    read: Callable[[int | None], tuple[Sequence[V], bool]],
    *,
    max_chars: int = MAX_CURSOR_CHARS,
) -> tuple[list[V], str | None]:
    """One page of a versions listing, newest first (an agent's, a document's, a scope's
    rules): ``read`` the versions before the one ``cursor`` names (``version_after``; None: from
    the newest) and whether more follow, keep what fits one answer (``within_budget``), and the
    cursor of the next page (None at the end)."""
    before = version_after(kind, cursor, listing, max_chars=max_chars) if cursor else None
    found, more = read(before)
    page, more = within_budget(found, more)
    return page, encode_cursor(kind, [*listing, page[-1].version]) if more and page else None
