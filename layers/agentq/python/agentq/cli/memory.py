"""``agentq memory ...``: a tenant's memory stores (docs/MEMORY.md) through the API: stores,
documents, their versions, redaction and search. A document's content comes from a file
(``--file``, '-' for stdin) or ``--content``; ``--expect`` is the content_sha256 last read, so
a write never overwrites a change made since (exit 1, conflict)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentq.cli.args import UsageError, add_command, read_text
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote


def _content(args: argparse.Namespace) -> str:
    if (args.file is None) == (args.content is None):
        raise UsageError("give the content with exactly one of --file or --content", field="content")
    if args.content is not None:
        return str(args.content)
    return read_text(args.file, what="the content")


def _cmd_memory(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    memory = api_client(args).memory
    action = args.memory_command
    out: Any
    if action == "create":
        settings = {
            k: v
            for k, v in {
                "description": args.description,
                "max_documents": args.max_documents,
                "max_document_bytes": args.max_document_bytes,
                "version_retention_days": args.retention_days,
            }.items()
            if v is not None
        }
        out = memory.create_store(args.store, **settings)
        text = [
            f"created memory store {out.name} (at most {out.max_documents} documents of {out.max_document_bytes} bytes)"
        ]
    elif action == "stores":
        out = memory.list_stores()
        text = [f"{s.name}  {s.documents} document(s)  {s.description}".rstrip() for s in out] or ["(no memory stores)"]
    elif action == "delete-store":
        out = memory.delete_store(args.store)
        text = [f"deleted memory store {out.name} and its {out.documents} document(s)"]
    elif action == "ls":
        out = memory.documents(args.store, args.prefix)
        text = [f"{d.path}  v{d.version}  {d.content_size_bytes} B  {d.content_sha256[:12]}" for d in out]
        text = text or ["(no documents)"]
    elif action == "cat":
        out = memory.read(args.store, args.path)
        if not args.json:
            sys.stdout.write(out.content or "")
            print(f"(v{out.version}, content_sha256 {out.content_sha256})", file=sys.stderr)
            return 0
        text = []
    elif action == "put":
        out = memory.write(args.store, args.path, _content(args), expected_content_sha256=args.expect)
        doc = out.document
        made = f"wrote {doc.path} as v{doc.version}" if out.written else f"{doc.path} unchanged (v{doc.version})"
        text = [f"{made}, content_sha256 {doc.content_sha256}"]
    elif action == "rm":
        out = memory.delete(args.store, args.path, expected_content_sha256=args.expect)
        text = [f"deleted {out.path} (v{out.version}; its versions stay)"]
    elif action == "history":
        out = memory.versions(args.store, args.path)
        text = []
        for v in out:
            by = v.created_by
            who = f"task {by.task_id} step {by.step}" if by.type == "task" else f"api {by.key_id or ''}".rstrip()
            state = "redacted" if v.redacted_at else (v.content_sha256 or "")[:12]
            text.append(f"v{v.version}  {v.operation:<8}  {when(v.created_at)}  {who}  {state}")
    elif action == "redact":
        out = memory.redact(args.store, args.path, args.version)
        text = [f"redacted v{out.version} of {out.path}"]
    else:
        out = memory.search(args.store, args.query, limit=args.limit)
        text = [f"{h.path}  {h.matches} match(es)  {h.snippet}" for h in out] or ["(nothing found)"]
    if args.json:
        dump([item.model_dump(mode="json") for item in out] if isinstance(out, list) else out)
    else:
        print("\n".join(text))
    return 0


def register(sub: Any) -> None:
    memory = add_command(sub, "memory", "memory stores: documents agents remember across tasks (read, edit, audit)")
    actions = memory.add_subparsers(dest="memory_command", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return remote(actions.add_parser(name, help=help, description=help))

    create = action("create", "create a memory store")
    create.add_argument("store", help="its name: lowercase letters, digits, '-' and '_'")
    create.add_argument("--description", help="what it holds (the model is told)")
    create.add_argument("--max-documents", type=int, help="at most this many documents (default 1000)")
    create.add_argument("--max-document-bytes", type=int, help="bytes per document (default and most 102400)")
    create.add_argument("--retention-days", type=int, help="keep each version this long (default 30)")
    action("stores", "your memory stores")
    delete_store = action("delete-store", "delete a store with every document and version")
    delete_store.add_argument("store")
    ls = action("ls", "a store's documents (path, version, size, hash)")
    ls.add_argument("store")
    ls.add_argument("--prefix", default="/", help="only paths starting with this")
    for name, help in (("cat", "print a document"), ("history", "a document's versions: who wrote each, when")):
        parser = action(name, help)
        parser.add_argument("store")
        parser.add_argument("path", help="e.g. /customers/ann.md")
    put = action("put", "write a document (a new version)")
    put.add_argument("store")
    put.add_argument("path")
    put.add_argument("-f", "--file", help="the content from a file ('-' reads stdin)")
    put.add_argument("--content", help="the content itself")
    put.add_argument("--expect", help="only if it still has this content_sha256 (else a conflict, exit 1)")
    rm = action("rm", "delete a document (its versions stay)")
    rm.add_argument("store")
    rm.add_argument("path")
    rm.add_argument("--expect", help="only if it still has this content_sha256")
    redact = action("redact", "remove a past version's content for good")
    redact.add_argument("store")
    redact.add_argument("path")
    redact.add_argument("version", type=int)
    search = action("search", "documents holding every word of a query")
    search.add_argument("store")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=10)
    memory.set_defaults(func=_cmd_memory)
