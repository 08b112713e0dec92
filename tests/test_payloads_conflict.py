"""A create-only put (``If-None-Match: *``, the content-addressed workspace objects) that S3 answers
``409 ConditionalRequestConflict``: another conditional write of the same key was under way (a
zombie and the run that took its task over uploading the same blob). S3's own model says to retry
the upload (botocore's ``PutObjectRequest.IfNoneMatch``); moto never answers it, so a botocore
``before-send`` hook on a real client answers the 409 as S3 would, parsed by botocore's own parser,
and every other request goes to the moto server.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse, HTTPHeaders
from botocore.exceptions import ClientError

from agentq.storage import serdes
from agentq.storage.container import Storage
from agentq.storage.serdes import PayloadStore

from tests.helpers import s3_payloads

CONFLICT = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting conditional operation is currently in progress against this resource.</Message>"
    b"<RequestId>r1</RequestId><HostId>h1</HostId></Error>"
)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


@pytest.fixture
def conflicts(store: Storage) -> Iterator[tuple[PayloadStore, list[str]]]:
    """The store's S3 payloads with a hook that answers the next puts 409 while ``answers`` holds
    an entry: ``"409"`` (the conflict alone) or ``"409 after"`` (the other write lands, then the
    conflict is answered)."""
    payloads = s3_payloads(store)
    answers: list[str] = []

    def hook(request: Any, **_: Any) -> Any:  # an AWSResponse is sent in place of the request
        if not answers:
            return None
        answer = answers.pop(0)
        if answer == "409 after":
            payloads.s3.meta.events.unregister("before-send.s3.PutObject", hook)
            try:  # the other writer's put lands while ours was in conflict with it
                payloads.put_bytes(KEY, b"same content", create_only=True)
            finally:
                payloads.s3.meta.events.register("before-send.s3.PutObject", hook)
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/xml"
        return AWSResponse(request.url, 409, headers, _Raw(CONFLICT))

    payloads.s3.meta.events.register("before-send.s3.PutObject", hook)
    try:
        yield payloads, answers
    finally:
        payloads.s3.meta.events.unregister("before-send.s3.PutObject", hook)


KEY = f"tasks/t/workspace/blobs/{hashlib.sha256(b'same content').hexdigest()}"
Body = Callable[[], bytes | io.BytesIO]


@pytest.mark.parametrize(
    "body", [lambda: b"same content", lambda: io.BytesIO(b"same content")], ids=["bytes", "stream"]
)
def test_a_create_only_put_in_conflict_with_one_that_lands_is_told_the_object_is_there(
    conflicts: tuple[PayloadStore, list[str]], body: Body
) -> None:
    payloads, answers = conflicts
    answers.append("409 after")
    assert payloads.put_bytes(KEY, body(), create_only=True) is False  # was: ClientError ConditionalRequestConflict
    assert payloads.get_bytes(KEY) == b"same content"


@pytest.mark.parametrize(
    "body", [lambda: b"same content", lambda: io.BytesIO(b"same content")], ids=["bytes", "stream"]
)
def test_a_create_only_put_in_conflict_with_one_that_failed_writes_the_object_itself(
    conflicts: tuple[PayloadStore, list[str]], body: Body
) -> None:
    payloads, answers = conflicts
    answers.extend(["409", "409"])
    assert payloads.put_bytes(KEY, body(), create_only=True) is True  # the stream was sent whole again
    assert payloads.get_bytes(KEY) == b"same content" and answers == []


def test_a_conflict_that_does_not_clear_or_a_put_that_may_replace_is_raised(
    conflicts: tuple[PayloadStore, list[str]],
) -> None:
    payloads, answers = conflicts
    answers.extend(["409"] * (len(serdes.CONFLICT_WAITS) + 1))
    with pytest.raises(ClientError) as raised:
        payloads.put_bytes(KEY, b"same content", create_only=True)
    assert raised.value.response["Error"]["Code"] == "ConditionalRequestConflict" and answers == []
    answers.append("409")  # not create-only: a 409 is not this code's to read
    with pytest.raises(ClientError):
        payloads.put_bytes("tasks/t/other", b"x")
