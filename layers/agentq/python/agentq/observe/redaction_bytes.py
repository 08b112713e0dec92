"""Where the spellings found in bytes read as several encodings are replaced
(``observe.redaction``'s ``redact_encoded``): which views' spans to replace, and the bytes with
them replaced, so the text around each decodes as before."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

# The encodings ``redact_encoded`` reads bytes in besides an ASCII-compatible one, and the bytes of
# a character there (UTF-16's past U+FFFF: two units). A character of a spelling takes at most
# WIDEST bytes in any of them for each byte it takes in UTF-8.
WIDE_ENCODINGS = (("utf-16-le", 2), ("utf-16-be", 2), ("utf-32-le", 4), ("utf-32-be", 4))
WIDEST = 4
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def byte_offsets(text: str, width: int) -> Callable[[int], int]:
    """Where each character of ``text`` (decoded from bytes of ``width``: one character a unit,
    as ``redact_encoded`` decodes) starts in those bytes: UTF-16's characters past U+FFFF take two."""
    astral = [m.start() for m in _ASTRAL.finditer(text)] if width == 2 else []
    return lambda index: width * (index + bisect.bisect_left(astral, index))


Span = tuple[int, int, bytes]  # start, end, and what replaces the bytes between


def merged(spans: list[Span]) -> list[Span]:
    """In order, overlapping spans as one, with the longest of their marks (the widest encoding's)."""
    merged: list[Span] = []
    for start, end, mark in sorted(spans):
        if merged and start <= merged[-1][1]:
            first, last, other = merged[-1]
            merged[-1] = (first, max(end, last), max(mark, other, key=len))
        else:
            merged.append((start, end, mark))
    return merged


def chosen(found: list[tuple[int, int, bytes, int, bool]]) -> list[Span]:
    """The spans to replace: all of the views a decoder of the whole body reads (its bytes, and
    UTF-16 and UTF-32 from byte 0), and another view's (from byte 1, 2 or 3) unless it is within
    one of those but for less than a unit at either end. That is the same text read a byte off
    (ASCII in UTF-16-LE is UTF-16-BE a byte on): no character of it is left once the other span is
    replaced, and replacing its span instead would shift the rest of the body for its decoder."""
    first = merged([(start, end, mark) for start, end, mark, _, aligned in found if aligned])
    if all(aligned for *_, aligned in found):
        return first
    starts = [start for start, _, _ in first]
    chosen = list(first)
    for start, end, mark, width, aligned in found:
        at = bisect.bisect_right(starts, start + width - 1) - 1
        if not aligned and (at < 0 or end > first[at][1] + width - 1):
            chosen.append((start, end, mark))
    return chosen


def replaced(data: bytes, spans: list[Span], end: int) -> bytes:
    """The first ``end`` bytes of ``data``, each span replaced by its mark; one that holds byte
    ``end`` (or lies past it) is left out whole."""
    out, at = [], 0
    for start, stop, mark in merged(spans):
        if stop > end:
            end = min(start, end)
            break
        out += [data[at:start], mark]
        at = stop
    out.append(data[at:end])
    return b"".join(out)


def fitted(spans: list[Span], text: str) -> list[Span]:
    """The spans merged, each mark (``text`` in UTF-8 or one of ``WIDE_ENCODINGS``) made as long
    as the bytes it replaces: ``text`` and then ``*`` in that encoding (``*`` alone where ``text``
    is longer), and a ``*`` byte a byte of a span that is not whole units of it."""
    codecs = {text.encode(codec): (codec, width) for codec, width in (("utf-8", 1), *WIDE_ENCODINGS)}
    out: list[Span] = []
    for start, end, mark in merged(spans):
        codec, width = codecs[mark]
        units, odd = divmod(end - start, width)
        fill = text + "*" * (units - len(text)) if units >= len(text) else "*" * units
        out.append((start, end, fill.encode(codec) + b"*" * odd))
    return out
