"""The events hub: one long-running server of task event streams for every watcher, fed by the
table's stream (``python -m agentq.hub``; ECS Fargate behind a load balancer in AWS,
``infra/hub.py``; a thread of ``agentq dev`` locally, ``agentq_dev.stack``).

Why a server of our own: a watcher on the ``events`` function is a Lambda execution held for as
long as it watches (10,000 watchers, 10,000 executions, about $257 an hour); on AppSync Events or
an API Gateway WebSocket every message is billed per delivery, $3.60 an hour per 1,000 watchers
at one live-text message a second (docs/ARCHITECTURE.md, invariant 10, "Live events at scale").
Here a watcher is a socket and a thread of a process that serves thousands, and the table is
read once per change per watched task whatever the number of its watchers.

What it serves is the API's own ``GET /tasks/{id}/events`` (SSE and JSON pages; the same checks
before any event, the same frames, ids and cursors: ``api/http_server.py`` with an ``EventHub``),
authorised in-process by the API's own authorizer function (API keys and OIDC tokens:
``api.auth.header_authorizer``), and ``/health`` for the load balancer. Its pollers read a task
when the table's stream says it was written (``api/stream_feed.py``), not every 300 ms. A
tenant and a token's user may hold only so many streams open (``api/stream_caps.py``); an open
stream is authorised again every ``api.authorizer_cache_seconds`` (ended when its key is revoked
or its token expired) and lives an hour at most (``EventHub``), and its client resumes. It writes
nothing: its role reads the table and its stream.
"""

from __future__ import annotations

import logging
import os

from agentq.api.app import build_app
from agentq.api.auth import header_authorizer
from agentq.api.event_hub import EventHub, authorize_seconds
from agentq.api.http_server import ApiServer
from agentq.api.oidc import OidcSettings, OidcVerifier
from agentq.api.stream_caps import StreamCaps
from agentq.api.stream_feed import StreamFeed
from agentq.runtime import Settings, build_fanout, build_mcp, build_queues, build_registry, build_store, client
from agentq.storage.table_stream import TableStream

IDLE_READ_SECONDS = 30.0  # a fed poller's own read, should the stream miss a change
STREAMS_PER_TENANT = 1000  # per hub server (AGENTQ_HUB_STREAMS_PER_TENANT)
STREAMS_PER_USER = 20  # per hub server, a token's user (AGENTQ_HUB_STREAMS_PER_USER)


def caps_from_env(environ: dict[str, str] | None = None) -> StreamCaps:
    env = os.environ if environ is None else environ
    return StreamCaps(
        int(env.get("AGENTQ_HUB_STREAMS_PER_TENANT", STREAMS_PER_TENANT)),
        int(env.get("AGENTQ_HUB_STREAMS_PER_USER", STREAMS_PER_USER)),
    )


def build_hub(
    settings: Settings,
    *,
    authorizer: object | None = None,
    local: bool = False,
    caps: StreamCaps | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    interval: float = 0.4,
    idle_read: float = IDLE_READ_SECONDS,
) -> tuple[ApiServer, StreamFeed]:
    """The hub's server and its feed, not started. ``authorizer``: a header -> authorizer context
    (None: the deployment's, from the table's keys and ``AGENTQ_OIDC``; with ``local``, none: the
    one local user, as the local API without auth)."""
    store = build_store(settings, pool=128)
    if authorizer is None and not local:
        oidc = OidcSettings.from_env()
        authorizer = header_authorizer(store.api_keys, OidcVerifier(oidc) if oidc else None)
    app = build_app(store, build_registry(settings), build_queues(settings), build_fanout(settings),
                    default_tenant=None, defaults=settings.defaults, mcp=build_mcp())  # fmt: skip
    hub = EventHub(store, idle_interval=idle_read, caps=caps or caps_from_env(), authorize_every=authorize_seconds())
    stream = TableStream(client(settings, "dynamodbstreams", pool=4), client(settings, "dynamodb", pool=4),
                         settings.table)  # fmt: skip
    feed = StreamFeed(hub, stream, interval=interval)
    server = ApiServer(app.resolve, host=host, port=port, authorizer=authorizer,  # type: ignore[arg-type]
                       hub=hub, hub_only=True, healthy=lambda: feed.healthy)  # fmt: skip
    return server, feed


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    server, feed = build_hub(Settings.from_env(), host="0.0.0.0", port=int(os.environ.get("PORT", "8080")))
    feed.start()
    server.start().thread.join()


if __name__ == "__main__":
    main()
