"""How a worker running as root starts bubblewrap: as uid 65534, with every path it binds staged.

Why: bwrap started by root maps the sandbox's uid to root outside its user namespace, so the
code, without a capability but root all the same, could write any file of root's that a mount
showed it, and a kernel bug reachable from a namespace would make it root on the host. Started
as an unprivileged uid, bwrap makes an unprivileged user namespace and the sandbox is that uid
inside and out. But bwrap resolves the path of everything it binds as the uid it runs as (before
it mounts anything), and a root worker's paths need not be reachable by another uid: an
interpreter under ``/root`` (0700), a workspace under a 0700 directory, the egress proxy's socket
in its 0700 directory. Opening them up on the host would open them to every process of that uid.

So this program, run by ``bwrap.BwrapSandbox`` as root (one thread; ``-I -S``; the standard
library only), stands between the worker and bwrap:

1. it makes a mount namespace of its own, slave to the host's (nothing it mounts reaches the host);
2. opens, as root, every path bwrap is to bind;
3. mounts a small tmpfs at ``STAGE`` and binds each opened path at ``STAGE/<n>``, through
   ``/proc/self/fd``: the very object it opened, not its path resolved again;
4. becomes the uid and gid (no supplementary group; every capability goes with root) and execs
   bwrap with each bind's source replaced by its ``STAGE/<n>``.

Only bwrap's own process sees the stage (the sandbox's root is built from it and the host's
``/tmp`` is not in the sandbox anyway); it is gone with bwrap. A step that fails prints why,
prefixed ``MARK``, and exits: bwrap never starts, nothing runs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Callable

STAGE = "/tmp"  # in this program's mount namespace only; bwrap mounts the sandbox's root over it
MARK = "agentq-sandbox-stage: "
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_SLAVE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x80000

# bwrap's options as BwrapSandbox writes them, with how many values each takes: a command line
# with any other option is refused, not guessed at (a value is never taken for an option).
ARITY = {
    "--unshare-all": 0, "--unshare-user": 0, "--disable-userns": 0, "--die-with-parent": 0,
    "--new-session": 0, "--clearenv": 0, "--cap-drop": 1, "--uid": 1, "--gid": 1, "--hostname": 1,
    "--setenv": 2, "--symlink": 2, "--proc": 1, "--dev": 1, "--remount-ro": 1, "--size": 1,
    "--tmpfs": 1, "--chdir": 1, "--json-status-fd": 1, "--bind": 2, "--ro-bind": 2, "--ro-bind-try": 2,
}  # fmt: skip
BINDS = ("--bind", "--ro-bind", "--ro-bind-try")


def staged(argv: list[str]) -> tuple[list[str], list[tuple[str, bool]]]:
    """bwrap's ``argv`` with every bind's source replaced by its place in the stage, and those
    sources in order, each with whether it may be missing (``--ro-bind-try``)."""
    out, sources, at = argv[:1], [], 1
    while at < len(argv) and argv[at] != "--":
        option = argv[at]
        if option not in ARITY:
            raise ValueError(f"bwrap option {option!r} is not one the stage knows")
        values = argv[at + 1 : at + 1 + ARITY[option]]
        if len(values) != ARITY[option]:
            raise ValueError(f"bwrap option {option!r} lacks its values")
        if option in BINDS:
            sources.append((values[0], option == "--ro-bind-try"))
            values = [f"{STAGE}/{len(sources) - 1}", values[1]]
        out += [option, *values]
        at += 1 + ARITY[option]
    return out + argv[at:], sources


_SOURCE: list[str] = []


def _source() -> str:
    if not _SOURCE:
        with open(__file__, encoding="utf-8") as f:
            _SOURCE.append(f.read())
    return _SOURCE[0]


def command(python: str, argv: list[str], uid: int, gid: int, env: dict[str, str]) -> list[str]:
    """What the worker runs instead of bwrap's ``argv``: this program, then bwrap as ``uid``
    with ``env``. Its arguments are plain strings, no JSON: ``json`` would cost this program a
    third of its start, on every call: uid, gid, the number of ``KEY=VALUE`` environment entries
    and they, the number of sources and each as ``+path`` (may be missing) or ``=path``, then
    the staged command line."""
    bwrap, sources = staged(argv)
    spec = [str(uid), str(gid), str(len(env)), *(f"{k}={v}" for k, v in env.items()), str(len(sources))]
    spec += [("+" if optional else "=") + path for path, optional in sources]
    return [python, "-I", "-S", "-B", "-c", _source(), *spec, *bwrap]


def _parse(args: list[str]) -> tuple[int, int, dict[str, str], list[tuple[str, bool]], list[str]]:
    uid, gid, count = int(args[0]), int(args[1]), int(args[2])
    env = dict(entry.split("=", 1) for entry in args[3 : 3 + count])
    at = 3 + count
    n = int(args[at])
    sources = [(entry[1:], entry[0] == "+") for entry in args[at + 1 : at + 1 + n]]
    return uid, gid, env, sources, args[at + 1 + n :]


class _Refused(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise _Refused(f"{what}: {os.strerror(err)}")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _stage(libc: ctypes.CDLL, sources: list[tuple[str, bool]]) -> None:
    _check(libc.unshare(CLONE_NEWNS), "cannot make a mount namespace of its own (unshare)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "cannot make its mounts private")
    opened: list[int] = []
    for path, optional in sources:  # every one before the stage hides the host's /tmp
        try:
            opened.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
        except FileNotFoundError:
            if not optional:
                raise _Refused(f"cannot find {path}") from None
            opened.append(-1)  # not staged: bwrap's --ro-bind-try skips it
        except OSError as exc:
            raise _Refused(f"cannot open {path}: {exc.strerror}") from None
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(libc.mount(b"tmpfs", STAGE.encode(), b"tmpfs", flags, b"mode=0755,size=64k"), f"cannot mount {STAGE}")
    for n, fd in enumerate(opened):
        if fd < 0:
            continue
        target = f"{STAGE}/{n}"
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        source = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(source, target.encode(), None, MS_BIND | MS_REC, None), f"cannot bind {sources[n][0]}")
        os.close(fd)


def _become(uid: int, gid: int) -> None:
    steps: tuple[tuple[str, Callable[[], None]], ...] = (
        ("drop the supplementary groups", lambda: os.setgroups([])),
        (f"become gid {gid}", lambda: os.setresgid(gid, gid, gid)),
        (f"become uid {uid}", lambda: os.setresuid(uid, uid, uid)),
    )
    for what, step in steps:
        try:
            step()
        except OSError as exc:
            why = {
                errno.EINVAL: "it is not mapped in the user namespace this worker runs in",
                errno.EPERM: "this worker lacks CAP_SETUID/CAP_SETGID, or runs in a user namespace that forbids it",
            }.get(exc.errno or 0)
            raise _Refused(f"cannot {what} to start bubblewrap{f' ({why})' if why else ''}: {exc.strerror}") from None
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise _Refused(f"did not become uid {uid}, gid {gid} entirely")


def main() -> None:
    uid, gid, env, sources, argv = _parse(sys.argv[1:])
    try:
        _stage(_libc(), sources)
        _become(uid, gid)
    except _Refused as exc:
        reason = str(exc)
    except OSError as exc:
        reason = f"cannot stage the paths bwrap binds: {exc}"
    else:
        try:
            os.execve(argv[0], argv, env)
        except OSError as exc:
            reason = f"cannot start {argv[0]}: {exc.strerror}"
    sys.stderr.write(f"{MARK}{reason}\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
