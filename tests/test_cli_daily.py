"""The CLI for what people do every day (issue 39 item 11): `agentq chat` starts a conversation
and shows what was said before, and refuses a task that takes no message before you type;
`submit` flags for fallbacks, memory, concurrency keys and double texting, checked as the API
checks them; the settings a 422 or a help text points at say where they belong. Against the
local stack's API (its workers run the scripted tasks); chat as a person types, through stdin."""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest

import agentq
from agentq.api.client import Client
from agentq.cli.main import build_parser
from agentq.core.models import TaskStatus

from tests import test_cli
from tests.api_support import ROOT, ApiStack
from tests.test_cli import Ran

cli = test_cli.cli  # the fixture: `agentq ...` in this process, against the local API
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request would exit 1 "cannot reach", not 2
TWO_TURNS = '{"turns": [{"text": "first answer"}, {"text": "second answer"}]}'


@pytest.fixture
def client(api_stack: ApiStack) -> Client:
    return agentq.Client(api_stack.url, api_stack.key)


def chat(api_stack: ApiStack, *args: str, typed: str) -> subprocess.CompletedProcess[str]:
    env = {**api_stack.cli_env(), "AGENTQ_POLL_SECONDS": "0.05"}
    return subprocess.run(
        [sys.executable, "-m", "agentq", "chat", *args],
        input=typed, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False,
    )  # fmt: skip


def test_chat_without_a_task_starts_a_conversation_whose_first_line_is_the_goal(
    api_stack: ApiStack, client: Client
) -> None:
    goal = f"plan my week {uuid.uuid4().hex[:6]}"
    ran = chat(api_stack, "--script", TWO_TURNS, typed=f"{goal}\nand then?\n")
    assert ran.returncode == 0, ran.stderr
    assert "agent> first answer" in ran.stdout and "agent> second answer" in ran.stdout
    (task,) = [t for t in client.list_tasks(limit=50).tasks if t.goal == goal]
    assert [m.text for m in client.messages(task.task_id)] == ["and then?"]


def test_chat_shows_what_was_said_before_then_goes_on(api_stack: ApiStack, client: Client) -> None:
    body = {"goal": "greet me", "provider": "scripted",
            "script": {"turns": [{"text": "hello"}, {"text": "again"}, {"text": "third"}]}}  # fmt: skip
    task_id = client.submit(body).task_id
    client.wait(task_id, timeout=60, poll=0.05)
    client.send(task_id, "once more")
    client.wait(task_id, timeout=60, poll=0.05)
    ran = chat(api_stack, task_id, typed="and finally?\n")
    assert ran.returncode == 0, ran.stderr
    lines = [line for line in ran.stdout.splitlines() if line.startswith(("you> ", "agent> "))]
    assert lines[:4] == ["you> greet me", "agent> hello", "you> once more", "agent> again"]  # the history, in order
    assert "agent> third" in ran.stdout


@pytest.mark.parametrize("ending", ["cancelled", "cost_exceeded"])
def test_chat_on_a_task_that_takes_no_message_says_so_before_reading_any(
    api_stack: ApiStack, client: Client, ending: str
) -> None:
    if ending == "cancelled":
        slow = {"goal": "slow", "provider": "scripted", "script": {"turns": [{"text": "x", "latency_seconds": 30}]}}
        task_id = client.submit(slow).task_id
        client.cancel(task_id)
    else:
        turns = [{"text": "n" * 800, "tool_calls": [{"name": "lookup", "input": {"query": "q"}}]}] * 5
        task_id = client.submit({"goal": "spend", "provider": "scripted", "script": {"turns": turns},
                                 "constraints": {"tools": ["lookup"], "max_tokens": 2_600,
                                                 "max_output_tokens": 1_000}}).task_id  # fmt: skip
    assert client.wait(task_id, timeout=60, poll=0.05).status is TaskStatus(ending)
    ran = chat(api_stack, task_id, typed="hello?\n")
    assert ran.returncode == 1
    assert ending.replace("cost_exceeded", "ran out of budget") in ran.stderr
    assert "you> hello?" not in ran.stdout and not ran.stdout.rstrip().endswith("you>")  # never asked for a line
    assert client.messages(task_id) == []


def test_submit_flags_for_fallbacks_memory_concurrency_and_double_texting_reach_the_task(
    api_stack: ApiStack, client: Client, cli: Callable[..., Ran]
) -> None:
    store = f"notes-{uuid.uuid4().hex[:6]}"
    client.memory.create_store(store)
    ran = cli("submit", "g", "--provider", "anthropic", "--model", "claude-sonnet-4-6",
              "--fallback", "openai/gpt-4.1-mini", "--fallback", "bedrock-converse/us.amazon.nova-pro-v1:0",
              "--memory", f"{store}:read_only", "--concurrency-key", "customer-42", "--concurrency-limit", "2",
              "--on-conflict", "skip", "--double-texting", "reject")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    sub = api_stack.stack.store().tasks.get(ran.stdout.strip()).submission
    assert [(c.provider, c.model) for c in sub.fallbacks] == [
        ("openai", "gpt-4.1-mini"), ("bedrock-converse", "us.amazon.nova-pro-v1:0"),
    ]  # fmt: skip
    assert [(m.store, m.access) for m in sub.memory] == [(store, "read_only")]
    assert sub.concurrency is not None and sub.concurrency.model_dump() == {
        "key": "customer-42", "limit": 2, "on_conflict": "skip",
    }  # fmt: skip
    assert sub.double_texting == "reject"  # (no key in the workers: the task then fails missing_api_key)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--fallback", "gpt-4.1"], "argument --fallback: takes PROVIDER/MODEL, not 'gpt-4.1'"),
        (["--fallback", "acme/m"], "argument --fallback: provider: Input should be 'anthropic', 'bedrock'"),
        (["--fallback", "openai/"], "argument --fallback: model: String should have at least 1 character"),
        (["--memory", "Bad Store"], "argument --memory: store: String should match pattern"),
        (["--memory", "notes:write"], "argument --memory: access: Input should be 'read_write' or 'read_only'"),
        (["--concurrency-limit", "2"], "--concurrency-limit and --on-conflict need --concurrency-key"),
        (["--concurrency-key", "k", "--concurrency-limit", "0"], "concurrency.limit: Input should be greater than"),
        (["--concurrency-key", "k" * 129], "concurrency.key: String should have at most 128 characters"),
        (["--on-conflict", "wait"], "argument --on-conflict: invalid choice: 'wait'"),
        (["--double-texting", "shout"], "argument --double-texting: invalid choice: 'shout'"),
    ],
)
def test_a_bad_daily_flag_names_itself_exits_2_and_sends_nothing(
    cli: Callable[..., Ran], flags: list[str], message: str
) -> None:
    ran = cli("submit", "x", "--script", "research", "--url", NOWHERE, *flags)
    assert ran.returncode == 2, ran.stderr
    assert message in ran.stderr and "cannot reach" not in ran.stderr


def test_a_file_is_overridden_by_the_flags_and_its_other_memory_attachments_kept(tmp_path: object) -> None:
    from pathlib import Path

    from agentq.cli.submit import build_submission

    base = Path(str(tmp_path)) / "task.json"
    base.write_text('{"goal": "g", "memory": [{"store": "a"}, {"store": "b", "access": "read_only"}], '
                    '"concurrency": {"key": "k", "limit": 3}}')  # fmt: skip
    args = build_parser().parse_args(["submit", "--file", str(base), "--memory", "b", "--on-conflict", "skip"])
    body = build_submission(args)
    assert body["memory"] == [{"store": "a"}, {"store": "b", "access": "read_write"}]
    assert body["concurrency"] == {"key": "k", "limit": 3, "on_conflict": "skip"}


def test_an_unpriced_model_says_where_agentq_prices_belongs(cli: Callable[..., Ran]) -> None:
    ran = cli("submit", "x", "--provider", "openai", "--model", f"my-local-model-{uuid.uuid4().hex[:4]}")
    assert ran.returncode == 2
    assert "AGENTQ_PRICES in the environment of the API and the workers" in ran.stderr
    assert "not of the shell that submits" in ran.stderr


def test_the_tenant_limit_help_says_a_limit_at_the_fleets_capacity_keeps_freed_slots_for_that_tenant() -> None:
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    tenants = subcommands.choices["tenants"]
    (actions,) = [a for a in tenants._actions if isinstance(a, argparse._SubParsersAction)]
    text = " ".join(actions.choices["limit"].format_help().split())
    assert "equal to the fleet's capacity" in text and "goes to its own waiting tasks" in text
