"""Noticing that a stream's client hung up while the stream waits for its task.

Why: a stream learns its client is gone only when a write fails, and an idle stream writes
only its keep-alive, every 15 s. Until then its thread, its poller subscription and its slot
under the caps (``api/stream_caps.py``) stay taken: a user opening pages faster than that
reached the per-user cap (20) with streams nobody read and was refused 429.

How: one thread per server watches every open stream's socket for readability (one
``selectors`` set, epoll on Linux: no cost while nothing happens). A stream's client sends
nothing after its request, so a socket turning readable is its hang-up: a peek reads the end
(or an error) and the stream is woken to end now. A client that sends bytes instead is left to
the writes, as before (its socket is no longer watched, so it is not seen again and again).
A client that half-closes its side after its request (no browser, ``curl`` or our client does)
is taken for gone: its stream ends without ``event: end`` and it resumes from its last id.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Callable

SELECT_SECONDS = 1.0  # how often the watcher looks whether it still has sockets to watch


class HangUps:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, wake: threading.Event) -> Callable[[], bool]:
        """Watch ``sock`` until ``forget``: once its client hangs up, ``wake`` is set and the
        answer (a ``() -> bool``) says so."""
        gone = threading.Event()
        with self.lock:
            self.selector.register(sock, selectors.EVENT_READ, (wake, gone))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="stream-hang-ups", daemon=True)
                self.thread.start()
        return gone.is_set

    def forget(self, sock: socket.socket) -> None:
        """Stop watching ``sock`` (before it is closed: its descriptor may be reused)."""
        with self.lock, contextlib.suppress(KeyError, ValueError):  # not watched (any more)
            self.selector.unregister(sock)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.selector.get_map():
                    self.thread = None  # nothing to watch: a later ``watch`` starts another
                    return
            for key, _ in self.selector.select(timeout=SELECT_SECONDS):
                sock, (wake, gone) = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                try:
                    peeked = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue  # not readable after all
                except OSError:
                    peeked = b""  # reset, or closed under us: gone either way
                self.forget(sock)
                if not peeked:
                    gone.set()
                    wake.set()
