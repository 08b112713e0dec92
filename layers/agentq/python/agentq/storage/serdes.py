"""Conversion between Python values and DynamoDB attribute values, and S3 offload of payloads.

The SerDes seam: DynamoDB has no float and caps items at 400 KB, so floats travel as
Decimal and any payload over ``threshold`` bytes is written to S3 under a key that names
the writer's lease epoch (a zombie's late upload can never overwrite a committed payload).
"""

from __future__ import annotations

import base64
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from agentq.core.ports import Readable

if TYPE_CHECKING:
    from typing import IO

    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

_SER = TypeSerializer()
DESERIALIZER = TypeDeserializer()

DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024


def _to_ddb_value(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_ddb_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_ddb_value(v) for v in value]
    return value


def _from_ddb_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_ddb_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_ddb_value(v) for v in value]
    return value


def to_item(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _SER.serialize(_to_ddb_value(v)) for k, v in data.items() if v is not None}


def to_attr(value: Any) -> dict[str, Any]:
    # The stub types one attribute value as a private TypedDict; items carry them as plain dicts.
    return cast("dict[str, Any]", _SER.serialize(_to_ddb_value(value)))


def to_values(values: dict[str, Any]) -> dict[str, Any]:
    """ExpressionAttributeValues from plain Python values."""
    return {k: to_attr(v) for k, v in values.items()}


def from_item(item: dict[str, Any], *, keep_decimal: frozenset[str] = frozenset()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in item.items():
        value = DESERIALIZER.deserialize(raw)
        out[key] = value if key in keep_decimal else _from_ddb_value(value)
    return out


class Payloads(Protocol):
    """Where payloads too large for an item go (S3, or memory in tests)."""

    threshold: int

    def encode(self, key: str, payload: str) -> dict[str, Any]: ...

    def copy(self, source_key: str, key: str) -> None: ...

    def decode(self, attrs: dict[str, Any]) -> str: ...

    def delete_prefix(self, prefix: str) -> int: ...

    def put_bytes(
        self, key: str, data: bytes | Readable, *, create_only: bool = False, sha256: str | None = None
    ) -> bool: ...

    def get_bytes(self, key: str) -> bytes: ...

    def open_bytes(self, key: str) -> Readable: ...


class MissingObject(LookupError):
    """No object under the key (a workspace's content that should be there: see storage.workspaces)."""


DELETE_OBJECTS_MAX = 1000


# Waits (seconds) before a create-only put tries again after S3's 409 ConditionalRequestConflict:
# another conditional write of the same key was under way (a zombie and the run that took its
# task over uploading the same content-addressed blob). S3 says to retry the upload (PutObject's
# IfNoneMatch, botocore's S3 model); moto never answers it. The retry gets 412 once the other write
# landed (the content is there: False), or writes it if that one failed.
CONFLICT_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8)


def _rewound(body: Any) -> bool:
    """Whether ``body`` can be sent again: bytes, or a stream put back to its start."""
    if isinstance(body, bytes):
        return True
    seek = getattr(body, "seek", None)
    if seek is None:
        return False
    seek(0)
    return True


class PayloadStore:
    """Keeps large payloads out of DynamoDB items."""

    def __init__(self, s3: S3Client, bucket: str, threshold: int = DEFAULT_OFFLOAD_THRESHOLD) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.threshold = threshold

    def encode(self, key: str, payload: str) -> dict[str, Any]:
        """Attributes to store for ``payload``: inline ``body`` or an S3 ``ref``."""
        data = payload.encode()
        if len(data) <= self.threshold:
            return {"body": payload}
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")
        return {"ref": key, "ref_bytes": len(data)}

    def copy(self, source_key: str, key: str) -> None:
        """Server-side copy (a fork takes its own copy of the payloads it inherits)."""
        self.s3.copy_object(Bucket=self.bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": source_key})

    def decode(self, attrs: dict[str, Any]) -> str:
        if "body" in attrs:
            return str(attrs["body"])
        obj = self.s3.get_object(Bucket=self.bucket, Key=attrs["ref"])
        return obj["Body"].read().decode()

    def put_bytes(
        self, key: str, data: bytes | Readable, *, create_only: bool = False, sha256: str | None = None
    ) -> bool:
        """Store ``data`` (bytes, or a stream with a length, sent as it is read) under ``key``;
        ``create_only``: never replace an object already there (``If-None-Match: *``,
        content-addressed objects), False when one was; ``sha256`` (hex): S3 refuses a body
        that does not hash to it (``ChecksumSHA256``)."""
        body = data if isinstance(data, bytes) else cast("IO[bytes]", data)
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if create_only else {}
        if sha256 is not None:
            extra["ChecksumSHA256"] = base64.b64encode(bytes.fromhex(sha256)).decode()
        for wait in (*CONFLICT_WAITS, None):
            try:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, **extra)
            except self.s3.exceptions.ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if create_only and code in ("PreconditionFailed", "412"):
                    return False
                if create_only and code == "ConditionalRequestConflict" and wait is not None and _rewound(body):
                    time.sleep(wait)  # another create of the key is under way: its 412 or our write, next
                    continue
                raise
            return True
        raise AssertionError("not reached")  # the last pass returns or raises

    def get_bytes(self, key: str) -> bytes:
        return self.open_bytes(key).read()

    def open_bytes(self, key: str) -> Readable:
        """The object's body, to read a piece at a time."""
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self.s3.exceptions.NoSuchKey:
            raise MissingObject(key) from None

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many."""
        deleted = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys: list[ObjectIdentifierTypeDef] = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            for start in range(0, len(keys), DELETE_OBJECTS_MAX):
                chunk = keys[start : start + DELETE_OBJECTS_MAX]
                resp = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
                if resp.get("Errors"):
                    error = resp["Errors"][0]
                    raise RuntimeError(
                        f"could not delete s3://{self.bucket}/{error['Key']}: {error.get('Code')} {error.get('Message')}"
                    )
                deleted += len(chunk)
        return deleted
