"""A task's files as the API shows them (``GET /tasks/{id}/files``, ``/files/{path}``, ``/diff``):
the workspace's entries at a committed step, and the difference between two steps."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentq.api.models.base import ApiModel

MAX_FILES_PAGE = 10_000  # GET /tasks/{id}/files ?limit=
DEFAULT_FILES_PAGE = 1_000


class FileEntry(ApiModel):
    """One entry of a task's workspace as a committed step left it (``core.workspace``)."""

    path: str = Field(description="relative to the workspace root, '/'-separated")
    kind: Literal["file", "dir", "link"]
    mode: int = Field(description="permission bits")
    size: int = Field(description="bytes (0 for a directory or a link)")
    sha256: str | None = Field(default=None, description="a file's content hash")
    target: str | None = Field(default=None, description="a symbolic link's target (never followed)")


class FileList(ApiModel):
    task_id: str
    step: int = Field(description="the committed step whose workspace this is")
    manifest: str | None = Field(description="the manifest's SHA-256; null: the submission's starting files")
    total_files: int = Field(description="regular files in the whole workspace")
    total_bytes: int = Field(description="their bytes")
    files: list[FileEntry] = Field(description="entries sorted by path, a page of them")
    next_after: str | None = Field(description="pass as ?after= for the next page; null at the end")


class FileDiff(ApiModel):
    task_id: str
    from_step: int
    to_step: int
    added: list[str]
    removed: list[str]
    changed: list[str] = Field(description="content, mode or link target changed")
    patch: str = Field(description="a unified diff of the text files among them; binary files are named "
                       "('Binary files differ'), not shown, and so are files over 1 MB or whose diff would take "
                       "more line comparisons than it is allowed ('Large files differ', with both sides' sizes and "
                       "sha256 hashes)")  # fmt: skip
    truncated: bool = Field(description="the patch was cut at its size limit; the path lists are whole")


class WorkspaceUploadRequest(BaseModel):
    """An archive of starting files (``POST /workspace-uploads``)."""

    model_config = ConfigDict(extra="forbid")

    archive_b64: str = Field(
        min_length=1,
        description="a tar (plain, gzip, bzip2 or xz) or zip archive, base64; what it unpacks to must stay inside "
        "its root (no absolute or '..' names, no links out, no devices) and within the limits",
    )


class WorkspaceUploaded(ApiModel):
    upload: str = Field(description="name it as a submission's (or an agent's) workspace.upload")
    files: int = Field(description="regular files in it")
    bytes: int = Field(description="their bytes")
    stored_bytes: int = Field(description="content stored now (content an earlier upload holds is stored once)")
