"""botocore's answers in the retry loop's terms, for the Bedrock Converse provider: each failure
as a ``CallFailure`` (a status, a timeout, no connection, a reply that is not one) and whether it
can have been billed (ARCHITECTURE 4), and the check of a 200's body that botocore does not make
(``whole_or_cut``, a ``before-parse`` hook). The httpx SDKs' counterparts are in ``retry``
(``no_reply_began``) and ``pages``."""

from __future__ import annotations

import http.client
from typing import Any

import botocore.eventstream
import botocore.exceptions
import botocore.parsers

from agentq.core.providers import pages
from agentq.core.providers.retry import CallFailure, MalformedReply, error_status_answered

# ConverseStream's exception events carry a code but no HTTP status: the status each stands for.
STREAM_EXCEPTION_STATUS = {
    "throttlingException": 429,
    "serviceUnavailableException": 503,
    "internalServerException": 500,
    "modelStreamErrorException": 500,
    "validationException": 400,
}


def botocore_failure(exc: Exception) -> CallFailure | None:
    """botocore's exceptions in the retry loop's terms: a ``ClientError`` by its HTTP status
    (ThrottlingException 429, ServiceUnavailableException 503, ValidationException 400, ...),
    a read timeout, no connection, or a 200 botocore could not parse."""
    if isinstance(exc, botocore.exceptions.ClientError):
        meta: dict[str, Any] = dict(exc.response.get("ResponseMetadata") or {})
        error: dict[str, Any] = dict(exc.response.get("Error") or {})
        status = int(meta.get("HTTPStatusCode") or STREAM_EXCEPTION_STATUS.get(str(error.get("Code")), 500))
        return CallFailure(
            "status", status, error.get("Code") or None, str(error.get("Message") or exc), meta.get("HTTPHeaders"),
            unbilled=error_status_answered(meta.get("HTTPStatusCode")),
        )  # fmt: skip
    if isinstance(exc, botocore.exceptions.ConnectTimeoutError):  # no connection was made
        return CallFailure("timeout", detail=str(exc), unbilled=True)
    if isinstance(exc, botocore.exceptions.ReadTimeoutError):
        return CallFailure("timeout", detail=str(exc))
    if isinstance(exc, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)):
        return CallFailure("connection", detail=str(exc), unbilled=closed_before_any_reply(exc))
    if isinstance(exc, botocore.parsers.ResponseParserError):
        return CallFailure("malformed", detail=str(exc).splitlines()[0][:200])
    if isinstance(exc, botocore.eventstream.ParserError):  # a ConverseStream 200 that is no event stream
        return CallFailure("malformed", detail=f"not an event stream ({str(exc)[:150]})")
    return None


WHOLE_OR_CUT = "agentq-whole-or-cut"


def whole_or_cut(response_dict: dict[str, Any], **_: Any) -> None:
    """A Converse 200's body before botocore parses it, which cannot tell a cut reply from a page:
    botocore does not hold a body to its ``Content-Length`` (half of one reads as ``{}``) and
    parses one that is not JSON as ``{"message": <body>}``, so both would reach
    ``to_llm_response`` as the same reply of no shape. Here a body short of its length is a cut
    reply (possibly billed), as is an encoded body or one that is not UTF-8 (botocore would
    fail on either with a bare ``UnicodeDecodeError``); a page read to its declared end
    (``pages``: status 200, markup) is no reply (``MalformedReply.whole``: nothing billed);
    anything else goes on to botocore as before. (A ConverseStream 200 that is no event stream
    is botocore's ``eventstream.ParserError``: malformed, possibly billed.)"""
    body, headers = response_dict.get("body"), response_dict.get("headers") or {}
    status = int(response_dict.get("status_code") or 0)
    if not 200 <= status < 300 or not isinstance(body, bytes):
        return
    declared = str(headers.get("content-length") or "")
    if declared.isdigit() and len(body) < int(declared):
        raise MalformedReply(f"a 200 cut in its body ({len(body)} of its {declared} bytes)")
    encoding = str(headers.get("content-encoding") or "identity").lower()
    if encoding != "identity":  # botocore neither asks for nor decodes one: its parser would fail on the bytes
        raise MalformedReply(f"a 200 of a {encoding} encoded body, which botocore does not decode")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:  # botocore's parser decodes it as UTF-8 and would fail unclassified
        raise MalformedReply(f"a 200 of {len(body)} bytes that are not UTF-8") from None
    ended = (declared.isdigit() and len(body) == int(declared)) or pages.is_chunked(headers)
    if status == 200 and ended and pages.is_markup(body):
        raise MalformedReply(f"a page of {pages.content_type(headers)}, not a reply", whole=True)


def closed_before_any_reply(exc: botocore.exceptions.BotoCoreError) -> bool:
    """botocore's connection error from which no reply can have been billed (ARCHITECTURE 4, as
    ``retry.no_reply_began`` for the httpx SDKs): no connection made (``EndpointConnectionError``),
    or one closed before any byte of a reply: urllib3's ``ProtocolError`` over http.client's
    ``RemoteDisconnected``, which http.client raises only when the read of the status line found
    the connection closed with nothing on it. A reset while the status line or the body was
    read is another error (``ConnectionResetError``, ``IncompleteRead``): a reply may have been
    under way, so not known unbilled."""
    if isinstance(exc, botocore.exceptions.EndpointConnectionError):
        return True
    error = exc.kwargs.get("error")
    causes = getattr(error, "args", ()) if isinstance(exc, botocore.exceptions.ConnectionClosedError) else ()
    return any(isinstance(cause, http.client.RemoteDisconnected) for cause in causes)
