"""A request as API Gateway's REST proxy integration hands it to the API's handler: the proxy
event, the authorizer's say on its ``Authorization`` header (the caller's context, or a 401), and
one request through both (``dispatch``). The API's HTTP server (``api/http_server.py``: the
``events`` function in AWS, ``agentq dev``, the events hub) and in-process WSGI clients
(``wsgi_app``) run the very handler API Gateway invokes through these, so what is checked, and how
a refusal reads, is the same everywhere.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from agentq.api.app import is_public
from agentq.api.auth import Unauthorized
from agentq.api.errors import error_body
from agentq.api.routes.mcp import in_rpc_words, is_mcp_path

LOCAL_TENANT = "local"


def proxy_event(
    method: str,
    url: str,
    headers: dict[str, str],
    body: str | bytes | None,
    tenant: str | None = LOCAL_TENANT,
    *,
    operator: bool = False,
    key_id: str | None = None,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event; ``tenant=None`` carries no authorizer context. ``key_id``:
    the caller's API key, which API Gateway's authorizer context names too (a person's memory
    write records it). ``context``: the whole authorizer context instead (a token's user, a
    key's ``act_for_users``), as the authorizer made it. A body of bytes (the server's) is
    decoded as UTF-8, never with replacement: bytes that are not UTF-8 are handed on
    base64-encoded, as a binary body is, and the resolver answers 400 naming ``body``
    (``api/body_guard.py``) rather than store a goal altered. ``path`` is the URL's, still
    percent-encoded, as API Gateway's REST proxy event has it: the resolver routes on its segments
    and decodes each route parameter after (``agentq.api.app``), so ``%2F`` never splits one."""
    parts = urlsplit(url)
    path = parts.path
    text, encoded = body, False
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:  # handed on as a binary body is: base64, which the resolver refuses (400)
            text, encoded = base64.b64encode(body).decode("ascii"), True
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()} or None
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": dict(parse_qs(parts.query, keep_blank_values=True).items()) or None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "requestId": uuid.uuid4().hex,
            "stage": "local",
            "httpMethod": method,
            "path": path,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": dict(context) if context else (_context(tenant, operator, key_id) if tenant else None),
        },
        "body": text,
        "isBase64Encoded": encoded,
    }


def _context(tenant: str, operator: bool, key_id: str | None) -> dict[str, Any]:
    ctx: dict[str, Any] = {"tenant": tenant, "operator": operator}
    if key_id:
        ctx["key_id"] = key_id
    return ctx


# An Authorization header value -> the caller's tenant (a str), or its whole authorizer context
# (a mapping with ``tenant``, ``operator``, ``key_id``, a key's ``act_for_users`` or a token's
# ``user``); raises to refuse the key (``api.auth.Unauthorized``: a public reason is answered).
Authorizer = Callable[[str | None], "str | Mapping[str, Any]"]


REQUEST_CONTEXT = "x-amzn-request-context"  # where the Lambda Web Adapter puts API Gateway's request context


def context_tenant(header: str | None) -> dict[str, Any]:
    """The authorizer context API Gateway put in the request context (its tenant, and a token's
    user), as the Lambda Web Adapter forwards it (the server behind it in AWS,
    ``functions/events``); raises without a tenant."""
    context = (json.loads(header or "{}") or {}).get("authorizer") or {}
    tenant = context.get("tenant") if isinstance(context, dict) else None
    if not isinstance(tenant, str) or not tenant:
        raise PermissionError("no tenant in the request context")
    return {k: v for k, v in context.items() if k in ("tenant", "user", "key_id", "operator", "act_for_users")}


Caller = dict[str, Any]  # the authorizer context: tenant, operator, key_id, act_for_users or user

# No keys: the one local user operates the deployment, and may act for any end user.
_KEYLESS: Caller = {"tenant": LOCAL_TENANT, "operator": True, "act_for_users": True}


def _caller(authorizer: Authorizer | None, url: str, headers: dict[str, str]) -> Caller:
    """The caller's authorizer context; raises when the authorizer refuses the key or token."""
    if authorizer is None:
        return _KEYLESS
    if is_public(urlsplit(url).path):
        return {"tenant": LOCAL_TENANT, "operator": False}
    if authorizer is context_tenant:
        header = next((v for k, v in headers.items() if k.lower() == REQUEST_CONTEXT), None)
        return context_tenant(header)
    found = authorizer(next((v for k, v in headers.items() if k.lower() == "authorization"), None))
    if isinstance(found, str):
        return {"tenant": found, "operator": False}
    return dict(found)


_KEY_REFUSAL = "missing, unknown or revoked API key"
_REFUSED_KEY = (401, "unauthorized", _KEY_REFUSAL, None, {"WWW-Authenticate": "Bearer"})


def refusal(exc: Exception) -> tuple[int, dict[str, str], bytes]:
    """The 401 of a refused request: a public reason when it has one (a token's, ``api.oidc``;
    a header not of the form ``Bearer <key>``, naming ``Authorization``), else the same words
    for every key (which say nothing of which keys exist)."""
    public = isinstance(exc, Unauthorized) and exc.public
    message = exc.reason if isinstance(exc, Unauthorized) and public else _KEY_REFUSAL
    field = exc.field if isinstance(exc, Unauthorized) and public else None
    headers = {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"}
    return 401, headers, json.dumps(error_body("unauthorized", message, field)).encode()


def dispatch(
    handler: Any,
    authorizer: Authorizer | None,
    method: str,
    url: str,
    headers: dict[str, str],
    body: str | bytes | None,
    *,
    caller: Caller | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request through the authorizer (if any; ``caller``: what it already said) and the
    handler: (status, headers, body)."""
    if caller is None:
        try:
            caller = _caller(authorizer, url, headers)
        except Exception as exc:  # the authorizer's refusal, whatever the reason: 401 as API Gateway
            status, out, page = refusal(exc)
            if is_mcp_path(urlsplit(url).path):  # an MCP client reads JSON-RPC errors only
                page = in_rpc_words(status, page, body) or page
            return status, out, page
    result = handler(proxy_event(method, url, headers, body, context=caller), None)
    out = {**(result.get("headers") or {})}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        out.setdefault(name, values[-1])
    out.pop("Content-Length", None)
    raw = result.get("body") or ""
    # A binary answer (a workspace file) comes base64-encoded, as API Gateway expects it.
    payload = base64.b64decode(raw) if result.get("isBase64Encoded") else raw.encode()
    return int(result.get("statusCode", 500)), out, payload


def wsgi_app(handler: Any, authorizer: Authorizer | None = None) -> Callable[..., Any]:
    """The handler as a WSGI application (in-process clients, any WSGI server)."""
    from http import HTTPStatus

    lock = threading.Lock()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else None
        headers = {k[5:].replace("_", "-").title(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        url = environ.get("PATH_INFO", "/") + (f"?{environ['QUERY_STRING']}" if environ.get("QUERY_STRING") else "")
        with lock:
            status, out, payload = dispatch(handler, authorizer, environ["REQUEST_METHOD"], url, headers, body)
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        start_response(f"{status} {phrase}", [*out.items(), ("Content-Length", str(len(payload)))])
        return [payload]

    return app
