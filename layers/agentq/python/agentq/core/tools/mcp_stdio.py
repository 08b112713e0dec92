"""The stdio transport of an MCP session (``core.tools.mcp``): a server the worker starts, its
messages one JSON line each, every line refused once over ``MAX_REPLY_BYTES`` as it is read,
before it is held whole, as an HTTP reply is (``core.tools.mcp_http``).

Why not the ``mcp`` package's ``stdio_client``: it joins a line's chunks with no bound, copying
the line so far again for every chunk, then parses it whole. One 32 MB line took 66 s and grew
a worker by 352 MB. A stdio server is a command the operator chose, but it relays what it
fetches, and a broken one writes without a newline: one such reply must not take down the
worker and every task it runs (a read-only call runs again on resume), nor the API process
that lists the server's tools when an agent version is created.

The rest follows the package's transport (and the MCP lifecycle's shutdown): the server in its
own process group, its stdin closed at the end, a grace period to exit, then the group killed.
A server whose reply was refused gets no grace: what it writes next is never read, and it is
killed at once. POSIX only, as the workers are.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager, suppress
from typing import TYPE_CHECKING, TextIO

import anyio
from anyio.abc import ByteReceiveStream, Process

from agentq.core.tools.mcp_http import ReplyBound, ReplyRefused

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams
    from mcp.shared.message import SessionMessage

GRACE_SECONDS = 2.0
"""How long a server has to exit once its stdin is closed, and again after SIGTERM."""


@asynccontextmanager
async def bounded_stdio_client(
    command: list[str], env: dict[str, str], bound: ReplyBound, errlog: TextIO = sys.stderr
) -> AsyncIterator[TransportStreams]:
    """Start ``command`` (the package's default environment with ``env`` over it) and carry an
    MCP session over its stdin and stdout. A line over ``bound`` is refused (``bound.refused``
    says so) and ends the session's stream, so whatever was waiting fails at once."""
    from mcp.client.stdio import get_default_environment

    process = await anyio.open_process(
        command, env=get_default_environment() | env, stderr=errlog, start_new_session=True
    )
    read_writer, read_stream = anyio.create_memory_object_stream["SessionMessage | Exception"](0)
    write_stream, write_reader = anyio.create_memory_object_stream["SessionMessage"](0)
    writer_done = anyio.Event()
    assert process.stdin is not None and process.stdout is not None

    async def reader() -> None:
        assert process.stdout is not None
        try:
            async with read_writer, aclosing(_lines(process.stdout, bound)) as lines:
                async for line in lines:
                    await read_writer.send(_parse(line))
        except ReplyRefused:
            await _close(process.stdout)  # its next write fails: nothing more of it is read
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session or our shutdown closed a stream
        with suppress(Exception):  # ends as _stop closes stdout, or as the task group is cancelled
            async for _ in process.stdout:  # discarded, a chunk at a time: a server flushing
                pass  # its output must not block on a full pipe and miss its chance to exit

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the server stopped reading: the session sees the end
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the server must not outlive a cancelled call
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(0.5):  # what the session already handed over is sent
                    await writer_done.wait()
                await _stop(process, refused=bound.refused is not None)
            tg.cancel_scope.cancel()


async def _lines(stdout: ByteReceiveStream, bound: ReplyBound) -> AsyncGenerator[bytes, None]:
    """The server's lines, each refused once over ``bound.limit`` bytes before its end came:
    at most the bound and one chunk are ever held."""
    pending = bytearray()
    async for chunk in stdout:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            if len(pending) > bound.limit:
                raise bound.refuse(f"a reply over the {bound.limit} bytes one reply may hold")
            yield bytes(pending)
            pending.clear()
            start = end + 1
        pending += chunk[start:]
        if len(pending) > bound.limit:
            raise bound.refuse(f"a reply over the {bound.limit} bytes one reply may hold")


def _parse(line: bytes) -> SessionMessage | Exception:
    """One line as a message, or the error the session surfaces for a line that is none."""
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _stop(process: Process, *, refused: bool) -> None:
    """Close its stdin and give it the grace period (none after a refused reply), then end
    what is left of its process group (a child it started outlives it otherwise): SIGTERM,
    SIGKILL after the grace; nothing if the group is gone."""
    from mcp.os.posix.utilities import terminate_posix_process_tree

    assert process.stdin is not None and process.stdout is not None
    await _close(process.stdin)
    if not refused:
        with anyio.move_on_after(GRACE_SECONDS):
            while process.returncode is None:
                await anyio.sleep(0.01)
    await terminate_posix_process_tree(process, 0.0 if refused else GRACE_SECONDS)
    await _close(process.stdout)
    with anyio.move_on_after(GRACE_SECONDS):
        await process.aclose()


async def _close(stream: ByteReceiveStream | anyio.abc.ByteSendStream) -> None:
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.aclose()
