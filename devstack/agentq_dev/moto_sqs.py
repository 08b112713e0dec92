"""moto's SQS keeps the receipt handle of every message ever deleted (``Queue.deleted_messages``)
so that a second delete of the same message answers success, as SQS does, and never trims it:
the server grows by a few hundred bytes per message for as long as it runs (a long ``agentq dev``
session, a soak). Here each queue keeps its ``RECENT`` most recent handles instead. A handle
is only ever presented again by a worker that received the message moments earlier (a
visibility timeout of seconds locally), so the window loses nothing the local stack can meet.

Also: a long poll waiting on a queue returns as soon as a message of it is made visible again
(``ChangeMessageVisibility`` to 0), as with SQS. moto wakes its waiting long polls only when a
message is sent; one made visible waited out the poll's remaining second, which every hand-on
of a dead worker's tasks (``queueing.recovery``: its messages made visible at once) paid on
top of the resume it measures.

And: a long poll whose client has gone (a worker that ended or was killed while its idle tier
waited its 20 s) stops at its next wake, before it takes a message (``moto_http.client_gone``).
moto went on waiting for the poll's whole wait, and took the next message sent or made visible
(a dead worker's task handed on, at once) for no one: it came back only after its visibility
timeout, one receive nearer the dead-letter queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from agentq_dev import moto_http, moto_version


class ClientGone(ConnectionAbortedError):
    """A long poll's client closed its connection while the poll waited (a ``ConnectionError``:
    ``moto_http`` drops the connection without an answer, as for any client that went away)."""


RECENT = 100_000


class RecentReceipts:
    """The set interface moto uses (``in``, ``add``, ``update``), keeping the newest ``limit``."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RECENT if limit is None else limit
        self._handles: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, handle: object) -> bool:
        return handle in self._handles

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[str]:
        return iter(self._handles)

    def add(self, handle: str) -> None:
        self._handles[handle] = None
        self._handles.move_to_end(handle)
        while len(self._handles) > self.limit:
            self._handles.popitem(last=False)

    def update(self, handles: Iterable[str]) -> None:
        for handle in handles:
            self.add(handle)


@moto_version.verified_patch
def install() -> None:
    """Give every SQS queue moto creates from now on a ``RecentReceipts``, wake the long polls
    of a queue whose message is made visible, and end a long poll whose client has gone."""
    from moto.sqs.models import Queue, SQSBackend

    change_visibility = SQSBackend.change_message_visibility

    def change_message_visibility(self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int) -> None:
        change_visibility(self, queue_name, receipt_handle, visibility_timeout)
        if int(visibility_timeout) == 0:  # visible now: a waiting long poll takes it (the batch comes here too)
            lock = self.get_queue(queue_name)._messages_lock
            with lock:
                lock.notify_all()

    SQSBackend.change_message_visibility = change_message_visibility  # type: ignore[method-assign]
    wait = Queue.wait_for_messages

    def wait_for_messages(self: Any, timeout: int) -> None:
        wait(self, timeout)  # ReceiveMessage's wait between two looks at the queue
        if moto_http.client_gone():
            raise ClientGone("the long poll's client closed its connection")

    Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]
    original = Queue.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.deleted_messages = RecentReceipts()

    Queue.__init__ = __init__  # type: ignore[method-assign]
