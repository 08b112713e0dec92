"""MCP servers as tool sources, against real servers of the ``mcp`` package
(tests/mcp_servers/billing.py: streamable HTTP behind a bearer token read from a secret, and
the same server over stdio) and real worker processes on the local stack: tools are listed
and pinned when an agent version is created; calls go through the effect machinery (a
read-only tool runs again on resume, a side-effecting one at most once and *outcome unknown*
after a crash); a server that is down, errs, or dies mid-call gives the model a clear error."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentq.core.models import TaskStatus, ToolsStep
from agentq_dev.stack import LocalStack

from tests.helpers import agentq_process, api_json, call, run_agentq, wait_for
from tests.mcp_servers.billing import release_path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "billing-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Billing:
    """The HTTP billing server (restartable on its port), its ledger, and a stack that knows it."""

    port: int
    ledger: Path
    stack: LocalStack
    key: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "BILLING_TOKEN": TOKEN, "BILLING_LEDGER": str(self.ledger), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_servers.billing", "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(up, timeout=30, what="the billing MCP server")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def started(self, customer: str) -> bool:
        """Whether the server has received a send_invoice call for ``customer`` (it may still run)."""
        return self.calls_started(customer) > 0

    def calls_started(self, customer: str) -> int:
        """How many send_invoice calls for ``customer`` the server has received (finished or not)."""
        marks = self.ledger.with_name(self.ledger.name + ".started")
        lines = marks.read_text().splitlines() if marks.exists() else []
        return sum(json.loads(line)["customer"] == customer for line in lines)

    def release(self, customer: str) -> None:
        """End the held send_invoice call for ``customer`` (tests.mcp_servers.billing)."""
        Path(release_path(str(self.ledger), customer)).touch()

    def invoices(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ledger.read_text().splitlines()] if self.ledger.exists() else []

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        assert self.stack.api_server is not None
        return api_json(self.stack.api_server.url, self.key, method, path, body)

    def agent(self, turns: list[dict[str, Any]], servers: list[dict[str, Any]] | None = None, **over: Any) -> str:
        name = f"biller-{uuid.uuid4().hex[:8]}"
        body = {"name": name, "provider": "scripted", "script": {"turns": turns},
                "mcp_servers": servers or [{"name": "billing"}, {"name": "billing_stdio"}], **over}  # fmt: skip
        status, created = self.http("POST", "/agents", body)
        assert status == 201, created
        return name

    def run_task(self, agent: str, *, lease: float = 2, wait: float = 0, **env: str) -> subprocess.Popen[str]:
        """A worker process for one new task of ``agent``; returns it (the task id is its ``task_id``)."""
        status, accepted = self.http("POST", "/tasks", {"goal": "bill them", "agent": agent})
        assert status == 202, accepted
        proc = agentq_process(
            ["run-task", accepted["task_id"], "--lease", str(lease), "--wait", str(wait)],
            env=self.stack.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        proc.task_id = accepted["task_id"]  # type: ignore[attr-defined]
        return proc

    def resume(self, task_id: str, wait: float = 20) -> dict[str, Any]:
        done = run_agentq(["run-task", task_id, "--lease", "2", "--wait", str(wait)], env=self.stack.env(), timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return dict(json.loads(done.stdout.splitlines()[-1]))

    def results(self, task_id: str) -> list[Any]:
        steps = self.stack.store().steps.load(task_id)
        return [r for s in steps if isinstance(s.body, ToolsStep) for r in s.body.results]


@pytest.fixture(scope="module")
def billing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Billing]:
    ledger = tmp_path_factory.mktemp("billing") / "invoices.jsonl"
    port = _free_port()
    servers = {
        "billing": {
            "url": f"http://127.0.0.1:{port}/mcp",
            "headers": {"Authorization": "Bearer ${secret:billing-token}"},
            "timeout_seconds": 20,
        },
        "billing_stdio": {
            "command": [sys.executable, "-m", "tests.mcp_servers.billing", "--stdio"],
            "env": {"BILLING_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)},
        },
    }
    stack = LocalStack(
        prefix=f"mcp{uuid.uuid4().hex[:8]}",
        workers=0,
        auth=True,
        extra_env={
            "AGENTQ_MCP_SERVERS": json.dumps(servers),
            "AGENTQ_SECRET_BILLING_TOKEN": TOKEN,
            "AGENTQ_SECRET_NAMES": "billing-token",
            "PYTHONPATH": str(ROOT),
        },
    ).start()
    billing = Billing(port=port, ledger=ledger, stack=stack, key=stack.create_api_key("team-m"))
    billing.start()
    try:
        yield billing
    finally:
        billing.kill()
        stack.stop()


def test_an_agent_version_pins_its_servers_tools_with_their_read_only_hints(billing: Billing) -> None:
    name = billing.agent([{"text": "x"}], servers=[{"name": "billing", "tools": ["lookup_price", "send_invoice"]}],
                         tool_policies={"mcp__billing__send_invoice": "ask"})  # fmt: skip
    status, version = billing.http("GET", f"/agents/{name}")
    assert status == 200
    pins = {p["name"]: p for p in version["mcp_tools"]}
    assert set(pins) == {"lookup_price", "send_invoice"}
    assert pins["lookup_price"]["read_only"] and not pins["send_invoice"]["read_only"]
    assert pins["send_invoice"]["input_schema"]["required"] == ["customer", "amount_cents"]
    assert all(p["server"] == "billing" for p in pins.values())

    for servers, field in [
        ([{"name": "nowhere"}], "mcp_servers[0].name"),
        ([{"name": "billing", "tools": ["refund_everything"]}], "mcp_servers[0].tools[0]"),
    ]:
        status, refused = billing.http("POST", "/agents", {"name": f"bad-{uuid.uuid4().hex[:6]}", "provider": "scripted",
                                                            "script": "research", "mcp_servers": servers})  # fmt: skip
        assert status == 422 and refused["error"]["field"] == field, refused
    status, refused = billing.http("POST", "/tasks", {"goal": "g", "agent": name, "mcp_tools": []})
    assert status == 422 and refused["error"]["field"] == "mcp_tools"
    raw_pin = {"server": "billing", "name": "send_invoice", "input_schema": {"type": "object"}}
    status, refused = billing.http("POST", "/tasks", {"goal": "g", "provider": "scripted", "script": "research",
                                                       "mcp_tools": [raw_pin]})  # fmt: skip
    assert status == 422 and refused["error"]["field"] == "mcp_tools"  # only an agent version brings MCP tools


def test_a_task_calls_mcp_tools_over_http_and_stdio_with_each_invoice_sent_once(billing: Billing) -> None:
    before = len(billing.invoices())
    turns: list[dict[str, Any]] = [
        {"text": "pricing", "tool_calls": [call("mcp__billing__lookup_price", sku="abc"),
                                           call("mcp__billing__broken", reason="db down")]},
        {"text": "billing", "tool_calls": [call("mcp__billing__send_invoice", customer="acme", amount_cents=300),
                                           call("mcp__billing_stdio__send_invoice", customer="initech", amount_cents=7)]},
        {"text": "billed both"},
    ]  # fmt: skip
    proc = billing.run_task(billing.agent(turns))
    out, err = proc.communicate(timeout=120)
    assert json.loads(out.splitlines()[-1])["status"] == "succeeded", err[-3000:]
    results = {r.name: r for r in billing.results(proc.task_id)}  # type: ignore[attr-defined]
    assert results["mcp__billing__lookup_price"].content == "abc costs 300 cents"
    assert not results["mcp__billing__lookup_price"].side_effects
    broken = results["mcp__billing__broken"]
    assert broken.is_error and "answered broken with an error" in broken.content
    assert results["mcp__billing__send_invoice"].side_effects
    assert results["mcp__billing__send_invoice"].content == "invoice sent to acme for 300 cents"
    assert results["mcp__billing_stdio__send_invoice"].content == "invoice sent to initech for 7 cents"
    sent = billing.invoices()[before:]
    assert sorted(i["customer"] for i in sent) == ["acme", "initech"]


def test_an_mcp_call_a_policy_rule_denies_never_reaches_the_server_and_the_model_reads_the_rule(
    billing: Billing,
) -> None:
    customer = f"denied-{uuid.uuid4().hex[:8]}"
    turns: list[dict[str, Any]] = [
        {"text": "billing", "tool_calls": [call("mcp__billing__lookup_price", sku="abcd"),
                                           call("mcp__billing__send_invoice", customer=customer, amount_cents=5)]},
        {"text": "done"},
    ]  # fmt: skip
    agent = billing.agent(turns, servers=[{"name": "billing"}])
    # Matches only what the engine's check says of an MCP call: the action `mcp` and its server.
    rule = """@id("no-invoices") @message("invoices are sent by the finance agent")
        forbid(principal, action == Action::"mcp", resource == Tool::"mcp__billing__send_invoice")
        when { context.call.mcp_server == "billing" };"""
    status, written = billing.http("PUT", f"/policies/agent:{agent}", {"policies": rule})
    assert status == 201, written
    proc = billing.run_task(agent)
    out, err = proc.communicate(timeout=120)
    assert json.loads(out.splitlines()[-1])["status"] == "succeeded", err[-3000:]
    assert billing.calls_started(customer) == 0  # the server never received it
    assert all(i["customer"] != customer for i in billing.invoices())
    results = {r.name: r for r in billing.results(proc.task_id)}  # type: ignore[attr-defined]
    assert results["mcp__billing__lookup_price"].content == "abcd costs 400 cents"  # the server was there
    denied = results["mcp__billing__send_invoice"]
    assert denied.is_error and denied.policy is not None and denied.policy["rule"] == f"agent:{agent}/no-invoices"
    assert f"denied by policy rule agent:{agent}/no-invoices: invoices are sent by the finance agent" in denied.content


def test_a_worker_killed_mid_call_never_sends_an_invoice_twice_and_reruns_a_read_only_call(billing: Billing) -> None:
    before = len(billing.invoices())
    turns: list[dict[str, Any]] = [
        {"text": "slow billing", "tool_calls": [
            call("mcp__billing__lookup_price", sku="xyz"),
            call("mcp__billing__send_invoice", customer="globex", amount_cents=42, held=True)]},
        {"text": "done"},
    ]  # fmt: skip
    proc = billing.run_task(billing.agent(turns, servers=[{"name": "billing"}]))
    task_id = proc.task_id  # type: ignore[attr-defined]
    store = billing.stack.store()
    wait_for(lambda: store.effects.get(task_id, turns_id(store, task_id)) is not None, timeout=30,
             what="the invoice call to start")  # fmt: skip
    wait_for(lambda: billing.started("globex"), timeout=30, what="the server to receive the call")  # mid-call
    os.kill(proc.pid, signal.SIGKILL)  # the call is held until released: the worker dies mid-call
    proc.wait()
    try:
        report = billing.resume(task_id)
    finally:
        billing.release("globex")  # the dead worker's call ends now (a resent one too: seen below)
    assert report["status"] == "succeeded"
    results = {r.name: r for r in billing.results(task_id)}
    assert results["mcp__billing__lookup_price"].content == "xyz costs 300 cents"  # read-only: run again
    invoice = results["mcp__billing__send_invoice"]
    assert invoice.status == "unknown_outcome" and invoice.is_error
    # Never twice: the server received one call for globex, ever (the dead worker's; the resumed
    # worker, done by now, sent none), and finishes it once released: wait for its invoice.
    sent = wait_for(lambda: [i for i in billing.invoices()[before:] if i["customer"] == "globex"], timeout=30,
                    what="the server to finish the call the dead worker started")  # fmt: skip
    assert len(sent) == 1 and billing.calls_started("globex") == 1


def turns_id(store: Any, task_id: str) -> str:
    """The tool_use id of the task's send_invoice call, once its first LLM step is committed."""
    for step in store.steps.load(task_id):
        for block in getattr(step.body, "content", []):
            if block.get("type") == "tool_use" and block["name"].endswith("send_invoice"):
                return str(block["id"])
    return "(not yet)"


def test_a_server_that_is_down_or_dies_mid_call_gives_the_model_a_clear_error(billing: Billing) -> None:
    slow: list[dict[str, Any]] = [{"text": "billing", "tool_calls": [
        call("mcp__billing__send_invoice", customer="hooli", amount_cents=9, held=True)]}, {"text": "after"}]  # fmt: skip
    agent = billing.agent(slow, servers=[{"name": "billing"}])
    try:
        proc = billing.run_task(agent, lease=10)
        wait_for(lambda: billing.started("hooli"), timeout=60, what="the server to receive the call")  # mid-call
        billing.kill()
        out, err = proc.communicate(timeout=120)
        assert json.loads(out.splitlines()[-1])["status"] == "succeeded", err[-3000:]
        [dropped] = billing.results(proc.task_id)  # type: ignore[attr-defined]
        assert dropped.is_error and "outcome unknown" in dropped.content and "'billing'" in dropped.content

        down = billing.run_task(agent, lease=10)
        out, err = down.communicate(timeout=120)
        assert json.loads(out.splitlines()[-1])["status"] == "succeeded", err[-3000:]
        [refused] = billing.results(down.task_id)  # type: ignore[attr-defined]
        assert refused.is_error and "cannot reach MCP server 'billing'" in refused.content
    finally:
        billing.start()
    assert billing.stack.store().tasks.get(down.task_id).status is TaskStatus.SUCCEEDED  # type: ignore[attr-defined]
