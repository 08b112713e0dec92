"""What every fake model API's HTTP server here shares (tests/fake_messages_api.py,
tests/fake_model_servers.py): the server, which numbers its connections and closes them when it
stops, and the ``Gate`` that holds a reply while it watches the client."""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ModelServer(ThreadingHTTPServer):
    """A model API's HTTP server on 127.0.0.1 that numbers the connections it accepts (a
    request's ``connection``: a client's port may come back on a later one) and, once stopped,
    closes those still open: a client that keeps its connection (the providers' shared SDK
    clients) gets no answer from a stopped server, as from a real one gone down."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.connections: dict[Any, int] = {}  # each open connection's number, from 1
        self._numbers = itertools.count(1)
        self._guard = threading.Lock()
        # A short poll interval keeps shutdown() (and so each test's teardown) near-instant.
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.01}, name=name, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            self.connections[request] = next(self._numbers)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            self.connections.pop(request, None)
        super().shutdown_request(request)

    def number(self, connection: Any) -> int:
        with self._guard:
            return self.connections.get(connection, 0)

    def stop(self) -> None:
        self.shutdown()
        with self._guard:  # held: a handler closing its socket meanwhile would free its number for another
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        self.server_close()
        self._thread.join(timeout=5)


@dataclass
class Gate:
    """A model still thinking: the reply waits until the test ``open``s the gate (or ``limit``
    seconds pass: ``expired``), and the server watches its client meanwhile: a client that
    closes the connection (a call cut by its task's timeout) sets ``hung_up`` and is sent
    nothing. What a test of a cut call asserts on: the server had not answered when the task
    ended, and whether the client hung up or left the request open."""

    limit: float = 30.0
    opened: threading.Event = field(default_factory=threading.Event)
    hung_up: threading.Event = field(default_factory=threading.Event)
    expired: bool = False

    def open(self) -> None:
        self.opened.set()

    def hold(self, connection: socket.socket) -> bool:
        """Wait for the gate; False when the client hung up first (send nothing more)."""
        deadline = time.monotonic() + self.limit
        while not self.opened.wait(0.02):
            if _hung_up(connection):
                self.hung_up.set()
                return False
            if time.monotonic() > deadline:
                self.expired = True
                return True
        return True


def _hung_up(connection: socket.socket) -> bool:
    """The client closed its end: a client awaiting its reply sends nothing, so a readable
    socket with nothing to read (or reset) is one whose client has gone."""
    if not select.select([connection], [], [], 0)[0]:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
