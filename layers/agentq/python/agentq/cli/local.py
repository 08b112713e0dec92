"""Commands that run agentq in this process or on this machine: ``dev`` (the local stack
until Ctrl-C), ``demo`` and ``run`` (a fresh local stack for one task), ``worker`` (a queue
consumer on the deployment's AGENTQ_* and AWS_* settings) and ``run-task`` (one task, no queue).

``dev``, ``demo`` and ``run`` run on the development stack, the package ``agentq_dev``
(devstack/: moto and its patches, the fork server, the demo), which is installed with agentq
from its repository but is not in the Lambda layer or the worker image, so that what AWS runs
carries none of it. They import it when they run (``_on_the_dev_stack``); every other command,
``worker`` included, works without it."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentq.cli.args import UsageError, add_command, at_least_one, fraction, positive, seconds, seconds_or_zero
from agentq.cli.submit import SCRIPT_DOC, load_script
from agentq.core.errors import AgentqError

TOOLS_HELP = (
    "a module of your @tool functions (repeatable; added to $AGENTQ_TOOL_MODULES and installed agentq.tools packages)"
)


DEV_STACK_MISSING = (
    "needs the development stack (the agentq_dev package), which this install does not have: the Lambda "
    "layer and the worker image carry only what AWS runs. Install agentq from its repository "
    "(`pip install -e '.[local]'`, or `make demo`)"
)


def _on_the_dev_stack(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A command that runs the local stack: without ``agentq_dev`` it says what to install
    (exit 2); on a moto the stack's patches were not verified against it says which one to
    install (exit 2), rather than a traceback either way."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            from agentq_dev.moto_version import UnverifiedMoto
        except ModuleNotFoundError as missing:
            if missing.name != "agentq_dev":
                raise
            print(f"agentq {args.command}: {DEV_STACK_MISSING}", file=sys.stderr)
            return 2
        try:
            return command(args)
        except UnverifiedMoto as exc:
            print(f"agentq: {exc}", file=sys.stderr)
            return 2

    return run


@_on_the_dev_stack
def _cmd_demo(args: argparse.Namespace) -> int:
    from agentq_dev.demo import run_demo

    return run_demo(kill_at_step=args.kill_at_step)


def _tool_modules(args: argparse.Namespace) -> tuple[str, ...]:
    """``AGENTQ_TOOL_MODULES`` and every ``--tools``, each once, each importable (checked here,
    so a typo is one line naming the module, before anything starts)."""
    from agentq.tool_modules import VARIABLE, load_tool_modules

    if os.getcwd() not in sys.path:  # `--tools my_tools` from the project's folder, as uvicorn finds an app
        sys.path.insert(0, os.getcwd())
    names = [m.strip() for m in os.environ.get(VARIABLE, "").split(",") if m.strip()]
    names += [m for m in args.tools or [] if m not in names]
    load_tool_modules(names)
    return tuple(names)


KEYLESS_SCRIPT = "first_task"  # built in; the same turns as examples/scripts/first_task.yaml


@_on_the_dev_stack
def _cmd_run(args: argparse.Namespace) -> int:
    """The goal by Anthropic when there is a key, else by a script; which one is said before
    anything starts, so a run without a key is never mistaken for a model's work."""
    from agentq_dev.demo import run_goal

    modules = _tool_modules(args)
    script = load_script(args.script) if args.script else None
    if script is not None:
        shown = args.script if isinstance(script, str) else f"{len(script.get('turns') or [])} turns of {args.script}"
        print(f"agentq run: running your goal with the scripted provider (script: {shown}); see {SCRIPT_DOC}")
    elif not os.environ.get("ANTHROPIC_API_KEY"):
        script = KEYLESS_SCRIPT
        print(
            f"agentq run: no ANTHROPIC_API_KEY: running your goal with the scripted provider (script: {KEYLESS_SCRIPT}, "
            f"built in, as examples/scripts/first_task.yaml; the format: {SCRIPT_DOC}); set ANTHROPIC_API_KEY for a "
            "real model",
            flush=True,
        )
    return run_goal(
        args.goal, model=args.model, max_tokens=args.max_tokens, tool_modules=modules, system=args.system, script=script
    )


def _cmd_run_task(args: argparse.Namespace) -> int:
    from agentq.worker import run_task

    result = run_task(args.task_id, lease_seconds=args.lease, wait_seconds=args.wait)
    print(
        json.dumps(
            {
                "task_id": result.task_id,
                "outcome": result.outcome,
                "status": result.status.value if result.status else None,
                "steps_committed": result.steps_committed,
                "resumed_from_step": result.resumed_from_step,
                "error": result.error,
            }
        )
    )
    done = result.outcome in ("finished", "continue") or (result.status is not None and result.status.terminal)
    return 0 if done else 1


# A workspace-pool worker whose host cannot run the sandbox exits with this (EX_CONFIG), and
# the line names it; the EC2 tier's log metric filter counts it (infra/workspace_tier.py).
SANDBOX_EXIT = 78
SANDBOX_REFUSAL = "refusing to claim from queue pool"


def _cmd_worker(args: argparse.Namespace) -> int:
    from agentq.observe import configure_process_logging
    from agentq.runtime import Settings
    from agentq.sandbox.base import SandboxUnavailable
    from agentq.scale_in import TERMINATING_EXIT
    from agentq.worker import Worker, WorkerConfig

    if args.heartbeat >= args.lease:  # its peers would hand its tasks on while it lives
        raise UsageError(f"--heartbeat ({args.heartbeat:g} s) must be below --lease ({args.lease:g} s): a worker "
                         "renews its liveness within its lease", field="heartbeat")  # fmt: skip
    if args.visibility <= args.heartbeat:  # a message it received, not yet claimed, would show to its peers
        raise UsageError(f"--visibility ({args.visibility} s) must be above --heartbeat ({args.heartbeat:g} s): each "
                         "heartbeat hides a received message for --visibility seconds", field="visibility")  # fmt: skip
    configure_process_logging(logging.INFO if args.verbose else None)  # JSON with AGENTQ_LOG_FORMAT=json
    config = WorkerConfig(
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        heartbeat_seconds=args.heartbeat,
        visibility_seconds=args.visibility,
        max_receive_count=args.max_receive_count,
        beat_threads=args.beat_threads,
        admission_safety=args.admission_safety,
        admission_floor=args.admission_floor,
        idle_poll_wait_seconds=args.idle_poll_wait,
    )
    settings = dataclasses.replace(Settings.from_env(), tool_modules=_tool_modules(args))
    worker = Worker(settings, config)
    try:
        worker.check_sandbox()
    except SandboxUnavailable as exc:  # the workspace pool's worker on a host that cannot sandbox
        logging.getLogger("agentq.worker").error("sandbox_unavailable: %s", exc)
        print(f"agentq worker: {SANDBOX_REFUSAL} {settings.queue_pool!r}: {exc}", file=sys.stderr)
        return SANDBOX_EXIT
    worker.serve_forever()
    return TERMINATING_EXIT if worker.terminating.is_set() else 0


NO_WORKERS = "none (--workers 0): tasks wait until a worker runs, e.g. `agentq worker` with the env below"


def _reload(stack: Any, modules: tuple[str, ...], changed: list[Path], say: Callable[[str], None]) -> None:
    """Import the changed tool modules afresh; if they load, restart the workers on them."""
    from agentq.runtime import build_registry
    from agentq_dev.reload import forget

    names = ", ".join(p.name for p in changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    forget(modules)
    try:
        tools = sorted(build_registry(stack.settings).names())
    except Exception as exc:  # a module mid-edit: keep the workers that work
        message = exc.message if isinstance(exc, AgentqError) else f"{type(exc).__name__}: {exc}"
        say(f"agentq dev: {names} changed but does not load ({message}); workers kept")
        return
    workers = stack.restart_workers()
    say(f"agentq dev: {names} changed; workers restarted ({', '.join(str(p.pid) for p in workers)})")
    say(f"            tools      {', '.join(tools)}")


def _cmd_dev_token(args: argparse.Namespace) -> int:
    """``agentq dev token --user U --tenant T``: a JWT of a running ``agentq dev --auth``'s issuer."""
    import os

    from agentq.api.oidc import TENANT_RULE, refused_identity
    from agentq.core.endusers import USER_RULE
    from agentq_dev.oidc_issuer import ISSUER_ENV, mint_from_state

    path = os.environ.get(ISSUER_ENV)
    if not path or not args.user:
        need = f"export {ISSUER_ENV} as `agentq dev --auth` printed it" if not path else "give --user"
        print(f"agentq dev token: {need}", file=sys.stderr)
        return 2
    refused = refused_identity(args.tenant, args.user)  # the API's own check of a token's claims
    if refused is not None:
        value, what, rule = (
            (args.tenant, "tenant", TENANT_RULE) if refused == "tenant" else (args.user, "user name", USER_RULE)
        )
        print(f"agentq dev token: --{refused} {value!r} is not a {what} the API takes ({rule})", file=sys.stderr)
        return 2
    print(mint_from_state(path, user=args.user, tenant=args.tenant, ttl=args.ttl))
    return 0


@_on_the_dev_stack
def _cmd_dev(args: argparse.Namespace) -> int:
    if args.action == "token":
        return _cmd_dev_token(args)
    import signal

    from agentq_dev.moto_server import LOCAL_CREDENTIALS
    from agentq_dev.stack import LocalStack

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # even when started with SIGINT ignored (a background job)
    from agentq.runtime import build_registry
    from agentq_dev.stack import DEFAULT_TOOL_MODULES

    modules = _tool_modules(args)
    stack = LocalStack(
        workers=args.workers,
        auth=args.auth,
        tool_modules=(*DEFAULT_TOOL_MODULES, *modules),
        supervise=True,
        fair=True,
        events_hub=True,
    )
    try:
        stack.start()
        assert stack.settings is not None and stack.api_server is not None
        env = {**LOCAL_CREDENTIALS, **stack.settings.env(), "AGENTQ_URL": stack.api_server.url}

        def say(line: str) -> None:
            print(line, flush=True)

        say(f"agentq dev: AWS (moto) {stack.moto.endpoint_url}")
        say(f"            API        {stack.api_server.url}   (GET /openapi.json lists the routes)")
        say(f"            console    {stack.api_server.url}/console/   (API explorer: /console/explorer)")
        if stack.hub_server is not None:
            say(f"            events hub {stack.hub_server.url}   (watchers; fed by the table's stream)")
        say(f"            workers    {', '.join(str(p.pid) for p in stack.processes) or NO_WORKERS}")
        say(f"            tools      {', '.join(sorted(build_registry(stack.settings).names()))}")
        fair = stack.settings.defaults
        if fair.fleet_capacity is not None:
            say(f"            fair share {fair.fleet_capacity} tasks run at once; a tenant's default limit is "
                f"{fair.tenant_max_running}, the rest is kept for the others (`agentq tenants limit` overrides)")  # fmt: skip
        if args.auth:
            from agentq_dev.oidc_issuer import ISSUER_ENV

            assert stack.issuer is not None
            env["AGENTQ_API_KEY"] = stack.create_api_key("local", act_for_users=True)
            env[ISSUER_ENV] = str(stack.issuer.write_state())
            say(
                "            auth       on: requests need Authorization: Bearer <key>; a key for tenant 'local' follows"
            )
            say(f"            OIDC       issuer {stack.issuer.settings.issuer} (audience {stack.issuer.audience}): "
                "a user's token: agentq dev token --user alice --tenant local")  # fmt: skip
        else:
            say("            auth       off: every request is tenant 'local' (--auth to require API keys)")
        say("            env for other shells:")
        for key, value in env.items():
            say(f"              export {key}={value}")
        say(
            "Ctrl-C stops everything. A worker that dies is replaced (SIGKILL one to watch its task resume)."
            + (" Workers restart when a tool module changes." if args.reload else "")
        )
        watcher = None
        if args.reload:
            from agentq_dev.reload import ModuleWatcher

            watcher = ModuleWatcher(modules)
        while True:  # a worker that exits is replaced by the stack's supervisor (agentq_dev.fleet)
            time.sleep(0.5)
            if watcher is not None and (changed := watcher.changed()):
                _reload(stack, modules, changed, say)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave moto or workers behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


def register(sub: Any) -> None:
    from agentq.core.models import DEFAULT_MODEL

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return add_command(sub, name, help)

    dev = command(
        "dev", "start the local stack (moto, queues, table, workers, API) until Ctrl-C; prints the env to export"
    )
    dev.add_argument("action", nargs="?", choices=["token"],
                     help="token: mint a JWT of a running `agentq dev --auth`'s local OIDC issuer")  # fmt: skip
    dev.add_argument("--user", help="token: the end user it names (its sub claim)")
    dev.add_argument("--tenant", default="local", help="token: the tenant it names (default local)")
    dev.add_argument("--ttl", type=seconds, default=3600, help="token: seconds it is valid (above 0)")
    dev.add_argument("--workers", type=positive, default=2, help="worker processes (one that exits is replaced); 0: "
                     "none, tasks wait until one runs, e.g. `agentq worker` in a shell with the env it prints")  # fmt: skip
    dev.add_argument("--auth", action="store_true", help="require API keys or an OIDC issuer's tokens as in AWS (prints "
                     "a key for tenant 'local', and starts a local issuer: `agentq dev token` mints its tokens)")  # fmt: skip
    dev.add_argument("--tools", action="append", metavar="MODULE", help=TOOLS_HELP)
    dev.add_argument("--reload", action="store_true", help="restart the workers when a tool module's source changes")
    dev.set_defaults(func=_cmd_dev)

    demo = command(
        "demo", "the local stack end to end: a scripted research agent, its worker SIGKILLed mid-task, resumed"
    )
    demo.add_argument(
        "--kill-at-step", type=int, default=6, help="SIGKILL the worker once this step is committed (0: never)"
    )
    demo.set_defaults(func=_cmd_demo)

    run = command(
        "run", "run one goal on a fresh local stack (Anthropic if ANTHROPIC_API_KEY is set, else a script it names)"
    )
    run.add_argument("goal", help="what the agent should achieve")
    run.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"Anthropic model id (default {DEFAULT_MODEL}, as the API's)"
    )
    run.add_argument("--max-tokens", type=int, default=100_000, help="token budget")
    run.add_argument("--system", help="the system prompt")
    run.add_argument("--tools", action="append", metavar="MODULE", help=TOOLS_HELP)
    run.add_argument("--script", metavar="NAME|FILE|JSON",
                     help=f"play the goal with this script, key or not (without a key: {KEYLESS_SCRIPT}); "
                     f"the format: {SCRIPT_DOC}")  # fmt: skip
    run.set_defaults(func=_cmd_run)

    worker = command("worker", "long-poll the tier queues and run tasks (uses AGENTQ_* and AWS_* settings)")
    worker.add_argument("--concurrency", type=at_least_one, default=256, help="tasks in flight at once")
    worker.add_argument("--lease", type=seconds, default=3.0, help="lease seconds")
    worker.add_argument("--heartbeat", type=seconds, default=1.0, help="seconds between lease/visibility extensions")
    worker.add_argument(
        "--visibility",
        type=at_least_one,
        default=4,
        help="seconds each heartbeat hides a received message for (at least 1)",
    )
    worker.add_argument("--max-receive-count", type=at_least_one, default=5, help="the queues' maxReceiveCount")
    worker.add_argument(
        "--beat-threads", type=at_least_one, default=16, help="lease writes the heartbeat makes at once"
    )
    worker.add_argument("--admission-safety", type=fraction, default=0.5,
                        help="hold what the heartbeat can extend in this fraction of (lease - heartbeat)")  # fmt: skip
    worker.add_argument(
        "--admission-floor", type=positive, default=8, help="hold at least this many tasks however slow the store"
    )
    worker.add_argument("--idle-poll-wait", type=int, default=20, choices=range(1, 21), metavar="1..20",
                        help="seconds an idle tier's long poll waits for a message (SQS allows 1 to 20)")  # fmt: skip
    worker.add_argument(
        "-v", "--verbose", action="store_true", help="log at INFO (default: $POWERTOOLS_LOG_LEVEL or WARNING)"
    )
    worker.add_argument("--tools", action="append", metavar="MODULE", help=TOOLS_HELP)
    worker.set_defaults(func=_cmd_worker)

    run_task = command("run-task", "run one task in this process until it ends (no queue)")
    run_task.add_argument("task_id")
    run_task.add_argument("--lease", type=seconds, default=30.0, help="lease seconds")
    run_task.add_argument(
        "--wait", type=seconds_or_zero, default=0.0, help="keep trying to claim for this long if another lease is live"
    )
    run_task.set_defaults(func=_cmd_run_task)
