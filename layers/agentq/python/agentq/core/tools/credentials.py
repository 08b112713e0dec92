"""Credentials at egress: what a tool holds instead of a secret, and how ``${vault:NAME}`` in a
request's headers becomes one, for a bound host only (``core.vault``).

``CredentialHandle`` is what ``ctx.credential("github")`` gives a tool: a client that sends the
credential's header with a request to one of its hosts (through the SSRF guard, redirects
re-checked hop by hop, the credential dropped on a hop to any other host, and a redirect whose URL
holds it refused: ``core.tools.fetch.spells_a_value``) and refuses any other destination. It has
no attribute that holds the value, and its repr names only the credential.

``vault_headers`` is the same rule for headers that hold references (``http_fetch``'s
``headers``): each hop's headers are expanded for that hop's host; a reference to a credential
that is not bound there refuses the first hop and is dropped from a redirect's (and a redirect
whose URL echoes it is not followed, as above).

A request that carries a credential goes as the egress proxy sends one (``core.tools.egress``):
without the headers that ask the server to transform its answer (``TRANSFORMING_HEADERS``, the
proxy's own list, in any case: a ``Range`` of an echo is a piece of the value no spelling
matches, and twenty of them spell it), and an answer the redactor cannot read whole, a ``206``
or a body in a coding, is refused before a byte of it is read (``whole_answer``).
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping

from agentq.core.tools.fetch import FetchPolicy, FetchRefused, HeaderSource, Response, Target, get
from agentq.core.vault import (
    TRANSFORMING_HEADERS,
    Credential,
    CredentialRefused,
    CredentialSource,
    expand,
    references,
    refused,
)

MAX_HEADERS = 20
FORBIDDEN_HEADERS = frozenset({"host", "connection", "content-length", "transfer-encoding", "te", "upgrade", "trailer"})


class CredentialHandle:
    """One credential, usable only by sending it to its hosts (``request``)."""

    __slots__ = ("_credential", "_policy", "_source", "hosts", "kind", "name")

    def __init__(
        self, credential: Credential, policy: FetchPolicy | None = None, *, source: CredentialSource | None = None
    ) -> None:
        """``source``: where ``credential`` was read, read again before each hop sends it (a
        handle a tool keeps while the user deletes or rebinds the credential sends it no more)."""
        self._credential = credential
        self._source = source
        self._policy = policy or FetchPolicy.from_env()
        self.name = credential.name
        self.kind = credential.kind
        self.hosts = [str(b) for b in credential.hosts]

    def __repr__(self) -> str:
        return f"CredentialHandle({self.name!r}, hosts={self.hosts!r})"

    def allows(self, url: str) -> bool:
        from agentq.core.tools.fetch import parse_target

        target = parse_target(url)
        return self._credential.allows(target.host, target.port)

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | str | None = None,
        timeout: float = 10.0,
        max_bytes: int = 1_000_000,
    ) -> Response:
        """``method url`` with the credential's header added; a URL whose host the credential is
        not bound to raises ``CredentialRefused`` before anything is sent."""
        plain = untransformed(headers or {})

        def hop(target: Target, number: int) -> Mapping[str, str]:
            credential = self._credential if self._source is None else self._source.get(self.name)
            if credential.allows(target.host, target.port):
                name, value = credential.header()
                return {**plain, name: value}
            if number == 0:
                raise refused(credential, target.host, target.port)
            return plain  # a redirect elsewhere: followed without the credential

        data = body.encode() if isinstance(body, str) else body
        # fetch's errors name the URL and the address, never a header it was sending
        return get(url, max_bytes=max_bytes, timeout=timeout, policy=self._policy, method=method.upper(),
                   headers=hop, body=data, check=whole_answer)  # fmt: skip

    def get(self, url: str, **kwargs: object) -> Response:
        return self.request("GET", url, **kwargs)  # type: ignore[arg-type]

    def post(self, url: str, **kwargs: object) -> Response:
        return self.request("POST", url, **kwargs)  # type: ignore[arg-type]


def check_headers(headers: Mapping[str, str]) -> None:
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"headers: at most {MAX_HEADERS}")
    for name, value in headers.items():
        if name.lower() in FORBIDDEN_HEADERS or name.lower().startswith("proxy-"):
            raise ValueError(f"headers: {name!r} is set by http_fetch itself")
        if not name or any(c in name for c in " :\r\n\t") or any(c in value for c in "\r\n"):
            raise ValueError(f"headers: {name!r} is not a header name and value")


def vault_headers(headers: Mapping[str, str], source: CredentialSource | None) -> HeaderSource:
    """Each hop's headers, ``${vault:NAME}`` expanded for that hop's host (see the module)."""
    referring = {k for k, v in headers.items() if references(v)}
    if referring and source is None:
        from agentq.core.vault import unavailable

        raise unavailable(references(headers[min(referring)])[0], None, None)

    plain = untransformed(headers) if referring else dict(headers)

    def hop(target: Target, number: int) -> Mapping[str, str]:
        out = {k: v for k, v in plain.items() if k not in referring}
        for key in referring:
            assert source is not None
            try:
                out[key] = expand(headers[key], source, target.host, target.port)
            except CredentialRefused:
                if number == 0:
                    raise
        return out

    return hop


def credentialed(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` refer to a credential: the request goes as ``vault_headers`` and
    ``whole_answer`` say."""
    return any(references(v) for v in headers.values())


def untransformed(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without those that ask a server to transform its answer, in any case."""
    return {k: v for k, v in headers.items() if k.lower() not in TRANSFORMING_HEADERS}


def whole_answer(target: Target, response: http.client.HTTPResponse) -> None:
    """Refuse a credentialed request's answer that the redactor cannot read whole, as the egress
    proxy does (``core.tools.egress_answer``), in words that quote none of it: a ``206`` (a
    range of an echo holds a piece of the value no spelling matches) and a body in a content or
    transfer coding but ``chunked`` (the request asked for identity)."""
    where = f"the answer from {target.host}:{target.port} not returned"
    if response.status == 206:
        raise FetchRefused(f"{where}: a 206, and a range of an answer may hold a piece of the credential no "
                           "redaction finds")  # fmt: skip
    named = [*(response.msg.get_all("Content-Encoding") or []), *(response.msg.get_all("Transfer-Encoding") or [])]
    codings = {c.strip().lower() for value in named for c in value.split(",")} - {"", "identity", "chunked"}
    if codings:
        raise FetchRefused(f"{where}: a body in a Content-Encoding or Transfer-Encoding (the request asked for "
                           "identity), which no redaction reads")  # fmt: skip
