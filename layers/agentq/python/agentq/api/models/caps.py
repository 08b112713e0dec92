"""Caps per end user, agent and API key as the API shows them (``core.caps``; the write body is
``core.caps.CapLimits``): the caps, and what each window holds now."""

from __future__ import annotations

from pydantic import Field

from agentq.api.models.base import ApiModel
from agentq.core.caps import CapLimits


class WindowUse(ApiModel):
    tokens: int = Field(description="tokens held and spent in the window (a call's hold counts until it settles)")
    usd: str = Field(description="dollars held and spent in the window")
    used_tokens: int = Field(description="of which settled: what the provider reported")
    used_usd: str


class CapView(ApiModel):
    scope: str = Field(description="user, agent or key")
    name: str = Field(description="the end user, the agent's name or the API key's id")
    limits: CapLimits
    hour: WindowUse = Field(description="this clock hour (UTC)")
    day: WindowUse = Field(description="this UTC day")


class CapList(ApiModel):
    caps: list[CapView]
