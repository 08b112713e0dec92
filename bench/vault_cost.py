"""What the vault adds to a call that uses a credential, what a use costs, and the marker scan.

    .venv/bin/python bench/vault_cost.py [--runs 50] [--json]

On a moto server (DynamoDB for the vault's items, KMS for the data keys) and a local echo
server, each row the wall-clock time of one ``http_fetch`` through the registry (p50/p99,
nearest rank, after two warm-up calls):

- ``no credential``: the fetch alone, the baseline;
- ``same run``: ``${vault:github}`` in a header, the credential already opened by this
  run (a task's later calls): one BatchGetItem, its item read again (deleted or rebound since,
  it would not be sent) with the task's META (a task a stop marked, cancelled or taken over
  gets none: ``Vault.get_running``), nothing decrypted while it is unchanged;
- ``same run, no task read``: the same without the run's lease, as every use was before a
  use read META too (ARCHITECTURE invariant 17): one GetItem, one item;
- ``new run, cached key``: a new run's first use: one BatchGetItem, the data key from the
  worker's cache (``core.vault_crypto.EnvelopeCipher``, five minutes);
- ``new run, cold KMS``: the same with the cache emptied: one BatchGetItem and one
  ``kms:Decrypt``.

Calls and dollars per use are counted from the botocore calls each row made (the figures of a
real AWS account differ only in latency), a GetItem one item, a BatchGetItem two (the
credential's and META, each under 4 KB: META's size is printed). Prices: ``bench/_prices.py``,
the one table (a DynamoDB read request unit: a strongly consistent read of an item under 4 KB
is one; a KMS request).

The marker scan: a credential holding a unique marker is used by a task on the moto-backed store
(an echoing API sends it back), then every item of the table and object of the bucket is scanned
for the marker (raw, base64, percent-encoded); ``tests/test_vault_marker.py`` does the same with
the local stack's real worker processes, logs and spans.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3

from _benchlib import InProcessCounter
from _plot import Panel, add_plot_args, plot_from_args
from _prices import as_json, quote, rate
from _report import time_cases
from agentq.control import vault as control_vault
from agentq.core.engine import Engine, LeaseState
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.tools import ToolContext, ToolRegistry
from agentq.core.tools.builtin import http_fetch_tool
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.vault import CredentialWrite
from agentq.core.vault_crypto import EnvelopeCipher, KmsDataKeys
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.item_size import item_size
from agentq.storage.keys import meta_key
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.helpers import scripted
from tests.vault_support import echo_server

PRICE_KEYS = ("dynamodb_rru", "kms_request")
DYNAMODB_READ_USD = rate("dynamodb_rru")
KMS_REQUEST_USD = rate("kms_request")


class Queues:
    def send(self, *_: Any, **__: Any) -> None:
        pass


def forms(marker: str) -> list[bytes]:
    raw = marker.encode()
    out = [raw, urllib.parse.quote(marker, safe="").encode()]
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).rstrip(b"=")
        out.append(encoded[-(-shift * 8 // 6) : (shift + len(raw)) * 8 // 6])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    add_plot_args(parser, "vault_cost")
    args = parser.parse_args()
    import os

    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with MotoServer() as moto, echo_server() as echo:
        names = ResourceNames.for_prefix(f"vault{uuid.uuid4().hex[:8]}")
        settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=moto.endpoint_url)
        provision(session(settings), names, endpoint_url=moto.endpoint_url)
        store = build_store(settings)
        kms = boto3.client("kms", endpoint_url=moto.endpoint_url, region_name=settings.region)
        keys = KmsDataKeys(kms, kms.create_key(Description="bench vault")["KeyMetadata"]["KeyId"])
        cipher = EnvelopeCipher(keys)
        marker = "BENCHMARK" + uuid.uuid4().hex
        write = CredentialWrite.model_validate({"user": "ann", "value": marker, "hosts": [echo.host]})
        control_vault.put(store, Queues(), cipher, "t", "github", write)  # type: ignore[arg-type]
        registry = ToolRegistry([http_fetch_tool(FetchPolicy(allow=(HostRule.parse(echo.host),)))])
        counter = InProcessCounter().install()

        def fetch(credentials: TaskCredentials | None) -> None:
            headers = {"Authorization": "Bearer ${vault:github}"} if credentials is not None else {}
            ctx = ToolContext("bench", "toolu_bench", "k", credentials=credentials)
            result = registry.execute("http_fetch", {"url": echo.url("/"), "headers": headers}, ctx, ["http_fetch"])
            assert result.status == "ok", result.content

        # A run's credentials read its task's META with each use: a running task of ann's, claimed.
        running = store.tasks.create(scripted([{"text": "x"}]).model_copy(update={"user": "ann"}), tenant="t")
        claimed = store.tasks.claim(running.task_id, "bench", 3600)
        assert claimed is not None
        held = LeaseState(claimed[0])
        meta_bytes = item_size(store.table.get(meta_key(running.task_id)) or {})
        same_run = TaskCredentials(store.vault, cipher, "t", "ann", held)
        unchecked = TaskCredentials(store.vault, cipher, "t", "ann")

        def cold() -> TaskCredentials:
            cipher.forget()  # every cached data key dropped: the next open asks KMS
            return TaskCredentials(store.vault, cipher, "t", "ann", held)

        cases: dict[str, Callable[[], None]] = {
            "no credential": lambda: fetch(None),
            "same run": lambda: fetch(same_run),
            "same run, no task read": lambda: fetch(unchecked),
            "new run, cached key": lambda: fetch(TaskCredentials(store.vault, cipher, "t", "ann", held)),
            "new run, cold KMS": lambda: fetch(cold()),
        }
        rows: dict[str, dict[str, Any]] = {}
        for name, timing in time_cases(cases, args.runs, counter).items():
            per_use = timing.calls_per_run  # every thread's calls (the tool runs in a thread of its own)
            read_units = per_use.get("dynamodb:GetItem", 0) + 2 * per_use.get("dynamodb:BatchGetItem", 0)
            usd = read_units * DYNAMODB_READ_USD + per_use.get("kms:Decrypt", 0) * KMS_REQUEST_USD
            rows[name] = {"p50_ms": timing.p50_ms, "p99_ms": timing.p99_ms, "calls_per_use": per_use,
                          "usd_per_use": usd}  # fmt: skip
        counter.uninstall()
        base = rows["no credential"]["p50_ms"]
        for row in rows.values():
            row["added_p50_ms"] = row["p50_ms"] - base

        # The marker scan: a task that uses the credential against the echo, then the table and bucket.
        fetch_use = {"name": "http_fetch", "input": {"url": echo.url("/me"),
                                                     "headers": {"Authorization": "Bearer ${vault:github}"}}}  # fmt: skip
        sub = scripted([{"text": "", "tool_calls": [fetch_use]}, {"text": "done"}], tools=["http_fetch"])
        task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
        Engine(store, worker_id="bench", tools=registry, cipher=cipher).run(task.task_id)
        ddb = boto3.client("dynamodb", endpoint_url=moto.endpoint_url, region_name=settings.region)
        items = [i for page in ddb.get_paginator("scan").paginate(TableName=names.table) for i in page["Items"]]
        s3 = boto3.client("s3", endpoint_url=moto.endpoint_url, region_name=settings.region)
        blobs = [json.dumps(items, default=str).encode()]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=names.bucket):
            blobs += [s3.get_object(Bucket=names.bucket, Key=o["Key"])["Body"].read() for o in page.get("Contents", [])]
        scan = {"items": len(items), "objects": len(blobs) - 1, "echoes_sent": len(echo.requests),
                "hits": sum(blob.count(form) for blob in blobs for form in forms(marker))}  # fmt: skip

    labels = list(rows)
    plot_from_args(
        args,
        f"http_fetch with and without a vault credential, {args.runs} runs each",
        [Panel("bar", "latency per call", "ms", labels, {q: [rows[n][f"{q}_ms"] for n in labels] for q in ("p50", "p99")}),
         Panel("bar", "cost per use", "micro-USD", labels, {"$": [rows[n]["usd_per_use"] * 1e6 for n in labels]})],
    )  # fmt: skip
    if args.json:
        print(json.dumps({"runs": args.runs, "rows": rows, "marker_scan": scan, "meta_bytes": meta_bytes,
                          "prices": as_json(*PRICE_KEYS)}))  # fmt: skip
        return
    print(
        f"{'call':<30} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'calls/use':<36} {'$/use':>10}   ({args.runs} runs)"
    )
    for name, row in rows.items():
        calls_text = ", ".join(f"{op} {n:g}" for op, n in sorted(row["calls_per_use"].items())) or "-"
        print(f"{name:<30} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['added_p50_ms']:>8.2f} "
              f"{calls_text:<36} {row['usd_per_use']:>10.2e}")  # fmt: skip
    print(f"marker scan: {scan['hits']} hit(s) in {scan['items']} items and {scan['objects']} objects "
          f"(the credential was sent {scan['echoes_sent']} time(s))")  # fmt: skip
    print(f"the task's META, read with each use: {meta_bytes} bytes (under 4 KB: one read unit)")
    print(f"prices: {quote(*PRICE_KEYS)}")


if __name__ == "__main__":
    main()
