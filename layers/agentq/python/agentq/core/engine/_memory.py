"""The memory stores a tool call sees (``core.tools.memory``): the task's tenant named for it,
its writes fenced by the run's lease and recorded with the task, the step of the ``tool_use``
and the call's id, so a version says which call of which task made it.

A forked task has its parent's attachments and reads the stores as they are now, not as they
were at the fork point: a store is shared knowledge that other tasks keep changing, the fork's
copied steps already hold what the parent read, and a write of the fork is checked against the
content now (``expected_sha256``), which a view of the past could only make conflict.
"""

from __future__ import annotations

from agentq.core.engine._session import LeaseState
from agentq.core.memory import (
    Author,
    MemoryAttachment,
    MemoryDocument,
    MemoryReadOnly,
    MemorySearchHit,
    SearchView,
)
from agentq.core.ports import MemoryBook


class TaskMemory:
    """``MemoryAccess`` for one call of one task."""

    def __init__(
        self,
        book: MemoryBook,
        tenant: str,
        held: LeaseState,
        attachments: list[MemoryAttachment],
        step: int,
        tool_use_id: str,
    ) -> None:
        self.book, self.tenant, self.held = book, tenant, held
        self.access = {a.store: a.access for a in attachments}
        self.step, self.tool_use_id = step, tool_use_id

    def documents_page(
        self, store: str, prefix: str, limit: int, after: str | None
    ) -> tuple[list[MemoryDocument], str | None]:
        return self.book.documents_page(self.tenant, store, prefix, limit=limit, after=after)

    def read(self, store: str, path: str) -> MemoryDocument:
        return self.book.read(self.tenant, store, path)

    def write(self, store: str, path: str, content: str, expected_sha256: str | None) -> tuple[MemoryDocument, bool]:
        if self.access.get(store) != "read_write":
            raise MemoryReadOnly(f"memory store {store!r} is not attached read-write to this task")
        author = Author(type="task", task_id=self.held.lease.task_id, step=self.step, tool_use_id=self.tool_use_id)
        return self.book.write(
            self.tenant, store, path, content, author=author, expected_sha256=expected_sha256, lease=self.held.lease
        )

    def search(self, store: str, query: str, limit: int, view: SearchView) -> list[MemorySearchHit]:
        return self.book.search(self.tenant, store, query, limit=limit, view=view)
