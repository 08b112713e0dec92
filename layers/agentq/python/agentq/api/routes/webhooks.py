"""``GET /webhooks/secret``: the caller's callback signing secret (made on first use), with
which it verifies the callbacks it receives (``agentq.core.webhooks.verify``)."""

from __future__ import annotations

from agentq.api.errors import responses
from agentq.api.models import WebhookSecret
from agentq.api.routes.common import ApiDeps, Router


def router(deps: ApiDeps) -> Router:
    routes = Router()

    @routes.get(
        "/webhooks/secret",
        summary="The tenant's callback signing secret",
        description="Callbacks (`notify` on a submission) carry `agentq-signature: t=<unix seconds>,v1=<hex "
        "HMAC-SHA256 of '<t>.<body>'>` under this secret; refuse one more than five minutes old.",
        operation_id="getWebhookSecret",
        tags=["webhooks"],
        responses=responses(200, WebhookSecret),
    )
    def secret() -> WebhookSecret:
        return WebhookSecret(secret=deps.store.webhook_secrets.get_or_create(deps.tenant()))

    return routes
