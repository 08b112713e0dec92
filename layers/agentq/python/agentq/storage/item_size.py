"""The size of a DynamoDB item by DynamoDB's documented rules: what a write is billed on.

A write costs one write request unit per started KB of the item (the larger of its size
before and after the write), twice that inside a transaction, and an item may not pass 400 KB.
So "META stays within 1 KB" is a claim about this number, not about the length of some
rendering of the item: each attribute counts its name's UTF-8 bytes plus its value's bytes,
a number about one byte per two significant digits plus one, a list or map 3 bytes plus
one per element plus its elements (a map's keys included).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

from agentq.storage.serdes import to_item

WRITE_UNIT_BYTES = 1024


def number_size(raw: str) -> int:
    """A number's size: one byte per two significant digits (leading and trailing zeroes and
    the exponent dropped), plus one. The local server sizes numbers with this too
    (``agentq_dev.moto_sizes``), so its item limit is DynamoDB's, whatever a moto release does."""
    digits = raw.strip().lstrip("+-").replace(".", "").split("e")[0].split("E")[0].strip("0")
    return math.ceil(max(1, len(digits)) / 2) + 1


def _binary_size(raw: Any) -> int:
    if isinstance(raw, (bytes, bytearray)):
        return len(raw)
    value = getattr(raw, "value", None)  # boto3's Binary
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return len(base64.b64decode(raw))


def attribute_size(value: Mapping[str, Any]) -> int:
    """Size of one typed attribute value (``{"S": ...}``, wire form)."""
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return number_size(str(raw))
    if kind == "B":
        return _binary_size(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(number_size(n) for n in raw)
    if kind == "BS":
        return sum(_binary_size(b) for b in raw)
    if kind == "L":
        return 3 + sum(1 + attribute_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + attribute_size(v) + 1 for k, v in raw.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def wire_item_size(item: Mapping[str, Any]) -> int:
    """Size of an item in wire form (``{"name": {"S": ...}}``, as the low-level client has it)."""
    return sum(len(name.encode()) + attribute_size(value) for name, value in item.items())


def item_size(item: Mapping[str, Any]) -> int:
    """Size of an item as the ``Table`` primitives return it (plain Python values)."""
    return wire_item_size(to_item(dict(item)))


def write_units(size: int, *, transactional: bool = False) -> int:
    """Write request units of writing an item of ``size`` bytes."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES)) * (2 if transactional else 1)
