"""Authorizer Lambda (API Gateway TOKEN authorizer): ``Authorization: Bearer <key>`` -> tenant.

Thin over ``agentq.api.auth``: the key's SHA-256 is looked up in the task table; a live key is
answered with an Allow policy for the stage and ``context = {"tenant", "key_id"}``, which API
Gateway hands to the API Lambda as ``requestContext.authorizer``. Anything else raises
"Unauthorized", which API Gateway turns into a 401.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger

from agentq.api.auth import KeyStore, token_authorizer
from agentq.observe import route_core_logs
from agentq.runtime import Settings, client

logger = Logger(service="agentq-authorizer")
route_core_logs(logger)

_settings = Settings.from_env()
_keys = KeyStore(client(_settings, "dynamodb", pool=4), _settings.table)


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return token_authorizer(_keys, event)
