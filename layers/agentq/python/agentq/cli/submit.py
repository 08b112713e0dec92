"""``agentq submit``: a task from a goal and flags (or a JSON ``--file`` they override),
printed as its id, or followed to its end with ``--wait``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from agentq.cli.args import UsageError, add_command, add_wait, read_text, read_yaml, wait_timeout
from agentq.cli.output import dump, final, follow, print_result
from agentq.cli.target import api_client, remote

SCRIPT_DOC = "docs/SCRIPTED_PROVIDER.md"


def parse_metadata(pairs: list[str]) -> dict[str, str]:
    from agentq.core.metadata import BadPair, parse_pairs

    try:
        return parse_pairs(pairs)
    except BadPair as exc:
        said = f"--metadata: {exc}" if exc.twice else f"--metadata takes KEY=VALUE, not {exc.pair!r}"
        raise UsageError(said, field="metadata") from None


def load_script(value: str) -> Any:
    """A built-in script name as is; a file (JSON or YAML) read here and sent inline, since the
    API cannot read the caller's files."""
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise UsageError(f"--script is not valid JSON: {exc}", field="script") from None
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"--script {value}: a directory, not a script file", field="script")
    if not path.is_file() and ("/" in value or value.endswith((".yaml", ".yml", ".json"))):
        raise UsageError(f"--script {value}: no such file", field="script")
    if not path.is_file():
        return value  # a built-in script's name: the API knows them
    return read_yaml(value, what="the script", field="script")


def constraint_value(field: str) -> Callable[[str], Any]:
    """An argparse type for one field of the task's constraints, checked against the bounds the
    API checks (``Constraints``), so a bad value is refused here, naming the flag, before any
    request. A money amount stays a decimal string: a float would round it."""

    def parse(text: str) -> Any:
        from pydantic import ValidationError

        from agentq.core.models import Constraints

        try:
            value = getattr(Constraints.model_validate_strings({field: text}), field)  # strict numbers: from text
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(f"{exc.errors()[0]['msg']} (got {text!r})") from None
        return str(value) if isinstance(value, Decimal) else value

    return parse


def fallback(text: str) -> dict[str, str]:
    """``PROVIDER/MODEL`` (the model may hold ``/`` or ``:``), checked as the API checks one of
    ``fallbacks``, as an argparse type."""
    from pydantic import ValidationError

    from agentq.core.models import ModelChoice

    provider, sep, model = text.partition("/")
    if not sep:
        raise argparse.ArgumentTypeError(f"takes PROVIDER/MODEL, not {text!r}")
    try:
        return ModelChoice(provider=provider, model=model).model_dump()  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        raise argparse.ArgumentTypeError(f"{'.'.join(map(str, first['loc']))}: {first['msg']} (got {text!r})") from None


def memory_attachment(text: str) -> dict[str, Any]:
    """``STORE`` or ``STORE:read_only`` / ``STORE:read_write``, checked as the API checks one of
    ``memory``, as an argparse type."""
    from pydantic import ValidationError

    from agentq.core.memory import MemoryAttachment

    store, sep, access = text.partition(":")
    value: dict[str, Any] = {"store": store, **({"access": access} if sep else {})}
    try:
        return MemoryAttachment.model_validate(value).model_dump(exclude_none=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise argparse.ArgumentTypeError(f"{'.'.join(map(str, first['loc']))}: {first['msg']} (got {text!r})") from None


def concurrency(args: argparse.Namespace, base: Any) -> dict[str, Any] | None:
    """``--concurrency-key`` with ``--concurrency-limit`` and ``--on-conflict`` (over a file's
    ``concurrency``), checked as the API checks it; a limit or policy without a key is bad usage."""
    from pydantic import ValidationError

    from agentq.core.models import Concurrency

    key, limit, policy = args.concurrency_key, args.concurrency_limit, args.on_conflict
    if key is None and limit is None and policy is None:
        return None
    value = dict(base) if isinstance(base, dict) else {}
    if key is not None:
        value["key"] = key
    if "key" not in value:
        raise UsageError("--concurrency-limit and --on-conflict need --concurrency-key", field="concurrency.key")
    if limit is not None:
        value["limit"] = limit
    if policy is not None:
        value["on_conflict"] = policy
    try:
        return Concurrency.model_validate(value).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "concurrency." + ".".join(map(str, first["loc"]))
        raise UsageError(f"{where}: {first['msg']}", field=where) from None


TOOL_POLICIES = ("allow", "ask", "ask_tenant", "deny")


def tool_policy(text: str) -> tuple[str, str]:
    """``NAME=allow|ask|ask_tenant|deny``, as an argparse type."""
    name, sep, policy = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"takes NAME=allow|ask|ask_tenant|deny, not {text!r}")
    if policy.strip() not in TOOL_POLICIES:
        raise argparse.ArgumentTypeError(
            f"the policy of {name.strip()!r} is allow, ask, ask_tenant or deny, not {policy!r}"
        )
    return name.strip(), policy.strip()


def load_output_schema(value: str) -> dict[str, Any]:
    """A JSON Schema inline (``{...}``) or in a JSON or YAML file, checked as the API checks it."""
    import yaml

    from agentq.core.output import check_schema

    inline = value.lstrip().startswith("{")
    source = "the inline JSON" if inline else value
    try:
        schema = json.loads(value) if inline else yaml.safe_load(Path(value).read_text())  # JSON is YAML
    except OSError as exc:
        raise UsageError(f"--output-schema: cannot read {value}: {exc}", field="output_schema") from None
    except (ValueError, yaml.YAMLError) as exc:
        what = "not JSON" if inline else "neither JSON nor YAML"
        raise UsageError(f"--output-schema: {source} is {what}: {exc}", field="output_schema") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--output-schema: {source} must hold a JSON object (a schema)", field="output_schema")
    try:
        check_schema(schema)
    except ValueError as exc:
        raise UsageError(f"--output-schema: {exc}", field="output_schema") from None
    return schema


def tools_called(script: Any) -> list[str]:
    """The tools a script calls, in order, each once: what a scripted task given no allowlist
    is allowed, since a script calling a tool it may not run can only fail that call. A
    ``spawn_subagents`` call adds each sub-agent's ``tools`` and the tools its script calls
    (inline or a built-in's, and so on down): a sub-agent's tools are a subset of its parent's,
    so a parent allowed only its own turns' tools had every sub-agent given a tool refused. A
    built-in's name is read from this installation's copy (an unknown name: the API says so).
    ``final_answer`` is left out: a task with an output schema is offered it anyway."""
    from agentq.core.output import FINAL_ANSWER_TOOL

    names = _script_tools(script, depth=0)
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n and n != FINAL_ANSWER_TOOL]


_SPAWN_DEPTH = 8  # sub-agents of sub-agents read this deep (a built-in spawning itself stops here)


def _script_tools(script: Any, depth: int) -> list[Any]:
    """The names of the tools ``script`` calls, a sub-agent's among them, unchecked, in order."""
    from agentq.core.fanout import SPAWN_TOOL
    from agentq.core.providers.scripted import builtin_script_names
    from agentq.core.providers.scripted import load_script as load_builtin

    if isinstance(script, str) and script in builtin_script_names():
        script = load_builtin(script).model_dump()
    if not isinstance(script, dict) or not isinstance(script.get("turns"), list):
        return []
    names: list[Any] = []
    for turn in script["turns"]:
        for call in (turn.get("tool_calls") or []) if isinstance(turn, dict) else []:
            if not isinstance(call, dict):
                continue
            names.append(call.get("name"))
            given = call.get("input")
            spawned = given.get("subagents") if isinstance(given, dict) else None
            if call.get("name") != SPAWN_TOOL or not isinstance(spawned, list) or depth >= _SPAWN_DEPTH:
                continue
            for child in spawned:
                tools = child.get("tools") if isinstance(child, dict) else None
                names.extend(tools if isinstance(tools, list) else [])
                names.extend(_script_tools(child.get("script"), depth + 1) if isinstance(child, dict) else [])
    return names


def build_submission(args: argparse.Namespace, upload: Callable[[bytes], str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.file:
        text = read_text(args.file, what="the submission")
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"cannot read the submission from {args.file}: not JSON: {exc}", field="file") from None
        if not isinstance(body, dict):
            raise UsageError(f"{args.file} must hold a JSON object", field="file")
    if args.goal:
        body["goal"] = args.goal
    if not body.get("goal"):
        raise UsageError('give the goal (agentq submit "...") or --file with a goal', field="goal")
    if args.script:
        body["script"] = load_script(args.script)
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
    for flag, key in (("max_cost_usd", "max_cost_usd"), ("context_threshold", "context_threshold")):
        if getattr(args, flag, None) is not None:
            constraints[key] = getattr(args, flag)
    if getattr(args, "economy", False):
        constraints["economy"] = True
    if getattr(args, "tool_policy", None):
        constraints["tool_policies"] = {**(constraints.get("tool_policies") or {}), **dict(args.tool_policy)}
    tools = [t.strip() for item in args.tools for t in item.split(",") if t.strip()]
    if tools:
        constraints["tools"] = tools
    elif "tools" not in constraints and "agent" not in body and body.get("provider") == "scripted":
        tools = tools_called(body.get("script"))
        if tools:
            constraints["tools"] = tools
            print(f"agentq: no --tools: allowing the tools the script calls: {', '.join(tools)}", file=sys.stderr)
    if constraints:
        body["constraints"] = constraints
    if args.metadata:
        body["metadata"] = {**(body.get("metadata") or {}), **parse_metadata(args.metadata)}
    if getattr(args, "output_schema", None):
        body["output_schema"] = load_output_schema(args.output_schema)
    if getattr(args, "notify", None):
        body["notify"] = {"url": args.notify}
    if getattr(args, "after", None):
        body["depends_on"] = [t for value in args.after for t in value.split(",") if t]
    if getattr(args, "fallback", None):
        body["fallbacks"] = list(args.fallback)
    if getattr(args, "memory", None):
        mine = {a["store"]: a for a in args.memory}
        body["memory"] = [a for a in body.get("memory") or [] if a.get("store") not in mine] + list(mine.values())
    keyed = concurrency(args, body.get("concurrency")) if hasattr(args, "concurrency_key") else None
    if keyed is not None:
        body["concurrency"] = keyed
    if getattr(args, "double_texting", None):
        body["double_texting"] = args.double_texting
    if getattr(args, "workspace", None):
        from agentq.cli.files import read_workspace

        body["workspace"] = {**(body.get("workspace") or {}), **read_workspace(args.workspace, upload)}
    return body


def _cmd_submit(args: argparse.Namespace) -> int:
    timeout = wait_timeout(args)
    client = api_client(args)
    accepted = client.submit(build_submission(args, client.upload_workspace), idempotency_key=args.idempotency_key)
    if not args.wait:
        if args.json:
            dump(accepted)
        else:
            print(accepted.task_id)
        return 0
    print(f"submitted {accepted.task_id}", file=sys.stderr, flush=True)
    view = follow(client, accepted.task_id, timeout)
    if args.json:
        dump(view)
    else:
        print_result(client.result(accepted.task_id))
    return final(view)


def register(sub: Any) -> None:
    submit = remote(add_command(sub, "submit", "submit a task; prints its id (--wait: follow it to the end)"))
    submit.add_argument("goal", nargs="?", help="what the agent should achieve")
    submit.add_argument("--file", help="a JSON submission to start from ('-' reads stdin); flags override it")
    submit.add_argument("--provider", choices=["anthropic", "bedrock", "bedrock-converse", "openai", "scripted"],
                        help="LLM provider (default: scripted with --script, else anthropic)")  # fmt: skip
    submit.add_argument("--model", help="model id (default: the API's)")
    submit.add_argument("--script", metavar="NAME|FILE|JSON",
                        help="scripted provider, no API key: a built-in script (first_task, research), a JSON/YAML "
                        "file or inline JSON (its tools are allowed unless --tools is given); the format: "
                        f"{SCRIPT_DOC}")  # fmt: skip
    submit.add_argument("--system", help="system prompt")
    submit.add_argument(
        "--agent", help="an agent definition, NAME, NAME@VERSION or NAME@ALIAS (it sets model, system, tools)"
    )
    submit.add_argument("--max-tokens", type=int, help="token budget of the task and all its sub-agents")
    submit.add_argument("--max-steps", type=int, help="LLM turns allowed")
    submit.add_argument("--max-output-tokens", type=int, help="output tokens per LLM call")
    submit.add_argument("--timeout", type=int, help="seconds the task may run in all")
    submit.add_argument("--tools", action="append", default=[], metavar="NAME[,NAME]",
                        help="tool allowlist (repeat or comma-separate)")  # fmt: skip
    submit.add_argument("--tool-policy", action="append", default=[], type=tool_policy,
                        metavar="NAME=allow|ask|ask_tenant|deny",
                        help="a tool's policy: allow (default), ask (each call waits for approve/reject), ask_tenant "
                        "(the same, decided only with the tenant's API key, never an end user's token), deny "
                        "(repeatable)")  # fmt: skip
    submit.add_argument("--output-schema", metavar="FILE|JSON",
                        help="a JSON Schema the answer must validate against: a JSON/YAML file or inline JSON")  # fmt: skip
    submit.add_argument("--max-cost-usd", type=constraint_value("max_cost_usd"), metavar="USD",
                        help="the most the task (sub-agents included) may spend, in US dollars")  # fmt: skip
    submit.add_argument("--economy", action="store_true",
                        help="each LLM turn through the Message Batches API at half price, waiting minutes to hours "
                        "(Anthropic only)")  # fmt: skip
    submit.add_argument("--context-threshold", type=constraint_value("context_threshold"), metavar="SHARE",
                        help="share of the context window (0.1-0.95, default 0.7) past which old tool results "
                        "are cleared")  # fmt: skip
    submit.add_argument("--priority", choices=["high", "normal", "low"], help="queue tier (default normal)")
    submit.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="a label kept with the task"
    )
    submit.add_argument("--notify", metavar="URL", help="an https:// URL to POST the task's end to, signed")
    submit.add_argument("--after", action="append", default=[], metavar="TASK_ID[,TASK_ID]",
                        help="run after these tasks succeed (depends_on); it waits blocked until then")  # fmt: skip
    submit.add_argument("--fallback", action="append", default=[], type=fallback, metavar="PROVIDER/MODEL",
                        help="a model to fall back to when the task's model is down or overloaded, in order "
                        "(repeatable, up to 4; e.g. openai/gpt-4.1)")  # fmt: skip
    submit.add_argument("--memory", action="append", default=[], type=memory_attachment,
                        metavar="STORE[:read_only]",
                        help="a memory store the task may use (read_write unless :read_only; repeatable)")  # fmt: skip
    submit.add_argument("--concurrency-key", metavar="KEY",
                        help="at most --concurrency-limit (default 1) of your tasks with this key run at once")  # fmt: skip
    submit.add_argument("--concurrency-limit", type=int, metavar="N", help="with --concurrency-key: 1 to 10,000")
    submit.add_argument("--on-conflict", choices=["queue", "cancel_running", "skip"],
                        help="with --concurrency-key, when the key is full: queue (default), cancel_running, "
                        "skip")  # fmt: skip
    submit.add_argument("--double-texting", choices=["queue", "interrupt", "reject"],
                        help="what a message sent while the agent is busy does: queue (default), interrupt the "
                        "turn in flight, or reject it (409)")  # fmt: skip
    submit.add_argument("--workspace", metavar="DIR|FILE",
                        help="start the task's workspace with DIR's files and their modes, or an archive FILE's "
                        "(tar, tar.gz, zip): inline up to 1,000 files and 160 KB of base64, larger uploaded first")  # fmt: skip
    submit.add_argument("--idempotency-key", help="retry-safe: the same key and body return the same task")
    add_wait(submit, "follow the task (status changes on stderr), then print its result")
    submit.set_defaults(func=_cmd_submit)
