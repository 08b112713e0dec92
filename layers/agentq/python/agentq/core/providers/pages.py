"""A 200 that is a page, not a reply, and what the budget makes of it (ARCHITECTURE 4).

A captive portal, a corporate proxy's sign-in or a gateway's error page can come back with
status 200 where a model's reply was asked. The APIs' replies are JSON or an event stream; a
page is markup (its first character ``<``). A page read to the end its framing declared is
everything the server sent, and no reply began in it: nothing billed can be charged to it, so
the call's hold goes back (``MalformedReply.whole``) instead of staying counted as unknown.

Anything else that is not a reply may be part of one, and stays possibly billed: a body cut
short; JSON of another shape (a reply without its usage, or the prefix of a reply that a proxy
cut and framed again); a body whose end was never declared (HTTP/1.0's, ending where the
connection closed); a body in an encoding the client did not decode; a status other than 200 (a
202 from a gateway that queued the request); whatever a streamed Converse call gets that is no
event stream (botocore reads it as one, and fails).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentq.core.providers.retry import MalformedReply

# What a page (not a reply) is sent as: a streamed call reads such a body itself (``streamed_page``).
PAGE_TYPES = ("text/html", "application/xhtml+xml", "text/xml", "application/xml")
# What httpx decodes for certain (it leaves the bytes of an encoding it has no decoder for as
# they came, and a compressed reply's bytes may begin with ``<``).
DECODED = ("", "identity", "gzip", "deflate")


def is_markup(body: bytes) -> bool:
    """The body is markup: its first character, past whitespace and a byte order mark, is ``<``."""
    return body.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] == b"<"


def declared_end(response: Any) -> bool:
    """An httpx response (the Anthropic and OpenAI SDKs') whose body declared where it ends:
    HTTP/2's frames, a ``Content-Length`` or the chunked encoding's last chunk. httpx raises
    when such a body stops short (``RemoteProtocolError``), so once read without an error it
    was read whole."""
    headers = response.headers
    return bool(response.http_version == "HTTP/2" or "content-length" in headers or is_chunked(headers))


def is_chunked(headers: Any) -> bool:
    """The body is sent in chunks, so its last (empty) chunk says where it ends."""
    return "chunked" in str(headers.get("transfer-encoding", "")).lower()


def is_page(response: Any, body: bytes) -> bool:
    """An httpx response that is a page read whole (see the module docstring)."""
    decoded = str(response.headers.get("content-encoding", "")).lower() in DECODED
    return bool(response.status_code == 200 and declared_end(response) and decoded and is_markup(body))


def content_type(headers: Any) -> str:
    return str(headers.get("content-type") or "no content type")


def parsed_or_page(raw: Any) -> Any:
    """A Stainless SDK's raw response (``with_raw_response``: the Anthropic and OpenAI SDKs)
    parsed as ``create`` would have returned it; a body that is not JSON is a ``MalformedReply``,
    ``whole`` when it is a page (the SDK hands back the text of a page sent as ``text/html``,
    and raises a bare JSON error for one sent as JSON)."""
    response = raw.http_response
    try:
        parsed = raw.parse()
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError: not JSON
        said = f"not JSON ({exc.msg} at char {exc.pos})" if isinstance(exc, json.JSONDecodeError) else "not JSON"
        raise MalformedReply(said, whole=is_page(response, response.content)) from exc
    if isinstance(parsed, str):  # the SDK's text of a body that is not typed JSON
        page = is_page(response, response.content)
        raise MalformedReply(f"a 200 of {content_type(response.headers)}, not a reply", whole=page)
    return parsed


def streamed_page(
    response: Any, timed_out: Callable[..., Exception], broken: Callable[..., Exception]
) -> MalformedReply | None:
    """Where a stream was asked: a 200 sent as a page type is read here, and is a
    ``MalformedReply``, ``whole`` when it is a page; None for anything else, which the SDK reads
    as the stream it should be. A read that fails raises the SDK's own error (``timed_out`` or
    ``broken``, each given the request), as the SDK fails a stream it reads."""
    if not content_type(response.headers).lower().startswith(PAGE_TYPES):
        return None
    try:
        body = bytes(response.read())
    except Exception as exc:  # cut while read: possibly billed, as any broken reply
        error = timed_out if "Timeout" in type(exc).__name__ else broken
        raise error(request=response.request) from exc
    said = f"a 200 of {content_type(response.headers)} that carried no message, where an event stream was asked"
    return MalformedReply(said, whole=is_page(response, body))
