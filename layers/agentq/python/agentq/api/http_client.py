"""The HTTP underneath ``agentq.Client``: one API call with its retries (``request``), the
server-sent event stream read a connection at a time (``_sse``), and the API's error answers as
exceptions (``ApiError`` and a subclass per status). An answer that is not the API's (a 2xx
whose body is not JSON, or JSON of another shape: a proxy's or a captive portal's page, another
service or another version of the API at the URL) is ``UnexpectedAnswer`` naming the URL, and a
body cut short is a connection that failed (``ConnectionFailed``, a GET retried first): never the
JSON parser's, pydantic's or http.client's own exception. ``api.client`` adds the API's
resources on top and re-exports every name here."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as ShapeError

from agentq.api.models import TaskEvent, TaskView
from agentq.api.models.base import body_limit
from agentq.core.errors import AgentqError, ValidationError

M = TypeVar("M", bound=BaseModel)


class ApiError(AgentqError):
    """The API answered with an error."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.status = status
        self.code = code

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"HTTP {self.status} {self.code}: {self.message}{where}"

    @staticmethod
    def of(status: int, code: str, message: str, field: str | None = None) -> ApiError:
        if status in (400, 413, 415, 422):
            return InvalidRequest(status, code, message, field)
        kind = {401: AuthenticationError, 403: AuthenticationError, 404: NotFound, 409: Conflict}.get(status)
        if kind is None:
            kind = ServerError if status >= 500 else ApiError
        return kind(status, code, message, field)


class InvalidRequest(ApiError):
    """400, 413, 415, 422: the request is wrong; ``field`` names what to fix."""


class AuthenticationError(ApiError):
    """401/403: no valid API key."""


class NotFound(ApiError):
    """404: no such task for this tenant."""


class Conflict(ApiError):
    """409: the task's state forbids the operation (or an idempotency key was reused)."""


class ServerError(ApiError):
    """5xx."""


class UnexpectedAnswer(ApiError):
    """A 2xx whose body is not the answer the route gives: not JSON, or JSON of another shape (the
    URL is not the API's, or serves another version of it). A retry would change nothing."""

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class _NotStreaming(Exception):
    """The server answered an event stream request with something else (it cannot stream)."""


class ConnectionFailed(AgentqError):
    code = "connection_failed"


class WaitTimeout(AgentqError, TimeoutError):
    code = "wait_timeout"

    def __init__(self, message: str, view: TaskView) -> None:
        super().__init__(message, field="timeout")
        self.view = view


_RETRYABLE = {502, 503, 504}


class HttpClient:
    """The API's URL, key, timeout and retries, and the calls every resource method makes."""

    def __init__(
        self, url: str | None = None, api_key: str | None = None, *, timeout: float = 30, retries: int = 2
    ) -> None:
        url = url or os.environ.get("AGENTQ_URL")
        if not url:
            raise AgentqError("no API URL: pass url= or set AGENTQ_URL (agentq dev prints it)", field="url")
        self.url = _checked_url(url).rstrip("/")
        self.api_key = api_key or os.environ.get("AGENTQ_API_KEY")
        if self.api_key is not None and not _HEADER_TOKEN.fullmatch(self.api_key):
            raise ValidationError(
                "the API key holds a space, a line end or a character outside printable ASCII, which no request "
                "header can carry (a line end pasted with it?)",
                field="api_key",
            )
        self.timeout = timeout
        self.retries = retries

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # ------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry: bool | None = None,
        decode: bool = True,
    ) -> Any:
        """One API call; returns the decoded JSON (``decode=False``: the body's bytes). GETs (and
        anything ``retry=True``) are retried on connection failures and 502/503/504. A body over
        the path's limit (``body_limit``) is the server's 413 naming ``body``, raised before it
        is sent."""
        retry = method == "GET" if retry is None else retry
        url = self.url + path
        if query:
            pairs = {
                k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None
            }
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs, doseq=True)  # a list is a repeated parameter
        all_headers = {"Accept": "application/json", **(headers or {})}
        if self.api_key:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            all_headers["Content-Type"] = "application/json"
            limit = body_limit(path)
            if len(data) > limit:  # the server's 413, said here: sent, it cut the upload off mid-body ("cannot reach")
                message = f"request body of {len(data)} bytes; the limit is {limit} (nothing was sent)"
                raise InvalidRequest(413, "body_too_large", message, "body")
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            req = urllib.request.Request(url, data=data, method=method, headers=all_headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    status, ctype = resp.status, resp.headers.get("Content-Type") or ""
                break
            except urllib.error.HTTPError as err:
                error = _error_of(err.code, err.read())
                if err.code in _RETRYABLE and attempt + 1 < attempts:
                    time.sleep(0.2 * 2**attempt)
                    continue
                raise error from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as err:
                # http.client's own: a body cut short of its Content-Length (IncompleteRead), a
                # status line that is none: the answer did not arrive, as when the connection fails.
                if attempt + 1 < attempts:
                    time.sleep(0.2 * 2**attempt)
                    continue
                raise ConnectionFailed(f"cannot reach {self.url}: {_reason(err)}", field="url") from None
        if not decode:
            return raw
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # not JSON, or not UTF-8
            head = raw[:80].decode("utf-8", "replace")
            message = f"the answer from {url} is not JSON (HTTP {status}, Content-Type {ctype or 'none'}): {head!r}"
            raise UnexpectedAnswer(status, "not_json", message, "url") from None

    def call(
        self,
        model: type[M],
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry: bool | None = None,
    ) -> M:
        """One API call (``request``) whose answer is read as ``model``: an answer of another
        shape is ``UnexpectedAnswer`` naming the URL, not pydantic's ValidationError."""
        data = self.request(method, path, body, query=query, headers=headers, retry=retry)
        try:
            return model.model_validate(data)
        except ShapeError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the answer"
            message = f"unexpected answer from {self.url}{path} (another API version?): {where}: {first['msg']}"
            raise UnexpectedAnswer(200, "unexpected_answer", message, "url") from None

    def _get(self, model: type[M], path: str, **query: Any) -> M:
        return self.call(model, "GET", path, query=query)

    def _sse(self, task_id: str, cursor: str | None, tree: bool, base: str | None = None) -> Iterator[TaskEvent | None]:
        """One connection to the stream (at ``base``: the events hub; default the API): its
        events, then None if it said ``end``. A connection that fails or drops (refused, closed
        before an answer, a chunk cut short: http.client's IncompleteRead) is ``ConnectionFailed``,
        which ``iter_events`` resumes from; data that is no event (not UTF-8, not an event's
        JSON) is ``UnexpectedAnswer``: read again, it would say the same."""
        query = {k: v for k, v in {"tree": "true" if tree else None, "after": cursor}.items() if v}
        base = base or self.url
        url = f"{base}/tasks/{_seg(task_id)}/events" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(url, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=max(self.timeout, 60))
        except urllib.error.HTTPError as err:
            raise _error_of(err.code, err.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            raise ConnectionFailed(f"cannot reach {base}: {_reason(err)}", field="url") from None
        with resp:
            if resp.status == 204:
                yield None
                return
            if "text/event-stream" not in (resp.headers.get("Content-Type") or ""):
                raise _NotStreaming()
            kind, data = "", list[str]()
            lines = iter(resp)
            while True:
                try:
                    raw = next(lines, None)
                except (OSError, http.client.HTTPException) as err:
                    raise ConnectionFailed(f"cannot reach {base}: {_reason(err)}", field="url") from None
                if raw is None:
                    return  # closed without an end: iter_events reconnects
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    raise _malformed(url, f"a line is not UTF-8: {raw[:80]!r}") from None
                if not line:
                    if kind == "end":
                        yield None
                        return
                    if data:
                        yield _event_of("\n".join(data), url)
                    kind, data = "", list[str]()
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))


def _event_of(data: str, url: str) -> TaskEvent:
    try:
        return TaskEvent.model_validate_json(data)
    except ShapeError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the data"
        raise _malformed(url, f"{where}: {first['msg']}: {data[:80]!r}") from None


def _malformed(url: str, what: str) -> UnexpectedAnswer:
    return UnexpectedAnswer(200, "malformed_stream", f"malformed event stream from {url} (another API version?): {what}",
                            "url")  # fmt: skip


# An API key (``aq_...``) or a token (a JWT) is printable ASCII without spaces: what a header carries.
_HEADER_TOKEN = re.compile(r"[!-~]+")


def _checked_url(url: str) -> str:
    """``url`` if a request can be made to it; else a ``ValidationError`` naming ``url`` (what
    urllib and http.client would raise later as a ValueError from deep in a call)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValidationError(f"the API's URL {url!r} holds a space, a line end or a control character", field="url")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ValidationError(f"the API's URL {url!r} is not a URL: {exc}", field="url") from None
    if not parts.hostname:
        raise ValidationError(f"the API's URL {url!r} names no host", field="url")
    if not (parts.path + parts.query).isascii():
        raise ValidationError(f"the API's URL {url!r} holds a character outside ASCII in its path: %-encode it",
                              field="url")  # fmt: skip
    segments = parts.path.split("/")
    if "console" in segments:
        # `agentq dev` prints the console's URL beside the API's; taken for the API's, every
        # call reached a console route, which answered for the body or the asset it was sent
        # ("goal: unknown field", "no console asset 'tasks'") instead of for the URL.
        base = "/".join(segments[: segments.index("console")])
        api = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base, "", ""))
        raise ValidationError(f"{url!r} is the console's URL, the web page the API serves under /console: "
                              f"the API's is {api}", field="url")  # fmt: skip
    return url


def _seg(value: str, field: str = "task_id") -> str:
    """One path segment, every reserved character encoded (a ``/`` too: the server decodes it
    inside the segment); an empty one is refused here, before a request to another route is
    sent (``/tasks//cancel``)."""
    if not value:
        raise ValidationError(f"{field} must not be empty", field=field)
    return urllib.parse.quote(value, safe="")


def _reason(err: Exception) -> str:
    """Why a request failed, in words: URLError's reason, or the exception's own (http.client's
    ``IncompleteRead(16 bytes read, 984 more expected)``), else its type's name."""
    reason = getattr(err, "reason", None) or err
    return str(reason) or type(reason).__name__


def _error_of(status: int, raw: bytes) -> ApiError:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return ApiError.of(status, str(err.get("code", "http_error")), str(err.get("message", "")), err.get("field"))
    # API Gateway's own answers (before our handler): {"message": "Unauthorized"}
    message = str(data.get("message") or data.get("Message") or "") if isinstance(data, dict) else ""
    code = {401: "unauthorized", 403: "forbidden", 429: "throttled"}.get(status, "http_error")
    return ApiError.of(status, code, message or f"HTTP {status}")
