"""The first code that runs in the sandbox: it locks the process down, then runs the script.

Its source is handed to the sandbox's interpreter with ``python -I -S -B -u -c`` (standard
library only: the sandbox sees no site-packages), the limits as JSON in ``argv[1]`` and the
script on stdin. Before the script runs it:

1. reads the script and makes stdin ``/dev/null``, closes every inherited descriptor;
2. lowers the resource limits (CPU seconds, address space, file size, open files, no core
   dumps): an unprivileged process can lower its hard limits but never raise them again;
3. where namespaces are expected (bubblewrap), checks that they are in place (only ``lo`` in
   the network namespace, no other process visible) and refuses to go on if not;
4. installs a seccomp filter that the kernel enforces on every later system call of the
   process and anything it could start: no process creation (execve, fork, non-thread
   clone), no sockets (only an anonymous connected ``socketpair``, which asyncio needs), no
   signals or scheduling/resource changes aimed at another process, no ptrace or reading
   another process's memory, no io_uring (it could open sockets behind seccomp's back), no
   namespace, mount, module, key-ring or BPF calls, no memory held outside the address space
   ``RLIMIT_AS`` bounds (``_OUTSIDE_ADDRESS_SPACE``). An unexpected architecture (a 32-bit or
   x32 system call on x86-64) kills the process.

Each step that fails exits with ``SETUP_FAILED_EXIT`` and a line starting with
``SETUP_FAILED_MARK`` on stderr, before the script ran: the caller reports the sandbox as
unavailable. The seccomp filter is a second wall, not the first one: in bubblewrap the
namespaces already hide the worker; in the sandbox Lambda function (no namespaces there) the
filter and the function's own boundary are what stand. Unlike the audit hook this replaces,
nothing here relies on the interpreter behaving: ctypes and raw system calls meet the same
kernel checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import resource
import socket
import struct
import sys
import threading
import traceback
import types

SETUP_FAILED_EXIT = 121  # agentq.sandbox.base.SETUP_FAILED_EXIT (this file imports nothing of agentq)
SETUP_FAILED_MARK = "agentq-sandbox-setup-failed: "
CODE_FILE = "main.py"

# --- the seccomp filter ----------------------------------------------------------------------

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# Refused outright (EPERM). Numbers from the kernel's uapi headers (asm/unistd_64.h for
# x86-64, asm-generic/unistd.h for arm64); a name missing on an architecture does not exist there.
_DENY = (
    "execve execveat fork vfork socket connect bind listen accept accept4 tkill "
    "pidfd_open pidfd_send_signal pidfd_getfd ptrace process_vm_readv process_vm_writev kcmp "
    "perf_event_open bpf userfaultfd io_uring_setup io_uring_enter io_uring_register keyctl add_key "
    "request_key fanotify_init open_by_handle_at name_to_handle_at lookup_dcookie unshare setns mount "
    "umount2 pivot_root chroot move_mount open_tree fsopen fsconfig fsmount fspick mount_setattr reboot "
    "kexec_load kexec_file_load init_module finit_module delete_module swapon swapoff acct quotactl "
    "syslog settimeofday clock_settime adjtimex clock_adjtime sethostname setdomainname iopl ioperm "
    "personality uselib vhangup setpriority ioprio_set migrate_pages move_pages get_robust_list "
    "process_madvise process_mrelease"
).split()
# Refused to python_exec and the file tools (not to the workspace shell, whose memory is bounded
# per process only, 256 processes of RLIMIT_AS each: docs/SANDBOX.md): the ways to hold the
# host's memory outside the address space that ``memory_mb`` (RLIMIT_AS) bounds. A memfd keeps its
# pages once unmapped (1 GiB held at memory_mb=256, VmRSS 14 MB), a SysV segment or message queue
# and a POSIX queue belong to the IPC namespace, not to the process (32,000 queues of 16 KB: 500
# MB), and a socket's send buffer raised with SO_SNDBUF holds up to twice net.core.wmem_max of
# kernel memory (120 socketpairs: 941 MB). asyncio's socketpair needs no option set.
_OUTSIDE_ADDRESS_SPACE = "memfd_create memfd_secret shmget shmat msgget msgsnd mq_open setsockopt".split()
# Allowed only when the first argument is this process (signals to itself: raise(), a thread's
# own signal handling); anything aimed at another pid gets EPERM.
_OWN_PID_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
# Allowed when the first argument is 0 (the caller) or this process.
_SELF_OR_ZERO = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41,
        "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288, "kill": 62,
        "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "perf_event_open": 298, "bpf": 321, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248,
        "request_key": 249, "fanotify_init": 300, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "lookup_dcookie": 212, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "reboot": 169, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168,
        "acct": 163, "quotactl": 179, "syslog": 103, "settimeofday": 164, "clock_settime": 227,
        "adjtimex": 159, "clock_adjtime": 305, "sethostname": 170, "setdomainname": 171, "iopl": 172,
        "ioperm": 173, "personality": 135, "uselib": 134, "vhangup": 153, "prlimit64": 302,
        "sched_setaffinity": 203, "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314,
        "setpriority": 141, "ioprio_set": 251, "migrate_pages": 256, "move_pages": 279,
        "get_robust_list": 274, "process_madvise": 440, "process_mrelease": 448, "memfd_create": 319,
        "memfd_secret": 447, "shmget": 29, "shmat": 30, "msgget": 68, "msgsnd": 69, "mq_open": 240, "setsockopt": 54,
    },
    "aarch64": {
        "execve": 221, "execveat": 281, "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199,
        "connect": 203, "bind": 200, "listen": 201, "accept": 202, "accept4": 242, "kill": 129, "tkill": 130,
        "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_open": 434,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217,
        "request_key": 218, "fanotify_init": 262, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "lookup_dcookie": 18, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "reboot": 142, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "swapon": 224, "swapoff": 225,
        "acct": 89, "quotactl": 60, "syslog": 116, "settimeofday": 170, "clock_settime": 112,
        "adjtimex": 171, "clock_adjtime": 266, "sethostname": 161, "setdomainname": 162, "personality": 92,
        "vhangup": 58, "prlimit64": 261, "sched_setaffinity": 122, "sched_setscheduler": 119,
        "sched_setparam": 118, "sched_setattr": 274, "setpriority": 140, "ioprio_set": 30,
        "migrate_pages": 238, "move_pages": 239, "get_robust_list": 100, "process_madvise": 440,
        "process_mrelease": 448, "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "shmat": 196,
        "msgget": 186, "msgsnd": 189, "mq_open": 180, "setsockopt": 208,
    },
}  # fmt: skip

CLONE_THREAD = 0x00010000
# Namespace flags: a "thread" that also asks for a new namespace is not a thread.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
AF_UNIX = 1
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF

# Classic BPF, as seccomp runs it over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
_LD_ABS_W, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1 = 0, 4, 16, 24  # args: the low 32 bits (little-endian)
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000


# What a workspace's shell may do that python_exec may not (``build_filter(processes=True)``):
# start processes (a shell is nothing else), signal them (its own PID namespace is the wall:
# bubblewrap's, which ``expect_namespaces`` checks), and open sockets of the families a build
# or a test run uses, in a network namespace that holds only its own loopback device.
_PROCESS_CALLS = ("execve", "execveat", "fork", "vfork")
_SOCKET_CALLS = ("socket", "connect", "bind", "listen", "accept", "accept4")
AF_INET, AF_INET6 = 2, 10


def build_filter(arch: str, own_pid: int, *, processes: bool = False) -> bytes:
    """The filter program for ``arch``, as the bytes of a ``struct sock_filter`` array.

    Argument checks look at the low 32 bits only, which is what the kernel itself reads for
    a ``pid_t`` or ``int`` argument, so the upper half cannot be used to sneak past them.
    ``processes``: the workspace shell's filter (see ``_PROCESS_CALLS``); still no ptrace,
    namespaces, mounts, modules, BPF, io_uring, nor a socket family but Unix, IPv4 and IPv6; but
    memfds, SysV IPC, POSIX queues and socket options, which python_exec's filter refuses.
    """
    table = SYSCALLS[arch]
    deny = [n for n in _DENY if not (processes and n in (*_PROCESS_CALLS, *_SOCKET_CALLS))]
    deny += [] if processes else list(_OUTSIDE_ADDRESS_SPACE)
    prog: list[tuple[int, int | str, int | str, int]] = []

    def op(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        prog.append((code, jt, jf, k))

    labels: dict[str, int] = {}
    op(_LD_ABS_W, _OFF_ARCH)
    op(_JEQ, AUDIT_ARCH[arch], 0, "kill")
    op(_LD_ABS_W, _OFF_NR)
    if arch == "x86_64":
        op(_JGE, X32_SYSCALL_BIT, "kill", 0)
    for name in deny:
        if name in table:
            op(_JEQ, table[name], "deny", 0)
    if processes:
        op(_JEQ, table["socket"], "socket", 0)
    for name in () if processes else _OWN_PID_ONLY:
        op(_JEQ, table[name], "own_pid", 0)
    for name in _SELF_OR_ZERO:
        op(_JEQ, table[name], "self_or_zero", 0)
    op(_JEQ, table["clone"], "clone", 0)
    op(_JEQ, table["clone3"], "enosys", 0)  # glibc then falls back to clone, which is checked
    op(_JEQ, table["socketpair"], "socketpair", 0)
    op(_RET, RET_ALLOW)

    labels["self_or_zero"] = len(prog)
    op(_LD_ABS_W, _OFF_ARG0)
    op(_JEQ, 0, "allow", 0)
    op(_JEQ, own_pid, "allow", "deny")
    labels["own_pid"] = len(prog)
    op(_LD_ABS_W, _OFF_ARG0)
    op(_JEQ, own_pid, "allow", "deny")
    labels["clone"] = len(prog)
    op(_LD_ABS_W, _OFF_ARG0)
    if processes:  # any process or thread, never a new namespace
        op(_AND, CLONE_NAMESPACES)
        op(_JEQ, 0, "allow", "deny")
    else:
        op(_AND, CLONE_THREAD | CLONE_NAMESPACES)
        op(_JEQ, CLONE_THREAD, "allow", "deny")
    if processes:
        labels["socket"] = len(prog)
        op(_LD_ABS_W, _OFF_ARG0)
        op(_JEQ, AF_UNIX, "allow", 0)
        op(_JEQ, AF_INET, "allow", 0)
        op(_JEQ, AF_INET6, "allow", "deny")
    labels["socketpair"] = len(prog)
    op(_LD_ABS_W, _OFF_ARG0)
    op(_JEQ, AF_UNIX, "allow" if processes else 0, "deny")
    op(_LD_ABS_W, _OFF_ARG1)
    op(_AND, SOCK_TYPE_MASK)
    op(_JEQ, SOCK_STREAM, "allow", "deny")
    labels["allow"] = len(prog)
    op(_RET, RET_ALLOW)
    labels["deny"] = len(prog)
    op(_RET, RET_ERRNO | errno.EPERM)
    labels["enosys"] = len(prog)
    op(_RET, RET_ERRNO | errno.ENOSYS)
    labels["kill"] = len(prog)
    op(_RET, RET_KILL_PROCESS)

    out = bytearray()
    for index, (code, jt, jf, k) in enumerate(prog):
        jumps = []
        for target in (jt, jf):
            offset = target if isinstance(target, int) else labels[target] - index - 1
            if not 0 <= offset <= 255:
                raise ValueError(f"seccomp jump out of range at {index}: {offset}")
            jumps.append(offset)
        out += struct.pack("<HBBI", code, jumps[0], jumps[1], k)
    return bytes(out)


def machine() -> str:
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def install_filter(program: bytes) -> None:
    """no_new_privs, then the filter: the kernel refuses an unprivileged filter without the
    former, and both are inherited by everything the process could ever start."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP) failed: {os.strerror(err)}")


# --- the run ---------------------------------------------------------------------------------


def _fail(reason: str) -> None:
    sys.stderr.write(SETUP_FAILED_MARK + reason + "\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED_EXIT)


def _set_limits(config: dict[str, int]) -> None:
    def lower(which: int, want: int) -> None:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(which, (want, want))

    # SIGXCPU at the soft limit; the hard limit a second later is SIGKILL, should it be caught.
    cpu = int(config["cpu_seconds"])
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_hard == resource.RLIM_INFINITY or cpu_hard > cpu + 1:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    lower(resource.RLIMIT_AS, int(config["memory_bytes"]))
    lower(resource.RLIMIT_FSIZE, int(config["max_file_bytes"]))
    lower(resource.RLIMIT_NOFILE, int(config["max_open_files"]))
    lower(resource.RLIMIT_CORE, 0)
    if "max_processes" in config:  # a workspace shell: counted in its own user namespace
        lower(resource.RLIMIT_NPROC, int(config["max_processes"]))


def _check_namespaces() -> None:
    """In bubblewrap, refuse to run unless the namespaces really are there."""
    with open("/proc/net/dev") as f:
        interfaces = {line.split(":", 1)[0].strip() for line in f.readlines()[2:]}
    if interfaces - {"lo"}:
        _fail(f"network interfaces other than lo are visible: {sorted(interfaces)}")
    own = os.getpid()
    others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, own)]
    if others:
        _fail(f"other processes are visible ({len(others)}): no private PID namespace")


def _run_script(source: bytes, code_file: str = CODE_FILE, data: bytes = b"", data_file: str = "") -> None:
    with open(code_file, "wb") as f:  # so tracebacks and inspect can show the script's lines
        f.write(source)
    if data_file:  # bytes the script reads, not compiled (a file tool's content: sandbox.workspace)
        fd = os.open(data_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    try:
        code = compile(source, code_file, "exec", dont_inherit=True)
    except SyntaxError as exc:
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.exit(1)
    module = types.ModuleType("__main__")
    module.__file__ = code_file
    sys.modules["__main__"] = module
    sys.argv[:] = [code_file]
    sys.path.insert(0, "")  # modules the script writes next to itself stay importable
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        sys.exit(1)


# --- the workspace shell ----------------------------------------------------------------------

SHELL = "/bin/bash"
PROXY_PORT = 3128  # inside the sandbox's own network namespace: its loopback, nobody else's
PR_SET_DUMPABLE = 4


def _relay(a: socket.socket, b: socket.socket) -> None:
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _forward(listener: socket.socket, proxy_path: str, child: int) -> None:
    """The shell's way out, when the task allows hosts: each connection to 127.0.0.1:3128 in
    the sandbox goes to the worker's egress proxy over a Unix socket bound in, which checks
    every destination (docs/SANDBOX.md). Runs in the sandbox's first process, under no filter:
    the shell cannot trace it (its filter), nor read its memory or open its /proc files (made
    not dumpable before the fork, ``_run_shell``), nor write its memory (/proc is read-only)."""
    listener.settimeout(0.05)
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
        try:
            conn, _ = listener.accept()
        except (TimeoutError, OSError):
            continue
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(proxy_path)
        except OSError:
            conn.close()
            continue
        conn.settimeout(None)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_relay, args=(a, b), daemon=True).start()


def _run_shell(command: bytes, config: dict[str, object], arch: str) -> None:
    """exec the command line with bash under the process-allowing filter; with a proxy, from
    a forked child while this process forwards its connections."""
    env = dict(os.environ)
    proxy = config.get("proxy_socket")
    listener = None
    if proxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", PROXY_PORT))
        listener.listen(64)
        url = f"http://127.0.0.1:{PROXY_PORT}"
        env.update({"http_proxy": url, "https_proxy": url, "HTTP_PROXY": url, "HTTPS_PROXY": url})
        # Before the fork, not after it in the forwarder: the shell must never find this process
        # dumpable, however soon it runs. The child's execve of bash makes it dumpable again.
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
        child = os.fork()
        if child:
            _forward(listener, str(proxy), child)
        listener.close()
    argv = [SHELL, "-c", command.decode("utf-8", errors="surrogateescape")]
    install_filter(build_filter(arch, os.getpid(), processes=True))
    os.execve(SHELL, argv, env)


def main() -> None:
    try:
        config = json.loads(sys.argv[1])
        source = sys.stdin.buffer.read(int(config["max_code_bytes"]) + 1)
        if len(source) > int(config["max_code_bytes"]):
            _fail("the script is larger than the sandbox accepts")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        _set_limits(config)
        mode = config.get("mode", "python")
        if config.get("expect_namespaces"):
            _check_namespaces()
        elif mode == "shell":
            _fail("a shell runs only where its own namespaces are the wall (bubblewrap)")
        arch = machine()
        if arch not in SYSCALLS:
            _fail(f"no seccomp filter for the {arch} architecture")
        if mode == "shell":
            _run_shell(source, config, arch)
        install_filter(build_filter(arch, os.getpid()))
    except Exception as exc:  # any setup problem: nothing of the script has run
        _fail(f"{type(exc).__name__}: {exc}")
    # The last ``data_bytes`` of stdin are data for ``data_file``, not part of the script.
    cut = len(source) - int(config.get("data_bytes") or 0)
    source, data = source[:cut], source[cut:]
    _run_script(source, str(config.get("code_file", CODE_FILE)), data, str(config.get("data_file") or ""))


if __name__ == "__main__":
    main()
