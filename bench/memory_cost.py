"""What a memory store costs: the DynamoDB units of a ``memory_write`` and a ``memory_read`` by
document size, and the latency and read units of a ``memory_search`` by the number of documents
it reads (docs/MEMORY.md: a search reads the whole store, which its document limit bounds).

    python bench/memory_cost.py                           # 100 B .. 100 kB documents; stores of 10, 100, 1000
    python bench/memory_cost.py --stores 10,50 --searches 3 --json

Write units are DynamoDB's billing rule (``storage/item_size.py``) applied to the items a write's
one transaction names, read back after it: the lease check on the task's META, the store item
(its document count), the document's head and its new version, each a transactional write (two
units per started KB; a ConditionCheck in a TransactWriteItems is billed as a write). A read is
the head's strongly consistent read units (one per started 4 KB). The search is timed through
``Storage.memory_stores.search`` on the in-memory twin and on the project's moto server (its
wall time is the local HTTP server's, not DynamoDB's; the read units are what DynamoDB would
bill for the store's one Query, summed over its items).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import uuid
from typing import Any

from _benchlib import JsonOut, fmt, log, machine, summary, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.memory import Author, MemoryStoreSpec
from agentq.core.models import TaskSubmission
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage import keys
from agentq.storage.container import Storage, memory_storage
from agentq.storage.item_size import item_size, write_units
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

READ_UNIT_BYTES = 4096
PERSON = Author(type="api")
TASK = TaskSubmission.model_validate(
    {"goal": "remember", "provider": "scripted", "script": {"turns": [{"text": "unused"}]}}
)
WORDS = "order lamp shade returned refund courier delivered card address invoice".split()


def _doc(size: int, seed: int) -> str:
    words = [WORDS[(seed * 7 + i) % len(WORDS)] for i in range(size // 6 + 1)]
    return " ".join(words)[:size]


def write_cost(store: Storage, sizes: list[int]) -> list[dict[str, Any]]:
    """Units of one write by a task (lease check included) and of one read, per document size."""
    task = store.tasks.create(TASK, tenant="bench")
    claimed = store.tasks.claim(task.task_id, "bench", 60)  # its lease fences the write, as a worker holds it
    assert claimed is not None
    lease = claimed[0]
    meta = store.table.get(keys.meta_key(lease.task_id)) or {}
    rows = []
    for size in sizes:
        name = f"cost-{size}"
        store.memory_stores.create_store("bench", MemoryStoreSpec(name=name))
        author = Author(type="task", task_id=lease.task_id, step=1, tool_use_id="toolu_bench")
        store.memory_stores.write("bench", name, "/doc.md", _doc(size, 1), author=author, lease=lease)
        pk = keys.memory_store_pk("bench", name)
        head = store.table.get({"pk": pk, "sk": keys.memory_doc_sk("/doc.md")}) or {}
        version = store.table.get({"pk": pk, "sk": keys.memory_version_sk("/doc.md", 1)}) or {}
        store_item = store.table.get({"pk": pk, "sk": keys.MEMORY_STORE}) or {}
        parts = {"lease check": meta, "store": store_item, "head": head, "version": version}
        units = {k: write_units(item_size(v), transactional=True) for k, v in parts.items()}
        rows.append(
            {
                "content_bytes": size,
                "head_bytes": item_size(head),
                "version_bytes": item_size(version),
                "write_units": units,
                "write_units_total": sum(units.values()),
                "read_units": max(1, math.ceil(item_size(head) / READ_UNIT_BYTES)),
            }
        )
    return rows


def search_cost(store: Storage, backend: str, counts: list[int], doc_bytes: int, searches: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for count in counts:
        name = f"search-{count}-{uuid.uuid4().hex[:6]}"
        store.memory_stores.create_store("bench", MemoryStoreSpec(name=name, max_documents=max(count, 1)))
        for i in range(count):
            store.memory_stores.write("bench", name, f"/docs/{i:05d}.md", _doc(doc_bytes, i), author=PERSON)
        items = store.table.query(keys.memory_store_pk("bench", name), prefix=keys.MEMORY_DOC)
        took = []
        for _ in range(searches):
            started = time.perf_counter()
            hits = store.memory_stores.search("bench", name, "lamp refund", limit=10)
            took.append((time.perf_counter() - started) * 1000)
        timed = summary(took)
        rows.append(
            {
                "backend": backend,
                "documents": count,
                "hits": len(hits),
                "search_ms": timed,
                "read_units": max(1, math.ceil(sum(item_size(i) for i in items) / READ_UNIT_BYTES)),
            }
        )
        log(f"{backend}: {count} documents, search p50 {timed['p50']:.1f} ms")
    return rows


def report(result: dict[str, Any]) -> str:
    lines = [
        "one memory_write by a task: one transaction (lease check, store, head, version); DynamoDB write units "
        "(2 per started KB, per item), and the read units of one memory_read",
        "",
        table(
            ["content", "head B", "version B", "lease", "store", "head", "version", "write units", "read units"],
            [
                [
                    f"{r['content_bytes']:,} B",
                    f"{r['head_bytes']:,}",
                    f"{r['version_bytes']:,}",
                    *(str(r["write_units"][k]) for k in ("lease check", "store", "head", "version")),
                    str(r["write_units_total"]),
                    str(r["read_units"]),
                ]
                for r in result["writes"]
            ],
        ),
        "",
        f"memory_search of a store of N documents of {result['doc_bytes']:,} bytes ('lamp refund', every word "
        f"in each), {result['searches']} searches each, ms; {result['machine']['cpus']} cpus, "
        f"load {result['machine']['loadavg_at_start']}",
        "",
        table(
            ["backend", "documents", "p50 ms", "p95 ms", "read units"],
            [
                [
                    r["backend"],
                    f"{r['documents']:,}",
                    fmt(r["search_ms"]["p50"], 1),
                    fmt(r["search_ms"]["p95"], 1),
                    f"{r['read_units']:,}",
                ]
                for r in result["searches_by_size"]
            ],
        ),
    ]
    return "\n".join(lines)


def panels(result: dict[str, Any]) -> list[Panel]:
    writes = result["writes"]
    backends = sorted({r["backend"] for r in result["searches_by_size"]})
    counts = sorted({r["documents"] for r in result["searches_by_size"]})
    by = {(r["backend"], r["documents"]): r for r in result["searches_by_size"]}
    return [
        Panel("bar", "units of one memory_write / memory_read", "units",
              [f"{r['content_bytes']:,} B" for r in writes],
              {"write units": [r["write_units_total"] for r in writes], "read units": [r["read_units"] for r in writes]},
              xlabel="document content"),
        Panel("line", "memory_search p50", "ms", counts,
              {b: [by[(b, n)]["search_ms"]["p50"] if (b, n) in by else None for n in counts] for b in backends},
              xlabel="documents in the store", logx=True, logy=True),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000,102400", help="document sizes in bytes, comma-separated")
    ap.add_argument("--stores", default="10,100,1000", help="documents per searched store, comma-separated")
    ap.add_argument("--doc-bytes", type=int, default=1000, help="size of each searched document")
    ap.add_argument("--searches", type=int, default=10, help="searches timed per store")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "memory_cost")
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    counts = sorted({int(s) for s in args.stores.split(",")})
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with JsonOut(args.json) as out:
        result: dict[str, Any] = {"bench": "memory_cost", "machine": machine(), "doc_bytes": args.doc_bytes,
                                  "searches": args.searches}  # fmt: skip
        result["writes"] = write_cost(memory_storage(), sizes)
        rows = search_cost(memory_storage(), "in-memory twin", counts, args.doc_bytes, args.searches)
        with MotoServer() as server:
            names = ResourceNames.for_prefix(f"mem{uuid.uuid4().hex[:8]}")
            settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=server.endpoint_url)
            provision(session(settings), names, endpoint_url=settings.endpoint_url)
            rows += search_cost(build_store(settings), "moto server", counts, args.doc_bytes, args.searches)
        result["searches_by_size"] = rows
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.json:
            out.emit(result)
        else:
            print(report(result))
    plot_from_args(args, "memory stores: write and read units, search latency", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
