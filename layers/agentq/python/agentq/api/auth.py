"""API keys at the door: a bearer key -> its tenant, or 401.

The keys themselves (hashes in the task table, create / lookup / revoke / list) are
``agentq.storage.api_keys``. This module decides what a presented ``Authorization`` header is
worth, and answers API Gateway. In AWS a Lambda TOKEN authorizer (``functions/authorizer``)
calls ``token_authorizer`` and API Gateway passes ``{"tenant": ..., "operator": ...}`` to the
API in ``requestContext.authorizer`` (API Gateway hands a REST API a boolean context value as
the string ``"true"``/``"false"``: ``agentq.api.app`` reads both). The local API server calls ``authorize`` in-process and puts the
tenant in the same place. A missing, malformed, unknown or revoked key is answered 401 alike:
the answer tells a caller nothing about which keys exist.

What the authorizer Lambda imports, so it stays light: no models, engine, store, runtime or
boto3 (``key_store_from_env`` builds a ``DynamoTable`` over a botocore client; the key store
reads through it without loading boto3).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from agentq.core.errors import AgentqError
from agentq.storage.api_keys import ApiKey, KeyStore

log = logging.getLogger("agentq.auth")

_TOKEN_PATTERN = re.compile(r"aq_[A-Za-z0-9_-]{20,200}")  # fullmatch: `$` would let a trailing newline by


class Unauthorized(AgentqError):
    """No valid API key. ``str()`` is exactly "Unauthorized": what API Gateway expects a TOKEN
    authorizer to raise for a 401; the reason is in ``reason`` (logged, never returned)."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__("Unauthorized")
        self.reason = reason


def bearer_token(header: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header value."""
    if not header:
        raise Unauthorized("no Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization is not 'Bearer <key>'")
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
    return {"tenant": key.tenant, "key_id": key.key_id, "operator": key.operator}


def token_authorizer(keys: KeyStore, event: dict[str, Any]) -> dict[str, Any]:
    """A Lambda TOKEN authorizer: the tenant of the bearer key, or raise Unauthorized (401)."""
    try:
        key = authorize(keys, event.get("authorizationToken"))
    except Unauthorized as exc:
        log.info("refused: %s", exc.reason)
        raise
    return policy(key.key_id, str(event.get("methodArn", "*")), context=authorizer_context(key))


def table_from_env() -> str:
    """The task table, as ``runtime.Settings.from_env`` names it: ``AGENTQ_TABLE`` (what the
    stack sets), else the prefix's table (``runtime`` is imported only then)."""
    table = os.environ.get("AGENTQ_TABLE")
    if table is not None:
        return table
    from agentq.runtime import Settings

    return Settings.from_env().table


def key_store_from_env(pool: int = 4) -> KeyStore:
    """The key store of this deployment, over a botocore DynamoDB client of its own."""
    from agentq.aws import botocore_client
    from agentq.storage.dynamodb import DynamoTable

    return KeyStore(DynamoTable(botocore_client("dynamodb", pool=pool), table_from_env()))
