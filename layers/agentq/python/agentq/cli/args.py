"""What every command group's parser shares: the epilog (exit codes, how the API is found),
``add_command`` that gives each subcommand that epilog and a description, ``UsageError``,
the error of bad usage or input (exit 2, the message naming the field), and ``read_text`` /
``read_yaml``, how a file the user names is read."""

from __future__ import annotations

import argparse
import io
import math
import sys
from typing import Any

from agentq.core.errors import AgentqError

EPILOG = """\
exit codes: 0 success; 1 the task or operation did not succeed (task failed, not found, conflict,
API or AWS unreachable, an answer that is not the API's, AWS refused); 2 bad usage or input (the
message names the field), or AWS settings missing; 130 interrupted.

Remote commands find the API from --url/--api-key, else --profile NAME (or $AGENTQ_PROFILE) in
~/.config/agentq/profiles.toml, else $AGENTQ_URL/$AGENTQ_API_KEY, else the [default] profile.
For a local stack, run `agentq dev` and export the AGENTQ_URL it prints.
"""


class UsageError(AgentqError):
    """Bad usage or configuration: exit 2."""

    code = "usage"


# The largest file a command reads, in request bodies: what it holds is sent in one of at most
# ``MAX_BODY_BYTES``, and four times that leaves room for YAML's comments and indentation. A 30 MB
# script took minutes to parse before its request was refused.
FILE_BODIES = 4


def read_text(value: str, *, what: str, field: str = "file") -> str:
    """The text of the file ``value`` names ('-': stdin), as UTF-8. A file that cannot be read
    (missing, a directory, not allowed), is over ``FILE_BODIES`` request bodies (refused before
    more is read) or is not UTF-8 text (a binary, a UTF-16 export) is a ``UsageError`` naming the file
    and ``field``: exit 2, never a traceback."""
    from agentq.api.models.base import MAX_BODY_BYTES

    limit = FILE_BODIES * MAX_BODY_BYTES
    try:
        if value == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # the bytes: decoded here, as a file's are
            data = stdin.read(limit + 1) if stdin is not None else sys.stdin.read(limit + 1).encode()
        else:
            with open(value, "rb") as stream:
                data = stream.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} from {value}: {exc.strerror or exc}", field=field) from None
    if len(data) > limit:
        raise UsageError(
            f"cannot read {what} from {value}: over {limit} bytes, and what it holds goes in a request body "
            f"of at most {MAX_BODY_BYTES}",
            field=field,
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bom = " (it starts with a UTF-16 byte-order mark)" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else ""
        raise UsageError(
            f"cannot read {what} from {value}: not UTF-8 text{bom}: byte {exc.start} is "
            f"0x{data[exc.start]:02x}; save it as UTF-8",
            field=field,
        ) from None


def read_yaml(value: str, *, what: str, field: str = "file") -> Any:
    """The YAML (or JSON: JSON is YAML) in the file ``value`` names, read by ``read_text``; a
    parse error is a ``UsageError`` whose message names the file, line and column."""
    import yaml

    stream = io.StringIO(read_text(value, what=what, field=field))
    stream.name = "<stdin>" if value == "-" else value  # what yaml's error says the input is
    try:
        return yaml.safe_load(stream)
    except yaml.YAMLError as exc:
        raise UsageError(f"cannot read {what} from {value}: {exc}", field=field) from None


def add_command(sub: Any, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A top-level subcommand: its help, its description (the help unless given), the epilog."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description or help, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    return parser


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {number}")
    return number


def at_least_one(value: str) -> int:
    """A count of at least 1 (a concurrency, a number of threads): -2 says ">= 1", not ">= 0"."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {number}")
    return number


def fraction(value: str) -> float:
    """A share above 0 and at most 1."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < number <= 1:  # nan fails this too
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, not {value}")
    return number


def seconds_or_zero(value: str) -> float:
    """A duration that may be 0 (do not wait): a finite number of seconds >= 0."""
    try:
        if float(value) == 0:
            return 0.0
    except ValueError:
        pass  # said by ``seconds``
    return seconds(value)


def seconds(value: str) -> float:
    """A duration: a finite number of seconds above 0 (0, a negative, ``nan`` and ``inf`` are refused)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {value}")
    return number


WAIT_TIMEOUT = 24 * 3600.0  # what --wait waits at most unless --wait-timeout says


def add_wait(parser: argparse.ArgumentParser, help: str) -> None:
    """``--wait`` and its ``--wait-timeout`` (seconds above 0; only with --wait: see ``wait_timeout``)."""
    parser.add_argument("--wait", action="store_true", help=help)
    parser.add_argument("--wait-timeout", type=seconds, metavar="SECONDS",
                        help="with --wait: give up waiting after this many seconds, exit 1 "
                        "(above 0; default a day)")  # fmt: skip


def wait_timeout(args: argparse.Namespace) -> float:
    """The seconds ``--wait`` waits; asked before anything is sent, so ``--wait-timeout`` without
    ``--wait`` (where it would do nothing) is refused first."""
    if args.wait_timeout is not None and not args.wait:
        raise UsageError("--wait-timeout needs --wait: without it nothing waits", field="wait_timeout")
    return WAIT_TIMEOUT if args.wait_timeout is None else float(args.wait_timeout)
