"""JSON a request body may not hold, refused before powertools parses it.

Why here and not in the models: powertools parses the body with ``json.loads`` before any
model sees it, and four kinds of valid-looking JSON break outside pydantic's reach, each
once a 500: nesting deep enough to exhaust the parser's recursion (``RecursionError``), an
integer longer than Python's 4,300-digit conversion limit (``ValueError`` from ``int``), a
lone UTF-16 surrogate (``"\\ud800"``), which ``json`` accepts but no UTF-8 encoder will
write, so it fails later, when the task is stored, and ``NaN``, ``Infinity`` or a number past a
float's range (``1e400``), which ``json`` accepts but pydantic stores as ``null``: the item read
back is not the one validated, and each read of it (a tenant's whole listing) failed. Each is
a 400 naming where it is, and nothing is written.

A field named twice in one object (``{"constraints": {...}, "constraints": {...}}``) is a 422
naming it: ``json`` keeps the last silently, so a proxy, a log or a WAF reading the first saw
other limits than the ones that ran (RFC 8259 4: such an object's meaning is unpredictable).
The A2A and MCP endpoints' JSON-RPC bodies pass this guard too (the resolver's, before any route).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

from agentq.core.models import MAX_JSON_DEPTH

MAX_DEPTH = MAX_JSON_DEPTH  # one limit with the clients that check it first (core.evaluations)
MAX_INT_DIGITS = 4300  # Python's int/str conversion limit (sys.get_int_max_str_digits' default)


class _HugeInt:
    """An integer literal too long to convert, kept as text so the walk can say where it is."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits)


def _parse_int(text: str) -> int | _HugeInt:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else _HugeInt(text)


class _NotFinite:
    """NaN, Infinity, -Infinity or a literal too large for a float: not JSON numbers (RFC 8259),
    and stored as null by pydantic, so a value that validated would be read back changed."""

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_float(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


class _Twice:
    """An object naming ``key`` more than once, kept so the walk can say where it is."""

    def __init__(self, key: str) -> None:
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Twice:
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            return _Twice(key)
        value[key] = item
    return value


class BodyProblem(Exception):
    """``status``: 400 for JSON no parser or store takes whole, 422 for a field named twice."""

    def __init__(self, message: str, field: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status


def check_body(event: Mapping[str, Any]) -> None:
    """Raise ``BodyProblem`` for a JSON body that would break the parser or the store."""
    raw = event.get("body")
    if not raw:
        return
    if event.get("isBase64Encoded"):
        try:
            raw = base64.b64decode(raw).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise BodyProblem(f"body is not UTF-8 text: {exc}", "body") from exc
    try:
        value = json.loads(
            raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_NotFinite, object_pairs_hook=_object
        )
    except RecursionError as exc:
        raise BodyProblem(f"body nests deeper than {MAX_DEPTH} levels", "body") from exc
    except ValueError:  # not JSON at all: the resolver's own answer (400 invalid_json) names it
        return
    _walk(value)


def _walk(root: Any) -> None:
    """Depth and text checks without recursion (the value may be deep)."""
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BodyProblem(f"body nests deeper than {MAX_DEPTH} levels", path or "body")
        if isinstance(value, _HugeInt):
            raise BodyProblem(f"{path or 'body'}: an integer of {value.digits} digits", path or "body")
        if isinstance(value, _NotFinite):
            raise BodyProblem(f"{path or 'body'}: {value.text} is not a JSON number", path or "body")
        if isinstance(value, _Twice):
            where = f"{path}.{value.key}" if path else value.key
            raise BodyProblem(f"{where}: given twice in one object (send each field once)", where, 422)
        if isinstance(value, str):
            _text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _text(key, path or "body")
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _text(value: str, path: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BodyProblem(
            f"{path or 'body'}: a lone UTF-16 surrogate is not text ({exc.reason})", path or "body"
        ) from exc
