"""A tool's input schema as the model sees it: pydantic's JSON schema of the tool's parameters,
without the titles pydantic generates and with ``$ref``s inlined unless the model is recursive
(models follow a self-contained schema more reliably)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

# Keys whose value is a schema, a list of schemas, or a name -> schema map. Everything else
# (default, enum, const, examples...) is data and must be copied untouched: a default value
# may well contain a "title" key.
_SCHEMA_KEYS = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "additionalItems",
    }
)
_SCHEMA_LIST_KEYS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
_SCHEMA_MAP_KEYS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class RecursiveSchema(Exception):
    pass


@functools.lru_cache(maxsize=512)
def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema without pydantic's generated titles and, unless the model is
    recursive, with ``$ref``s inlined: models follow a self-contained schema more reliably."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})
    schema: dict[str, Any]
    try:
        schema = _clean(raw, defs, inline=True, stack=())
    except RecursiveSchema:
        schema = _clean(raw, defs, inline=False, stack=())
        if defs:
            schema["$defs"] = _clean(defs, defs, inline=False, stack=(), is_map=True)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


def _clean(node: Any, defs: dict[str, Any], *, inline: bool, stack: tuple[str, ...], is_map: bool = False) -> Any:
    if is_map:
        return {k: _clean(v, defs, inline=inline, stack=stack) for k, v in node.items()}
    if isinstance(node, list):
        return [_clean(v, defs, inline=inline, stack=stack) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    ref = node.get("$ref")
    if inline and isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = ref.removeprefix("#/$defs/")
        if target in stack or target not in defs:
            raise RecursiveSchema(target)
        out.update(_clean(defs[target], defs, inline=inline, stack=(*stack, target)))
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if inline and key == "$ref" and isinstance(ref, str) and ref.startswith("#/$defs/"):
            continue
        if inline and key == "discriminator":
            continue  # an OpenAPI hint whose mapping points into the $defs we just removed
        if key in _SCHEMA_KEYS or key in _SCHEMA_LIST_KEYS:
            out[key] = _clean(value, defs, inline=inline, stack=stack)
        elif key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
            out[key] = _clean(value, defs, inline=inline, stack=stack, is_map=True)
        else:
            out[key] = copy.deepcopy(value)
    return out
