"""Conditional GETs: a 200 answer to a GET carries a strong ETag (a hash of its body), and a
request whose ``If-None-Match`` names that tag is answered ``304 Not Modified`` with no body.

Why: the console keeps a page live by polling (it must work behind API Gateway, where a
REST API cannot hold a server-sent-events stream open through a Lambda proxy), and most polls
find nothing new: a 304 costs a few header bytes instead of the whole view. The tag is taken
over the exact bytes sent, so it changes whenever anything in the answer does; the server
still builds the view, so the saving is transfer and the browser's work, not table reads.
API Gateway passes both headers through a proxy integration unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver


def entity_tag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def matches(if_none_match: str | None, tag: str) -> bool:
    """RFC 9110 weak comparison: ``*``, or any listed tag equal to ours with W/ ignored."""
    if not if_none_match:
        return False
    candidates = [t.strip() for t in if_none_match.split(",")]
    return "*" in candidates or tag in (t.removeprefix("W/") for t in candidates)


def conditional_get(app: ApiGatewayResolver, next_middleware: Callable[..., Any]) -> Any:
    """Powertools middleware (``app.use([conditional_get])``): every route, GETs only."""
    response = next_middleware(app)
    if app.current_event.http_method.upper() != "GET" or not isinstance(response, Response):
        return response
    if response.status_code != 200 or response.body is None:
        return response
    body = response.body
    if not isinstance(body, str | bytes):
        body = app._serializer(body)  # what the resolver would send; serialised once, here
        response.body = body
    tag = entity_tag(body.encode() if isinstance(body, str) else body)
    response.headers["ETag"] = tag
    asked = next((v for k, v in (app.current_event.headers or {}).items() if k.lower() == "if-none-match"), None)
    if matches(asked, tag):
        headers: dict[str, str | list[str]] = {"ETag": tag}
        if "Cache-Control" in response.headers:
            headers["Cache-Control"] = response.headers["Cache-Control"]
        return Response(status_code=304, headers=headers, body="")
    return response
