"""Policy rules at the engine's call points besides a registered tool's (``core.engine._policy``,
docs/POLICIES.md): a spawn a rule denies starts no sub-agent and the model reads the rule's
message as the spawn's error; every decision a rule took part in is a ``PolicyDecision`` event
naming the rule and a ``policy_decisions`` metric by decision, a ``log_only`` rule's as
``would_deny``/``would_ask`` beside what happened.

The engine's own behaviour, on the in-memory twin (a denied MCP call against a real MCP server:
tests/test_mcp_tools.py; tool calls over HTTP with real workers: tests/test_policies.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from agentq.control.policies import put_policy
from agentq.core.engine import Engine, EngineConfig
from agentq.core.fanout import SPAWN_TOOL
from agentq.core.models import Task, TaskStatus, ToolsStep
from agentq.core.tools import ToolRegistry
from agentq.observe import names
from agentq.storage.container import Storage

from tests.helpers import call, scripted
from tests.test_observability import emf_documents, metric_total

STORAGE = "memory"


class Fanout:
    """Step Functions' part of a spawn: which spawns were started (the children are not run)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        self.started.append(spawn_id)
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        raise AssertionError("not reached")


def _engine(store: Storage, registry: ToolRegistry, fanout: Fanout | None = None) -> Engine:
    config = EngineConfig(lease_seconds=30, policy_cache_seconds=0)
    return Engine(store, worker_id="w", tools=registry, config=config, fanout=fanout)


def _results(store: Storage, task_id: str) -> list[Any]:
    return [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]


def _every_task(store: Storage, tenant: str) -> list[str]:
    tasks, _ = store.tasks.list_for_tenant(tenant, limit=100, roots_only=False)
    return sorted(t.task_id for t in tasks)


SPAWN_TURNS: list[dict[str, Any]] = [
    {"text": "splitting", "tool_calls": [call(SPAWN_TOOL, subagents=[
        {"goal": "one", "script": {"turns": [{"text": "child one"}]}},
        {"goal": "two", "script": {"turns": [{"text": "child two"}]}},
    ])]},
    {"text": "done alone"},
]  # fmt: skip


def test_a_spawn_a_rule_denies_creates_no_child_and_the_model_reads_the_rules_message(
    store: Storage, registry: ToolRegistry
) -> None:
    put_policy(store, "acme", "tenant", """
        @id("no-spawns") @message("this tenant's tasks work alone")
        forbid(principal, action == Action::"spawn", resource);""")  # fmt: skip
    fanout = Fanout()
    root = store.tasks.create(scripted(SPAWN_TURNS, tools=[SPAWN_TOOL]), tenant="acme")

    result = _engine(store, registry, fanout).run(root.task_id)

    assert result.status is TaskStatus.SUCCEEDED  # it went on to its next turn, never waited for children
    assert fanout.started == [] and store.spawns.list(root.task_id) == []
    assert _every_task(store, "acme") == [root.task_id]  # no child META was written
    (spawn,) = _results(store, root.task_id)
    assert spawn.name == SPAWN_TOOL and spawn.is_error
    assert "denied by policy rule tenant/no-spawns: this tenant's tasks work alone" in spawn.content
    assert spawn.policy is not None and spawn.policy["decision"] == "deny"
    assert spawn.policy["rule"] == "tenant/no-spawns"

    # The same task in a tenant without the rule does spawn: the setup above would create children.
    other = store.tasks.create(scripted(SPAWN_TURNS, tools=[SPAWN_TOOL]), tenant="beta")
    assert _engine(store, registry, fanout).run(other.task_id).status is TaskStatus.WAITING
    assert len(fanout.started) == 1 and len(_every_task(store, "beta")) == 3


RULES = """
    @id("no-secret-lookups") @message("secret lookups are off")
    forbid(principal, action == Action::"tool", resource == Tool::"lookup")
    when { context.args has query && context.args.query == "secret" };
    @id("shadow-deny-public") @mode("log_only") @message("would deny public lookups")
    forbid(principal, action == Action::"tool", resource == Tool::"lookup")
    when { context.args has query && context.args.query == "public" };
    @id("shadow-ask-public") @mode("log_only") @effect("ask") @message("would ask about public lookups")
    forbid(principal, action == Action::"tool", resource == Tool::"lookup")
    when { context.args has query && context.args.query == "public" };"""


def test_each_decision_a_rule_took_part_in_is_an_event_naming_the_rule_and_a_metric_by_decision(
    store: Storage,
    registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTQ_EMF", "1")  # the long-running worker's switch
    put_policy(store, "acme", "tenant", RULES)
    turns = [
        {"text": "looking", "tool_calls": [call("lookup", query="secret"), call("lookup", query="public"),
                                           call("lookup", query="plain")]},
        {"text": "done"},
    ]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="acme")
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="agentq.events"):
        result = _engine(store, registry).run(task.task_id)
    docs = emf_documents(capsys.readouterr().out)

    assert result.status is TaskStatus.SUCCEEDED
    secret, public, plain = _results(store, task.task_id)
    assert secret.is_error and "secret lookups are off" in secret.content and not public.is_error
    assert plain.policy is None and not plain.is_error
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "agentq.events"]
    decisions = [e for e in events if e["event"] == "PolicyDecision"]
    assert len(decisions) == 2, decisions  # the plain lookup no rule matched is not an event
    denied, shadowed = decisions
    assert denied["decision"] == "deny" and denied["rule"] == "tenant/no-secret-lookups" and denied["version"] == 1
    assert denied["message"] == "secret lookups are off" and "log_only" not in denied
    assert shadowed["decision"] == "allow" and "rule" not in shadowed
    assert sorted((h["rule"], h["effect"]) for h in shadowed["log_only"]) == [
        ("tenant/shadow-ask-public", "ask"), ("tenant/shadow-deny-public", "deny")
    ]  # fmt: skip
    for event in decisions:
        assert event["tenant"] == "acme" and event["task_id"] == task.task_id and event["step"] == 2
        assert event["kind"] == "tool" and event["tool"] == "lookup"

    def counted(decision: str) -> float:
        return metric_total(docs, names.POLICY_DECISIONS, service=names.EXECUTOR, decision=decision)

    assert (counted("deny"), counted("allow"), counted("would_deny"), counted("would_ask")) == (1, 1, 1, 1)
    assert counted("ask") == 0
