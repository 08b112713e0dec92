"""A remote A2A agent an agent definition delegates to (``core.remote_agents``): each becomes a
tool ``a2a__<name>`` of the agent's tasks. Only the reference is stored here: the card URL, the
one host it and the agent it describes may be on, and the vault credential (by name, never its
value) sent to it."""

from __future__ import annotations

from pydantic import Field

from agentq.core.models.strict import StrictModel

REMOTE_AGENT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,39}$"
REMOTE_TOOL_PREFIX = "a2a__"


class RemoteAgentRef(StrictModel):
    name: str = Field(
        pattern=REMOTE_AGENT_PATTERN,
        description="lowercase letters, digits, '-' and '_'; 1-40: the model calls it as the tool a2a__<name>",
    )
    card_url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description="the remote agent's Agent Card (https; http only for a host AGENTQ_A2A_ALLOW names)",
    )
    host: str = Field(
        max_length=262,
        description="the one host (or host:port) the card and the agent it describes may be on",
    )
    credential: str | None = Field(
        default=None,
        max_length=128,
        description="the vault credential sent to it (by name, bound to its host; the model never sees it)",
    )
    description: str | None = Field(
        default=None, max_length=1024, description="what the model is told the agent does (default: the card's)"
    )

    @property
    def tool(self) -> str:
        return f"{REMOTE_TOOL_PREFIX}{self.name}"
