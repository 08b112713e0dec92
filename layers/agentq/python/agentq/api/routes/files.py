"""A task's files at a committed step: ``GET /tasks/{id}/files``, ``/files/{path}`` and
``/diff``. The logic is ``agentq.control.files``; another tenant's task is not found. And
``POST /workspace-uploads``: an archive as starting files (``agentq.control.workspaces``).

``/files/{path}``'s path spans several segments (``src/app.py``): ``widen`` lets that one
route's parameter match slashes, which powertools' path parameters do not."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from agentq.api import views
from agentq.api.errors import JSON, responses
from agentq.api.models import (
    DEFAULT_FILES_PAGE,
    MAX_FILES_PAGE,
    FileDiff,
    FileEntry,
    FileList,
    WorkspaceUploaded,
    WorkspaceUploadRequest,
)
from agentq.api.models.base import UPLOAD_PATH
from agentq.api.routes.common import ApiDeps, Router, TaskId
from agentq.control import files as control
from agentq.control.workspaces import upload_archive
from agentq.core.errors import ValidationError
from agentq.core.workspace import Entry

FILE_ROUTE = "/tasks/<task_id>/files/<path>"
KINDS = {"f": "file", "d": "dir", "l": "link"}

Step = Annotated[
    int | None, Query(ge=0, description="a committed step number (0: the starting files); default the last")
]


def _view(e: Entry) -> FileEntry:
    return FileEntry(
        path=e.path,
        kind=KINDS[e.kind],  # type: ignore[arg-type]
        mode=e.mode,
        size=e.size,
        sha256=e.digest if e.kind == "f" else None,
        target=e.digest if e.kind == "l" else None,
    )


def widen(app: APIGatewayRestResolver) -> None:
    """Let ``FILE_ROUTE``'s ``path`` match a multi-segment path (API Gateway proxies
    ``/tasks/{task_id}/{proxy+}`` whole)."""
    for route in app._dynamic_routes:  # powertools keeps the compiled rules here
        if route.path == FILE_ROUTE:
            route.rule = re.compile(r"^/tasks/(?P<task_id>[^/]+)/files/(?P<path>.+?)/*$")


def router(deps: ApiDeps) -> Router:
    routes = Router()
    store, tenant = deps.store, deps.tenant

    @routes.get(
        "/tasks/<task_id>/files",
        summary="A task's files at a committed step",
        description="The workspace as step N left it (default the last committed step; 0: the starting files): "
        "every entry sorted by path with its kind, mode, size and SHA-256, a page at a time.",
        operation_id="listTaskFiles",
        tags=["files"],
        responses=responses(200, FileList, 404, 422),
    )
    def list_files(
        task_id: TaskId,
        step: Step = None,
        after: Annotated[str | None, Query(max_length=4096, description="next_after of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_FILES_PAGE, description="entries per page")] = DEFAULT_FILES_PAGE,
    ) -> FileList:
        state = control.state_at(store, views.owned(store, task_id, deps.caller()), step)
        shown, next_after = control.page(state, after=after, limit=limit)
        return FileList(
            task_id=task_id,
            step=state.step,
            manifest=state.digest,
            total_files=state.manifest.files,
            total_bytes=state.manifest.total_bytes,
            files=[_view(e) for e in shown],
            next_after=next_after,
        )

    def get_file(
        task_id: TaskId,
        path: Annotated[str, Path(description="the file's path in the workspace, slashes and all")],
        step: Step = None,
    ) -> Response[Any]:
        state = control.state_at(store, views.owned(store, task_id, deps.caller()), step)
        entry, data = control.content(state, path)
        headers = {
            "X-Agentq-Mode": f"{entry.mode:o}",
            "X-Agentq-Sha256": entry.digest,
            "X-Agentq-Step": str(state.step),
        }
        text = control.text_of(data)
        if text is not None:
            return Response(200, "text/plain; charset=utf-8", text, headers=headers)
        return Response(200, "application/octet-stream", data, headers=headers)

    # Bytes are not a model: without a return annotation powertools sends the Response as it is
    # (base64 for bytes) instead of serializing the body through the response validator.
    del get_file.__annotations__["return"]
    routes.get(
        FILE_ROUTE,
        summary="One file of a task's workspace",
        description="The file's bytes as step N left it: UTF-8 text as text/plain, anything else as "
        f"application/octet-stream (send Accept: application/octet-stream). At most {control.MAX_FILE_BYTES} bytes; "
        "the X-Agentq-Mode header carries its permission bits (octal), X-Agentq-Sha256 its hash.",
        operation_id="getTaskFile",
        tags=["files"],
        responses={
            **responses(200, FileEntry, 404, 422),
            200: {
                "description": "the file's bytes",
                "content": {"application/octet-stream": {}, "text/plain": {}},
            },
        },
    )(get_file)

    @routes.get(
        "/tasks/<task_id>/diff",
        summary="What changed in a task's files between two steps",
        description="Paths added, removed and changed from step A to step B (`steps=A..B`, or `A..` to the last "
        f"step), and a unified diff of the text files among them, at most {control.MAX_PATCH_CHARS} characters.",
        operation_id="diffTaskFiles",
        tags=["files"],
        responses=responses(200, FileDiff, 404, 422),
    )
    def diff_files(
        task_id: TaskId,
        steps: Annotated[str, Query(max_length=40, description="A..B: two committed step numbers")],
    ) -> FileDiff:
        task = views.owned(store, task_id, deps.caller())
        first, last = control.parse_range(steps)
        old = control.state_at(store, task, first, field="steps")
        new = control.state_at(store, task, last, field="steps")
        found = control.compare(old, new)
        return FileDiff(
            task_id=task_id,
            from_step=old.step,
            to_step=new.step,
            added=found.added,
            removed=found.removed,
            changed=found.changed,
            patch=found.patch,
            truncated=found.truncated,
        )

    @routes.post(
        UPLOAD_PATH,
        summary="Upload an archive of starting files",
        description="A tar (plain or compressed) or zip archive, base64 in archive_b64, unpacked and checked member by "
        "member (nothing outside its root, no links out, no devices, within the limits) and stored content-addressed "
        "under the tenant; a submission's or an agent's workspace.upload names the answer's `upload`. For starting "
        "files past what a submission carries inline.",
        operation_id="uploadWorkspace",
        tags=["files"],
        responses=responses(201, WorkspaceUploaded, 400, 413, 415, 422, description="Stored"),
    )
    def upload(body: Annotated[WorkspaceUploadRequest, Body(description="the archive")]) -> Response[WorkspaceUploaded]:
        try:
            data = base64.b64decode(body.archive_b64, validate=True)
        except (binascii.Error, ValueError) as exc:  # a non-ASCII character is a ValueError of its own
            raise ValidationError(f"archive_b64: not base64 ({exc})", field="archive_b64") from None
        done = upload_archive(store, data, tenant=tenant())
        answer = WorkspaceUploaded(
            upload=done.upload, files=done.files, bytes=done.bytes, stored_bytes=done.stored_bytes
        )
        return Response(status_code=201, content_type=JSON, body=answer)

    return routes
