"""A finished A2A task's artifacts, in A2A 1.0's JSON (camelCase, as ``a2a-sdk``'s protobuf
types print): one function for every place that shows them, so ``GetTask``, a stream's last
events (``api/a2a_views.py``, ``api/a2a_stream.py``) and the completion push the worker queues
(``queueing/a2a_push.py``) agree. It sits in queueing, below both: the API may import it, the
worker may not import the API.

- ``result``: the agent's answer, a data part when it has an output schema (the engine stores a
  valid answer as JSON, and only that), else a text part.
- ``workspace`` (a task with a workspace, completed): its files as of its last committed step,
  one part per file, each a ``url`` part (the protocol's file reference) with its ``filename``,
  ``mediaType``, and its size, SHA-256 and mode in the part's metadata. The URL is this API's own
  ``GET /tasks/{id}/files/{path}?step=N``, behind the same auth as the A2A call, so no secret is
  in it and another tenant's key gets 404. Directories and links are not files: the listing
  (``GET /tasks/{id}/files``) shows them. At most ``MAX_LISTED_FILES`` files and
  ``MAX_LISTED_BYTES`` of their content are listed, in path order; the artifact's metadata
  (``agentq``) says how many files and bytes there are and whether the list was cut.

The file names were written by the model: each path is checked as a workspace path (relative,
no ``.``/``..``/empty segment, no NUL; one that fails is left out and counted) and every segment is
percent-encoded in the URL, so no name can point the URL outside the task's files.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from agentq.core.models import Task, TaskStatus
from agentq.core.workspace import Entry, check_path, has_workspace
from agentq.storage.container import Storage
from agentq.storage.workspace_state import state_at

BASE_KEY = "a2a_base"  # the submission's metadata key holding the API's URL as the A2A caller reached it
TEXT, JSON_TYPE, BINARY = "text/plain", "application/json", "application/octet-stream"
MAX_LISTED_FILES = 100
MAX_LISTED_BYTES = 256 * 1024 * 1024  # of the listed files' content


def file_url(base: str, task_id: str, path: str, step: int) -> str:
    """The API's URL of one file of the task at ``step``: every path segment percent-encoded."""
    segments = "/".join(quote(segment, safe="") for segment in path.split("/"))
    return f"{base}/tasks/{quote(task_id, safe='')}/files/{segments}?step={step}"


def media_type(path: str) -> str:
    guessed, _ = mimetypes.guess_type(path.rsplit("/", 1)[-1], strict=False)
    return guessed or BINARY


def result_artifact(task: Task) -> dict[str, Any] | None:
    if task.status is not TaskStatus.SUCCEEDED or task.result is None:
        return None
    if task.submission.output_schema is not None:
        part: dict[str, Any] = {"data": json.loads(task.result), "mediaType": JSON_TYPE}
    else:
        part = {"text": task.result, "mediaType": TEXT}
    return {"artifactId": f"{task.task_id}-result-{task.invocation}", "name": "result", "parts": [part]}


def file_parts(
    entries: Iterable[Entry], base: str, task_id: str, step: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The parts listing the files among ``entries`` (in their order), and what the artifact's
    metadata says of them: how many files and bytes there are, how many are listed, whether the
    list was cut, and how many names were left out for not being workspace paths."""
    parts: list[dict[str, Any]] = []
    files = total = listed_bytes = withheld = 0
    truncated = False
    for entry in entries:
        if entry.kind != "f":
            continue
        files += 1
        total += entry.size
        try:
            check_path(entry.path)
        except ValueError:
            withheld += 1  # never put in a URL
            continue
        if len(parts) >= MAX_LISTED_FILES or listed_bytes + entry.size > MAX_LISTED_BYTES:
            truncated = True
            continue
        listed_bytes += entry.size
        parts.append({
            "url": file_url(base, task_id, entry.path, step),
            "filename": entry.path,
            "mediaType": media_type(entry.path),
            "metadata": {"agentq": {"size": entry.size, "sha256": entry.digest, "mode": f"{entry.mode:o}"}},
        })  # fmt: skip
    meta: dict[str, Any] = {"step": step, "files": files, "bytes": total, "listedFiles": len(parts),
                            "listedBytes": listed_bytes, "truncated": truncated}  # fmt: skip
    if truncated:
        meta["truncatedReason"] = (f"at most {MAX_LISTED_FILES} files and {MAX_LISTED_BYTES} bytes are listed; "
                                   f"GET /tasks/{task_id}/files lists them all")  # fmt: skip
    if withheld:
        meta["withheldFiles"] = withheld
    return parts, meta


def workspace_artifact(store: Storage, task: Task) -> dict[str, Any] | None:
    sub = task.submission
    if task.status is not TaskStatus.SUCCEEDED or not has_workspace(sub.workspace, sub.constraints.tools):
        return None
    state = state_at(store, task, None)
    base = str(sub.metadata.get(BASE_KEY) or "")
    parts, meta = file_parts(state.manifest.entries, base, task.task_id, state.step)
    if not meta["files"]:
        return None  # no files: nothing to list (an A2A artifact has at least one part)
    if not parts:
        parts.append({"text": meta.get("truncatedReason", "no file can be listed"), "mediaType": TEXT})
    return {
        "artifactId": f"{task.task_id}-workspace-{task.invocation}",
        "name": "workspace",
        "description": f"the task's files as of step {state.step}, each at its URL on this API (same auth)",
        "parts": parts,
        "metadata": {"agentq": meta},
    }


def artifacts(store: Storage, task: Task) -> list[dict[str, Any]]:
    """The task's artifacts: none until it completed; then ``result``, and ``workspace`` when it
    has one."""
    found = [result_artifact(task), workspace_artifact(store, task)]
    return [a for a in found if a is not None]
