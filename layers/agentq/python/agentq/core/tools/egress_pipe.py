"""The egress proxy's relay (``core.tools.egress``): one connection's bytes, both ways, in the
thread that serves it, bounded by a silence of ``idle_seconds`` either way; a plain request's
through its framed ``Body`` (nothing after its end goes upstream), a credentialed request's answer
into its ``Answer`` (read whole and redacted before the client gets any of it). Kept apart so the
proxy's module holds its checks, and this one only the copying."""

from __future__ import annotations

import contextlib
import selectors
import socket

from agentq.core.tools.egress_answer import Answer
from agentq.core.tools.egress_request import BadBody, Body


def pipe(
    client: socket.socket,
    upstream: socket.socket,
    idle_seconds: float,
    body: Body | None = None,
    answer: Answer | None = None,
) -> None:
    """Copies bytes both ways in this one thread until both sides have ended, or until no byte
    has moved either way for ``idle_seconds`` (a send that makes no progress as long counts).
    With a plain request's ``body``, the client's bytes go upstream through it (its framed body,
    then nothing), and the upstream's end is the connection's: its one answer is over. With an
    ``answer`` (a credentialed request's), the upstream's bytes go into it, not to the client
    (but an interim head, redacted), until its framed end or the upstream's."""
    peer = {client: upstream, upstream: client}
    open_ = {client, upstream}  # the sides still sending
    client.settimeout(idle_seconds)  # bounds a sendall to a side that stopped reading
    upstream.settimeout(idle_seconds)
    answered = False  # a byte of the upstream's answer went to the client
    with selectors.DefaultSelector() as selector:
        for sock in open_:
            selector.register(sock, selectors.EVENT_READ)
        while open_:
            ready = selector.select(idle_seconds)
            if not ready:
                return  # idle: the caller closes both
            for key, _ in ready:
                src = key.fileobj
                assert isinstance(src, socket.socket)
                try:
                    chunk = src.recv(65536)
                    if chunk:
                        if src is upstream and answer is not None:
                            client.sendall(answer.feed(chunk))
                            if answer.done:
                                return
                            continue
                        if src is client and body is not None:
                            try:
                                chunk = body.feed(chunk)  # b"" once the body is over: dropped
                            except BadBody as exc:
                                exc.answered = answered
                                raise
                        peer[src].sendall(chunk)
                        answered = answered or src is upstream
                        continue
                except OSError:
                    return
                if src is upstream and body is not None:
                    if answer is not None:
                        answer.end()
                    return  # the one answer is over: nothing the client sends now goes anywhere
                selector.unregister(src)
                open_.discard(src)
                with contextlib.suppress(OSError):
                    peer[src].shutdown(socket.SHUT_WR)
