"""Callbacks: a task's end POSTed to the URL its submission names (``notify``), signed so the
receiver knows it came from this deployment for this tenant, and aimed only where it is safe.

Signature (Stripe's scheme, which receivers know): ``agentq-signature: t=<unix seconds>,
v1=<hex HMAC-SHA256 of "<t>.<body>" under the tenant's secret>``. ``verify`` checks it and
refuses a timestamp more than five minutes off, so a captured request cannot be replayed later.

Where: ``https://`` only, and never to an internal address (loopback, private, link-local,
metadata...), checked when the task is submitted and again, on the resolved addresses, when the
POST is made (the connection goes to the address that was checked: a DNS answer that changes in
between cannot redirect it). ``AGENTQ_WEBHOOK_ALLOW`` names hosts (``host``, ``host:port``)
that may be contacted anyway, over http too: a development receiver on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import socket
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq.core.errors import ValidationError
from agentq.core.tools.addresses import IPAddress, refusal
from agentq.core.tools.fetch import (
    Deadline,
    FetchRefused,
    HostRule,
    Target,
    _connection,
    _getaddrinfo,
    parse_target,
)

ALLOW_VARIABLE = "AGENTQ_WEBHOOK_ALLOW"
SIGNATURE_HEADER = "agentq-signature"
TOLERANCE_SECONDS = 300
RESOLVE_SECONDS = 5.0  # resolving a callback's host, at each delivery
# The POST as a whole, connect to answer: a receiver (its URL is the tenant's) that drips its
# answer a byte at a time is cut off here, not each read at a socket timeout.
TIMEOUT_SECONDS = 10.0


def longest_delivery_seconds() -> float:
    """The most one ``post`` takes: resolving its host, then the exchange. A deliverer starts a
    delivery only with this much time left, and its batch is sized by it (functions/webhooks)."""
    return RESOLVE_SECONDS + TIMEOUT_SECONDS


def allowed_hosts(env: Mapping[str, str] | None = None) -> list[HostRule]:
    raw = (os.environ if env is None else env).get(ALLOW_VARIABLE, "")
    return [HostRule.parse(part) for part in raw.split(",") if part.strip()]


def _https_only(url: str) -> str:
    return f"callbacks go to https:// URLs only (http:// too for a host {ALLOW_VARIABLE} names), not {url!r}"


def _target(url: str) -> Target:
    """The callback's target, its scheme checked first: a scheme no callback uses is refused
    in the callbacks' own words, not in those of ``http_fetch``, whose URL parser this is."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        return parse_target(url)  # which says what is wrong with it
    if scheme not in ("http", "https"):
        raise FetchRefused(_https_only(url))
    return parse_target(url)


def check_url(url: str, *, field: str = "notify.url", resolve: bool = True) -> None:
    """Refuse (ValidationError naming ``field``) a URL that is not https or leads inside."""
    try:
        target = _target(url)
    except FetchRefused as exc:
        raise ValidationError(f"{field}: {exc}", field=field) from None
    if any(rule.matches(target.host, target.port) for rule in allowed_hosts()):
        return
    if target.scheme != "https":
        raise ValidationError(f"{field}: {_https_only(url)}", field=field)
    if resolve:
        try:
            _checked_addresses(target)
        except FetchRefused as exc:
            raise ValidationError(f"{field}: {exc}", field=field) from None
        except (OSError, TimeoutError):
            pass  # not resolvable now: the delivery resolves it again, and refuses an internal answer


def _checked_addresses(target: Target) -> list[IPAddress]:
    addresses = _resolved(target)
    if not addresses:
        raise FetchRefused(f"{target.host} did not resolve to any address")
    for address in addresses:
        why = refusal(address)
        if why is not None:
            raise FetchRefused(f"{target.host} resolves to {address}, which is {why}")
    return addresses


def _resolved(target: Target) -> list[IPAddress]:
    deadline = Deadline(RESOLVE_SECONDS)
    try:
        return _getaddrinfo(target, deadline)
    finally:
        deadline.cancel()


def signature(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: str, header: str, body: bytes, *, now: float | None = None, tolerance: float = TOLERANCE_SECONDS
) -> bool:
    """Whether ``header`` (the ``agentq-signature`` value) signs ``body`` under ``secret`` and
    is recent: what a receiver calls before trusting a callback."""
    try:
        parts = dict(item.split("=", 1) for item in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, body, timestamp), f"t={timestamp},v1={parts.get('v1', '')}")


@dataclass(frozen=True)
class Delivery:
    """One callback, as queued: what to POST where, and for whom (whose secret signs it)."""

    delivery_id: str  # the same on every attempt (``agentq-delivery``): a receiver dedupes by it
    tenant: str
    url: str
    payload: dict[str, object]
    headers: dict[str, str] = field(default_factory=dict)  # the receiver's own (an A2A push config's auth)

    @classmethod
    def for_task_end(cls, tenant: str, url: str, task: Mapping[str, object], *, finished_at: float | None) -> Delivery:
        """An end's callback. Its id is derived from the end (the task, its status, when it
        ended: ``end_delivery_id``), not drawn: every report of one end (a redelivered
        message's, a duplicate's) queues it under the same ``agentq-delivery``, which a receiver
        de-duplicates on; a later end of the task (after a redrive, a follow-up) has a new one."""
        delivery_id = end_delivery_id(str(task.get("task_id")), str(task.get("status")), finished_at)
        return cls(delivery_id=delivery_id, tenant=tenant, url=url, payload={"type": "task.ended", **task})

    @classmethod
    def for_task_event(cls, tenant: str, url: str, kind: str, task: Mapping[str, object]) -> Delivery:
        """A callback that is not an end: ``task.idle``, ``task.message_received``."""
        return cls(delivery_id=uuid.uuid4().hex, tenant=tenant, url=url, payload={"type": f"task.{kind}", **task})

    def to_json(self) -> str:
        """Without ``headers`` when it has none: a callback's message is as it always was."""
        fields = {k: v for k, v in self.__dict__.items() if k != "headers" or v}
        return json.dumps(fields, default=str)

    @classmethod
    def from_json(cls, raw: str) -> Delivery:
        """The delivery a queue message holds. Raises ``ValueError`` naming what is wrong when it
        is not one (not JSON, not an object, a field missing or of the wrong type): a body no
        attempt can deliver, which the deliverer dead-letters with that reason."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"not a delivery: a JSON {_json_type(data)}, not an object")
        for name in ("delivery_id", "tenant", "url"):
            if name not in data:
                raise ValueError(f"not a delivery: {name} is missing")
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"not a delivery: {name} must be a non-empty string, not {_json_type(data[name])}")
        payload, headers = data.get("payload"), data.get("headers") or {}
        if not isinstance(payload, dict):
            raise ValueError(f"not a delivery: payload must be an object, not {_json_type(payload)}")
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ValueError("not a delivery: headers must be an object of strings")
        return cls(delivery_id=data["delivery_id"], tenant=data["tenant"], url=data["url"], payload=payload,
                   headers=headers)  # fmt: skip


def end_delivery_id(task_id: str, status: str, finished_at: float | None) -> str:
    """The ``agentq-delivery`` of a task's end: the same for every report of that end."""
    ended = "" if finished_at is None else f"{finished_at:.6f}"
    return hashlib.sha256("\0".join(("task.ended", task_id, status, ended)).encode()).hexdigest()[:32]


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for a message saying what came instead."""
    if value is None:
        return "null"
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def post(delivery: Delivery, secret: str, *, now: float | None = None) -> int:
    """POST the delivery, signed; returns the status. Raises on a refused address, a
    connection failure or a timeout (the queue retries it): ``TIMEOUT_SECONDS`` for the whole
    exchange, however the receiver spaces its bytes."""
    target = _target(delivery.url)
    allowed = next((r for r in allowed_hosts() if r.matches(target.host, target.port)), None)
    if allowed is None and target.scheme != "https":
        raise FetchRefused(_https_only(delivery.url))
    addresses = [allowed.literal] if allowed is not None and allowed.literal is not None else None
    if addresses is None:
        addresses = _checked_addresses(target) if allowed is None else _resolved(target)
    body = json.dumps(delivery.payload, default=str).encode()
    timestamp = int(time.time() if now is None else now)
    conn = _connection(target, addresses[0], TIMEOUT_SECONDS)
    deadline = Deadline(TIMEOUT_SECONDS)
    connect = conn._create_connection  # type: ignore[attr-defined]

    def watched(*args: Any) -> socket.socket:
        sock: socket.socket = connect(*args)
        deadline.watch(sock)  # from the TLS handshake on: shut down when the deadline passes
        return sock

    conn._create_connection = watched  # type: ignore[attr-defined]
    try:
        conn.request("POST", target.path, body=body, headers={
            **delivery.headers,
            "Content-Type": "application/json", "User-Agent": "agentq-webhooks/1",
            SIGNATURE_HEADER: signature(secret, body, timestamp), "agentq-delivery": delivery.delivery_id,
            "Connection": "close",
        })  # fmt: skip
        response = conn.getresponse()
        response.read(4096)
        if deadline.expired:  # the shutdown ended the answer early: what was read is cut, not an answer
            raise TimeoutError
        return int(response.status)
    except (OSError, http.client.HTTPException) as exc:
        if deadline.expired:
            raise TimeoutError(f"{target.host} did not take the callback within {TIMEOUT_SECONDS:.1f} s") from None
        raise ConnectionError(f"could not deliver to {target.host}: {type(exc).__name__}: {exc}") from None
    finally:
        deadline.cancel()
        conn.close()
