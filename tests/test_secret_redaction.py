"""A deployment secret (``${secret:NAME}`` in an MCP server's headers or environment, a tool's
``ctx.secret``) is sent to servers whose answers the model reads; one that repeats it back puts
nothing of it in the task: not in a step's results, an event, the task's error, a log line or a
workspace file (ARCHITECTURE 15). The redactor has each value from the moment it is read, in the
run that reads it or in none (a client a tool module keeps, a thread of the tool's own), and
every run's output is redacted of it. A value it could not find without finding ordinary text
too is refused before anything is sent.

Real parts: the engine, the ``mcp`` package's client and its server (tests/mcp_servers/echo.py,
in a process of its own, over streamable HTTP and stdio), an HTTP API that echoes its request
(tests/vault_support.py). What the task left is read whole: every item of the table and every
payload object, and every line logged meanwhile through the process's redacting filter."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import McpToolPin, TaskStatus, ToolOutcome, ToolsStep
from agentq.core.secrets import Secrets, SecretUnavailable, env_var_for
from agentq.core.tools import ToolContext, ToolRegistry, tool
from agentq.core.tools.mcp import McpServerConfig, McpServers
from agentq.observe.logs import RedactingFilter
from agentq.observe.redaction import REDACTED
from agentq.storage.container import Storage, memory_storage

from tests.helpers import call, scripted, wait_for
from tests.test_redaction_cuts import leaked
from tests.test_remote_agent_redaction import _stored
from tests.test_vault import _results
from tests.vault_support import EchoServer, echo_server

ROOT = Path(__file__).resolve().parent.parent
NAME = "echo-token"
log = logging.getLogger("tests.secret_tools")


def _value() -> str:
    """A secret no earlier test read (the redactor keeps each for the process's life): SQK starts
    no other text here."""
    return "SQK" + uuid.uuid4().hex + "Z"


def _secrets(value: str) -> Secrets:
    return Secrets.from_env({env_var_for(NAME): value, "AGENTQ_SECRET_NAMES": NAME})


def _ask(url: str, value: str) -> str:
    """What an API that reflects its request said to a call made with ``value``."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {value}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


@tool
def echo_secret(url: str, ctx: ToolContext) -> str:
    """Calls an API with the deployment's secret and returns what it said."""
    return _ask(url, ctx.secret(NAME))


@tool
def echo_secret_raises(url: str, ctx: ToolContext) -> str:
    """Calls an API with the deployment's secret and raises with what it said."""
    raise RuntimeError(_ask(url, ctx.secret(NAME)))


@tool
def echo_secret_logs(url: str, ctx: ToolContext) -> str:
    """Calls an API with the deployment's secret and logs what it said."""
    log.warning("the API said %s", _ask(url, ctx.secret(NAME)))
    return "logged"


KEPT: dict[str, str] = {}  # what a tool module keeps across runs: a secret read once


@tool
def echo_kept(url: str) -> str:
    """Calls an API with the secret its module read before, and returns what it said."""
    return _ask(url, KEPT["value"])


@tool
def echo_from_a_thread(url: str, ctx: ToolContext) -> str:
    """Reads the secret in a thread of its own (none of the run's context) and calls with it."""
    read: list[str] = []
    worker = threading.Thread(target=lambda: read.append(ctx.secrets.get(NAME)))  # type: ignore[union-attr]
    worker.start()
    worker.join()
    return _ask(url, read[0])


@tool
def save_report(url: str, ctx: ToolContext) -> str:
    """Calls an API with the deployment's secret and saves what it said in the workspace."""
    said = _ask(url, ctx.secret(NAME))
    assert ctx.workspace is not None
    return ctx.workspace.file_op("write", writable=True, path="report.txt", content=said)


TOOLS = ToolRegistry([echo_secret, echo_secret_raises, echo_secret_logs, echo_kept, echo_from_a_thread, save_report])


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """Every line logged meanwhile, through the filter the process's handlers carry (observe.logs)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    handler.addFilter(RedactingFilter())
    root, level = logging.getLogger(), logging.getLogger().level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with echo_server() as server:
        yield server


@pytest.fixture(scope="module")
def mcp_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The echo MCP server over streamable HTTP (its port), and the ledger both transports write."""
    ledger = tmp_path_factory.mktemp("echo") / "heard.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "ECHO_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.mcp_servers.echo", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(up, timeout=30, what="the echo MCP server")
        yield port, ledger
    finally:
        proc.kill()
        proc.wait()


def _servers(mcp_echo: tuple[int, Path], secrets: Secrets) -> McpServers:
    port, ledger = mcp_echo
    return McpServers({
        "echo": McpServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout_seconds=20,
                                headers={"Authorization": "Bearer ${secret:echo-token}"}),
        "echo_stdio": McpServerConfig(command=[sys.executable, "-m", "tests.mcp_servers.echo", "--stdio"],
                                      env={"ECHO_TOKEN": "${secret:echo-token}", "ECHO_LEDGER": str(ledger),
                                           "PYTHONPATH": str(ROOT)}),
    }, secrets)  # fmt: skip


PINS = [
    McpToolPin(server=server, name=name, input_schema={"type": "object"}, read_only=True)
    for server in ("echo", "echo_stdio")
    for name in ("whoami", "whoami_error")
]


def _run(store: Storage, engine: Engine, calls: list[dict[str, Any]], **update: Any) -> tuple[str, list[ToolOutcome]]:
    """A task whose one turn makes ``calls``, run to its end on ``engine``."""
    names = sorted({c["name"] for c in calls} | set(update.pop("tools", [])))
    sub = scripted([{"text": "", "tool_calls": calls}, {"text": "done"}], tools=names).model_copy(update=update)
    task_id = store.tasks.create(sub, tenant=f"t-{uuid.uuid4().hex[:6]}").task_id
    assert engine.run(task_id).status is TaskStatus.SUCCEEDED
    return task_id, _results(store, task_id)


def _nothing_of(value: str, store: Storage, task_id: str, lines: list[str]) -> None:
    """No spelling of ``value`` in the task's results, its events, its error, the store, the logs."""
    results = json.dumps([r.model_dump(mode="json") for r in _results(store, task_id)])
    head = store.events.head(task_id)
    assert head is not None
    events = json.dumps([(e.type, e.data, e.step) for e in store.events.read(task_id, head, None, limit=1000)],
                        default=str)  # fmt: skip
    error = json.dumps(store.tasks.get(task_id).error)
    where = {"results": results, "events": events, "error": error, "store": _stored(store), "logs": "\n".join(lines)}
    assert {k: leaked(v, value) for k, v in where.items() if leaked(v, value)} == {}


def test_an_mcp_server_echoing_its_secret_header_or_environment_shows_the_model_none_of_it(
    mcp_echo: tuple[int, Path], logged: list[str]
) -> None:
    value, store = _value(), memory_storage()
    secrets = _secrets(value)
    engine = Engine(store, worker_id="w", tools=ToolRegistry(), config=EngineConfig(lease_seconds=10),
                    secrets=secrets, mcp=_servers(mcp_echo, secrets))  # fmt: skip
    task_id, results = _run(store, engine, [call(p.qualified) for p in PINS], mcp_tools=PINS)
    heard = [json.loads(line) for line in mcp_echo[1].read_text().splitlines()]
    assert {"authorization": f"Bearer {value}"} in heard and {"started": True, "token": value} in heard  # it was sent
    http, http_error, stdio, stdio_error = results
    for said in (http, stdio):
        assert not said.is_error and said.content.startswith("you sent ") and REDACTED in said.content, said
    for refused in (http_error, stdio_error):
        assert refused.is_error and f"refused: you sent {'Bearer ' if refused is http_error else ''}{REDACTED}" in (
            refused.content
        ), refused
    assert any(REDACTED in line for line in logged)  # the errors were logged, redacted
    _nothing_of(value, store, task_id, logged)


def test_an_mcp_servers_listing_that_echoes_its_secret_pins_none_of_it(mcp_echo: tuple[int, Path]) -> None:
    """Listed as an agent version is created (outside any run): the pins are what every model
    that uses the version is offered."""
    value = _value()
    servers = _servers(mcp_echo, _secrets(value))
    for server in ("echo", "echo_stdio"):
        pins = servers.list_tools(server)
        assert {p.name for p in pins} == {"whoami", "whoami_error"}
        assert all(p.description.endswith(f"{REDACTED})") for p in pins), pins
        assert leaked(json.dumps([p.model_dump(mode="json") for p in pins]), value) == []


def test_a_tool_that_returns_raises_or_logs_an_echo_of_its_secret_shows_the_model_none_of_it(
    echo: EchoServer, logged: list[str]
) -> None:
    value, store = _value(), memory_storage()
    engine = Engine(store, worker_id="w", tools=TOOLS, config=EngineConfig(lease_seconds=10), secrets=_secrets(value))
    url = echo.url("/me")
    calls = [call(name, url=url) for name in ("echo_secret", "echo_secret_raises", "echo_secret_logs")]
    task_id, (returned, raised, logs) = _run(store, engine, calls)
    assert any(r.get("authorization") == f"Bearer {value}" for r in echo.requests)  # it was sent
    assert not returned.is_error and f"Authorization: Bearer {REDACTED}" in returned.content, returned
    assert raised.is_error and f"Authorization: Bearer {REDACTED}" in raised.content, raised
    assert logs.content == "logged" and any(f"Bearer {REDACTED}" in line for line in logged)
    _nothing_of(value, store, task_id, logged)


@pytest.mark.parametrize("read", ["outside any run", "by another run", "in a thread of the tool's own"])
def test_a_secret_read_elsewhere_than_the_run_an_echo_reaches_is_redacted_from_it(
    echo: EchoServer, logged: list[str], read: str
) -> None:
    """The run whose result holds the echo need not be the one that read the value: a tool module
    keeps a client made with it across runs (read at import, or by another tenant's run), or reads
    it in a thread that has none of the run's context. Each read is the redactor's at once."""
    value, store = _value(), memory_storage()
    secrets = _secrets(value)
    engine = Engine(store, worker_id="w", tools=TOOLS, config=EngineConfig(lease_seconds=10), secrets=secrets)
    url = echo.url("/kept")
    if read == "outside any run":
        KEPT["value"] = secrets.get(NAME)
        calls = [call("echo_kept", url=url)]
    elif read == "by another run":
        _run(store, engine, [call("echo_secret", url=url)])
        KEPT["value"] = value  # what the other run's tool kept
        calls = [call("echo_kept", url=url)]
    else:
        calls = [call("echo_from_a_thread", url=url)]
    task_id, [said] = _run(store, engine, calls)
    assert not said.is_error and f"Authorization: Bearer {REDACTED}" in said.content, said
    _nothing_of(value, store, task_id, logged)
    log.warning("the module's client was made with %s", value)  # a log line of no run
    assert f"made with {REDACTED}" in logged[-1]


@pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
def test_a_tool_that_saves_an_echo_of_its_secret_in_the_workspace_checkpoints_none_of_it(
    echo: EchoServer, logged: list[str], tmp_path: Path
) -> None:
    from agentq.core.workspace import Manifest

    value, store = _value(), memory_storage()
    config = EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"))
    engine = Engine(store, worker_id="w", tools=TOOLS, config=config, secrets=_secrets(value))
    task_id, [saved] = _run(store, engine, [call("save_report", url=echo.url("/report"))], tools=["write_file"])
    assert not saved.is_error, saved
    steps = [s.body for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep)]
    ref = [step.workspace for step in steps if step.workspace][-1]
    assert ref is not None
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task_id, ref.manifest))
    [report] = [e for e in manifest.entries if e.path == "report.txt"]
    stored = store.workspaces.get_blob(task_id, report.digest).decode()
    assert f"Authorization: Bearer {REDACTED}" in stored and leaked(stored, value) == []
    _nothing_of(value, store, task_id, logged)


@pytest.mark.parametrize("value", ["Sq7-k3y", "--------", "abababababab", "ab  ab  ab  ab  ab"])
def test_a_secret_the_redactor_could_not_find_is_refused_wherever_it_would_go_and_nothing_is_sent(
    echo: EchoServer, mcp_echo: tuple[int, Path], value: str
) -> None:
    """Under 8 characters, or of fewer than 5 different ones besides spaces: ordinary text holds it
    (indentation, a rule line), so no echo of it could be redacted without rewriting every run's
    text. Every place a secret goes answers to the model: each refuses it, naming it."""
    store, secrets = memory_storage(), _secrets(value)
    engine = Engine(store, worker_id="w", tools=TOOLS, config=EngineConfig(lease_seconds=10),
                    secrets=secrets, mcp=_servers(mcp_echo, secrets))  # fmt: skip
    sent, heard = len(echo.requests), mcp_echo[1].read_text() if mcp_echo[1].exists() else ""
    pins = [p for p in PINS if p.name == "whoami"]
    calls = [call("echo_secret", url=echo.url("/short")), *(call(p.qualified) for p in pins)]
    _, results = _run(store, engine, calls, mcp_tools=pins)
    assert len(results) == 3
    for refused in results:
        assert refused.is_error and f"secret {NAME!r} is not used" in refused.content, refused
    assert len(echo.requests) == sent  # nothing reached the API
    assert (mcp_echo[1].read_text() if mcp_echo[1].exists() else "") == heard  # nor either server, nor started
    with pytest.raises(SecretUnavailable, match="cannot be redacted"):
        secrets.expand("Bearer ${secret:echo-token}")
