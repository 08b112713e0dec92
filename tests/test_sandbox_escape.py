"""python_exec attacked: model-written code, through the real tool, tries to get out.

Every probe runs twice: in the local isolation (bubblewrap, what ``agentq worker`` and the
local stack use) and in the sandbox Lambda function's handler, run inside a model of its
Lambda execution environment (tests/sandbox_support.py: its own process space, read-only
root, /tmp only, credentials in the handler's environment, no network) and reached the way
the executor reaches it, through ``RemoteSandbox``. The handler gets no namespaces from us
beyond what Lambda itself provides, so what it stops it stops with its own means (seccomp,
rlimits, a non-dumpable subreaper, cleanup between calls).

A probe prints ESCAPED when an attempt succeeds; every test asserts it never does, and checks
from the outside that the attempt left no trace (the victim process lives, no file appeared,
the listener saw no connection, no process outlived its call).
"""

from __future__ import annotations

import os
import re
import site
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentq.core.tools import ToolContext, ToolExecution, default_registry, idempotency_key_for
from agentq.sandbox.bwrap import BwrapSandbox
from agentq.sandbox.remote import RemoteSandbox
from agentq.sandbox.runner import SYSCALLS, machine

from tests.sandbox_support import CREDENTIAL_MARKER, LambdaEnvironment, host_processes_in_namespace

Run = Callable[..., tuple[str, str, str]]
SECRET = "WORKERSECRET-5c1e"


@pytest.fixture(scope="module")
def lambda_environment() -> Iterator[LambdaEnvironment]:
    environment = LambdaEnvironment()
    yield environment
    environment.close()


@pytest.fixture(params=["bwrap", "lambda"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run(where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Run:
    """python_exec through the registry, in the sandbox under test. The worker's own
    environment carries a secret, as a real worker's carries its AWS credentials."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    if where == "bwrap":
        registry = default_registry(sandbox=BwrapSandbox())
    else:
        environment: LambdaEnvironment = request.getfixturevalue("lambda_environment")
        registry = default_registry(sandbox=RemoteSandbox(environment.invoke))

    def run_code(code: str, timeout: float = 10, memory_mb: int = 256) -> tuple[str, str, str]:
        result = execute(registry, code, timeout, memory_mb)
        assert result.status == "ok", result.content
        return sections(result.content)

    return run_code


def execute(registry: object, code: str, timeout: float, memory_mb: int) -> ToolExecution:
    ctx = ToolContext("task-escape", "toolu_1", idempotency_key_for("task-escape", "toolu_1"))
    raw = {"code": code, "timeout_seconds": timeout, "memory_mb": memory_mb}
    return registry.execute("python_exec", raw, ctx, ["python_exec"])  # type: ignore[attr-defined, no-any-return]


def sections(output: str) -> tuple[str, str, str]:
    match = re.fullmatch(r"(exit code [^\n]*)\n--- stdout ---\n(.*)\n--- stderr ---\n(.*)", output, re.DOTALL)
    assert match, output
    return match.group(1), match.group(2), match.group(3)


def no_escape(stdout: str, stderr: str) -> None:
    assert "ESCAPED" not in stdout, stdout
    for marker in (SECRET, CREDENTIAL_MARKER):
        assert marker not in stdout and marker not in stderr


# Each probe tries one thing per line and prints "<name> ESCAPED <what>" or "<name> blocked <why>".
PROBE_HEAD = """
import os, sys
def attempt(name, fn):
    try:
        got = fn()
    except BaseException as exc:
        print(name, "blocked", type(exc).__name__, exc)
    else:
        print(name, "ESCAPED", repr(got)[:300])
"""


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process outside the sandbox, holding a secret in its environment and arguments."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep(600)  # {SECRET}"],
        env={**os.environ, "AWS_SECRET_ACCESS_KEY": SECRET},
    )
    yield proc
    proc.kill()
    proc.wait()


# --- credentials and other processes ---------------------------------------------------------


def test_code_cannot_read_the_workers_environment_or_credentials(run: Run, victim: subprocess.Popen[bytes]) -> None:
    code = (
        PROBE_HEAD
        + f"""
print("env", sorted(os.environ))
for key, value in os.environ.items():
    if "SECRET" in key or "TOKEN" in key or key.startswith("AWS_"):
        print("env ESCAPED", key)
paths = ["/proc/1/environ", "/proc/%d/environ" % os.getppid(), "/proc/{os.getpid()}/environ",
         "/proc/{victim.pid}/environ", "/proc/{victim.pid}/cmdline", "/proc/{os.getpid()}/cmdline",
         "/root/.aws/credentials", "{Path.home()}/.aws/credentials", "/etc/shadow", "/proc/%d/mem" % os.getppid()]
for path in paths:
    def read(path=path):
        data = open(path, "rb").read(65536)
        return "" if b"{SECRET}" not in data and b"{CREDENTIAL_MARKER}" not in data else "ESCAPED " + path
    try:
        found = read()
        print(path, found or "readable, no secret in it")
    except OSError as exc:
        print(path, "blocked", type(exc).__name__)
"""
    )
    status, stdout, stderr = run(code)
    assert status == "exit code 0"
    no_escape(stdout, stderr)
    assert set(eval(stdout.splitlines()[0][4:])) <= {"HOME", "LANG", "PATH", "PWD", "TMPDIR"}, stdout
    # The parent (bwrap's init, or the Lambda handler) is unreadable or holds nothing.
    assert "/proc/%d/mem" not in stdout


def test_code_sees_no_process_but_its_own_and_cannot_read_any_secret_in_proc(
    run: Run, victim: subprocess.Popen[bytes]
) -> None:
    code = (
        PROBE_HEAD
        + f"""
own = os.getpid()
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("pids", pids, "own", own, "parent", os.getppid())
print("victim visible", os.path.exists("/proc/{victim.pid}/cmdline") and {victim.pid} != own)
for pid in pids:
    for part in ("environ", "cmdline", "maps", "root/", "cwd/"):
        path = "/proc/%d/%s" % (pid, part)
        try:
            data = os.listdir(path) if path.endswith("/") else open(path, "rb").read()
        except OSError:
            continue
        if b"{SECRET}" in repr(data).encode() or b"{CREDENTIAL_MARKER}" in repr(data).encode():
            print("proc ESCAPED", path)
"""
    )
    status, stdout, stderr = run(code)
    assert status == "exit code 0", stderr
    no_escape(stdout, stderr)
    pids = eval(stdout.splitlines()[0].split("pids ", 1)[1].split(" own")[0])
    assert len(pids) <= 3, stdout  # itself, its parent (the handler / bwrap's init) and at most bwrap's monitor
    assert f"victim visible {False}" in stdout or str(victim.pid) not in map(str, pids)


# --- other calls ------------------------------------------------------------------------------


def test_a_call_cannot_see_files_of_an_earlier_call(run: Run) -> None:
    run("open('/tmp/left-behind', 'w').write('call one')\nimport os\nos.mkdir('/tmp/dir')\nopen('/tmp/dir/x','w')")
    _, stdout, _ = run(
        "import os\nfor root, dirs, files in os.walk('/tmp'):\n    print(root, sorted(dirs), sorted(files))"
    )
    assert stdout == "/tmp [] ['main.py']\n"


def test_concurrent_calls_cannot_see_each_other(where: str, run: Run) -> None:
    if where == "lambda":
        pytest.skip("one Lambda environment runs one invocation at a time; concurrent calls get separate environments")
    outputs: dict[str, str] = {}

    def first() -> None:
        outputs["first"] = run(f"open('/tmp/secret-of-first','w').write('{SECRET}')\nimport time\ntime.sleep(3)")[1]

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(1)
    code = """
import os
hits = []
for top in ("/tmp", "/proc", "/dev", "/"):
    for root, dirs, files in os.walk(top):
        if root.startswith("/proc/") and root.count("/") > 3:
            dirs[:] = []
        for name in files:
            if name == "secret-of-first":
                hits.append(os.path.join(root, name))
print("ESCAPED" if hits else "not found", hits)
"""
    # A walk of the sandbox's whole filesystem (/usr, the interpreter): seconds, more on a loaded
    # machine, so the tool's longest limit; a failure says how the run ended.
    ended, stdout, stderr = run(code, timeout=60)
    thread.join()
    assert stdout.startswith("not found"), (ended, stdout, stderr[-2000:])
    no_escape(stdout, stderr)


# --- writing outside the working directory ----------------------------------------------------


def writable_targets() -> list[str]:
    """Where a planted file would run later: the worker's and the interpreter's import paths."""
    paths = [*site.getsitepackages(), sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sys.prefix]
    paths += ["/", "/etc", "/usr/lib/python3/dist-packages", "/usr/local/lib", "/root", "/var/task", "/opt/python"]
    paths += ["/dev", "/dev/shm", "/proc/self", "/home", str(Path.home())]
    return sorted(set(paths))


def test_code_cannot_write_outside_its_directory_nor_into_the_interpreters_paths(run: Run) -> None:
    targets = writable_targets()
    code = (
        PROBE_HEAD
        + f"""
for d in {targets!r}:
    for name in ("agentq-escape.pth", "sitecustomize.py"):
        path = os.path.join(d, name)
        def write(path=path):
            with open(path, "w") as f:
                f.write("import os; os.system('echo PWNED')\\n")
            return path
        attempt("write " + path, write)
    attempt("mkdir " + d, lambda d=d: os.mkdir(os.path.join(d, "agentq-escape-dir")))
attempt("chmod", lambda: os.chmod("{sys.executable}", 0o777))
attempt("rename stdlib", lambda: os.rename(os.__file__, "/tmp/os.py"))
"""
    )
    status, stdout, stderr = run(code)
    assert status == "exit code 0", stderr
    no_escape(stdout, stderr)
    for d in targets:
        for name in ("agentq-escape.pth", "sitecustomize.py", "agentq-escape-dir"):
            assert not os.path.exists(os.path.join(d, name)), os.path.join(d, name)
    _, stdout, _ = run("print('after')")
    assert stdout == "after\n"  # no .pth ran in the next interpreter


# --- processes --------------------------------------------------------------------------------

PROCESS_PROBES = """
import ctypes, subprocess, multiprocessing, pty
libc = ctypes.CDLL(None, use_errno=True)
def checked(value):
    if value == -1 or value is None or (isinstance(value, int) and value < 0):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return value
def in_child(pid):
    if pid == 0:
        os._exit(0)
    return pid
attempt("subprocess", lambda: subprocess.run(["/bin/sh", "-c", "touch /tmp/RAN-subprocess"]).returncode)
def ran(marker, status):
    if os.path.exists("/tmp/RAN-" + marker):
        return "ran, status %d" % status
    raise OSError("no process ran (status %d)" % status)
attempt("os.system", lambda: ran("system", os.system("touch /tmp/RAN-system")))
attempt("os.popen", lambda: os.popen("touch /tmp/RAN-popen").close())
attempt("os.posix_spawn", lambda: os.posix_spawn("/bin/sh", ["sh", "-c", "touch /tmp/RAN-spawn"], {}))
attempt("os.spawnv", lambda: checked(os.spawnv(os.P_WAIT, "/bin/sh", ["sh", "-c", "touch /tmp/RAN-spawnv"])))
attempt("os.fork", lambda: in_child(os.fork()))
attempt("os.forkpty", lambda: in_child(os.forkpty()[0]))
attempt("pty.fork", lambda: in_child(pty.fork()[0]))
attempt("multiprocessing", lambda: multiprocessing.get_context("fork").Process(target=print).start())
attempt("ctypes system", lambda: ran("ctypes", libc.system(b"touch /tmp/RAN-ctypes")))
attempt("ctypes fork", lambda: in_child(checked(libc.fork())))
attempt("ctypes vfork syscall", lambda: in_child(checked(libc.syscall(58 if os.uname().machine == "x86_64" else 220, 0x4111, 0, 0, 0, 0))))
attempt("ctypes clone3", lambda: checked(libc.syscall(435, 0, 0)))
attempt("ctypes execve", lambda: checked(libc.execv(b"/bin/sh", (ctypes.c_char_p * 4)(b"sh", b"-c", b"touch /tmp/RAN-exec", None))))
attempt("os.execv", lambda: os.execv("/bin/sh", ["sh", "-c", "touch /tmp/RAN-execv"]))
attempt("unshare", lambda: os.unshare(os.CLONE_NEWUSER) if hasattr(os, "unshare") else checked(libc.unshare(0x10000000)))
print("ran:", sorted(f for f in os.listdir("/tmp") if f.startswith("RAN-")))
"""


def test_code_cannot_start_a_process_by_any_route(run: Run) -> None:
    status, stdout, stderr = run(PROBE_HEAD + PROCESS_PROBES)
    assert status == "exit code 0", stderr
    no_escape(stdout, stderr)
    lines = stdout.splitlines()
    assert lines[-1] == "ran: []"
    blocked = [line.split(" blocked")[0] for line in lines if " blocked " in line]
    assert len(blocked) == 16, stdout


# --- signals ----------------------------------------------------------------------------------


def test_code_cannot_signal_other_processes(run: Run, victim: subprocess.Popen[bytes]) -> None:
    code = (
        PROBE_HEAD
        + f"""
import signal, ctypes
libc = ctypes.CDLL(None, use_errno=True)
def checked(value):
    if value != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
for target in ({victim.pid}, 1, os.getppid(), -1):
    attempt("kill %d" % target, lambda t=target: os.kill(t, signal.SIGKILL))
attempt("killpg", lambda: os.killpg({victim.pid}, signal.SIGKILL))
attempt("killpg parent", lambda: os.killpg(os.getpgid(os.getppid()), signal.SIGKILL))
attempt("tgkill", lambda: checked(libc.syscall(234 if os.uname().machine == "x86_64" else 131, 1, 1, 9)))
attempt("pidfd_open", lambda: checked(libc.syscall(434, 1, 0) and 1))
attempt("ptrace attach", lambda: checked(libc.ptrace(16, os.getppid(), None, None)))
attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19))
attempt("prlimit", lambda: __import__("resource").prlimit(os.getppid(), __import__("resource").RLIMIT_NOFILE, (1, 1)))
os.kill(os.getpid(), 0)
print("own signal ok")
"""
    )
    status, stdout, stderr = run(code)
    assert status == "exit code 0", stderr
    no_escape(stdout, stderr)
    assert victim.poll() is None, "the victim was killed"
    assert stdout.count(" blocked ") == 11 and "own signal ok" in stdout, stdout
    assert run("print('still serving')")[1] == "still serving\n"  # the handler / worker lives on


# --- network ----------------------------------------------------------------------------------


def test_code_cannot_open_sockets_and_the_listener_sees_nothing(run: Run) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    code = (
        PROBE_HEAD
        + f"""
import socket, ctypes, urllib.request
libc = ctypes.CDLL(None, use_errno=True)
def checked(value):
    if value < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return value
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt("tcp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port})))
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("http", lambda: urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=2))
attempt("runtime api", lambda: urllib.request.urlopen("http://127.0.0.1:9001/2018-06-01/runtime/invocation/next", timeout=2))
attempt("metadata", lambda: urllib.request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=2))
attempt("raw syscall socket", lambda: checked(libc.syscall(41 if os.uname().machine == "x86_64" else 198, 2, 1, 0)))
attempt("dgram socketpair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
attempt("io_uring", lambda: checked(libc.syscall(425, 8, ctypes.create_string_buffer(120))))
a, b = socket.socketpair()  # connected to itself: what asyncio needs, allowed
attempt("repoint socketpair", lambda: a.connect(("127.0.0.1", {port})))
print("socketpair ok")
"""
    )
    try:
        status, stdout, stderr = run(code, timeout=20)
        listener.settimeout(0.3)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert status == "exit code 0", stderr
    no_escape(stdout, stderr)
    assert stdout.count(" blocked ") == 13, stdout


# --- time, disk, memory -----------------------------------------------------------------------


def test_code_does_not_survive_its_timeout(where: str, run: Run) -> None:
    code = """
import os, signal, threading
for sig in (signal.SIGTERM, signal.SIGXCPU, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
print(os.readlink("/proc/self/ns/pid"), flush=True)
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
try:
    os.setsid()
except OSError:
    pass
while True:
    open("heartbeat", "a").write("x")
"""
    status, stdout, _ = run(code, timeout=1.5)
    assert status.startswith("exit code -9 (timed out after 1.5s")
    pid_ns = stdout.splitlines()[0]
    if where == "bwrap":
        assert re.fullmatch(r"pid:\[\d+\]", pid_ns)
        assert pid_ns != os.readlink("/proc/self/ns/pid")
        assert host_processes_in_namespace(pid_ns) == []  # the whole namespace is gone
    code = (
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid(), os.listdir('/tmp'))"
    )
    _, stdout, _ = run(code)
    pids, own, listing = stdout.rsplit(" ", 2)[0], int(stdout.split("] ")[1].split(" ")[0]), stdout.rsplit(" ", 1)[1]
    assert listing.strip() == "['main.py']"
    assert len(eval(pids + "]" if not pids.endswith("]") else pids)) <= 3, stdout
    assert own > 0


def test_code_cannot_fill_the_disk(run: Run) -> None:
    code = (
        PROBE_HEAD
        + """
written = 0
block = b"x" * (1024 * 1024)
try:
    for i in range(1024):
        with open("fill-%d" % i, "wb") as f:
            for _ in range(8):
                f.write(block)
                written += len(block)
except OSError as exc:
    print("stopped", type(exc).__name__, exc.errno)
print("written MB", written // (1024 * 1024), flush=True)
if written > 100 * 1024 * 1024:
    print("ESCAPED")
attempt("one big file", lambda: open("big", "wb").write(b"y" * (20 * 1024 * 1024)))
"""
    )
    status, stdout, stderr = run(code, timeout=30)
    no_escape(stdout, stderr)
    # Either the filesystem ran out (ENOSPC at 64 MB) or the supervisor killed the run for it.
    assert "stopped OSError 28" in stdout or "wrote more than 64 MB to disk" in status, (status, stdout)
    _, after, _ = run("import os, shutil\nprint(os.listdir('/tmp'), shutil.disk_usage('/tmp').used // 2**20)")
    assert after.startswith("['main.py'] ")
    assert int(after.split()[-1]) < 2


def test_code_cannot_create_unbounded_files(run: Run) -> None:
    code = """
import os
for i in range(1_000_000):
    open("f%d" % i, "w").close()
print("ESCAPED created", i + 1)
"""
    status, stdout, _ = run(code, timeout=30)
    assert "ESCAPED" not in stdout
    assert status == "exit code -9 (killed: created more than 2048 files and directories)", status
    assert run("import os\nprint(len(os.listdir('/tmp')))")[1] == "1\n"


def test_a_single_file_is_capped(run: Run) -> None:
    status, stdout, _ = run(PROBE_HEAD + "attempt('17MB', lambda: open('big', 'wb').write(b'z' * (17 * 2**20)))")
    assert "17MB blocked OSError [Errno 27] File too large" in stdout, (status, stdout)


def test_memory_beyond_the_limit_is_refused(run: Run) -> None:
    status, _, stderr = run("x = bytearray(512 * 1024 * 1024)\nprint('allocated')", memory_mb=128)
    assert status == "exit code 1 (memory limit of 128 MB exceeded)" and "MemoryError" in stderr


# Memory the host holds for the code outside its address space, which RLIMIT_AS (memory_mb) does
# not count: a memfd keeps its pages once unmapped, a SysV segment or queue and a POSIX queue
# belong to the IPC namespace, a socket's buffer raised with SO_SNDBUF is kernel memory, and a
# file in /dev/shm is a tmpfs page. Each route is tried by raw system call (no libc wrapper that
# may be missing), and the memfd one as a caller would use it: 1 GiB, RLIMIT_FSIZE at a time.
OUTSIDE_ADDRESS_SPACE = """
import ctypes, os, resource, socket
NR = {numbers}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(name, *args):
    r = libc.syscall(NR[name], *args)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r

attempt("memfd_create", lambda: call("memfd_create", b"m", 0))
attempt("memfd_secret", lambda: call("memfd_secret", 0))
attempt("shmget", lambda: call("shmget", 0, 1 << 20, 0o1600))
attempt("shmat", lambda: call("shmat", 0, None, 0))
attempt("msgget", lambda: call("msgget", 0, 0o1600))
attempt("msgsnd", lambda: call("msgsnd", 0, b"\\1" + bytes(15), 8, 0o4000))
attempt("mq_open", lambda: call("mq_open", b"q", os.O_CREAT | os.O_RDWR, 0o600, None))
attempt("SO_SNDBUF", lambda: socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20))
attempt("/dev/shm", lambda: open("/dev/shm/held", "wb").write(bytes(1 << 20)))
step, held, fds, chunk = resource.getrlimit(resource.RLIMIT_FSIZE)[0], 0, [], b"x" * (1 << 20)
try:
    while held < (1 << 30):
        fds.append(os.memfd_create("m"))
        for _ in range(step >> 20):
            held += os.write(fds[-1], chunk)
except OSError as exc:
    print("memfds stopped", exc)
print("memfds held MB", held >> 20)
"""


def test_code_cannot_hold_memory_outside_its_address_space_by_any_route(run: Run) -> None:
    """Before, memfds held 1 GiB for code given 256 MB (VmRSS 14 MB), 120 socketpairs with
    SO_SNDBUF 941 MB, 32,000 SysV queues 500 MB. What is still outside the limit is bounded by
    other means and listed in docs/SANDBOX.md (the 64 MB /tmp, pipes, default socket buffers)."""
    names = ("memfd_create", "memfd_secret", "shmget", "shmat", "msgget", "msgsnd", "mq_open")
    code = PROBE_HEAD + OUTSIDE_ADDRESS_SPACE.format(numbers={name: SYSCALLS[machine()][name] for name in names})
    status, stdout, stderr = run(code, timeout=30, memory_mb=256)
    no_escape(stdout, stderr)
    lines = stdout.strip().splitlines()
    assert lines[-1] == "memfds held MB 0", (status, stdout)  # was: memfds held MB 1024
    for name in (*names, "SO_SNDBUF"):
        assert f"{name} blocked PermissionError [Errno 1]" in stdout, stdout
    assert "/dev/shm blocked " in stdout and "/dev/shm ESCAPED" not in stdout, stdout


# --- failing closed ---------------------------------------------------------------------------


def test_bwrap_missing_is_a_refusal_not_an_unisolated_run() -> None:
    registry = default_registry(sandbox=BwrapSandbox(bwrap="/nonexistent/bwrap"))
    result = execute(registry, "open('/tmp/agentq-ran-anyway','w')", 5, 256)
    assert result.is_error and result.content.startswith("ToolError: SandboxUnavailable:")
    assert not os.path.exists("/tmp/agentq-ran-anyway")


def test_without_user_namespaces_bwrap_refuses_and_nothing_runs(tmp_path: Path) -> None:
    """The worker itself inside a sandbox that forbids new user namespaces (as a default
    Docker or Fargate container does): the real bwrap cannot set up, so python_exec refuses.
    A worker that is root there cannot even become uid 65534 to start bwrap (that namespace
    maps its own uid alone), and says so; it never runs bwrap as root instead."""
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w')"
    script = (
        "from agentq.core.tools import default_registry, ToolContext\n"
        "r = default_registry()\n"
        f"print(r.execute('python_exec', {{'code': {code!r}}}, ToolContext('t', 'u', 'k'), ['python_exec']).content)\n"
    )
    proc = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "ToolError: SandboxUnavailable: bubblewrap could not set up the sandbox, so nothing ran: "
    ), proc.stdout
    if os.geteuid() == 0:
        assert "cannot drop the supplementary groups to start bubblewrap" in proc.stdout, proc.stdout
        assert "user namespace" in proc.stdout and "never run as root instead" in proc.stdout, proc.stdout
    else:
        assert "nothing ran: bwrap:" in proc.stdout, proc.stdout
    assert not marker.exists()


def test_the_runner_refuses_when_the_namespaces_are_not_there() -> None:
    """Should bwrap ever run the code without its namespaces, the runner notices and refuses."""

    class Careless(BwrapSandbox):
        def command(self, request: object, status_fd: int) -> list[str]:
            argv = super().command(request, status_fd)  # type: ignore[arg-type]
            dropped = {"--unshare-all", "--disable-userns"}
            argv = [a for a in argv if a not in dropped]
            i = argv.index("--hostname")
            return argv[:i] + argv[i + 2 :]

    result = execute(default_registry(sandbox=Careless()), "print('RAN')", 5, 256)
    assert result.is_error, result.content
    assert result.content.startswith("ToolError: SandboxUnavailable: the sandbox refused to start: ")
    assert "RAN" not in result.content


def test_a_lambda_environment_that_cannot_be_cleaned_is_thrown_away() -> None:
    """If the handler cannot empty its scratch directory (here: pointed at a read-only one),
    it runs nothing and exits, so Lambda discards the environment; the call is refused."""
    environment = LambdaEnvironment(extra_env={"AGENTQ_SANDBOX_ROOT": "/opt/python/agentq"})
    try:
        registry = default_registry(sandbox=RemoteSandbox(environment.invoke))
        result = execute(registry, "print('RAN')", 5, 256)
        assert result.is_error, result.content
        assert result.content.startswith("ToolError: SandboxUnavailable: the sandbox function could not run the code")
        assert "exited without answering" in result.content and "RAN" not in result.content
        assert environment.proc is None  # gone; the next call would start a fresh one
    finally:
        environment.close()
