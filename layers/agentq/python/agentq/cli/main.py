"""The ``agentq`` command line: one entry point for people and scripts.

Remote commands (submit, status, watch, result, trace, list, cancel, approve, reject, budget,
fork) talk to any deployment's HTTP API by URL and key; ``keys`` and ``dlq`` use the table and
queues directly (AGENTQ_* and AWS_* settings); ``dev``, ``demo`` and ``run`` start the local stack.

Exit codes scripts can rely on: 0 success; 1 the task or operation did not succeed (the task
ended other than succeeded, not found, conflict, API unreachable, wait timed out); 2 bad usage
or bad input (the message names the field); 130 interrupted. Data goes to stdout, progress
and errors to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.core.errors import AgentqError, IllegalTransition, TaskNotFound

if TYPE_CHECKING:
    from agentq.api.client import Client


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentq.local.demo import run_demo

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


def _cmd_run(args: argparse.Namespace) -> int:
    from agentq.local.demo import run_goal

    return run_goal(
        args.goal, model=args.model, max_tokens=args.max_tokens, tool_modules=_tool_modules(args), system=args.system
    )


def _cmd_run_task(args: argparse.Namespace) -> int:
    from agentq.queueing.worker import run_task

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


def _cmd_worker(args: argparse.Namespace) -> int:
    from agentq.observe import configure_process_logging
    from agentq.queueing.worker import Worker, WorkerConfig
    from agentq.runtime import Settings

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
    )
    settings = dataclasses.replace(Settings.from_env(), tool_modules=_tool_modules(args))
    Worker(settings, config).serve_forever()
    return 0


def _reload(stack: Any, modules: tuple[str, ...], changed: list[Path], say: Callable[[str], None]) -> None:
    """Import the changed tool modules afresh; if they load, restart the workers on them."""
    from agentq.local.reload import forget
    from agentq.runtime import build_registry

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


def _cmd_dev(args: argparse.Namespace) -> int:
    import signal

    from agentq.local.moto_server import LOCAL_CREDENTIALS
    from agentq.local.stack import LocalStack

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # even when started with SIGINT ignored (a background job)
    from agentq.local.stack import DEFAULT_TOOL_MODULES
    from agentq.runtime import build_registry

    modules = _tool_modules(args)
    stack = LocalStack(
        workers=args.workers, auth=args.auth, tool_modules=(*DEFAULT_TOOL_MODULES, *modules), supervise=True
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
        say(f"            workers    {', '.join(str(p.pid) for p in stack.processes) or 'none'}")
        say(f"            tools      {', '.join(sorted(build_registry(stack.settings).names()))}")
        if args.auth:
            env["AGENTQ_API_KEY"] = stack.create_api_key("local")
            say(
                "            auth       on: requests need Authorization: Bearer <key>; a key for tenant 'local' follows"
            )
        else:
            say("            auth       off: every request is tenant 'local' (--auth to require API keys)")
        say("            env for other shells:")
        for key, value in env.items():
            say(f"              export {key}={value}")
        say("Ctrl-C stops everything." + (" Workers restart when a tool module changes." if args.reload else ""))
        watcher = None
        if args.reload:
            from agentq.local.reload import ModuleWatcher

            watcher = ModuleWatcher(modules)
        while True:  # a worker that exits is replaced by the stack's supervisor
            time.sleep(0.5)
            if watcher is not None and (changed := watcher.changed()):
                _reload(stack, modules, changed, say)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave moto or workers behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


def _cmd_dlq(args: argparse.Namespace) -> int:
    from agentq.queueing.dlq import list_dead_letters, redrive
    from agentq.runtime import Settings, build_queues, build_store

    settings = Settings.from_env()
    queues = build_queues(settings)
    if args.dlq_command == "list":
        letters = list_dead_letters(queues, build_store(settings), tier=args.tier, limit=args.limit)
        if args.json:
            print(json.dumps([letter.__dict__ for letter in letters]))
            return 0
        if not letters:
            print("no messages in the dead-letter queues")
        for d in letters:
            print(f"{d.tier:<7} {d.task_id or '-':<34} {d.task_status or '-':<10} {d.reason}")
        return 0
    reports = redrive(queues, tier=args.tier)
    for r in reports:
        moved = "moving asynchronously" if r.moved is None else f"{r.moved} message(s)"
        print(f"{r.tier:<7} {moved} back to the {r.tier} queue ({r.method})")
    return 0


# ------------------------------------------------------------------ remote commands


class UsageError(AgentqError):
    """Bad usage or configuration: exit 2."""

    code = "usage"


def profiles_path() -> Path:
    if os.environ.get("AGENTQ_PROFILES"):
        return Path(os.environ["AGENTQ_PROFILES"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "agentq" / "profiles.toml"


def _load_profiles(path: Path) -> dict[str, dict[str, Any]]:
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read profiles from {path}: {exc}", field="profile") from None
    return {name: value for name, value in data.items() if isinstance(value, dict)}


NO_TARGET = (
    "no API to talk to. Set AGENTQ_URL (and AGENTQ_API_KEY if the API needs a key), pass --url/--api-key, "
    'or name a profile with --profile (profiles live in {path}, e.g. [default] url = "..." api_key = "..."). '
    "There is no implicit local stack: it lives only while `agentq dev` runs, so start `agentq dev` in another "
    "shell and export the AGENTQ_URL it prints."
)


def resolve_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """URL and key: flags, then an explicit profile (--profile or AGENTQ_PROFILE), then
    AGENTQ_URL/AGENTQ_API_KEY, then the [default] profile."""
    url, key = getattr(args, "url", None), getattr(args, "api_key", None)
    path = profiles_path()
    name = getattr(args, "profile", None) or os.environ.get("AGENTQ_PROFILE")
    profile: dict[str, Any] = {}
    if name:
        profiles = _load_profiles(path)
        if name not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise UsageError(f"no profile {name!r} in {path} (profiles: {known})", field="profile")
        profile = profiles[name]
    else:
        url = url or os.environ.get("AGENTQ_URL")
        key = key or os.environ.get("AGENTQ_API_KEY")
        if not url:
            profile = _load_profiles(path).get("default", {})
    url = url or profile.get("url")
    key = key or profile.get("api_key")
    if not url:
        raise UsageError(NO_TARGET.format(path=path), field="url")
    return str(url), (str(key) if key else None)


def _client(args: argparse.Namespace) -> Client:
    from agentq.api.client import Client

    url, key = resolve_target(args)
    return Client(url, key)


def _dump(model: Any) -> None:
    data = model.model_dump(mode="json", by_alias=True) if hasattr(model, "model_dump") else model
    print(json.dumps(data, indent=2))


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS") or 200)  # piped: don't wrap at 80
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def _final(view: Any) -> int:
    return 0 if view.status.value == "succeeded" else 1


def _cmd_purge(args: argparse.Namespace) -> int:
    from agentq.control.retention import TASK_PK_PREFIX, purge_task
    from agentq.runtime import Settings, build_store

    store = build_store(Settings.from_env(), pool=4)
    results = []
    for raw in args.task_ids:
        task_id = raw.removeprefix(TASK_PK_PREFIX)  # as the stream's keys name it, or bare
        result = purge_task(store, task_id)  # a live task raises IllegalTransition: exit 1
        results.append(result)
        if not args.json:
            print(f"{task_id}: {result.items} item(s), {result.objects} payload object(s) deleted")
    if args.json:
        print(json.dumps([r.model_dump() for r in results]))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from agentq.cli.views import status_block

    view = _client(args).get(args.task_id)
    if args.json:
        _dump(view)
    else:
        print(status_block(view))
    return 0


def _parse_metadata(pairs: list[str]) -> dict[str, str]:
    from agentq.core.metadata import BadPair, parse_pairs

    try:
        return parse_pairs(pairs)
    except BadPair as exc:
        raise UsageError(f"--metadata takes KEY=VALUE, not {exc.pair!r}", field="metadata") from None


def _load_script(value: str) -> Any:
    """A built-in script name as is; a file (JSON or YAML) read here and sent inline, since the
    API cannot read the caller's files."""
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise UsageError(f"--script is not valid JSON: {exc}", field="script") from None
    path = Path(value)
    if not path.is_file():
        return value
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read script {value}: {exc}", field="script") from None


def build_submission(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.file:
        try:
            body = json.loads(Path(args.file).read_text()) if args.file != "-" else json.load(sys.stdin)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the submission from {args.file}: {exc}", field="file") from None
        if not isinstance(body, dict):
            raise UsageError(f"{args.file} must hold a JSON object", field="file")
    if args.goal:
        body["goal"] = args.goal
    if not body.get("goal"):
        raise UsageError('give the goal (agentq submit "...") or --file with a goal', field="goal")
    if args.script:
        body["script"] = _load_script(args.script)
    if getattr(args, "agent", None):
        body["agent"] = args.agent
    if args.provider:
        body["provider"] = args.provider
    elif "provider" not in body and "agent" not in body:
        body["provider"] = "scripted" if body.get("script") is not None else "anthropic"
    for flag, key in (("model", "model"), ("system", "system"), ("priority", "priority")):
        if getattr(args, flag):
            body[key] = getattr(args, flag)
    constraints = dict(body.get("constraints") or {})
    for flag, key in (("max_tokens", "max_tokens"), ("max_steps", "max_steps"), ("timeout", "timeout_seconds"),
                      ("max_output_tokens", "max_output_tokens")):  # fmt: skip
        if getattr(args, flag) is not None:
            constraints[key] = getattr(args, flag)
    tools = [t.strip() for item in args.tools for t in item.split(",") if t.strip()]
    if tools:
        constraints["tools"] = tools
    if constraints:
        body["constraints"] = constraints
    if args.metadata:
        body["metadata"] = {**(body.get("metadata") or {}), **_parse_metadata(args.metadata)}
    if getattr(args, "notify", None):
        body["notify"] = {"url": args.notify}
    if getattr(args, "after", None):
        body["depends_on"] = [t for value in args.after for t in value.split(",") if t]
    return body


def _follow(client: Any, task_id: str, timeout: float) -> Any:
    """Wait for the end, telling stderr about each change of status or step."""

    def show(view: Any) -> None:
        print(
            f"{view.status.value:<13} step {view.step:<4} tokens {view.tokens.total:<8,} {view.activity or ''}",
            file=sys.stderr,
            flush=True,
        )

    return client.wait(task_id, timeout=timeout, poll=args_poll(), on_update=show)


def args_poll() -> float:
    return float(os.environ.get("AGENTQ_POLL_SECONDS", "0.5"))


def _print_result(result: Any) -> None:
    if result.result is not None:
        print(result.result)
    if result.error:
        print(
            f"agentq: task {result.task_id} {result.status.value}: {result.error.get('message', '')}", file=sys.stderr
        )
    elif not result.complete:
        print(f"agentq: task {result.task_id} {result.status.value}; the result above is partial", file=sys.stderr)


def _cmd_submit(args: argparse.Namespace) -> int:
    client = _client(args)
    accepted = client.submit(build_submission(args), idempotency_key=args.idempotency_key)
    if not args.wait:
        if args.json:
            _dump(accepted)
        else:
            print(accepted.task_id)
        return 0
    print(f"submitted {accepted.task_id}", file=sys.stderr, flush=True)
    view = _follow(client, accepted.task_id, args.wait_timeout)
    if args.json:
        _dump(view)
    else:
        _print_result(client.result(accepted.task_id))
    return _final(view)


def _cmd_result(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.wait:
        _follow(client, args.task_id, args.wait_timeout)
    result = client.result(args.task_id)
    if args.json:
        _dump(result)
    else:
        _print_result(result)
    return 0 if result.complete else 1


def _cmd_list(args: argparse.Namespace) -> int:
    from agentq.cli.views import task_table

    client = _client(args)
    metadata = _parse_metadata(args.metadata)
    tasks, cursor = [], args.cursor
    while True:
        page = client.list_tasks(
            args.status, limit=args.limit, cursor=cursor, include_children=args.children, metadata=metadata
        )
        tasks.extend(page.tasks)
        cursor = page.next_cursor
        if not (args.all and cursor):
            break
    if args.json:
        print(
            json.dumps(
                {"tasks": [t.model_dump(mode="json", by_alias=True) for t in tasks], "next_cursor": cursor}, indent=2
            )
        )
        return 0
    if tasks:
        _console().print(task_table(tasks))
    else:
        print("no tasks" + (f" with status {args.status}" if args.status else ""), file=sys.stderr)
    if cursor:
        again = (f" --status {args.status}" if args.status else "") + "".join(f" --metadata {p}" for p in args.metadata)
        print(f"more: agentq list --cursor {cursor}{again}", file=sys.stderr)
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    from agentq.cli.views import trace_tree

    client = _client(args)
    view = client.get(args.task_id)
    events = list(client.iter_trace(args.task_id))
    if args.json:
        print(json.dumps({"task_id": args.task_id, "events": [e.model_dump(mode="json") for e in events]}, indent=2))
    else:
        _console().print(trace_tree(args.task_id, view, events))
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    from rich.live import Live

    from agentq.cli.views import event_line, watch_view

    client = _client(args)
    view = client.get(args.task_id)
    console = _console()
    page_cursor: str | None = None
    seen_on_page = 0
    recent: list[Any] = []

    def tail() -> None:
        """New trace events since the last look: re-read the last page, move on when it fills."""
        nonlocal page_cursor, seen_on_page
        while True:
            page = client.trace(args.task_id, limit=100, cursor=page_cursor)
            fresh = page.events[seen_on_page:]
            recent.extend(event_line(e, view.created_at) for e in fresh)
            del recent[: max(0, len(recent) - args.events)]
            if page.next_cursor:
                page_cursor, seen_on_page = page.next_cursor, 0
            else:
                seen_on_page = len(page.events)
                return

    with Live(watch_view(view, recent), console=console, refresh_per_second=8, transient=False) as live:
        while True:
            if args.events:
                tail()
            live.update(watch_view(view, recent))
            if view.status.terminal:
                break
            time.sleep(args.interval)
            view = client.get(args.task_id)
    return _final(view)


def _cmd_cancel(args: argparse.Namespace) -> int:
    result = _client(args).cancel(args.task_id)
    if args.json:
        _dump(result)
    else:
        print(f"cancelled {len(result.cancelled)} task(s): {', '.join(result.cancelled)}")
    return 0


def _cmd_decide(args: argparse.Namespace) -> int:
    client = _client(args)
    view = (
        client.approve(args.task_id, args.note) if args.command == "approve" else client.reject(args.task_id, args.note)
    )
    if args.json:
        _dump(view)
    else:
        done = {"approve": "approved", "reject": "rejected"}[args.command]
        print(f"{done} {view.task_id}; it is {view.status.value} and resumes with the decision")
    return 0


def _cmd_webhook_secret(args: argparse.Namespace) -> int:
    print(_client(args).webhook_secret())
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    view = _client(args).raise_budget(args.task_id, args.add_tokens, args.add_steps, args.add_usd)
    if args.json:
        _dump(view)
    else:
        from agentq.cli.views import budget_line, money_line

        print(
            f"{view.task_id}: {view.status.value}; budget {budget_line(view)}{money_line(view)}; "
            f"max steps {view.max_steps}"
        )
    return 0


def _cmd_fork(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.model:
        overrides["model"] = args.model
    if args.provider:
        overrides["provider"] = args.provider
    if args.script:
        overrides["script"] = _load_script(args.script)
    if args.max_tokens:
        overrides["constraints"] = {"max_tokens": args.max_tokens}
    view = _client(args).fork(args.task_id, args.at_step, **overrides)
    if args.json:
        _dump(view)
    else:
        print(view.task_id)
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from agentq.runtime import Settings, client
    from agentq.storage.api_keys import KeyStore
    from agentq.storage.dynamodb import DynamoTable

    settings = Settings.from_env()
    keys = KeyStore(DynamoTable(client(settings, "dynamodb", pool=2), settings.table))
    if args.keys_command == "create":
        token, record = keys.create(args.tenant)
        if args.json:
            print(
                json.dumps(
                    {
                        "api_key": token,
                        "key_id": record.key_id,
                        "tenant": record.tenant,
                        "created_at": record.created_at,
                    }
                )
            )
        else:
            print(token)
            print(f"key {record.key_id} for tenant {record.tenant!r}: store it now, it cannot be shown again "
                  f"(revoke with: agentq keys revoke {record.key_id})", file=sys.stderr)  # fmt: skip
        return 0
    if args.keys_command == "revoke":
        record = keys.revoke(args.key_id)
        print(
            f"revoked {record.key_id} (tenant {record.tenant!r}); API Gateway may accept it until its authorizer cache expires"
        )
        return 0
    rows = keys.list(args.tenant)
    if args.json:
        print(
            json.dumps(
                [
                    {"key_id": k.key_id, "tenant": k.tenant, "created_at": k.created_at, "revoked": k.revoked}
                    for k in rows
                ]
            )
        )
        return 0
    for k in rows:
        from agentq.cli.views import when

        print(f"{k.key_id}  {when(k.created_at)}  {'revoked ' + when(k.revoked_at) if k.revoked else 'active'}")
    if not rows:
        print(f"no keys for tenant {args.tenant!r}", file=sys.stderr)
    return 0


def _read_agent_file(value: str) -> dict[str, Any]:
    """An agent definition from YAML or JSON ('-': stdin). A ``script`` naming a file beside it
    is read here and sent inline, since the API cannot read the caller's files."""
    import yaml

    try:
        text = sys.stdin.read() if value == "-" else Path(value).read_text()
        body = yaml.safe_load(text)  # JSON is YAML
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read the agent definition from {value}: {exc}", field="file") from None
    if not isinstance(body, dict):
        raise UsageError(f"{value} must hold a mapping (name, model, tools, ...)", field="file")
    script = body.get("script")
    if isinstance(script, str) and value != "-" and (Path(value).parent / script).is_file():
        body["script"] = _load_script(str(Path(value).parent / script))
    return body


def _cmd_schedules(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    client = _client(args)
    if args.schedules_command == "create":
        import yaml

        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
            body = yaml.safe_load(text)
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read the schedule from {args.file}: {exc}", field="file") from None
        schedule = client.create_schedule(body)
        if args.json:
            _dump(schedule)
        else:
            print(f"{schedule.name}: {schedule.expression}; next fire {when(schedule.next_fire_at)}")
        return 0
    if args.schedules_command == "delete":
        deleted = client.delete_schedule(args.name)
        print(f"deleted {deleted.name}")
        return 0
    schedules = client.list_schedules()
    if args.json:
        _dump(schedules)
        return 0
    for s in schedules:
        print(f"{s.name:<24} {s.expression:<28} overlap {s.overlap:<5} fired {s.fired} skipped {s.skipped} "
              f"next {when(s.next_fire_at)} last {s.last_task_id or '-'}")  # fmt: skip
    return 0


def _cmd_agents(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    client = _client(args)
    if args.agents_command == "create":
        created = client.create_agent(_read_agent_file(args.file))
        if args.json:
            _dump(created)
        else:
            agent = created.agent
            what = "created" if created.created else "unchanged, the latest version is"
            print(agent.ref)
            print(f"{what} {agent.ref} ({len(agent.tools)} tools, model {agent.model}); "
                  f"submit with: agentq submit --agent {agent.name} \"...\"", file=sys.stderr)  # fmt: skip
        return 0
    if args.agents_command == "show":
        agent = client.get_agent(args.agent)
        if args.json:
            _dump(agent)
            return 0
        policies = agent.tool_policies
        print(f"{agent.ref}  created {when(agent.created_at)}")
        if agent.description:
            print(f"  {agent.description}")
        print(f"  provider {agent.provider}, model {agent.model}")
        tools = ", ".join(f"{t} ({policies[t]})" if t in policies else t for t in agent.tools)
        print(f"  tools: {tools or '(none)'}")
        limits = agent.constraints.model_dump(exclude_none=True)
        if limits:
            print("  defaults: " + ", ".join(f"{k}={v}" for k, v in limits.items()))
        if agent.system:
            print("  system: " + agent.system if len(agent.system) < 200 else f"  system: {agent.system[:200]}...")
        return 0
    if args.agents_command == "versions":
        versions = client.agent_versions(args.name)
        if args.json:
            print(json.dumps([v.model_dump(mode="json") for v in versions], indent=2))
        for v in [] if args.json else versions:
            print(f"{v.ref:<40} {when(v.created_at)}  {v.model}  {len(v.tools)} tools")
        return 0
    agents = client.list_agents()
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in agents], indent=2))
        return 0
    for a in agents:
        print(f"{a.name:<32} v{a.latest_version:<5} {when(a.updated_at)}  {a.description or ''}".rstrip())
    if not agents:
        print("no agents (create one: agentq agents create -f agent.yaml)", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------ parser

EPILOG = """\
exit codes: 0 success; 1 the task or operation did not succeed (task failed, not found, conflict,
API unreachable); 2 bad usage or input (the message names the field); 130 interrupted.

Remote commands find the API from --url/--api-key, else --profile NAME (or $AGENTQ_PROFILE) in
~/.config/agentq/profiles.toml, else $AGENTQ_URL/$AGENTQ_API_KEY, else the [default] profile.
For a local stack, run `agentq dev` and export the AGENTQ_URL it prints.
"""


def _remote(
    parser: argparse.ArgumentParser, json_help: str = "print the API's JSON instead of text"
) -> argparse.ArgumentParser:
    group = parser.add_argument_group("API")
    group.add_argument("--url", help="API URL (default: $AGENTQ_URL or the profile's url)")
    group.add_argument("--api-key", help="API key (default: $AGENTQ_API_KEY or the profile's api_key)")
    group.add_argument("--profile", help="a profile of ~/.config/agentq/profiles.toml (default: $AGENTQ_PROFILE)")
    parser.add_argument("--json", action="store_true", help=json_help)
    return parser


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {number}")
    return number


STATUSES = [
    "queued",
    "blocked",
    "running",
    "waiting",
    "paused",
    "succeeded",
    "failed",
    "cancelled",
    "cost_exceeded",
    "timed_out",
]


def build_parser() -> argparse.ArgumentParser:
    from agentq.core.models import DEFAULT_MODEL

    parser = argparse.ArgumentParser(
        prog="agentq",
        description="A durable task queue for long-running AI agents.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip

    # tasks
    submit = _remote(command("submit", "submit a task; prints its id (--wait: follow it to the end)"))
    submit.add_argument("goal", nargs="?", help="what the agent should achieve")
    submit.add_argument("--file", help="a JSON submission to start from ('-' reads stdin); flags override it")
    submit.add_argument("--provider", choices=["anthropic", "bedrock", "scripted"],
                        help="LLM provider (default: scripted with --script, else anthropic)")  # fmt: skip
    submit.add_argument("--model", help="model id (default: the API's)")
    submit.add_argument(
        "--script", help="scripted provider: a built-in script name (e.g. research) or a JSON/YAML file"
    )
    submit.add_argument("--system", help="system prompt")
    submit.add_argument("--agent", help="an agent definition, NAME or NAME@VERSION (it sets model, system, tools)")
    submit.add_argument("--max-tokens", type=int, help="token budget of the task and all its sub-agents")
    submit.add_argument("--max-steps", type=int, help="LLM turns allowed")
    submit.add_argument("--max-output-tokens", type=int, help="output tokens per LLM call")
    submit.add_argument("--timeout", type=int, help="seconds the task may run in all")
    submit.add_argument("--tools", action="append", default=[], metavar="NAME[,NAME]",
                        help="tool allowlist (repeat or comma-separate)")  # fmt: skip
    submit.add_argument("--priority", choices=["high", "normal", "low"], help="queue tier (default normal)")
    submit.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="a label kept with the task"
    )
    submit.add_argument("--notify", metavar="URL", help="an https:// URL to POST the task's end to, signed")
    submit.add_argument("--after", action="append", default=[], metavar="TASK_ID[,TASK_ID]",
                        help="run after these tasks succeed (depends_on); it waits blocked until then")  # fmt: skip
    submit.add_argument("--idempotency-key", help="retry-safe: the same key and body return the same task")
    submit.add_argument(
        "--wait", action="store_true", help="follow the task (status changes on stderr), then print its result"
    )
    submit.add_argument(
        "--wait-timeout", type=float, default=24 * 3600, help="give up waiting after this many seconds (exit 1)"
    )
    submit.set_defaults(func=_cmd_submit)

    secret = _remote(
        command("webhook-secret", "print this tenant's callback signing secret (verify callbacks with it)")
    )
    secret.set_defaults(func=_cmd_webhook_secret)

    status = _remote(command("status", "a task's status, step, tokens against its budget, cost, children and timing"))
    status.add_argument("task_id")
    status.set_defaults(func=_cmd_status)

    watch = _remote(command("watch", "a live view of a task until it ends: steps, tokens as a bar, children, activity"))
    watch.add_argument("task_id")
    watch.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes")
    watch.add_argument("--events", type=_positive, default=6, help="recent trace events to show (0: none)")
    watch.set_defaults(func=_cmd_watch)

    result = _remote(command("result", "a finished task's result on stdout (exit 1 unless it succeeded)"))
    result.add_argument("task_id")
    result.add_argument("--wait", action="store_true", help="wait for the task to end first")
    result.add_argument("--wait-timeout", type=float, default=24 * 3600, help="give up waiting after this many seconds")
    result.set_defaults(func=_cmd_result)

    trace = _remote(command("trace", "the task's LLM and tool calls as a tree, with timings and tokens"),
                    json_help="print every event as JSON (all pages)")  # fmt: skip
    trace.add_argument("task_id")
    trace.set_defaults(func=_cmd_trace)

    list_ = _remote(command("list", "your tasks, newest first"))
    list_.add_argument("--status", choices=STATUSES, help="only tasks in this status")
    list_.add_argument("--limit", type=int, default=20, help="tasks per page (1-100)")
    list_.add_argument("--cursor", help="continue from a previous page")
    list_.add_argument("--all", action="store_true", help="follow every page")
    list_.add_argument("--children", action="store_true", help="include sub-agents")
    list_.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="only tasks with this label (repeatable)"
    )
    list_.set_defaults(func=_cmd_list)

    cancel = _remote(command("cancel", "cancel a task and its whole subtree (partial results kept)"))
    cancel.add_argument("task_id")
    cancel.set_defaults(func=_cmd_cancel)
    for verb in ("approve", "reject"):
        decide = _remote(command(verb, f"{verb} a task paused by request_approval; it resumes with the decision"))
        decide.add_argument("task_id")
        decide.add_argument("--note", default="", help="a note the agent reads with the decision")
        decide.set_defaults(func=_cmd_decide)
    budget = _remote(command("budget", "raise a root task's token/step caps; a cost_exceeded task resumes"))
    budget.add_argument("task_id")
    budget.add_argument("--add-tokens", type=int, default=0, help="tokens to add to the cap")
    budget.add_argument("--add-steps", type=int, default=0, help="LLM turns to add to max_steps")
    budget.add_argument("--add-usd", default=None, help="dollars to add to the money cap (max_cost_usd)")
    budget.set_defaults(func=_cmd_budget)
    fork = _remote(
        command("fork", "a new task from another's committed steps 1..N (effects not repeated); prints its id")
    )
    fork.add_argument("task_id")
    fork.add_argument("--at-step", type=int, required=True, help="copy steps 1..N of the source")
    fork.add_argument("--model", help="another model for the fork")
    fork.add_argument("--provider", choices=["anthropic", "bedrock", "scripted"], help="another provider")
    fork.add_argument("--script", help="scripted provider: a built-in script name or a JSON/YAML file")
    fork.add_argument("--max-tokens", type=int, help="the fork's token budget")
    fork.set_defaults(func=_cmd_fork)

    agents = command("agents", "create, list or show agent definitions (versioned: model, system, tools, policies)")
    agents_sub = agents.add_subparsers(dest="agents_command", required=True, metavar="ACTION")
    agents_create = _remote(
        agents_sub.add_parser(
            "create",
            help="the next version of an agent from a YAML or JSON file (unchanged: nothing is created)",
            description="the next version of an agent from a YAML or JSON file (unchanged: nothing is created)",
        )
    )
    agents_create.add_argument("-f", "--file", required=True, help="agent.yaml or agent.json ('-' reads stdin)")
    _remote(agents_sub.add_parser("list", help="your agents with their latest version", description="your agents"))
    agents_show = _remote(
        agents_sub.add_parser("show", help="one version (default: the latest)", description="one version of an agent")
    )
    agents_show.add_argument("agent", help="NAME or NAME@VERSION")
    agents_versions = _remote(
        agents_sub.add_parser("versions", help="every version, newest first", description="every version of an agent")
    )
    agents_versions.add_argument("name", help="the agent's name")
    agents.set_defaults(func=_cmd_agents)

    schedules = command("schedules", "create, list or delete schedules (a cron or rate expression and a task)")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    schedules_create = _remote(
        schedules_sub.add_parser(
            "create", help="create or replace a schedule from a YAML or JSON file",
            description="create or replace a schedule: name, expression (cron(...) or rate(...)), submission, overlap",
        )
    )  # fmt: skip
    schedules_create.add_argument(
        "-f", "--file", required=True, help="schedule.yaml or schedule.json ('-' reads stdin)"
    )
    _remote(schedules_sub.add_parser("list", help="your schedules", description="your schedules"))
    schedules_delete = _remote(schedules_sub.add_parser("delete", help="delete one", description="delete a schedule"))
    schedules_delete.add_argument("name")
    schedules.set_defaults(func=_cmd_schedules)

    keys = command("keys", "create, list or revoke API keys (talks to the table: AGENTQ_* and AWS_* settings)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    keys_create = keys_sub.add_parser(
        "create", help="a new key for a tenant, printed once", description="a new key for a tenant, printed once"
    )
    keys_create.add_argument("--tenant", required=True, help="the tenant the key acts as")
    keys_create.add_argument("--json", action="store_true", help="print key, key_id and tenant as JSON")
    keys_revoke = keys_sub.add_parser("revoke", help="revoke a key by its id", description="revoke a key by its id")
    keys_revoke.add_argument("key_id", help="the key's id (key_...), as printed by create and list")
    keys_list = keys_sub.add_parser("list", help="a tenant's key ids", description="a tenant's key ids")
    keys_list.add_argument("--tenant", required=True, help="whose keys")
    keys_list.add_argument("--json", action="store_true", help="print JSON")
    keys.set_defaults(func=_cmd_keys)

    # operations
    dlq = command("dlq", "inspect or redrive the dead-letter queues (AGENTQ_* and AWS_* settings)")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    dlq_list = dlq_sub.add_parser("list", help="messages in the DLQs, with their task and reason")
    dlq_list.add_argument("--tier", choices=["high", "normal", "low"], help="one tier only")
    dlq_list.add_argument("--limit", type=int, default=100, help="messages to show")
    dlq_list.add_argument("--json", action="store_true", help="print JSON")
    dlq_redrive = dlq_sub.add_parser(
        "redrive", help="move DLQ messages back; their tasks resume from their checkpoints"
    )
    dlq_redrive.add_argument("--tier", choices=["high", "normal", "low"], help="one tier only")
    dlq.set_defaults(func=_cmd_dlq)

    purge = command("purge", "delete what finished tasks left behind: items, budget, payloads (AGENTQ_* and AWS_* settings)",
                    "delete everything finished tasks left behind (their items, budget and S3 payloads), as the "
                    "reaper does once TTL removed their META; refuses a task that is not finished")  # fmt: skip
    purge.add_argument(
        "task_ids", nargs="+", metavar="TASK_ID", help="task ids (or TASK#<id> as a stream record names them)"
    )
    purge.add_argument("--json", action="store_true", help="print what was deleted as JSON")
    purge.set_defaults(func=_cmd_purge)

    dev = command(
        "dev", "start the local stack (moto, queues, table, workers, API) until Ctrl-C; prints the env to export"
    )
    dev.add_argument("--workers", type=int, default=2, help="worker processes (one that exits is replaced)")
    dev.add_argument("--auth", action="store_true", help="require API keys as in AWS (prints a key for tenant 'local')")
    dev.add_argument(
        "--tools", action="append", metavar="MODULE",
        help="a module of your @tool functions (repeatable; added to $AGENTQ_TOOL_MODULES and installed agentq.tools packages)",
    )  # fmt: skip
    dev.add_argument("--reload", action="store_true", help="restart the workers when a tool module's source changes")
    dev.set_defaults(func=_cmd_dev)

    demo = command(
        "demo", "the local stack end to end: a scripted research agent, its worker SIGKILLed mid-task, resumed"
    )
    demo.add_argument(
        "--kill-at-step", type=int, default=6, help="SIGKILL the worker once this step is committed (0: never)"
    )
    demo.set_defaults(func=_cmd_demo)

    run = command("run", "run one goal on a fresh local stack (Anthropic if ANTHROPIC_API_KEY is set, else scripted)")
    run.add_argument("goal", help="what the agent should achieve")
    run.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"Anthropic model id (default {DEFAULT_MODEL}, as the API's)"
    )
    run.add_argument("--max-tokens", type=int, default=100_000, help="token budget")
    run.add_argument("--system", help="the system prompt")
    run.add_argument(
        "--tools", action="append", metavar="MODULE",
        help="a module of your @tool functions (repeatable; added to $AGENTQ_TOOL_MODULES and installed agentq.tools packages)",
    )  # fmt: skip
    run.set_defaults(func=_cmd_run)

    worker = command("worker", "long-poll the tier queues and run tasks (uses AGENTQ_* and AWS_* settings)")
    worker.add_argument("--concurrency", type=int, default=256, help="tasks in flight at once")
    worker.add_argument("--lease", type=float, default=3.0, help="lease seconds")
    worker.add_argument("--heartbeat", type=float, default=1.0, help="seconds between lease/visibility extensions")
    worker.add_argument("--visibility", type=int, default=4, help="visibility each heartbeat extends to (> lease)")
    worker.add_argument("--max-receive-count", type=int, default=5, help="the queues' maxReceiveCount")
    worker.add_argument("--beat-threads", type=int, default=16, help="lease writes the heartbeat makes at once")
    worker.add_argument("--admission-safety", type=float, default=0.5,
                        help="hold what the heartbeat can extend in this fraction of (lease - heartbeat)")  # fmt: skip
    worker.add_argument(
        "--admission-floor", type=int, default=8, help="hold at least this many tasks however slow the store"
    )
    worker.add_argument(
        "-v", "--verbose", action="store_true", help="log at INFO (default: $POWERTOOLS_LOG_LEVEL or WARNING)"
    )
    worker.add_argument(
        "--tools", action="append", metavar="MODULE",
        help="a module of your @tool functions (repeatable; added to $AGENTQ_TOOL_MODULES and installed agentq.tools packages)",
    )  # fmt: skip
    worker.set_defaults(func=_cmd_worker)

    run_task = command("run-task", "run one task in this process until it ends (no queue)")
    run_task.add_argument("task_id")
    run_task.add_argument("--lease", type=float, default=30.0, help="lease seconds")
    run_task.add_argument(
        "--wait", type=float, default=0.0, help="keep trying to claim for this long if another lease is live"
    )
    run_task.set_defaults(func=_cmd_run_task)
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except AgentqError as exc:
        where = f" ({exc.field})" if exc.field else ""
        print(f"agentq: {exc.message}{where}", file=sys.stderr)
        if getattr(exc, "status", None) in (401, 403):
            print("agentq: check the API key: --api-key, $AGENTQ_API_KEY or the profile's api_key", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
