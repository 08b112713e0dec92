"""API Lambda: API Gateway REST proxy events -> the agentq HTTP API (``agentq.api.app``).

The tenant is what the authorizer (``functions/authorizer``) put in
``requestContext.authorizer.tenant``; a request without one is answered 401 (no default tenant).
Each invocation flushes the API's metrics (``tasks_submitted``); the core's log lines go out as
this Logger's JSON.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.api.app import build_app
from agentq.observe import api_metrics, route_core_logs
from agentq.runtime import Settings, build_cipher, build_fanout, build_mcp, build_queues, build_registry, build_store

logger = Logger(service="agentq-api")
route_core_logs(logger)
tracer = Tracer(service="agentq-api")
_settings = Settings.from_env()
app = build_app(
    build_store(_settings),
    build_registry(_settings),
    build_queues(_settings),
    build_fanout(_settings),
    default_tenant=None,
    defaults=_settings.defaults,
    mcp=build_mcp(),
    cipher=build_cipher(_settings),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@api_metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
