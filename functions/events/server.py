"""Event streams in AWS: ``GET /tasks/{id}/events`` served by a long-lived HTTP server behind the
Lambda Web Adapter, because the Python managed runtime cannot stream a Lambda response. The
``a2a`` function runs it too, for ``POST /a2a/{agent}`` (``infra/a2a.py``): its A2A streams are
written event by event (``agentq.api.live_stream``).

API Gateway invokes this function with response streaming (``responseTransferMode: STREAM``); the
adapter turns each invocation into an HTTP request to this server and streams its answer back.
The server is the one ``agentq dev`` runs (``agentq.api.http_server``, with an ``EventHub``):
the same checks before any event, the same frames. The tenant is the authorizer's, which the
adapter forwards in the request context header (``context_tenant``); a request without one is
refused. One stream ends itself after ``LIVE_SECONDS`` (14 minutes), before the function's and
the integration's 15-minute timeout (a timeout is a Lambda error, and cuts a frame), and as soon
as its caller's key is revoked (read again every ``api.authorizer_cache_seconds``); the client
resumes with ``Last-Event-ID``. Why this and not a WebSocket API or the Fargate service: docs/ARCHITECTURE.md,
invariant 10.
"""

from __future__ import annotations

import os

from agentq.api.app import build_app
from agentq.api.event_hub import EventHub, authorize_seconds
from agentq.api.http_server import ApiServer, context_tenant
from agentq.api.live_stream import LIVE_SECONDS
from agentq.runtime import Settings, build_fanout, build_mcp, build_queues, build_registry, build_store


def main() -> None:
    settings = Settings.from_env()
    store = build_store(settings)
    app = build_app(
        store,
        build_registry(settings),
        build_queues(settings),
        build_fanout(settings),
        default_tenant=None,
        defaults=settings.defaults,
        mcp=build_mcp(),
    )
    port = int(os.environ.get("AWS_LWA_PORT", "8080"))
    hub = EventHub(store, max_seconds=LIVE_SECONDS, authorize_every=authorize_seconds())
    server = ApiServer(app.resolve, port=port, authorizer=context_tenant, hub=hub)
    server.start().thread.join()


if __name__ == "__main__":
    main()
