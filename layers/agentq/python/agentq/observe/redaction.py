"""Redaction: a credential's value, in any spelling it is likely to take, never leaves in text.

Every credential a worker decrypts (``core.engine._credentials``) is added here, for the
process's life (bounded: the most recent ``MAX_VALUES``). What the process writes out passes
through ``redact`` first: a tool's result and error before the step that holds it is built
(``core.engine._tool_call``), hence before any item, event, trace, span or callback is made of
it; and every log line, through ``RedactingFilter`` on the process's handlers (``observe.logs``).

The spellings: the value itself, percent-encoded (``quote``, ``quote_plus``), JSON-escaped, and
base64 (standard and URL-safe) at each of the three alignments a value can have inside a longer
encoded text (the middle characters that do not depend on what surrounds it: an echo of a whole
``Authorization`` header, base64-encoded, still loses the value). A value shorter than
``MIN_CHARS`` is never one a credential holds (``core.vault`` refuses it), so ordinary text is
never redacted by accident.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import urllib.parse
from collections import OrderedDict

MIN_CHARS = 8
MAX_VALUES = 4096
REDACTED = "[redacted credential]"


def spellings(value: str) -> set[str]:
    """The texts that carry ``value``: itself, percent-encoded, JSON-escaped, base64 cores."""
    raw = value.encode("utf-8")
    out = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value), json.dumps(value)[1:-1]}
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * shift + raw).decode().rstrip("=")
            start = -(-shift * 8 // 6)  # the first character that depends on the value alone
            end = (shift + len(raw)) * 8 // 6  # the last whole character of it
            out.add(encoded[start:end])
    return {s for s in out if len(s) >= MIN_CHARS}


class Redactor:
    """The values this process must not write out, and the one pattern that finds them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: OrderedDict[str, None] = OrderedDict()
        self._pattern: re.Pattern[str] | None = None
        self._bytes: re.Pattern[bytes] | None = None

    def add(self, *values: str) -> None:
        with self._lock:
            changed = False
            for value in values:
                if len(value) < MIN_CHARS:
                    continue
                for spelling in spellings(value):
                    if spelling not in self._values:
                        changed = True
                    self._values[spelling] = None
                    self._values.move_to_end(spelling)
            while len(self._values) > MAX_VALUES:
                self._values.popitem(last=False)
                changed = True
            if changed:  # longest first: a spelling that holds another is replaced whole
                ordered = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
                raw = [re.escape(v.encode("utf-8")) for v in ordered]
                self._bytes = re.compile(b"|".join(raw)) if raw else None

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(REDACTED, text)

    def redact_bytes(self, data: bytes) -> bytes:
        pattern = self._bytes
        if pattern is None or not data:
            return data
        return pattern.sub(REDACTED.encode(), data)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._pattern = None
            self._bytes = None


REDACTOR = Redactor()


def redact(text: str) -> str:
    return REDACTOR.redact(text)


MAX_FILE_BYTES = 16 * 1024 * 1024  # a workspace file larger than this is not read for redaction


def redact_files(root: str) -> list[str]:
    """Rewrite, in place, every regular file under ``root`` (up to ``MAX_FILE_BYTES``) that holds
    a credential's value, the value redacted: what a workspace's process wrote after reading an
    echoing API is not stored with it (``core.engine._workspace``). Returns the paths changed."""
    import os

    changed: list[str] = []
    if REDACTOR._bytes is None:
        return changed
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
                if not os.path.isfile(path) or os.path.islink(path) or info.st_size > MAX_FILE_BYTES:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                cleaned = REDACTOR.redact_bytes(data)
                if cleaned != data:
                    with open(path, "wb") as f:
                        f.write(cleaned)
                    changed.append(path)
            except OSError:
                continue
    return changed


class RedactingFilter(logging.Filter):
    """Rewrites a record whose message or traceback holds a credential; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if REDACTOR._pattern is None:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string is the formatter's to report
            return True
        cleaned = REDACTOR.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[0] is not None:
            # Formatters (powertools' JSON one) format exc_info themselves: a traceback that
            # holds a credential is folded into the message, redacted, and exc_info dropped.
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            clean = REDACTOR.redact(text)
            if clean != text:
                record.msg, record.args = f"{record.getMessage()}\n{clean}", None
                record.exc_info, record.exc_text = None, None
        if record.stack_info:
            record.stack_info = REDACTOR.redact(record.stack_info)
        return True


def has_redacting_filter(handler: logging.Handler) -> bool:
    return any(isinstance(f, RedactingFilter) for f in handler.filters)
