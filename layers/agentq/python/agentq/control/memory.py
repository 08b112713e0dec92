"""Memory stores as people and submissions use them (``core.memory``): the checks a submission
or an agent version's attachments pass before anything is written, shared by the API, the CLI
and the MCP server."""

from __future__ import annotations

from agentq.core.errors import ValidationError
from agentq.core.memory import MemoryAttachment, MemoryStoreNotFound
from agentq.storage.container import Storage


def check_attachments(store: Storage, attachments: list[MemoryAttachment], *, tenant: str) -> None:
    """Every attached store exists for ``tenant``: a task must not start with a memory its tools
    then cannot find (a missing store is a bad field here, not a missing resource)."""
    for i, attachment in enumerate(attachments):
        try:
            store.memory_stores.get_store(tenant, attachment.store)
        except MemoryStoreNotFound:
            raise ValidationError(
                f"memory[{i}].store: no memory store {attachment.store!r}; create it first (POST /memory-stores)",
                field=f"memory[{i}].store",
            ) from None
