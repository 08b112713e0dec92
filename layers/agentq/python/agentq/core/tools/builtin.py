"""The tools every worker ships with: fetch a URL, run Python, keep notes on the task.

None of them has side effects in the engine's sense: a re-run after a crash is harmless
(a GET, a sandboxed computation, rewriting a note with the same value), so the engine may
simply replay them instead of reporting an unknown outcome.

The two that touch the outside world take what guards them from the deployment:
``http_fetch`` a ``FetchPolicy`` (core/tools/fetch.py: the SSRF guard), ``python_exec`` a
``CodeSandbox`` (agentq.sandbox: bubblewrap on the host or the sandbox Lambda function).
``default_registry()`` gives the safe defaults; ``agentq.runtime.build_registry`` wires the
deployment's configuration.
"""

from __future__ import annotations

import codecs
from typing import Annotated

from pydantic import AfterValidator, Field

from agentq.core.tools._context import NoteStore, ToolContext
from agentq.core.tools._core import ToolRegistry, ToolSpec, tool
from agentq.core.tools.credentials import check_headers, credentialed, vault_headers, whole_answer
from agentq.core.tools.fetch import FetchPolicy
from agentq.core.tools.fetch import get as guarded_get
from agentq.core.tools.workspace import WORKSPACE_TOOL_SPECS, check_code_allowed, workspace_tool_specs
from agentq.sandbox.base import CodeSandbox, ExecRequest, SandboxLimits

# --- http_fetch -------------------------------------------------------------------------------


def _checked_headers(headers: dict[str, str]) -> dict[str, str]:
    check_headers(headers)
    return headers


def http_fetch_tool(policy: FetchPolicy | None = None) -> ToolSpec:
    """``http_fetch`` under ``policy`` (default: any public address, nothing internal)."""
    guard = policy or FetchPolicy()

    @tool(name="http_fetch", timeout_seconds=35.0)
    def http_fetch(
        url: Annotated[str, Field(min_length=1, max_length=8192, description="An http:// or https:// URL to GET.")],
        max_bytes: Annotated[
            int, Field(ge=1, le=1_000_000, description="Read at most this many bytes of the body; the rest is cut off.")
        ] = 65536,
        timeout_seconds: Annotated[
            float,
            Field(gt=0, le=30, description="Give up on the whole fetch (redirects included) after this many seconds."),
        ] = 10.0,
        headers: Annotated[
            dict[str, Annotated[str, Field(max_length=8192)]],
            Field(
                max_length=20,
                description="Extra request headers. A value may hold ${vault:NAME}: the credential NAME of the user "
                "this task acts for, added for a host it is bound to (you never see its value).",
            ),
            AfterValidator(_checked_headers),
        ] = {},  # noqa: B006 - pydantic copies a default, so no call shares it
        ctx: ToolContext | None = None,
    ) -> str:
        """Fetch a public web page or API response with an HTTP GET and return its status line, content type and body text (cut off at max_bytes). Non-2xx responses are returned, not raised. Internal, private, loopback and cloud metadata addresses are refused. A header value may refer to a credential of the user you act for as ${vault:NAME}.

        An error status is information the model can act on (a 404 means "try another URL"), so
        it comes back as the result; only a refused address or a failure to talk to the server
        at all is an error. A credential reference is expanded for each hop's host, so a redirect
        to a host it is not bound to carries none (``core.tools.credentials``).
        """
        timeout = timeout_seconds
        remaining = ctx.remaining() if ctx is not None else None
        if remaining is not None:
            timeout = max(0.1, min(timeout, remaining - 0.5))
        extra = vault_headers(headers, ctx.credentials if ctx is not None else None) if headers else None
        check = whole_answer if credentialed(headers) else None  # a range or an encoding of an echo: refused
        response = guarded_get(url, max_bytes=max_bytes, timeout=timeout, policy=guard, headers=extra, check=check)
        out = f"HTTP {response.status} {response.content_type}"
        if response.redirects:
            out += f" (after {len(response.redirects)} redirect(s), from {response.url})"
        out += f"\n\n{_decode_body(response.body, response.charset)}"
        if response.truncated:
            out += f"\n[truncated at {max_bytes} bytes]"
        return out

    return http_fetch


def _decode_body(body: bytes, charset: str) -> str:
    if b"\x00" in body[:1024]:
        return f"[binary body of {len(body)} bytes not shown]"
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"
    return body.decode(charset, errors="replace")


# --- python_exec ------------------------------------------------------------------------------


def python_exec_tool(sandbox: CodeSandbox | None = None) -> ToolSpec:
    """``python_exec`` running in ``sandbox`` (default: bubblewrap on this host, made on first use).

    The tool itself never runs the code: it hands it to the sandbox, and a sandbox that
    cannot isolate it raises ``SandboxUnavailable``, which the registry turns into an error
    result naming the reason. There is no unisolated fallback.
    """
    chosen: list[CodeSandbox] = [sandbox] if sandbox is not None else []

    def current() -> CodeSandbox:
        if not chosen:
            from agentq.sandbox.bwrap import BwrapSandbox

            chosen.append(BwrapSandbox())
        return chosen[0]

    @tool(name="python_exec", timeout_seconds=75.0, bounds_itself=True)
    def python_exec(
        code: Annotated[
            str, Field(min_length=1, max_length=100_000, description="Python 3 source to run as a script.")
        ],
        timeout_seconds: Annotated[
            float, Field(gt=0, le=60, description="Wall-clock limit; the process is killed when it is reached.")
        ] = 10.0,
        memory_mb: Annotated[int, Field(ge=64, le=2048, description="Address-space limit of the process in MB.")] = 256,
        ctx: ToolContext | None = None,
    ) -> str:
        """Run a Python script in an isolated sandbox and return its exit code, stdout and stderr. Only the standard library can be imported; there is no network access and no way to start other processes; the working directory is a fresh, empty /tmp (the only writable place, up to 64 MB and 2048 files), gone after the call, or the task's workspace (/workspace, kept) when the task has one. Print what you want to see.

        The sandbox is a process the worker can kill hard (runaway loop, memory blow-up) and
        that cannot see the worker, its credentials, other calls or the network.
        """
        box = current()
        check_code_allowed(box)  # a workspace's code runs in its own bubblewrap, not in ``box``
        timeout = ctx.bound(timeout_seconds) if ctx is not None else timeout_seconds  # time to kill and report
        if ctx is not None and ctx.workspace is not None:
            result = ctx.workspace.python(code, timeout, memory_mb)
        else:
            result = box.run(ExecRequest(code=code, timeout_seconds=timeout, memory_mb=memory_mb))
        status = f"exit code {result.exit_code}"
        limits = getattr(box, "limits", None) or SandboxLimits()
        explanation = result.explain(timeout, memory_mb, limits)
        if explanation:
            status += f" ({explanation})"
        return f"{status}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"

    return python_exec


# --- notes ------------------------------------------------------------------------------------

MAX_NOTE_KEY_CHARS = 128
MAX_NOTE_BYTES = 32 * 1024


def _fits_note(value: str) -> str:
    size = len(value.encode("utf-8"))
    if size > MAX_NOTE_BYTES:
        raise ValueError(f"a note holds at most {MAX_NOTE_BYTES} bytes of UTF-8, this one is {size}")
    return value


NoteKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_NOTE_KEY_CHARS,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Note name: letters, digits and _ . : - only, at most 128 characters.",
    ),
]


def _notes_of(ctx: ToolContext) -> NoteStore:
    if ctx.notes is None:
        raise RuntimeError("notes are not available for this task")
    return ctx.notes


@tool
def note_write(
    key: NoteKey,
    value: Annotated[
        str,
        Field(
            max_length=MAX_NOTE_BYTES,
            description="Text to store under key (at most 32 KB); replaces any previous value.",
        ),
        AfterValidator(_fits_note),
    ],
    ctx: ToolContext,
) -> str:
    """Save a text note on this task under a key, replacing any note of that name. Notes outlive the conversation's context, so use them for facts and progress you will need later.

    Declared without side effects: writing the same value twice leaves the same state, and
    the engine fences the write with the task lease, so a replay after a crash is harmless.
    """
    _notes_of(ctx).write_note(key, value)
    return f"saved note {key!r} ({len(value.encode('utf-8'))} bytes)"


@tool
def note_read(key: NoteKey, ctx: ToolContext) -> str:
    """Read the text note saved on this task under a key.

    A missing note is an ordinary answer, not an error: the model asking "did I write this
    down?" should get "no" without the call being flagged as a failure.
    """
    value = _notes_of(ctx).read_note(key)
    if value is None:
        return f"no note named {key!r}"
    return value


http_fetch = http_fetch_tool()
python_exec = python_exec_tool()
BUILTIN_TOOLS = (http_fetch, python_exec, note_write, note_read, *WORKSPACE_TOOL_SPECS)


def default_registry(*, sandbox: CodeSandbox | None = None, fetch_policy: FetchPolicy | None = None) -> ToolRegistry:
    """A fresh registry each call, so a caller registering its own tools changes no one else's.

    ``sandbox`` and ``fetch_policy`` are the deployment's (``agentq.runtime.build_registry``
    reads them from the environment); left out, python_exec uses bubblewrap on this host and
    http_fetch contacts public addresses only. A ``sandbox`` that refuses (``AGENTQ_SANDBOX=off``)
    refuses ``shell`` too, and python_exec in a workspace: no model-written code runs.
    """
    if sandbox is None and fetch_policy is None:
        return ToolRegistry(BUILTIN_TOOLS)
    return ToolRegistry(
        (
            http_fetch_tool(fetch_policy),
            python_exec_tool(sandbox),
            note_write,
            note_read,
            *workspace_tool_specs(sandbox),
        )
    )
