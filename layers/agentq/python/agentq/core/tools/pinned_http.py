"""An httpx transport whose connections go only to addresses a guard checked, never to a name.

A guard that resolves a host and refuses internal addresses protects nothing if the HTTP
client then resolves the name again to connect: DNS may answer the check with a public address
and the connection with 127.0.0.1, 10.x or 169.254.169.254 (rebinding), and the request, with
whatever credential header it carries, reaches the inside. ``http_fetch`` closes this by
connecting to the checked address itself (``core.tools.fetch``); a client built on httpx (the
``a2a-sdk``'s) is given this transport instead:

- ``Pins`` holds, for each ``host:port``, the addresses its guard checked (the caller pins them
  as it checks);
- the transport is httpcore's own connection pool with a network backend of ours
  (``network_backend``, httpcore's public hook; httpx's transport does not take one) whose
  ``connect_tcp`` connects to those addresses instead of the name, and refuses, failing closed,
  a ``host:port`` nothing pinned: an unchecked name is never resolved here;
- TLS runs over that connection with the URL's name (httpcore's ``start_tls``), so SNI and the
  certificate check are the name's, as is the ``Host`` header httpx writes from the URL;
- no proxy: the pool has none, and a client using it should be made with ``trust_env=False``
  (no proxy and no ``.netrc`` from the environment): a proxy would connect by the name itself.
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import typing
from collections.abc import AsyncIterator, Iterable, Iterator

import httpcore
import httpx

from agentq.core.vault import Credential

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# httpcore's errors as httpx's, most specific first (what httpx's own transport raises, so a
# caller tells a failed connect from a dropped one as it would with httpx alone).
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProxyError, httpx.ProxyError),
)


def _key(host: str, port: int) -> tuple[str, int]:
    """One spelling per host: lower case, no trailing dot, an IP literal in ipaddress's form
    (a guard's ``Target.host`` and httpcore's origin host may spell the same host differently)."""
    host = host.strip("[]").rstrip(".").lower()
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    return host, port


class Pins:
    """The checked addresses of each ``host:port`` one client may connect to."""

    def __init__(self) -> None:
        self._pins: dict[tuple[str, int], tuple[IPAddress, ...]] = {}

    def pin(self, host: str, port: int, addresses: Iterable[IPAddress]) -> None:
        """``host:port`` connects to ``addresses`` from now on (its latest check's)."""
        self._pins[_key(host, port)] = tuple(addresses)

    def addresses(self, host: str, port: int) -> tuple[IPAddress, ...]:
        return self._pins.get(_key(host, port), ())


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's AnyIO backend, connecting to a host's pinned addresses in turn."""

    def __init__(self, pins: Pins) -> None:
        self._pins = pins
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = self._pins.addresses(host, port)
        if not addresses:
            raise httpcore.ConnectError(f"refusing to connect to {host}:{port}: no address of it was checked")
        last: Exception | None = None
        for address in addresses:  # an IP literal: the inner backend does not resolve it
            try:
                return await self._inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("refusing to connect to a unix socket: only pinned TCP addresses")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncBaseTransport):
    """httpx over an httpcore pool whose every connection goes to a pinned address."""

    def __init__(self, pins: Pins, *, ssl_context: ssl.SSLContext | None = None) -> None:
        # httpx's default trust store (certifi, or SSL_CERT_FILE/SSL_CERT_DIR when set), as before.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or httpx.create_ssl_context(), network_backend=PinnedBackend(pins)
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            answer = await self._pool.handle_async_request(core)
        assert isinstance(answer.stream, typing.AsyncIterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream),
            extensions=answer.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: typing.AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core, mapped in _ERRORS:
            if isinstance(exc, core):
                raise mapped(str(exc)) from exc
        raise


class BoundCredential(httpx.Auth):
    """A vault credential's header on each request to a host:port it is bound to, on no other.

    Set as a client's default header it would go with every request the client makes, wherever a
    card (the remote's word) sends it; as the client's ``auth`` it is decided per request from the
    request's own URL (the name, as pinned connections keep it), and a port the binding does not
    name gets nothing."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def auth_flow(self, request: httpx.Request) -> typing.Generator[httpx.Request, httpx.Response, None]:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        if self.credential.allows(url.host, port):
            name, value = self.credential.header()
            request.headers[name] = value
        yield request


__all__ = ["BoundCredential", "PinnedBackend", "PinnedTransport", "Pins"]
