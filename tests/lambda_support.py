"""Driving the real Lambda handlers the way the Lambda service does: SQS records and API
Gateway proxy events built from real messages, and a LambdaContext with a clock."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load_handler(name: str) -> ModuleType:
    """A fresh import of functions/<name>/handler.py (module-level settings read anew)."""
    module_name = f"agentq_fn_{name}_{uuid.uuid4().hex[:6]}"
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "functions" / name / "handler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class FakeLambdaContext:
    function_name = "agentq-executor"
    function_version = "$LATEST"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:agentq-executor"
    log_group_name = "/aws/lambda/agentq-executor"
    log_stream_name = "local"

    def __init__(self, timeout_seconds: float) -> None:
        self.aws_request_id = uuid.uuid4().hex
        self._deadline = time.time() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.time()) * 1000))


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {
                    "ApproximateReceiveCount": m.get("Attributes", {}).get("ApproximateReceiveCount", "1"),
                    "SentTimestamp": m.get("Attributes", {}).get("SentTimestamp", "0"),
                    "SenderId": "local",
                    "ApproximateFirstReceiveTimestamp": "0",
                },
                "messageAttributes": {
                    k: {"stringValue": v.get("StringValue"), "dataType": v.get("DataType", "String")}
                    for k, v in (m.get("MessageAttributes") or {}).items()
                },
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


LAMBDA_RESPONSE_BYTES = 6 * 1024 * 1024  # a synchronous invocation's answer (API Gateway: 502 past it)


def lambda_pages(api: Any, path: str, field: str, tenant: str) -> tuple[list[Any], list[int]]:
    """Every item (``field`` of each page) of the listing at ``path``, through the Lambda handler
    (``api``: tests/test_api_routes.py's Api), following next_cursor; and each answer's size."""
    from agentq.api.http_server import proxy_event

    items: list[Any] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        url = path + (("&" if "?" in path else "?") + f"cursor={cursor}" if cursor else "")
        answer = api.handler.lambda_handler(proxy_event("GET", url, {}, None, tenant=tenant), FakeLambdaContext(30))
        assert answer["statusCode"] == 200, answer["body"][:500]
        sizes.append(len(answer["body"].encode()))
        page = json.loads(answer["body"])
        items += page[field]
        if (cursor := page["next_cursor"]) is None:
            return items, sizes
