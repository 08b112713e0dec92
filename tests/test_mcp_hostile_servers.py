"""The MCP client against hostile servers (tests/mcp_servers/hostile.py, the ``mcp`` package's
``MCPServer``): a reply far over what a tool result keeps is refused as it is read, before it is
held whole (``core.tools.mcp_http``): in a worker's call, where a side-effecting call that sent
one is finished as run, never run again, and in the API's listing of a server's tools. An agent
version whose MCP tools would share a name, or that names a server a tool's name could not tell
apart, is refused when it is created, not at each of its tasks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core.agents import AgentSpec, McpServerRef
from agentq.core.models import McpToolPin, ToolsStep
from agentq.core.tools.mcp import McpConfigurationError, McpServers
from agentq.core.tools.mcp_http import MAX_REPLY_BYTES
from agentq_dev.stack import LocalStack

from tests.helpers import api_json, call, run_agentq, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers.hostile", "--port", str(port), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_up(port: int) -> None:
    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(up, timeout=30, what="the hostile MCP server")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module", params=["json", "gzip"])
def json_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The hostile server answering each call with one JSON body (``json_response=True``), as it
    is or gzipped to a client that accepts gzip (64 MB is ~130 KB on the wire)."""
    port = _free_port()
    proc = _start(port, "--json", *(["--gzip"] if request.param == "gzip" else []))
    try:
        _wait_up(port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop([proc])


def _peak_rss_mb_of_a_call(server: dict[str, Any], megabytes: int) -> tuple[int, str]:
    """A fresh process calls ``huge`` once on ``server`` (an ``McpServerConfig``'s settings); its
    peak RSS growth (MB) past importing the ``mcp`` package's transports, and what the call gave."""
    code = f"""
import resource, json
import mcp.client.stdio, mcp.client.streamable_http
from agentq.core.tools.mcp import McpServers, McpServerConfig, McpError
s = McpServers({{"h": McpServerConfig.model_validate({server!r})}})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    out = "ok " + str(len(s.call("h", "huge", {{"megabytes": {megabytes}}}, may_have_run=False)))
except McpError as exc:
    out = "error " + exc.message[:300]
print(json.dumps([(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, out]))
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    grown, outcome = json.loads(done.stdout.splitlines()[-1])
    return int(grown), str(outcome)


def test_an_mcp_result_far_over_what_a_tool_result_keeps_is_refused_before_it_fills_the_worker_s_memory(
    json_server: str,
) -> None:
    # A tool result is cut to 100,000 characters (core.tools._core.MAX_RESULT_CHARS): a server
    # answering 64 MB must not cost the worker many times that in memory first. Over SSE the
    # mcp package refuses an event over its bound; a JSON answer it reads whole, and httpx
    # inflates a gzipped one whatever it becomes. Seen: 599 MB grown, the 64 MB returned.
    grown, outcome = _peak_rss_mb_of_a_call({"url": json_server, "timeout_seconds": 60}, 64)
    assert grown < 64, f"the worker's peak memory grew {grown} MB for one call ({outcome})"
    assert outcome.startswith("error MCP server 'h' sent a reply of ") and "refused unread" in outcome, outcome


def test_a_stdio_mcp_server_s_line_over_the_reply_bound_is_refused_before_it_fills_the_worker_s_memory() -> None:
    # A stdio server's reply is one line: the mcp package's stdio_client joins its chunks with no
    # bound, copying the line so far for each one, and parses it whole (core.tools.mcp_stdio).
    # Seen: a 24 MB line grew the worker by ~260 MB over ~40 s, and was returned.
    stdio = {"command": [sys.executable, "-m", "tests.mcp_servers.hostile", "--stdio"],
             "env": {"PYTHONPATH": str(ROOT)}, "timeout_seconds": 120}  # fmt: skip
    grown, outcome = _peak_rss_mb_of_a_call(stdio, 24)
    assert grown < 24, f"the worker's peak memory grew {grown} MB for one call ({outcome})"
    assert outcome == (
        f"error MCP server 'h' sent a reply over the {MAX_REPLY_BYTES} bytes one reply may hold: "
        "refused unread (a tool result keeps 100000 characters)"
    ), outcome


class _Stack:
    def __init__(self, stack: LocalStack, key: str, ledger: Path) -> None:
        self.stack, self.key, self.ledger = stack, key, ledger

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.stack.api_server is not None
        return api_json(self.stack.api_server.url, self.key, method, path, body)

    def agent(self, servers: list[dict[str, Any]], turns: list[dict[str, Any]] | None = None) -> tuple[int, Any]:
        body = {"name": f"h-{uuid.uuid4().hex[:8]}", "provider": "scripted",
                "script": {"turns": turns or [{"text": "done"}]}, "mcp_servers": servers}  # fmt: skip
        return self.http("POST", "/agents", body)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Stack]:
    """A local stack with hostile servers: ``big`` (JSON replies), ``twice`` (lists
    ``echo_headers`` twice) and ``bloated`` (SSE; its listing is 8 MB), and over stdio
    ``big_stdio`` and ``bloated_stdio``. Each ``big`` server's calls go to ``ledger/<name>``."""
    ledger = tmp_path_factory.mktemp("hostile")
    ports = {"big": _free_port(), "twice": _free_port(), "bloated": _free_port()}
    procs = [
        _start(ports["big"], "--json", HOSTILE_LEDGER=str(ledger / "big")),
        _start(ports["twice"], HOSTILE_DUPLICATE="1"),
        _start(ports["bloated"], HOSTILE_LISTING_MB="8"),
    ]
    servers: dict[str, Any] = {name: {"url": f"http://127.0.0.1:{port}/mcp", "timeout_seconds": 30}
                               for name, port in ports.items()}  # fmt: skip
    stdio = [sys.executable, "-m", "tests.mcp_servers.hostile", "--stdio"]
    servers["big_stdio"] = {"command": stdio, "timeout_seconds": 30,
                            "env": {"PYTHONPATH": str(ROOT), "HOSTILE_LEDGER": str(ledger / "big_stdio")}}  # fmt: skip
    servers["bloated_stdio"] = {"command": stdio, "env": {"PYTHONPATH": str(ROOT), "HOSTILE_LISTING_MB": "8"}}
    stack = None
    try:
        for port in ports.values():
            _wait_up(port)
        stack = LocalStack(prefix=f"hst{uuid.uuid4().hex[:8]}", workers=0, auth=True,
                           extra_env={"AGENTQ_MCP_SERVERS": json.dumps(servers), "PYTHONPATH": str(ROOT)}).start()  # fmt: skip
        yield _Stack(stack, stack.create_api_key("team-h"), ledger)
    finally:
        if stack is not None:
            stack.stop()
        _stop(procs)


def test_a_task_reads_why_a_huge_mcp_reply_was_refused_and_the_side_effecting_call_that_sent_one_never_runs_again(
    hostile: _Stack,
) -> None:
    turns: list[dict[str, Any]] = [{"tool_calls": [call("mcp__big__huge", megabytes=8), call("mcp__big__huge_once", megabytes=8),
                             call("mcp__big__echo_headers")]}, {"text": "done"}]  # fmt: skip
    status, created = hostile.agent([{"name": "big"}], turns)
    assert status == 201, created
    status, accepted = hostile.http("POST", "/tasks", {"goal": "g", "agent": created["agent"]["name"]})
    assert status == 202, accepted
    task_id = accepted["task_id"]
    done = run_agentq(["run-task", task_id, "--lease", "10", "--wait", "0"], env=hostile.stack.env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "succeeded", done.stderr[-3000:]

    store = hostile.stack.store()
    results = {r.name: r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results}
    read_only, once = results["mcp__big__huge"], results["mcp__big__huge_once"]
    assert read_only.is_error and "MCP server 'big' sent a reply of " in read_only.content, read_only.content
    assert f"over the {MAX_REPLY_BYTES} one reply may hold: refused unread (a tool result keeps 100000 characters)" in (
        read_only.content
    )
    assert once.is_error and once.side_effects
    assert "The call was sent: it ran, or may have, and is not run again" in once.content, once.content
    # At most once: its effect record is finished with that text (what a resumed task replays,
    # never running it again), and the server ran it once.
    record = store.effects.get(task_id, once.tool_use_id)
    assert record is not None and record.state == "done" and record.is_error and record.content == once.content
    assert (hostile.ledger / "big").read_text().splitlines() == ["huge_once 8"]
    # Replies are asked for unencoded: a gzipped one is inflated past any bound before it is read.
    assert "'accept-encoding': 'identity'" in results["mcp__big__echo_headers"].content


def test_a_stdio_server_s_reply_over_the_bound_is_refused_and_the_side_effecting_call_that_sent_one_never_runs_again(
    hostile: _Stack,
) -> None:
    turns: list[dict[str, Any]] = [{"tool_calls": [call("mcp__big_stdio__huge", megabytes=8),
                                                   call("mcp__big_stdio__huge_once", megabytes=8)]}, {"text": "done"}]  # fmt: skip
    status, created = hostile.agent([{"name": "big_stdio"}], turns)
    assert status == 201, created
    status, accepted = hostile.http("POST", "/tasks", {"goal": "g", "agent": created["agent"]["name"]})
    assert status == 202, accepted
    task_id = accepted["task_id"]
    done = run_agentq(["run-task", task_id, "--lease", "10", "--wait", "0"], env=hostile.stack.env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "succeeded", done.stderr[-3000:]

    store = hostile.stack.store()
    results = {r.name: r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results}
    read_only, once = results["mcp__big_stdio__huge"], results["mcp__big_stdio__huge_once"]
    refused = f"MCP server 'big_stdio' sent a reply over the {MAX_REPLY_BYTES} bytes one reply may hold: refused unread"
    assert read_only.is_error and read_only.content.endswith(f"{refused} (a tool result keeps 100000 characters)")
    assert once.is_error and once.side_effects
    sent = f"{refused}. The call was sent: it ran, or may have, and is not run again; its result is unknown"
    assert once.content.endswith(sent), once.content
    record = store.effects.get(task_id, once.tool_use_id)
    assert record is not None and record.state == "done" and record.is_error and record.content == once.content
    assert (hostile.ledger / "big_stdio").read_text().splitlines() == ["huge_once 8"]


@pytest.mark.parametrize("bloated", ["bloated", "bloated_stdio"])
def test_a_listing_over_the_reply_bound_is_refused_by_the_api_naming_the_server(hostile: _Stack, bloated: str) -> None:
    status, refused = hostile.agent([{"name": "big"}, {"name": bloated}])
    assert status == 422 and refused["error"]["field"] == "mcp_servers[1]", refused
    assert f"sent a reply over the {MAX_REPLY_BYTES} bytes one reply may hold" in refused["error"]["message"]


def test_a_server_listing_one_tool_name_twice_is_refused_when_the_agent_is_created_naming_the_tool(
    hostile: _Stack,
) -> None:
    # Two pins with one qualified name can never both be offered (ToolRegistry.register refuses
    # the second): the version must not be created, rather than every task of it failing later
    # (seen: 201, then every POST /tasks a 422 "constraints.tools: tool names must be unique").
    both: list[list[dict[str, Any]]] = [
        [{"name": "twice"}],
        [{"name": "big"}, {"name": "twice", "tools": ["huge", "echo_headers"]}],
    ]
    for servers in both:
        status, refused = hostile.agent(servers)
        field = f"mcp_servers[{len(servers) - 1}]"
        assert status == 422 and refused["error"]["field"] == field, refused
        assert "lists tool 'echo_headers' 2 times" in refused["error"]["message"]
    status, created = hostile.agent([{"name": "twice", "tools": ["huge"]}])  # what it lists once may be used
    assert status == 201, created
    status, refused = hostile.agent([{"name": "big", "tools": ["huge"]}, {"name": "big"}])  # one server twice
    assert status == 422 and refused["error"]["field"] == "mcp_servers[1]", refused
    assert "'mcp__big__huge', which mcp_servers[0] already offers" in refused["error"]["message"]


@pytest.mark.parametrize("name", ["a__b", "a_"])
def test_a_server_name_a_tool_s_name_could_not_tell_apart_is_refused_by_the_api_and_the_deployment(
    hostile: _Stack, name: str
) -> None:
    # Server "a" with tool "b__c" and server "a__b" with tool "c" are both mcp__a__b__c; server
    # "a_" with tool "b" and server "a" with tool "_b" both mcp__a___b.
    status, refused = hostile.agent([{"name": name}])  # refused for its form, registered or not
    assert status == 422 and refused["error"]["field"] == "mcp_servers[0].name", refused
    assert "no '__' and no '_' at the end" in refused["error"]["message"], refused
    with pytest.raises(McpConfigurationError) as failure:
        McpServers.from_env({"AGENTQ_MCP_SERVERS": json.dumps({name: {"url": "https://mcp.example.com/mcp"}})})
    assert failure.value.field == "AGENTQ_MCP_SERVERS" and "no '__' and no '_' at the end" in failure.value.message
    # A version stored before the rule, naming such a server, is still read.
    stored = f"old-{uuid.uuid4().hex[:8]}"
    spec = AgentSpec(name=stored, provider="scripted", script="research", mcp_servers=[McpServerRef(name=name)])
    pin = McpToolPin(server=name, name="c", input_schema={"type": "object"})
    hostile.stack.store().agents.create("team-h", spec, [pin])
    status, version = hostile.http("GET", f"/agents/{stored}")
    assert status == 200 and version["mcp_tools"][0]["server"] == name, version
