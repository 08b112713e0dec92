"""The ``agentq`` command line: one entry point for people and scripts.

Remote commands (submit, status, watch, events, result, trace, list, cancel, approve, reject, budget,
fork) talk to any deployment's HTTP API by URL and key; ``keys`` and ``dlq`` use the table and
queues directly (AGENTQ_* and AWS_* settings); ``dev``, ``demo`` and ``run`` start the local stack.
Each command group registers its subcommands next to their handlers: ``submit`` and ``tasks``
(the task commands), ``catalogue`` (agents, schedules), ``admin`` (keys, dlq, purge), ``local``
(dev, demo, run, worker, run-task); ``target`` finds the API, ``args`` holds what they share.

Exit codes scripts can rely on: 0 success (a reader that closed stdout early too: ``| head``); 1
the task or operation did not succeed (the task ended other than succeeded, not found, conflict,
API or AWS unreachable, an answer that is not the API's, AWS refused, wait timed out); 2 bad
usage, bad input (the message names the field) or missing AWS settings; 130 interrupted. Data
goes to stdout, progress and errors to stderr. AWS's own errors (botocore's:
no credentials, an endpoint that does not answer, an error answer) are said in a line as
ours are (``aws_failure``); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from agentq.cli import (
    admin,
    caps,
    catalogue,
    conversation,
    diff,
    evals,
    events,
    files,
    fleet,
    local,
    memory,
    policies,
    stops,
    submit,
    tasks,
    vault,
)
from agentq.cli.args import EPILOG, UsageError
from agentq.cli.submit import build_submission
from agentq.cli.target import resolve_target
from agentq.core.errors import AgentqError, IllegalTransition, TaskNotFound

__all__ = ["UsageError", "build_parser", "build_submission", "exit_code", "main", "resolve_target"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentq",
        description="A durable task queue for long-running AI agents.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # the order `agentq --help` lists them in
    for group in (
        submit,
        tasks,
        diff,
        evals,
        files,
        events,
        conversation,
        catalogue,
        policies,
        stops,
        memory,
        vault,
        caps,
        fleet,
        admin,
        local,
    ):
        group.register(sub)
    return parser


def exit_code(exc: AgentqError) -> int:
    """1 when the operation did not succeed (404, 409, 5xx, unreachable, timed out); 2 when the
    request or the usage was wrong (400, 401, 403, 413, 415, 422, a local check)."""
    from agentq.api.client import ConnectionFailed, WaitTimeout
    from agentq.storage.api_keys import KeyNotFound

    status = getattr(exc, "status", None)
    if isinstance(exc, (ConnectionFailed, WaitTimeout, KeyNotFound, TaskNotFound, IllegalTransition)):
        return 1
    if status is None:
        return 2
    return 2 if status in (400, 401, 403, 413, 415, 422) else 1


# What `agentq dev` prints for other shells, and what AWS itself needs: said when either is missing.
AWS_SETTINGS = (
    "for the local stack, export the env `agentq dev` printed (its export lines: AWS_ENDPOINT_URL, "
    "AWS_ACCESS_KEY_ID, AGENTQ_TABLE ...); for a deployment, AWS credentials (AWS_PROFILE, or "
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), AWS_REGION and its AGENTQ_* settings"
)


def aws_failure(exc: Exception) -> tuple[str, int] | None:
    """A line and an exit code for an error of AWS's client (botocore) that is not a bug: its
    settings missing (2), its endpoint not answering (1), an answer about those settings (1, its
    code and message: ``SETTINGS_CODES``). None for anything else, a bug of ours included
    (botocore's ParamValidationError, an answer refusing the request our code built)."""
    if "botocore.exceptions" not in sys.modules:  # nothing of AWS ran: not one of its errors
        return None
    from botocore import exceptions as aws

    settings = (aws.NoCredentialsError, aws.PartialCredentialsError, aws.CredentialRetrievalError,
                aws.TokenRetrievalError, aws.SSOError, aws.ProfileNotFound, aws.NoRegionError,
                aws.InvalidRegionError)  # fmt: skip
    if isinstance(exc, settings):
        return f"this command talks to AWS directly and its settings are missing ({exc}): {AWS_SETTINGS}", 2
    if isinstance(exc, (aws.ConnectionError, aws.HTTPClientError)):
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        hint = (f"AWS_ENDPOINT_URL is {endpoint}: if an `agentq dev` printed it, it has stopped (start it again "
                "and export what it prints) or unset AWS_ENDPOINT_URL" if endpoint
                else "check the network and AWS_REGION")  # fmt: skip
        return f"cannot reach AWS ({exc}); {hint}", 1
    if isinstance(exc, aws.ClientError) and _settings_answer(exc):
        error = exc.response.get("Error", {})
        said = f"AWS refused {exc.operation_name}: {error.get('Code', '?')}: {error.get('Message', '')}".rstrip()
        missing = _missing_resource(exc)
        return (f"{said.rstrip('.')}: {missing}" if missing else said), 1
    return None


# DynamoDB's operations: their ResourceNotFoundException is the table's (KMS, Secrets Manager and
# others answer with the same code about resources of their own).
TABLE_OPERATIONS = frozenset({
    "GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem", "BatchWriteItem",
    "TransactGetItems", "TransactWriteItems", "DescribeTable",
})  # fmt: skip


def _missing_resource(exc: Any) -> str | None:
    """Which table or queue AWS did not find, the variable that named it and the region: AWS's
    own words ("Requested resource not found", "The specified queue does not exist") name
    neither, and a prefix, table or region that is not the deployment's is the usual cause."""
    from agentq.aws import region_from_env
    from agentq.queueing.queues import MISSING_QUEUE_CODES, MISSING_QUEUE_NOTE, POOL_VARIABLE
    from agentq.resources import ResourceNames

    code = exc.response.get("Error", {}).get("Code")
    prefix = os.environ.get("AGENTQ_PREFIX")
    by_prefix = "AGENTQ_PREFIX" if prefix else "AGENTQ_PREFIX unset: agentq"
    names = ResourceNames.for_prefix(prefix or "agentq")
    if code == "ResourceNotFoundException" and exc.operation_name in TABLE_OPERATIONS:
        table = os.environ.get("AGENTQ_TABLE")
        kind, name, variable = "table", table or names.table, "AGENTQ_TABLE" if table else by_prefix
    elif code in MISSING_QUEUE_CODES:
        noted = (n.removeprefix(MISSING_QUEUE_NOTE) for n in getattr(exc, "__notes__", ()) if MISSING_QUEUE_NOTE in n)
        pool = f", {POOL_VARIABLE}" if os.environ.get(POOL_VARIABLE) else ""
        kind, name, variable = "queue", next(noted, names.queue("*")), by_prefix + pool
    else:
        return None
    return f"the {kind} {name!r} ({variable}) is not in region {region_from_env()}"


# AWS's answers about the settings a command ran with (whose credentials, which account's
# resources), not about the request our code built: a malformed expression's ValidationException
# or a failed condition is a bug of ours and keeps its traceback.
SETTINGS_CODES = frozenset({
    "AccessDenied", "AccessDeniedException", "UnrecognizedClientException", "InvalidClientTokenId",
    "ExpiredToken", "ExpiredTokenException", "InvalidSignatureException", "SignatureDoesNotMatch",
    "RequestExpired", "AuthFailure", "ResourceNotFoundException", "NoSuchBucket",
    "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist",
})  # fmt: skip


def _settings_answer(exc: Any) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in SETTINGS_CODES


def _subcommand_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest subcommand parser the words of ``argv`` name (``agents show`` -> its own)."""
    current = parser
    for word in argv:
        choices = next((a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if not isinstance(choices, dict) or word not in choices:
            continue
        current = choices[word]
    return current


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's own parser, so its usage (the flags it has) is shown
        chosen = _subcommand_parser(parser, argv if argv is not None else sys.argv[1:])
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args))
    except AgentqError as exc:
        where = f" ({exc.field})" if exc.field else ""
        print(f"agentq: {exc.message}{where}", file=sys.stderr)
        if getattr(exc, "status", None) == 401:  # a 403's key was taken: the request is what is not allowed
            print("agentq: check the API key: --api-key, $AGENTQ_API_KEY or the profile's api_key", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # stdout's reader has gone (`agentq events ID | head -1`): not a failure. What is left in
        # stdout's buffer goes to /dev/null, else Python's flush of it at exit meets the closed
        # pipe again ("Exception ignored ... BrokenPipeError", exit 120): the Python docs' note on
        # SIGPIPE (library/signal.html#note-on-sigpipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        said = aws_failure(exc)
        if said is None:
            raise
        message, code = said
        print(f"agentq {args.command}: {message}", file=sys.stderr)
        return code
