"""API keys (and OIDC tokens) at the door: a bearer key -> its tenant, a JWT -> its tenant and
user (``api.oidc``), or 401.

The keys themselves (hashes in the task table, create / lookup / revoke / list) are
``agentq.storage.api_keys``. This module decides what a presented ``Authorization`` header is
worth, and answers API Gateway. In AWS a Lambda TOKEN authorizer (``functions/authorizer``)
calls ``token_authorizer`` and API Gateway passes ``{"tenant": ..., "operator": ...}`` to the
API in ``requestContext.authorizer`` (API Gateway hands a REST API a boolean context value as
the string ``"true"``/``"false"``: ``agentq.api.app`` reads both). The local API server calls ``authorize`` in-process and puts the
tenant in the same place. A missing, malformed, unknown or revoked key is answered 401 alike:
the answer tells a caller nothing about which keys exist. A header of another form than
``Bearer <key>`` (``Basic ...``, a bare key, ``Bearer`` and nothing) is a 401 that says so and
names ``Authorization``: that is about the header sent, not about any key. (In AWS, API
Gateway answers such a header itself, before the authorizer runs: the stack's authorizer
takes only headers of the form ``Bearer <token>``, ``infra/api.py``.)

What the authorizer Lambda imports, so it stays light: no models, engine, store, runtime or
boto3 (``key_store_from_env`` builds a ``DynamoTable`` over a botocore client; the key store
reads through it without loading boto3).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

from agentq.core.endusers import Caller
from agentq.core.errors import AgentqError
from agentq.storage.api_keys import ApiKey, KeyStore


class OidcVerifier(Protocol):
    """What checks a JWT (``api.oidc.OidcVerifier``): its claims' tenant and user, or Unauthorized."""

    def verify(self, token: str) -> dict[str, str]: ...


log = logging.getLogger("agentq.auth")

AUTHORIZATION = "Authorization"  # the header a refusal of its form names
_TOKEN_PATTERN = re.compile(r"aq_[A-Za-z0-9_-]{20,200}")  # fullmatch: `$` would let a trailing newline by
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


class Unauthorized(AgentqError):
    """No valid API key or token. ``str()`` is exactly "Unauthorized": what API Gateway expects a
    TOKEN authorizer to raise for a 401; the reason is in ``reason``: logged, and returned only
    when ``public`` (a token's: it tells the holder about their own token; a key's says nothing
    of which keys exist)."""

    code = "unauthorized"

    def __init__(self, reason: str, *, public: bool = False, field: str | None = None) -> None:
        super().__init__("Unauthorized", field=field)
        self.reason = reason
        self.public = public


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts: what a bearer JWT is (an API key starts ``aq_`` and has no dot)."""
    return _JWT.fullmatch(token) is not None


def bearer(header: str | None) -> str:
    """The credential in an ``Authorization: Bearer <credential>`` header value. A header of
    another form is refused saying so, naming ``Authorization`` (public: it tells the caller
    about the header it sent, nothing about which keys exist, and never echoes the header)."""
    if not header:
        raise Unauthorized("no Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer":
        # the scheme is named only when it is one (letters): a bare key is never echoed
        named = token and scheme.isascii() and scheme.isalpha() and len(scheme) <= 20
        got = f"not a {scheme} credential" if named else "no 'Bearer ' before the key"
        raise Unauthorized(f"expected 'Bearer <key>': {got}", public=True, field=AUTHORIZATION)
    if not token:
        raise Unauthorized("expected 'Bearer <key>': no key after 'Bearer'", public=True, field=AUTHORIZATION)
    return token


def bearer_token(header: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header value."""
    token = bearer(header)
    if not _TOKEN_PATTERN.fullmatch(token):
        raise Unauthorized("malformed key")
    return token


def authorize(keys: KeyStore, header: str | None) -> ApiKey:
    """The live key behind an Authorization header value, or Unauthorized."""
    token = bearer_token(header)
    key = keys.lookup(token)
    if key is None:
        raise Unauthorized("unknown key")
    if key.revoked:
        raise Unauthorized(f"key {key.key_id} is revoked")
    return key


def policy(
    principal: str, method_arn: str, *, effect: str = "Allow", context: dict[str, str | bool] | None = None
) -> dict[str, Any]:
    """An authorizer response. The resource is widened from the one method to the whole API
    stage, so API Gateway's cached answer for this key serves every route."""
    parts = method_arn.split("/")
    resource = "/".join(parts[:2]) + "/*" if len(parts) >= 2 else method_arn
    out: dict[str, Any] = {
        "principalId": principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": resource}],
        },
    }
    if context:
        out["context"] = context
    return out


def authorizer_context(key: ApiKey) -> dict[str, str | bool]:
    """What the API learns of the caller (``requestContext.authorizer``), in AWS and locally."""
    return {"tenant": key.tenant, "key_id": key.key_id, "operator": key.operator, "act_for_users": key.act_for_users}


def token_context(claims: dict[str, str]) -> dict[str, str | bool]:
    """What the API learns of a caller with a valid JWT: its tenant and the user it acts as."""
    return {"tenant": claims["tenant"], "user": claims["user"], "operator": False}


def identify(keys: KeyStore, header: str | None, oidc: OidcVerifier | None = None) -> dict[str, str | bool]:
    """The authorizer context of an Authorization header value: an API key's, or with ``oidc``
    (the deployment's issuer) a JWT's; else Unauthorized."""
    token = bearer(header)
    if "." in token:  # a key never holds a dot: a token, well-formed or not (``api.oidc`` says which)
        if oidc is None:
            raise Unauthorized("this deployment accepts API keys only: no OIDC issuer is configured", public=True)
        return token_context(oidc.verify(token))
    return authorizer_context(authorize(keys, header))


def caller_of(context: Mapping[str, Any] | None) -> Caller | None:
    """The ``Caller`` an authorizer context describes (API Gateway hands booleans on as the
    strings "true"/"false"), or None without a tenant."""
    ctx = context if isinstance(context, Mapping) else {}
    tenant = ctx.get("tenant")
    if not tenant:
        return None
    user = ctx.get("user") or None

    def flag(name: str) -> bool:
        value = ctx.get(name)
        return value is True or (isinstance(value, str) and value.lower() == "true")

    return Caller(
        tenant=str(tenant),
        user=str(user) if user else None,
        names_users=flag("act_for_users"),
        operator=flag("operator"),
        key_id=str(ctx["key_id"]) if ctx.get("key_id") and not user else None,
    )


_UNQUOTABLE = re.compile(r'["\\\x00-\x1f\x7f-\x9f\u2028\u2029]')
REASON_LIMIT = 300


def quotable(reason: str) -> str:
    """A refusal's reason safe to put between the quotes of a JSON string unescaped: API Gateway
    substitutes ``$context.authorizer.error`` as is into the 401 body and the access log line
    (``infra/api.py``), so a ``"``, a ``\\`` or a control character there would let whatever
    wrote the reason add keys to either. Reasons are our own words (``api.oidc``); this holds
    even if one ever quotes a caller's text. ``"`` becomes ``'``, ``\\`` ``/``, a control
    character a space; at most ``REASON_LIMIT`` characters."""
    swap = {'"': "'", "\\": "/"}
    return _UNQUOTABLE.sub(lambda m: swap.get(m[0], " "), reason)[:REASON_LIMIT]


def token_authorizer(keys: KeyStore, event: dict[str, Any], oidc: OidcVerifier | None = None) -> dict[str, Any]:
    """A Lambda TOKEN authorizer: the tenant of the bearer key (or the tenant and user of a JWT,
    with ``oidc``). A refused key raises Unauthorized (API Gateway's bare 401); a refused token
    is a Deny whose context names why (``error``, made ``quotable``), which the stack's
    ACCESS_DENIED gateway response answers as a 401 JSON body (``infra/api.py``)."""
    method_arn = str(event.get("methodArn", "*"))
    try:
        context = identify(keys, event.get("authorizationToken"), oidc)
    except Unauthorized as exc:
        log.info("refused: %s", exc.reason)
        if exc.public:
            why: dict[str, str | bool] = {"error": quotable(exc.reason)}
            if exc.field:
                why["field"] = exc.field
            return policy("refused", method_arn, effect="Deny", context=why)
        raise
    principal = str(context.get("key_id") or f"{context['tenant']}/{context.get('user')}")
    return policy(principal, method_arn, context=context)


def table_from_env() -> str:
    """The task table, as ``runtime.Settings.from_env`` names it: ``AGENTQ_TABLE`` (what the
    stack sets), else the prefix's table (``runtime`` is imported only then)."""
    table = os.environ.get("AGENTQ_TABLE")
    if table is not None:
        return table
    from agentq.runtime import Settings

    return Settings.from_env().table


def header_authorizer(keys: KeyStore, oidc: OidcVerifier | None) -> Any:
    """An in-process authorizer for a server of our own (``agentq dev``, the events hub): the
    TOKEN authorizer's own function (``token_authorizer``), its policy read back as API Gateway
    reads it: an Allow's context reaches the API; a Deny is a 401 naming the reason in its
    context; a raise, a 401. A ``str | None`` header -> the authorizer context."""

    def authorize(header: str | None) -> dict[str, Any]:
        answer = token_authorizer(keys, {"authorizationToken": header, "methodArn": "local"}, oidc)
        if answer["policyDocument"]["Statement"][0]["Effect"] != "Allow":
            field = answer["context"].get("field")
            raise Unauthorized(str(answer["context"]["error"]), public=True, field=str(field) if field else None)
        return dict(answer["context"])

    return authorize


def key_store_from_env(pool: int = 4) -> KeyStore:
    """The key store of this deployment, over a botocore DynamoDB client of its own."""
    from agentq.aws import botocore_client
    from agentq.storage.dynamodb import DynamoTable

    return KeyStore(DynamoTable(botocore_client("dynamodb", pool=pool), table_from_env()))
