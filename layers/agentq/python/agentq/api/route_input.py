"""What a request sends that its route does not take, refused in one place for every route (the
resolver's ``_call_route``, once the route is known and before it runs), as an unknown body field
is refused by the models: a 4xx naming what to fix, and the route never runs.

- a single-valued parameter given more than once: 422 naming it, "given 2 times" (``?limit=5&limit=6``
  said "Input should be a valid integer"; ``?status=running&status=queued`` listed the valid values
  as if running were not one); a list parameter (``metadata``) repeats as documented
- a body sent to a route that takes none: 422 naming its first field (``POST
  /tasks/{id}/cancel {"max": -1}`` was a 200, the body ignored); no body, or ``{}`` (what
  the console sends with a bodiless POST), is what such a route takes
- a JSON ``null`` sent to a route that takes an object: 422 naming the body. A route whose body
  is optional (a redrive's ``message_ids``, an approval's note) took it for no body: the redrive
  of every dead letter of the tier, for a body its schema refuses

Routes left out of the OpenAPI document (A2A, MCP, the console's pages) read the request
themselves and are not checked here. A query parameter a route does not declare is passed on, not
refused: some routes read parameters of their own beyond what they declare (the event stream's
``wait``, the task list's ``agent``), and refusing them broke their clients.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.openapi.compat import is_scalar_sequence_field

Refusal = tuple[int, str, str, str]  # status, code, message, field


def refusal(route: Route, event: Mapping[str, Any]) -> Refusal | None:
    """Why ``route`` does not take this request's query or body, or None."""
    if not route.include_in_schema:
        return None
    dependant = route.dependant
    declared = {param.alias: param for param in dependant.query_params}
    for name, values in (event.get("multiValueQueryStringParameters") or {}).items():
        param = declared.get(name)
        if param is not None and len(values or ()) > 1 and not is_scalar_sequence_field(param):
            return 422, "validation_error", f"{name}: given {len(values)} times; give it once", name
    if event.get("body"):
        raw, encoded = str(event["body"]), bool(event.get("isBase64Encoded"))
        return _null_body(raw, encoded) if dependant.body_params else _no_body(raw, encoded)
    return None


def _null_body(raw: str, encoded: bool) -> Refusal | None:
    """A body of JSON ``null`` where the route takes an object; anything else is the model's to
    read. Looked for in the text (JSON's whitespace around ``null``), not parsed: a submission or
    an upload is parsed once, by the route."""
    if encoded:
        try:
            raw = base64.b64decode(raw).decode("utf-8", "replace") if len(raw) <= 64 else ""
        except ValueError:
            return None  # not base64: the resolver reads (and refuses) it as for every body
    if raw.strip(" \t\n\r") == "null":
        return 422, "validation_error", "the body must be a JSON object", "body"
    return None


def _no_body(raw: str, encoded: bool) -> Refusal | None:
    try:
        value = json.loads(base64.b64decode(raw) if encoded else raw)
    except ValueError as exc:
        return 400, "invalid_json", f"body is not valid JSON: {exc}", "body"
    if value == {}:
        return None
    if isinstance(value, dict):
        first = str(next(iter(value)))
        return 422, "validation_error", f"{first}: unknown field (this route takes no body)", first
    return 422, "validation_error", "body: this route takes no body (send none, or {})", "body"
