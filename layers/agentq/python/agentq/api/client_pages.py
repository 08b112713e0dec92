"""Following a listing's pages, as every client call that answers a whole listing does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar


class _Page(Protocol):
    @property
    def next_cursor(self) -> str | None: ...


P = TypeVar("P", bound=_Page)


def pages(read: Callable[[str | None], P]) -> Iterator[P]:
    """Each page of a listing in order: ``read`` the first (cursor None), then the one each
    page's ``next_cursor`` names, until a page names none."""
    cursor: str | None = None
    while True:
        page = read(cursor)
        yield page
        if not page.next_cursor:
            return
        cursor = page.next_cursor
