"""The web console: pages served by the API itself under ``/console``.

What the browser gets from these routes is HTML, CSS and JavaScript modules shipped in the
package (``console_assets/``): no build step, nothing fetched from anywhere else, so the
console works offline and its Content-Security-Policy admits this origin only. Every piece of
data a page shows comes from the public HTTP API, called by the browser with the key the person
typed, so the console sees exactly what that key's tenant may see and nothing more. That is
why these routes need no key: they hold no data. The API explorer is powertools' Swagger UI
(its assets are inlined from the powertools package) over the generated OpenAPI document.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver, Router

from agentq.api.conditional import conditional_get

CONSOLE_PATH = "/console"
EXPLORER_PATH = f"{CONSOLE_PATH}/explorer"
ASSETS_DIR = Path(__file__).with_name("console_assets")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# Only this origin: the page's scripts, styles and API calls. Inline script and style are
# refused, so a goal or a tool output rendered into the page cannot run as code.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Revalidate every time (cheap: conditional_get answers 304), so a deploy is seen at once.
ASSET_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def is_console(path: str) -> bool:
    """A console page or asset (public: no tenant, no data)."""
    return path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/")


@cache
def assets() -> dict[str, tuple[str, str]]:
    """File name -> (content type, text): read once per process, from the package."""
    return {
        p.name: (CONTENT_TYPES[p.suffix], p.read_text(encoding="utf-8"))
        for p in sorted(ASSETS_DIR.iterdir())
        if p.suffix in CONTENT_TYPES
    }


def _asset(name: str) -> Response[Any]:
    content_type, text = assets()[name]
    headers = dict(ASSET_HEADERS)
    if name.endswith(".html"):
        headers["Content-Security-Policy"] = CSP
        headers["Referrer-Policy"] = "no-referrer"
    return Response(status_code=200, content_type=content_type, body=text, headers=headers)


def _router() -> Router:
    router = Router()  # type: ignore[no-untyped-call]  # powertools leaves __init__ unannotated

    @router.get(CONSOLE_PATH, include_in_schema=False)
    def console_index() -> Response[Any]:
        # The resolver matches /console and /console/ alike; the page's assets are relative to
        # /console/, and a relative redirect keeps API Gateway's stage prefix (/prod/console/).
        if not router.current_event.path.endswith("/"):
            return Response(status_code=302, headers={"Location": "console/", **ASSET_HEADERS}, body="")
        return _asset("index.html")

    @router.get(f"{CONSOLE_PATH}/<name>", include_in_schema=False)
    def console_asset(name: str) -> Response[Any]:
        if name not in assets():
            body = {"error": {"code": "route_not_found", "message": f"no console asset {name!r}"}}
            return Response(status_code=404, content_type="application/json", body=json.dumps(body))
        return _asset(name)

    return router


def install(app: ApiGatewayResolver, hub_url: str | None = None) -> None:
    """Serve the console and the API explorer from ``app``, and answer conditional GETs
    (``agentq.api.conditional``) on every route, which the console's polling relies on.
    ``hub_url``: the events hub the page follows streams from, the one other origin its
    Content-Security-Policy admits (for ``connect-src`` only).

    The pages' router is made here, one per app, as each route module makes its own: a router
    reads the request from the app it was last included in (``Router.current_event``), so one
    router shared by two apps in a process (the local stack's, rebuilt, and a test's of its own in
    the same process) answered the first app's ``/console`` from the other's state: no event, a 500."""
    app.include_router(_router())
    app.enable_swagger(path=EXPLORER_PATH)
    middlewares: list[Callable[..., Any]] = [conditional_get]
    if hub_url:
        parts = urlsplit(hub_url)
        origin = f"{parts.scheme}://{parts.netloc}"

        def admit_hub(app: ApiGatewayResolver, next_middleware: Callable[..., Any]) -> Any:
            response = next_middleware(app)
            if isinstance(response, Response) and "Content-Security-Policy" in response.headers:
                csp = str(response.headers["Content-Security-Policy"])
                response.headers["Content-Security-Policy"] = csp.replace(
                    "connect-src 'self'", f"connect-src 'self' {origin}"
                )
            return response

        middlewares.append(admit_hub)
    app.use(middlewares)
