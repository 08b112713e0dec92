"""The tools every worker ships with: fetch a URL, run Python, keep notes on the task.

None of them has side effects in the engine's sense: a re-run after a crash is harmless
(a GET, a sandboxed computation, rewriting a note with the same value), so the engine may
simply replay them instead of reporting an unknown outcome.
"""

from __future__ import annotations

import codecs
import ctypes
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, Annotated, Any

from pydantic import AfterValidator, Field

from agentq.core.tools._core import NoteStore, ToolContext, ToolRegistry, tool

# --- http_fetch -------------------------------------------------------------------------------

HTTP_USER_AGENT = "agentq-http-fetch/0.1"
_HTTP_CHUNK = 64 * 1024


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows redirects to ftp:// too, and answers one to file:// with a bare 3xx;
    a GET-only web tool should stay on the web and say why it stopped."""

    def http_error_302(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any) -> Any:
        location = headers.get("location") or headers.get("uri")
        if location:
            target = urllib.parse.urljoin(req.full_url, location)
            if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
                raise ValueError(f"refusing to follow a redirect to {target!r}: only http and https URLs are fetched")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _http_opener() -> urllib.request.OpenerDirector:
    # Built by hand rather than with build_opener() so there is no file:, ftp: or data:
    # handler at all: the scheme check up front is then not the only thing standing guard.
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        _HttpOnlyRedirects(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


@tool(timeout_seconds=35.0)
def http_fetch(
    url: Annotated[str, Field(min_length=1, max_length=8192, description="An http:// or https:// URL to GET.")],
    max_bytes: Annotated[
        int, Field(ge=1, le=1_000_000, description="Read at most this many bytes of the body; the rest is cut off.")
    ] = 65536,
    timeout_seconds: Annotated[
        float, Field(gt=0, le=30, description="Give up on the request after this many seconds.")
    ] = 10.0,
    ctx: ToolContext | None = None,
) -> str:
    """Fetch a web page or API response with an HTTP GET and return its status line, content type and body text (cut off at max_bytes). Non-2xx responses are returned, not raised.

    An error status is information the model can act on (a 404 means "try another URL"), so
    it comes back as the result; only a failure to talk to the server at all is an error.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(
            f"http_fetch only fetches http:// and https:// URLs, not {scheme or 'scheme-less'} ones: {url!r}"
        )
    if not parts.hostname:
        raise ValueError(f"URL has no host: {url!r}")

    timeout = timeout_seconds
    remaining = ctx.remaining() if ctx is not None else None
    if remaining is not None:
        timeout = max(0.1, min(timeout, remaining - 0.5))
    give_up_at = time.monotonic() + timeout

    request = urllib.request.Request(
        url,
        method="GET",
        headers={"User-Agent": HTTP_USER_AGENT, "Accept": "*/*", "Accept-Encoding": "identity"},
    )
    try:
        response: Any = _http_opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:  # a non-2xx status: still an answer
        response = exc
    except urllib.error.URLError as exc:
        raise ConnectionError(f"could not fetch {url}: {exc.reason}") from None

    with response:
        status = response.status if response.status is not None else response.code
        content_type = response.headers.get("Content-Type") or "(no content-type)"
        charset = response.headers.get_content_charset() or "utf-8"
        body, truncated = _read_at_most(response, max_bytes, give_up_at, timeout) if response.fp else (b"", False)

    text = _decode_body(body, charset)
    out = f"HTTP {status} {content_type}\n\n{text}"
    if truncated:
        out += f"\n[truncated at {max_bytes} bytes]"
    return out


def _read_at_most(response: Any, max_bytes: int, give_up_at: float, timeout: float) -> tuple[bytes, bool]:
    """Read one byte past the limit to know whether anything was cut, never the whole body:
    a multi-gigabyte download must not be buffered just to be thrown away."""
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        if time.monotonic() > give_up_at:
            raise TimeoutError(f"the response body took longer than {timeout:.1f}s to arrive")
        chunk = response.read(min(_HTTP_CHUNK, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    data = b"".join(chunks)
    return data[:max_bytes], total > max_bytes


def _decode_body(body: bytes, charset: str) -> str:
    if b"\x00" in body[:1024]:
        return f"[binary body of {len(body)} bytes not shown]"
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"
    return body.decode(charset, errors="replace")


# --- python_exec ------------------------------------------------------------------------------

MAX_STREAM_BYTES = 32 * 1024  # per stream: stdout and stderr together stay within 64 KB
CHILD_FILE_BYTES = 16 * 1024 * 1024
CHILD_MAX_PROCESSES = 256  # threads count too; fork itself is refused by the audit hook
CHILD_MAX_OPEN_FILES = 256
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
CODE_FILE = "main.py"
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000

# Runs in the child before the user's code (``python -I -c _SANDBOX``). It installs an audit
# hook, which CPython offers no way to remove, refusing network access, process creation,
# native code (ctypes), raising resource limits, reaching other processes (signals, their
# /proc files, which hold e.g. the worker's AWS credentials) and walking the heap (gc) to
# tamper with the hook. The hook calls only functions captured here, not names looked up
# at call time, so user code cannot disarm it by monkeypatching os or builtins.
#
# This is a guard against an agent doing what it should not, not a security boundary against
# adversarial code: CPython's audit hooks are documented as not being a sandbox, and a
# determined attacker with arbitrary Python (interpreter bugs, rebuilding a patched extension
# module by hand) may get out. Untrusted code belongs in a separate Lambda function with no
# IAM permissions; unsharing the network namespace (below) is defence in depth.
_SANDBOX = r"""
import sys

def _agentq_lock_down():
    import posix, _posixsubprocess
    lstat, stat, readlink, getcwd, fspath = posix.lstat, posix.stat, posix.readlink, posix.getcwd, posix.fspath
    str_, bytes_, int_, type_, isinstance_ = str, bytes, int, type, isinstance
    str_add, str_eq, bytes_decode = str.__add__, str.__eq__, bytes.decode
    Denied, OSError_ = PermissionError, OSError
    own_pid = posix.getpid()
    own_pid_s = str(own_pid)
    IFMT, IFLNK, IFDIR = 0o170000, 0o120000, 0o040000

    def no_processes(*args, **kwargs):
        raise Denied("agentq sandbox: starting processes is not allowed")

    # fork_exec raises no audit event of its own; subprocess and multiprocessing both go
    # through it, so the function is replaced and re-importing the module is refused below.
    _posixsubprocess.fork_exec = no_processes

    def resolve(path):
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo = path.split("/")
        todo.reverse()
        parts = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
            here = "/" + "/".join(parts)
            try:
                mode = lstat(here).st_mode
            except OSError_:
                continue
            if mode & IFMT == IFLNK:
                hops += 1
                if hops > 40:
                    raise Denied("agentq sandbox: too many levels of symbolic links")
                target = readlink(here)
                parts.pop()
                if target.startswith("/"):
                    parts = []
                more = target.split("/")
                more.reverse()
                todo.extend(more)
        return parts

    home = resolve(getcwd())
    home_n = len(home)

    def check_open(path):
        kind = type_(path)
        if kind is int_:
            return
        if kind is not str_ and kind is not bytes_:
            path = fspath(path)
        if isinstance_(path, bytes_):
            path = bytes_decode(path, "utf-8", "surrogateescape")
        else:
            path = str_add("", path)
        parts = resolve(path)
        if parts[:1] == ["proc"]:
            if parts[1:] == [] or (parts[1].isdigit() and parts[1] != own_pid_s):
                raise Denied("agentq sandbox: other processes' /proc entries are off limits")
        try:
            mode = stat("/" + "/".join(parts)).st_mode
        except OSError_:
            return
        # A directory fd would let later dir_fd-relative opens escape the check above.
        if mode & IFMT == IFDIR and parts[:home_n] != home:
            raise Denied("agentq sandbox: opening directories outside the working directory is not allowed")

    def hook(event, args):
        if event.startswith(
            ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
             "os.system", "os.startfile", "os.symlink", "os.link", "os.killpg", "pty.", "gc.get_",
             "resource.setrlimit", "resource.prlimit", "_winapi.", "winreg.")
        ):
            raise Denied("agentq sandbox: " + event + " is not allowed (no network, no processes, no native code)")
        if event == "open":
            check_open(args[0])
        elif event == "os.kill":
            if args[0] != own_pid and args[0] != 0:
                raise Denied("agentq sandbox: signalling other processes is not allowed")
        elif event == "import":
            if str_eq(args[0], "_posixsubprocess") is True:
                raise Denied("agentq sandbox: re-importing _posixsubprocess is not allowed")

    sys.addaudithook(hook)

def _agentq_main():
    import traceback, types
    with open("main.py", "rb") as f:
        source = f.read()
    try:
        code = compile(source, "main.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.exit(1)
    module = types.ModuleType("__main__")
    module.__file__ = "main.py"
    sys.modules["__main__"] = module
    sys.argv[:] = ["main.py"]
    sys.path.insert(0, "")  # modules the script writes next to itself stay importable
    _agentq_lock_down()
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)

_agentq_main()
"""


def _libc_unshare() -> Callable[[int], int] | None:
    """Resolved in the parent: after fork only async-signal-safe work is safe, and loading a
    library (or importing anything) there could deadlock on a lock another thread held."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        unshare = libc.unshare
        unshare.argtypes = [ctypes.c_int]
        unshare.restype = ctypes.c_int
        return unshare
    except (OSError, AttributeError):
        return None


_UNSHARE = _libc_unshare()


def _child_setup(timeout: float, memory_mb: int) -> Callable[[], None]:
    """The preexec_fn: limits the child can only lower, set before the interpreter starts.

    Unsharing a fresh user + network namespace leaves the child with only a loopback device
    that is down; it fails where user namespaces are disabled, which is fine because the
    audit hook already refuses every socket (this is defence in depth).
    """
    import resource

    def clamp(which: int, want: int) -> tuple[int, int]:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        return want, want

    # SIGXCPU at the soft limit, SIGKILL a second later should the child ignore it.
    cpu = math.ceil(timeout) + 1
    cpu_soft, cpu_hard = clamp(resource.RLIMIT_CPU, cpu)
    if cpu_hard == cpu and resource.getrlimit(resource.RLIMIT_CPU)[1] == resource.RLIM_INFINITY:
        cpu_hard = cpu + 1
    limits = [
        (resource.RLIMIT_CPU, (cpu_soft, cpu_hard)),
        (resource.RLIMIT_AS, clamp(resource.RLIMIT_AS, memory_mb * 1024 * 1024)),
        (resource.RLIMIT_FSIZE, clamp(resource.RLIMIT_FSIZE, CHILD_FILE_BYTES)),
        (resource.RLIMIT_NOFILE, clamp(resource.RLIMIT_NOFILE, CHILD_MAX_OPEN_FILES)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if hasattr(resource, "RLIMIT_NPROC"):
        limits.append((resource.RLIMIT_NPROC, clamp(resource.RLIMIT_NPROC, CHILD_MAX_PROCESSES)))
    setrlimit = resource.setrlimit
    unshare = _UNSHARE

    def setup() -> None:
        if unshare is not None:
            unshare(_CLONE_NEWUSER | _CLONE_NEWNET)  # failure ignored: see above
        for which, value in limits:
            setrlimit(which, value)

    return setup


class _Drain(threading.Thread):
    """Keeps reading a pipe to the end but keeps only the first ``limit`` bytes, so a chatty
    child neither blocks on a full pipe nor fills the worker's memory."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            # read1: whatever the pipe has now, rather than blocking until 64 KB have arrived.
            while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
                self.total += len(chunk)
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
        except (OSError, ValueError):
            pass

    def text(self, name: str) -> str:
        out = bytes(self.kept).decode("utf-8", errors="replace")
        if self.total > len(self.kept):
            out += f"\n[{name} truncated: first {len(self.kept)} of {self.total} bytes shown]"
        return out


@tool(timeout_seconds=75.0)
def python_exec(
    code: Annotated[str, Field(min_length=1, max_length=100_000, description="Python 3 source to run as a script.")],
    timeout_seconds: Annotated[
        float, Field(gt=0, le=60, description="Wall-clock limit; the process is killed when it is reached.")
    ] = 10.0,
    memory_mb: Annotated[int, Field(ge=64, le=2048, description="Address-space limit of the process in MB.")] = 256,
    ctx: ToolContext | None = None,
) -> str:
    """Run a Python script in a sandboxed subprocess and return its exit code, stdout and stderr. There is no network access and no way to start other processes; the working directory is a fresh, empty temporary directory; only the standard library (and packages installed next to it) can be imported. Print what you want to see.

    A subprocess rather than exec() in the worker because only a process can be killed hard
    (runaway loop, memory blow-up) and given its own limits without taking the worker down.
    """
    timeout = timeout_seconds
    remaining = ctx.remaining() if ctx is not None else None
    if remaining is not None:
        timeout = max(0.5, min(timeout, remaining - 1.0))  # leave time to kill and report

    with tempfile.TemporaryDirectory(prefix="agentq-py-") as workdir:
        with open(os.path.join(workdir, CODE_FILE), "w", encoding="utf-8") as f:
            f.write(code)
        scratch = os.path.join(workdir, "tmp")
        os.mkdir(scratch)
        proc = subprocess.Popen(
            # -I: ignore PYTHON* variables and user site-packages and keep the cwd off sys.path;
            # -B: write no .pyc anywhere; -u: unbuffered, so output printed before a kill survives.
            # Not -S: a venv's (or the runtime's) installed packages stay importable.
            [sys.executable, "-I", "-B", "-u", "-c", _SANDBOX],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            # TMPDIR keeps tempfile inside the working directory, the only place the
            # sandbox lets the script open directories (and so clean them up).
            env={**CHILD_ENV, "TMPDIR": scratch},
            # The rlimits and the namespace unsharing must be set in the child before exec, which only
            # preexec_fn can do; the function makes plain syscalls (no locks, no imports), so the
            # fork-with-threads hazard PLW1509 warns of does not apply.
            preexec_fn=_child_setup(timeout, memory_mb),  # noqa: PLW1509
            start_new_session=True,  # its own process group, so the kill reaches everything it started
            close_fds=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Drain(proc.stdout, MAX_STREAM_BYTES), _Drain(proc.stderr, MAX_STREAM_BYTES)
        out.start()
        err.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            if timed_out:
                _kill_group(proc)
            proc.wait()
            out.join(timeout=2)
            err.join(timeout=2)
            proc.stdout.close()
            proc.stderr.close()

    stdout, stderr = out.text("stdout"), err.text("stderr")
    status = f"exit code {proc.returncode}"
    explanation = _explain_exit(proc.returncode, timed_out, timeout, memory_mb, stderr)
    if explanation:
        status += f" ({explanation})"
    return f"{status}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _explain_exit(returncode: int, timed_out: bool, timeout: float, memory_mb: int, stderr: str) -> str:
    """Say which limit ended the run: "exit code -9" alone would leave the model guessing."""
    if timed_out:
        return f"timed out after {timeout:.1f}s of wall-clock time; the process was killed"
    if returncode == -signal.SIGXCPU:
        return "killed: CPU time limit exceeded"
    if returncode != 0 and ("MemoryError" in stderr or "Cannot allocate memory" in stderr):
        return f"memory limit of {memory_mb} MB exceeded"
    if returncode == -signal.SIGKILL:
        return f"killed (most likely the memory limit of {memory_mb} MB)"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return ""


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


BUILTIN_TOOLS = (http_fetch, python_exec, note_write, note_read)


def default_registry() -> ToolRegistry:
    """A fresh registry each call, so a caller registering its own tools changes no one else's."""
    return ToolRegistry(BUILTIN_TOOLS)
