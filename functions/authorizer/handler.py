"""Authorizer Lambda (API Gateway TOKEN authorizer): ``Authorization: Bearer <key>`` -> tenant,
and, where the stack configures an OIDC issuer (``AGENTQ_OIDC``, from cdk.json's ``oidc``),
``Authorization: Bearer <JWT>`` -> tenant and user (``agentq.api.oidc``; a refused token is a
Deny naming why, which the stack's gateway response turns into a 401 JSON body).

Thin over ``agentq.api.auth``: the key's SHA-256 is looked up in the task table; a live key is
answered with an Allow policy for the stage and ``context = {"tenant", "key_id"}``, which API
Gateway hands to the API Lambda as ``requestContext.authorizer``. Anything else raises
"Unauthorized", which API Gateway turns into a 401.

Kept light for cold starts (``bench/import_time.py``): the import chain is the key lookup
(``agentq.storage.api_keys`` over the table seam: ``storage.table``, ``storage.dynamodb``,
``storage.keys``), the policy (``agentq.api.auth``), one botocore DynamoDB client and the
powertools Logger; no models, engine, store or boto3, neither at import nor in the first call
(``tests/test_api_auth.py`` checks both).

The client is built here, at import, and not on the first call: deferring it would take its
cost out of the import but put all of it on the first call (``bench/import_time.py
--first-call`` measures both), and where Lambda initialises an environment ahead of a request
(provisioned concurrency, SnapStart, an occasional proactive init) it would move that cost
from the init phase onto a request's path.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from agentq.api.auth import key_store_from_env, token_authorizer
from agentq.api.oidc import OidcSettings, OidcVerifier
from agentq.observe.logs import route_core_logs

logger = Logger(service="agentq-authorizer")
route_core_logs(logger)

_keys = key_store_from_env(pool=4)
_oidc_settings = OidcSettings.from_env()
_oidc = OidcVerifier(_oidc_settings) if _oidc_settings is not None else None  # its JWKS cached per environment


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return token_authorizer(_keys, event, _oidc)
