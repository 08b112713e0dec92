"""The tools that work in a task's workspace: ``shell``, ``read_file``, ``write_file``,
``edit_file``, ``list_files``, ``search_files`` (and ``python_exec``, which runs there when the
task has one: ``core.tools.builtin``).

Each call runs in a sandbox of its own with the workspace bound in (``sandbox.workspace``):
the tool functions here only word the call and its answer. None is declared side-effecting:
a call confined to the workspace is replay-safe, because a resume restores the workspace of
the last committed step before the call runs again (``core.engine._workspace``). A shell
command that reached an allowed host through the egress proxy is the exception: the engine
records it as a side effect at its first contact (``core.engine._tool_call.NetworkedCall``), so
after a crash it is reported as of unknown outcome instead of run again, as ``shell``'s
description tells the model.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from agentq.core.tools._context import ToolContext, WorkspaceAccess
from agentq.core.tools._core import ToolSpec, tool
from agentq.sandbox.base import HALTED, CodeSandbox, RefusingSandbox, SandboxUnavailable

Path = Annotated[
    str,
    Field(
        min_length=1,
        max_length=4096,
        description="A path relative to the workspace root (e.g. 'src/app.py'); '/workspace/...' also works.",
    ),
]
MAX_SHELL_SECONDS = 600
FILE_OP_SECONDS = 20.0  # a file tool's sandbox is killed after this, or sooner at the task's deadline


def _workspace(ctx: ToolContext | None) -> WorkspaceAccess:
    if ctx is None or ctx.workspace is None:
        raise RuntimeError("this task has no workspace (allow a workspace tool or submit one with the task)")
    return ctx.workspace


def check_code_allowed(sandbox: CodeSandbox | None) -> None:
    """Raise the deployment's refusal when its sandbox setting (``AGENTQ_SANDBOX``: ``off``, or
    one it cannot use) runs no code. A tool that runs model-written code in the workspace's
    bubblewrap (``shell``, ``python_exec`` of a task with a workspace) never goes through that
    sandbox, so it asks here first: "off" means no code runs, in a workspace or not. The file
    tools run only agentq's own code (``sandbox.fileops``) and stay."""
    if isinstance(sandbox, RefusingSandbox):
        raise SandboxUnavailable(sandbox.reason)


def _bounded(timeout: float, ctx: ToolContext | None) -> float:
    """The call's bound: ``timeout``, cut to end before the task's deadline (``ToolContext.bound``:
    the sandbox is killed at it, and the registry waits for that instead of abandoning the call)."""
    return timeout if ctx is None else ctx.bound(timeout)


def _file_op(ctx: ToolContext | None, op: str, *, writable: bool, **args: Any) -> str:
    return _workspace(ctx).file_op(op, writable=writable, timeout=_bounded(FILE_OP_SECONDS, ctx), **args)


def shell_tool(sandbox: CodeSandbox | None = None) -> ToolSpec:
    """``shell`` under the deployment's sandbox setting: refused when it runs no code
    (``check_code_allowed``), else run in the task's workspace."""

    @tool(name="shell", timeout_seconds=MAX_SHELL_SECONDS + 15, bounds_itself=True)
    def shell(
        command: Annotated[
            str, Field(min_length=1, max_length=100_000, description="A bash command line, run in the workspace.")
        ],
        timeout_seconds: Annotated[
            float, Field(gt=0, le=MAX_SHELL_SECONDS, description="Wall-clock limit; everything is killed when reached.")
        ] = 60.0,
        ctx: ToolContext | None = None,
    ) -> str:
        """Run a bash command line in the task's workspace (the working directory, /workspace) and return its exit code, stdout and stderr (each cut at 32 KB). bash, git, python3 and the usual coreutils are there; the workspace is the only writable place and is kept across steps and restarts. Processes do not outlive the call: when it returns, everything it started, background jobs included, has been killed. There is no network, except the hosts this task allows, reached through the proxy already set in http_proxy/https_proxy. A command that reached one of those hosts runs at most once: if the worker stops before its step is saved, it is not run again and you are told its outcome is unknown (check, then retry if needed). A command that used no network may run again after a worker crash, on the workspace as the last saved step left it; keep network steps (clone, download, push) in commands of their own.

        Replay-safe when it stays in the workspace: a worker that dies mid-command leaves no trace
        of it, because the next worker restores the workspace as the last committed step left it.
        """
        check_code_allowed(sandbox)
        timeout = _bounded(timeout_seconds, ctx)
        result = _workspace(ctx).shell(command, timeout)
        status = f"exit code {result.exit_code}"
        if result.timed_out:
            status += f" (timed out after {timeout:.1f}s; every process of the command was killed)"
        elif result.limit == "halted":
            status += f" ({HALTED})"
        elif result.exit_code < 0:
            status += " (killed by a signal: a limit of the sandbox, most likely memory or file size)"
        return f"{status}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"

    return shell


shell = shell_tool()


@tool(timeout_seconds=FILE_OP_SECONDS + 15, bounds_itself=True)
def read_file(
    path: Path,
    start_line: Annotated[int, Field(ge=1, description="First line to show (1-based).")] = 1,
    max_lines: Annotated[int | None, Field(ge=1, description="Show at most this many lines.")] = None,
    ctx: ToolContext | None = None,
) -> str:
    """Read a UTF-8 text file of the workspace, whole or a range of lines. Binary files, files over 2 MB and paths outside the workspace are refused with the reason."""
    return _file_op(ctx, "read", writable=False, path=path, start_line=start_line, max_lines=max_lines)


@tool(timeout_seconds=FILE_OP_SECONDS + 15, bounds_itself=True)
def write_file(
    path: Path,
    content: Annotated[str, Field(max_length=10_000_000, description="The file's whole new content (UTF-8).")],
    ctx: ToolContext | None = None,
) -> str:
    """Create or overwrite a text file in the workspace with the given content; missing directories are created."""
    return _file_op(ctx, "write", writable=True, path=path, content=content)


@tool(timeout_seconds=FILE_OP_SECONDS + 15, bounds_itself=True)
def edit_file(
    path: Path,
    old_string: Annotated[str, Field(min_length=1, description="The exact text to replace, whitespace included.")],
    new_string: Annotated[str, Field(description="The text to put in its place.")],
    replace_all: Annotated[bool, Field(description="Replace every occurrence instead of exactly one.")] = False,
    ctx: ToolContext | None = None,
) -> str:
    """Replace an exact string in a workspace text file. old_string must occur exactly once unless replace_all is set; include surrounding lines to make it unique."""
    return _file_op(
        ctx, "edit", writable=True, path=path, old_string=old_string, new_string=new_string, replace_all=replace_all
    )


@tool(timeout_seconds=FILE_OP_SECONDS + 15, bounds_itself=True)
def list_files(
    path: Annotated[str, Field(max_length=4096, description="A directory relative to the workspace root.")] = ".",
    recursive: Annotated[bool, Field(description="List the whole tree below it.")] = False,
    ctx: ToolContext | None = None,
) -> str:
    """List a workspace directory: subdirectories end with '/', files show their size, links their target."""
    return _file_op(ctx, "list", writable=False, path=path, recursive=recursive)


@tool(timeout_seconds=FILE_OP_SECONDS + 15, bounds_itself=True)
def search_files(
    pattern: Annotated[str, Field(min_length=1, max_length=1000, description="A Python regular expression.")],
    path: Annotated[str, Field(max_length=4096, description="A file or directory to search in.")] = ".",
    max_results: Annotated[int, Field(ge=1, le=1000, description="Stop after this many matching lines.")] = 200,
    ctx: ToolContext | None = None,
) -> str:
    """Search the workspace's text files for lines matching a regular expression (like grep -rn; .git is skipped). Answers path:line: text."""
    return _file_op(ctx, "search", writable=False, pattern=pattern, path=path, max_results=max_results)


FILE_TOOL_SPECS: tuple[ToolSpec, ...] = (read_file, write_file, edit_file, list_files, search_files)
WORKSPACE_TOOL_SPECS: tuple[ToolSpec, ...] = (shell, *FILE_TOOL_SPECS)


def workspace_tool_specs(sandbox: CodeSandbox | None = None) -> tuple[ToolSpec, ...]:
    """The workspace tools, ``shell`` under the deployment's sandbox setting."""
    return (shell_tool(sandbox), *FILE_TOOL_SPECS) if sandbox is not None else WORKSPACE_TOOL_SPECS
