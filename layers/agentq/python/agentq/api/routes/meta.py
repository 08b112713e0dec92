"""``GET /health`` (public, outside the security scheme) and ``GET /openapi.json`` (public,
not in its own document)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import Response

from agentq.api.errors import JSON
from agentq.api.models import Health, LivePath
from agentq.api.routes.common import Router


def router(version: str, document: Callable[[], dict[str, Any]], hub_url: str | None = None) -> Router:
    """``document`` builds the OpenAPI document; it is built on the first request and kept,
    since the routes do not change once the app is built. ``hub_url``: the events hub
    (``agentq.hub``), named in the health answer, the discovery a client reads to follow it."""
    routes = Router()
    cache: list[str] = []

    @routes.get(
        "/health",
        summary="Liveness",
        operation_id="health",
        tags=["meta"],
        responses={200: {"description": "The API answers", "content": {JSON: {"model": Health}}}},
        openapi_extensions={"security": []},
    )
    def health() -> Health:
        return Health(status="ok", version=version, live=LivePath(protocol="sse", url=hub_url) if hub_url else None)

    @routes.get("/openapi.json", include_in_schema=False)
    def openapi() -> Response[Any]:
        if not cache:
            cache.append(json.dumps(document()))
        return Response(status_code=200, content_type=JSON, body=cache[0])

    return routes
