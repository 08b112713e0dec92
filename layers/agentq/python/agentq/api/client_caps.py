"""The caps per end user, agent and API key through the API (``/caps``, ``core.caps``), for the
``agentq caps`` command and any Python caller: functions over a ``Client`` (kept out of
``api/client.py``, which holds every other resource within its module size)."""

from __future__ import annotations

from typing import Any

from agentq.api.http_client import HttpClient, _seg
from agentq.api.models.caps import CapList, CapView


def put_cap(client: HttpClient, scope: str, name: str, limits: dict[str, Any]) -> CapView:
    """Replace the caps of one end user, agent or API key of the tenant; a None limit is left out."""
    sent = {k: v for k, v in limits.items() if v is not None}
    return client.call(CapView, "PUT", f"/caps/{_seg(scope, 'scope')}/{_seg(name, 'name')}", sent, retry=True)


def list_caps(client: HttpClient, scope: str | None = None) -> list[CapView]:
    return client._get(CapList, "/caps", scope=scope).caps


def delete_cap(client: HttpClient, scope: str, name: str) -> CapView:
    return client.call(CapView, "DELETE", f"/caps/{_seg(scope, 'scope')}/{_seg(name, 'name')}")
