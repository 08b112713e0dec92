"""Every botocore call this process makes, counted with what AWS would bill for it: the meter of
``bench/workspace_cost.py``.

Each call is one ``Call`` (its phase, ``service:Operation``, what it touched, request and
response bytes, the request units DynamoDB would bill, whether it failed). The phase is a plain
attribute the bench moves (e.g. the turn of a scripted conversation), not a thread-local: the
engine calls the model on a thread of its own.

Request units follow DynamoDB's on-demand rules: a write is ``ceil(item / 1 KB)`` write units
(twice in a transaction), an update billed at the larger of the item before and after; a
strongly consistent read is ``ceil(size / 4 KB)`` read units per item (a Query or a batch: per
call, the items' sizes summed). Item sizes are DynamoDB's (names + values, ``storage.item_size``);
the size of an item an update changed is read back around the write by ``side``, an unmetered
client, since the request does not carry it. S3: every request is one billed request, a 412 of
a create-only PUT too.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

import botocore.client
import botocore.exceptions

from agentq.storage.item_size import wire_item_size, write_units

READ_UNIT_BYTES = 4096


@dataclass
class Call:
    phase: Any
    op: str  # service:Operation
    what: str  # S3: blob | manifest | payload; DynamoDB: the table
    sent: int = 0  # request body bytes (S3 PutObject)
    received: int = 0  # response body bytes (S3 GetObject)
    wru: int = 0
    rru: int = 0
    failed: str = ""  # the error code


def s3_kind(key: str) -> str:
    if "/workspace/blobs/" in key:
        return "blob"
    if "/workspace/manifests/" in key:
        return "manifest"
    return "payload"


class AwsMeter:
    def __init__(self, side_dynamodb: Any = None) -> None:
        self.calls: list[Call] = []
        self.phase: Any = None
        self.side = side_dynamodb
        self._lock = threading.Lock()
        self._quiet = threading.local()
        self._original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]  # private in the stubs

    def install(self) -> AwsMeter:
        meter, original = self, self._original

        def metered(client: Any, operation: str, params: dict[str, Any]) -> Any:
            if getattr(meter._quiet, "on", False):
                return original(client, operation, params)
            service = client.meta.service_model.service_name
            call = Call(meter.phase, f"{service}:{operation}", "")
            body = params.get("Body")  # before the call: botocore turns it into a stream in place
            # bytes, or a stream of known length (a workspace file, uploaded a chunk at a time)
            call.sent = len(body) if isinstance(body, Sized) else 0
            before = meter._sizes_before(service, operation, params)
            try:
                response = original(client, operation, params)
            except botocore.exceptions.ClientError as exc:
                call.failed = str(exc.response.get("Error", {}).get("Code", "error"))
                meter._record(call, service, operation, params, None, before)
                raise
            meter._record(call, service, operation, params, response, before)
            return response

        botocore.client.BaseClient._make_api_call = metered  # type: ignore[attr-defined]  # private in the stubs
        return self

    def uninstall(self) -> None:
        botocore.client.BaseClient._make_api_call = self._original  # type: ignore[attr-defined]  # private in the stubs

    # ----------------------------------------------------------------- sizes of updated items

    def _item_size(self, table: str, key: dict[str, Any]) -> int:
        if self.side is None:
            return 0
        self._quiet.on = True
        try:
            item = self.side.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        finally:
            self._quiet.on = False
        return wire_item_size(item) if item else 0

    def _updates(self, operation: str, params: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
        if operation == "UpdateItem":
            return [(params["TableName"], params["Key"], False)]
        if operation == "TransactWriteItems":
            return [
                (u["Update"]["TableName"], u["Update"]["Key"], True) for u in params["TransactItems"] if "Update" in u
            ]
        return []

    def _sizes_before(self, service: str, operation: str, params: dict[str, Any]) -> list[int]:
        if service != "dynamodb":
            return []
        return [self._item_size(table, key) for table, key, _ in self._updates(operation, params)]

    # ----------------------------------------------------------------- the bill of one call

    def _record(
        self, call: Call, service: str, operation: str, params: dict[str, Any], response: Any, before: list[int]
    ) -> None:
        if service == "s3":
            call.what = s3_kind(str(params.get("Key", "")))
            if response is not None and operation == "GetObject":
                call.received = int(response.get("ContentLength") or 0)
        elif service == "dynamodb":
            call.what = str(params.get("TableName", ""))
            call.wru, call.rru = self._units(operation, params, response, before)
        with self._lock:
            self.calls.append(call)

    def _units(self, operation: str, params: dict[str, Any], response: Any, before: list[int]) -> tuple[int, int]:
        wru = rru = 0
        if operation == "PutItem":
            wru = write_units(wire_item_size(params["Item"]))
        elif operation == "DeleteItem":
            wru = 1
        elif operation in ("UpdateItem", "TransactWriteItems"):
            updates = self._updates(operation, params)
            for (table, key, transactional), size_before in zip(updates, before, strict=True):
                wru += write_units(max(size_before, self._item_size(table, key)), transactional=transactional)
            for item in params.get("TransactItems", []):
                if "Put" in item:
                    wru += write_units(wire_item_size(item["Put"]["Item"]), transactional=True)
                elif "Delete" in item:
                    wru += 2
                elif "ConditionCheck" in item:
                    rru += 2
        elif operation == "BatchWriteItem":
            for requests in params["RequestItems"].values():
                for r in requests:
                    wru += write_units(wire_item_size(r["PutRequest"]["Item"])) if "PutRequest" in r else 1
        elif response is not None and operation == "GetItem":
            rru = max(1, math.ceil(wire_item_size(response.get("Item") or {}) / READ_UNIT_BYTES))
        elif response is not None and operation in ("Query", "Scan"):
            size = sum(wire_item_size(i) for i in response.get("Items", []))
            rru = max(1, math.ceil(size / READ_UNIT_BYTES))
        elif response is not None and operation == "BatchGetItem":
            items = [i for found in response.get("Responses", {}).values() for i in found]
            rru = sum(max(1, math.ceil(wire_item_size(i) / READ_UNIT_BYTES)) for i in items)
        return wru, rru

    # ----------------------------------------------------------------- views

    def of(self, phase: Any) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.phase == phase]

    def ops(self, calls: list[Call]) -> Counter[str]:
        return Counter(c.op for c in calls)
