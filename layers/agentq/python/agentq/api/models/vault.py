"""The vault as the API shows it: a credential's name, owner, kind, hosts and dates, never its
value (``core.vault``; the write body is ``core.vault.CredentialWrite``)."""

from __future__ import annotations

from pydantic import Field

from agentq.api.models.base import ApiModel
from agentq.core.vault import CredentialInfo


class CredentialList(ApiModel):
    user: str | None = Field(description="whose credentials these are; null: the tenant's own")
    credentials: list[CredentialInfo]
