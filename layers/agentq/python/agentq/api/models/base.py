"""What every API shape shares: the limits a caller can rely on, the response base
(``ApiModel``, read leniently), the error body and the health answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Limits a caller can rely on (also in the OpenAPI document as schema bounds).
MAX_BODY_BYTES = 256 * 1024  # larger request bodies answer 413
# POST /workspace-uploads carries an archive as base64: up to what a Lambda's request holds (6 MB).
UPLOAD_PATH = "/workspace-uploads"
MAX_UPLOAD_BODY_BYTES = 5_500_000


def body_limit(path: str) -> int:
    """The largest request body ``path`` takes."""
    return MAX_UPLOAD_BODY_BYTES if path.split("?", 1)[0].rstrip("/") == UPLOAD_PATH else MAX_BODY_BYTES


MAX_PAGE_SIZE = 100  # GET /tasks ?limit=
DEFAULT_PAGE_SIZE = 20
MAX_TRACE_PAGE = 200  # GET /tasks/{id}/trace ?limit=
MAX_EVENT_PAGE = 200  # GET /tasks/{id}/events ?limit=
DEFAULT_EVENT_PAGE = 100
DEFAULT_TRACE_PAGE = 100
MAX_MESSAGE_PAGE = 100  # GET /tasks/{id}/messages ?limit=
# The JSON of a page's texts (escaped: a character may take 12 bytes, two \uXXXX): fewer messages
# once past it. A Lambda's answer is its body escaped once more (at most twice as long) and may
# not pass 6 MB, so a page of 2 MB fits with room for everything else; one message alone (32,000
# characters, 384 KB escaped at most) always does.
MESSAGE_PAGE_BYTES = 2_000_000
# A trace page's events as JSON: fewer than ?limit= once past it (never none), for the reason of
# MESSAGE_PAGE_BYTES (a tool call's input is not cut, and 200 LLM texts of 16,000 characters
# escaped would be some 19 MB).
TRACE_PAGE_BYTES = 2_000_000
# A page of a listing of whole long items (an agent's or a document's versions, the schedules, a
# scope's policy history) as JSON: fewer than ?limit= once past it (never none), for the reason of
# MESSAGE_PAGE_BYTES (32 versions of a 200 KB agent were 6.4 MB: API Gateway's 502).
LISTING_PAGE_BYTES = 2_000_000
MAX_LISTING_PAGE = 100  # ?limit= of those listings
TRACE_TEXT_CHARS = 16_000  # longer LLM texts and tool outputs in a trace page are cut (``truncated``)
MAX_NOTE_CHARS = 4_000
# A held call's id names its APPROVAL# item, whose sort key DynamoDB caps at 1,024 bytes: no
# pending call has a longer one.
MAX_TOOL_USE_ID_CHARS = 1_000
TASK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
MAX_CURSOR_CHARS = 1024  # a page cursor (?cursor= of GET /tasks and /trace); longer is 400 invalid_cursor
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"  # unpadded base64url: what the API writes
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]{1,255}$"  # visible ASCII
GOAL_PREVIEW_CHARS = 200


class ApiModel(BaseModel):
    """A response shape: unknown fields are ignored when a client reads one."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# ------------------------------------------------------------------ errors


class ErrorDetail(ApiModel):
    code: str = Field(description="stable, for scripts: validation_error, invalid_json, task_not_found, ...")
    message: str
    field: str | None = Field(default=None, description="the request field at fault, dotted (constraints.max_tokens)")
    scope: dict[str, str] | None = Field(
        default=None, description="scope_stopped (423): the stopped scope, {kind: tenant|user|agent|key, value}"
    )


class ErrorResponse(ApiModel):
    error: ErrorDetail


class LivePath(ApiModel):
    """Where this deployment serves watchers (``GET /health`` names it; absent: the API's own route)."""

    protocol: Literal["sse"] = Field(description="server-sent events, as GET /tasks/{task_id}/events answers them")
    url: str = Field(
        description="the events hub's base URL: GET <url>/tasks/{task_id}/events with the same key or token, "
        "query, Accept and Last-Event-ID as the API's route, answering the same events with the same ids"
    )


class Health(ApiModel):
    status: Literal["ok"]
    version: str
    live: LivePath | None = Field(
        default=None,
        description="the events hub, when the deployment runs one: watchers follow it and fall back to the "
        "API's GET /tasks/{id}/events (SSE or JSON pages) whenever it fails, resuming from their last event id",
    )
