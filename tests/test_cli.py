"""The `agentq` command driven as a person drives it: a subprocess in a shell whose env holds
the URL and key `agentq dev` printed, against the local stack; `watch` under a pseudo-terminal.
Exit codes: 0 success, 1 the task or operation did not succeed, 2 bad usage or input."""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentq.cli.main import build_parser, main

from tests.api_support import ROOT, SCRIPTED, ApiStack
from tests.helpers import agentq_process, call, run_agentq

RESEARCH_TOOLS = "python_exec,note_write,note_read,send_report"


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`agentq ...` in this process (same parser, same main(), same exit codes): for the many
    error paths, where a subprocess per case would only add interpreter start-up time."""

    def run(*args: str, env: dict[str, str] | None = None) -> Ran:
        for key in ("AGENTQ_URL", "AGENTQ_API_KEY", "AGENTQ_PROFILE", "AGENTQ_PROFILES", "XDG_CONFIG_HOME"):
            monkeypatch.delenv(key, raising=False)
        for key, value in (env if env is not None else api_stack.cli_env()).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def agentq(
    api: ApiStack, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_agentq(list(args), env=env if env is not None else api.cli_env(), timeout=timeout, cwd=ROOT)


def test_submit_wait_then_status_result_trace_and_list(api_stack: ApiStack) -> None:
    run = f"cli-{time.time_ns()}"
    done = agentq(api_stack, "submit", "Analyse our signups", "--script", "research", "--tools", RESEARCH_TOOLS,
                  "--max-tokens", "60000", "--priority", "high", "--metadata", "team=growth", "--metadata", f"run={run}",
                  "--wait")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Signups grew 2.5x")  # the result on stdout
    task_id = re.search(r"submitted ([0-9a-f]{32})", done.stderr).group(1)  # type: ignore[union-attr]
    assert re.search(r"running\s+step \d+", done.stderr) and re.search(
        r"succeeded\s+step 15", done.stderr
    )  # progress on stderr

    status = agentq(api_stack, "status", task_id)
    assert status.returncode == 0
    lines = dict(line.split(None, 1) for line in status.stdout.splitlines() if line.strip())
    assert lines["status"] == "succeeded" and lines["steps"].startswith("15 (8 LLM turns of at most 50)")
    assert re.match(r"[\d,]+ in, [\d,]+ out; budget [\d,]+ / 60,000 tokens", lines["tokens"])
    assert lines["latency"].startswith("pickup ") and lines["cost"].startswith("$")

    trace = agentq(api_stack, "trace", task_id)
    assert trace.returncode == 0
    assert f"task {task_id} succeeded" in trace.stdout and "claimed by" in trace.stdout
    assert re.search(r"step 1 LLM \S+ · [\d,]+ in / [\d,]+ out tokens · [\d,]+ ms", trace.stdout)
    assert re.search(r"tool python_exec · [\d,]+ ms · ok", trace.stdout) and "side effect" in trace.stdout
    assert len(re.findall(r"s tool \w+ ·", trace.stdout)) == 8 and "finished: succeeded" in trace.stdout

    as_json = json.loads(agentq(api_stack, "trace", task_id, "--json").stdout)
    kinds = [e["type"] for e in as_json["events"]]
    assert (
        kinds.count("llm_call") == 8 and kinds.count("tool_call") == 8 and as_json["events"][-1]["event"] == "finished"
    )

    listed = agentq(api_stack, "list", "--status", "succeeded", "--limit", "100", "--json")
    assert task_id in [t["task_id"] for t in json.loads(listed.stdout)["tasks"]]
    table = agentq(api_stack, "list", "--limit", "3")
    assert (
        table.returncode == 0 and re.search(rf"{task_id}\s+succeeded\s+15", table.stdout)
    ) or "more: agentq list --cursor" in table.stderr
    found = agentq(api_stack, "list", "--metadata", f"run={run}", "--metadata", "team=growth", "--all", "--json")
    assert [t["task_id"] for t in json.loads(found.stdout)["tasks"]] == [task_id]
    none = agentq(api_stack, "list", "--metadata", f"run={run}", "--metadata", "team=other", "--all", "--json")
    assert json.loads(none.stdout)["tasks"] == []
    bad = agentq(api_stack, "list", "--metadata", "run")
    assert bad.returncode == 2 and "--metadata takes KEY=VALUE" in bad.stderr


def test_approve_reject_budget_fork_cancel_and_their_exit_codes(
    api_stack: ApiStack, cli: Callable[..., Ran], tmp_path: Path
) -> None:
    turns = [{"text": "", "tool_calls": [call("request_approval", question="ship it?")]}, {"text": "shipped"}]
    task_id = api_stack.submit({**SCRIPTED, "script": {"turns": turns}, "constraints": {"tools": ["request_approval"]}})
    api_stack.until(task_id, lambda v: v["status"] == "paused")

    wrong = cli("reject", "no-such-task")
    assert wrong.returncode == 1 and "no task 'no-such-task' (task_id)" in wrong.stderr
    early = cli("result", task_id)
    assert early.returncode == 1 and "is paused; its result is ready when it ends" in early.stderr
    done = agentq(api_stack, "approve", task_id, "--note", "lgtm")  # as a person would
    assert done.returncode == 0 and f"approved {task_id}" in done.stdout, done.stderr
    result = agentq(api_stack, "result", task_id, "--wait")
    assert result.returncode == 0 and result.stdout.strip() == "shipped"
    again = cli("approve", task_id)
    assert again.returncode == 1 and "not waiting for approval" in again.stderr
    other = api_stack.submit({**SCRIPTED, "script": {"turns": turns}, "constraints": {"tools": ["request_approval"]}})
    api_stack.until(other, lambda v: v["status"] == "paused")
    refused = cli("reject", other, "--note", "not today")
    # the decision re-enqueues the task, so a worker may already hold it when the answer is printed
    assert refused.returncode == 0 and re.match(
        rf"rejected {other}; it is (queued|running|succeeded)", refused.stdout
    ), refused.stdout
    bad = cli("budget", task_id, "--add-tokens", "-5")
    assert bad.returncode == 2 and "(add_tokens)" in bad.stderr

    asking = cli("fork", task_id, "--at-step", "1")  # the turn that asked for the approval: made again, in a fork
    assert asking.returncode == 2 and "fork at step 2 to keep their results, or at step 0" in asking.stderr
    assert "(at_step)" in asking.stderr, asking.stderr

    script = tmp_path / "ending.json"
    script.write_text(json.dumps({"turns": [{"text": "forked ending"}]}))
    fork = cli("fork", task_id, "--at-step", "0", "--script", str(script), "--model", "claude-haiku-4-5")
    assert fork.returncode == 0, fork.stderr
    view = api_stack.until(fork.stdout.strip(), lambda v: v["status"] == "succeeded")
    assert view["result"] == "forked ending" and view["model"] == "claude-haiku-4-5"

    slow = api_stack.submit({**SCRIPTED, "script": {"turns": [{"text": f"t{i}", "latency_seconds": 0.5, "tool_calls": [call("lookup", query="q")]} for i in range(40)]},
                             "constraints": {"tools": ["lookup"]}})  # fmt: skip
    cancelled = agentq(api_stack, "cancel", slow)
    assert cancelled.returncode == 0 and f"cancelled 1 task(s): {slow}" in cancelled.stdout
    partial = cli("result", slow, "--json")
    assert partial.returncode == 1 and json.loads(partial.stdout)["status"] == "cancelled"
    assert cli("cancel", slow).returncode == 1


def test_a_task_that_does_not_succeed_exits_1(api_stack: ApiStack, cli: Callable[..., Ran]) -> None:
    turns = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=1500)]} for i in range(6)] + [
        {"text": "end"}
    ]
    run = cli("submit", "too costly", "--script", json.dumps({"turns": turns}), "--tools", "lookup", "--max-tokens", "3000",
              "--max-output-tokens", "200", "--wait", "--json")  # fmt: skip
    assert run.returncode == 1
    assert json.loads(run.stdout)["status"] == "cost_exceeded"


def test_bad_usage_and_configuration_exit_2_with_a_precise_message(
    api_stack: ApiStack, cli: Callable[..., Ran], tmp_path: Path
) -> None:
    bare = {k: v for k, v in api_stack.cli_env().items() if k not in ("AGENTQ_URL", "AGENTQ_API_KEY")}
    bare["XDG_CONFIG_HOME"] = str(tmp_path)
    nothing = agentq(api_stack, "status", "abc", env=bare)  # what a person sees first
    assert nothing.returncode == 2
    assert "no API to talk to" in nothing.stderr and "agentq dev" in nothing.stderr and "AGENTQ_URL" in nothing.stderr

    profiles = tmp_path / "agentq" / "profiles.toml"
    profiles.parent.mkdir()
    profiles.write_text(
        f'[default]\nurl = "{api_stack.url}"\napi_key = "{api_stack.key}"\n\n[b]\nurl = "{api_stack.url}"\napi_key = "{api_stack.other_key}"\n'
    )
    task_id = api_stack.submit()
    assert cli("status", task_id, "--json", env=bare).returncode == 0  # the [default] profile
    assert cli("status", task_id, "--profile", "b", env=bare).returncode == 1  # tenant b: not found
    assert cli("status", task_id, env={**bare, "AGENTQ_PROFILE": "b"}).returncode == 1
    unknown = cli("list", "--profile", "nope", env=bare)
    assert (
        unknown.returncode == 2 and "no profile 'nope'" in unknown.stderr and "profiles: b, default" in unknown.stderr
    )

    down = cli("status", task_id, "--url", "http://127.0.0.1:9")
    assert down.returncode == 1 and "cannot reach http://127.0.0.1:9" in down.stderr
    usage = cli("submit", "--max-tokens", "many")
    assert usage.returncode == 2 and "invalid int value" in usage.stderr
    no_goal = cli("submit")
    assert no_goal.returncode == 2 and "(goal)" in no_goal.stderr
    invalid = cli("submit", "x", "--script", "research", "--max-tokens", "0")
    assert invalid.returncode == 2 and "constraints.max_tokens" in invalid.stderr
    metadata = cli("submit", "x", "--script", "research", "--metadata", "novalue")
    assert metadata.returncode == 2 and "KEY=VALUE" in metadata.stderr


def test_schedules_list_with_none_says_so_on_stderr_as_the_other_lists_do(
    api_stack: ApiStack, cli: Callable[..., Ran], tmp_path: Path
) -> None:
    env = api_stack.cli_env(AGENTQ_API_KEY=api_stack.stack.create_api_key(f"sched-{time.time_ns()}"))
    empty = cli("schedules", "list", env=env)
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no schedules (create one: agentq schedules create -f schedule.yaml)" in empty.stderr
    assert json.loads(cli("schedules", "list", "--json", env=env).stdout) == []
    spec = tmp_path / "schedule.yaml"
    spec.write_text(json.dumps({"name": "nightly", "expression": "rate(1 day)", "submission": SCRIPTED}))
    assert cli("schedules", "create", "-f", str(spec), env=env).returncode == 0
    listed = cli("schedules", "list", env=env)
    assert listed.stdout.startswith("nightly ") and "no schedules" not in listed.stderr


def test_every_command_has_help_text() -> None:
    parser = build_parser()
    assert "exit codes: 0 success; 1" in parser.format_help()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = subcommands.choices
    expected = {"submit", "status", "watch", "events", "result", "trace", "list", "cancel", "approve", "reject", "budget", "fork",
                "keys", "dlq", "dev", "demo", "run", "worker", "run-task"}  # fmt: skip
    assert expected <= set(commands)
    for name, sub in commands.items():
        assert sub.format_help().startswith(f"usage: agentq {name}")
        assert sub.description and len(sub.description) > 15, name
        for action in sub._actions:
            if action.option_strings and action.dest not in ("help",):
                assert action.help, f"{name} {action.option_strings} has no help"


def _run_in_pty(
    argv: list[str], env: dict[str, str], timeout: float, on_output: Callable[[str], None] | None = None
) -> tuple[int, str]:
    """Run ``argv`` in a terminal of its own until it exits; ``on_output`` sees the screen so far
    after each read."""
    master, slave = os.openpty()
    os.set_blocking(master, False)
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, close_fds=True, start_new_session=True
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
                if on_output is not None:
                    on_output(out.decode(errors="replace"))
            elif proc.poll() is not None:
                break
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10), out.decode(errors="replace")
    finally:
        os.close(master)


def test_watch_draws_a_live_view_in_a_terminal_until_the_task_ends(api_stack: ApiStack) -> None:
    turns = [
        {"text": f"thinking {i}", "latency_seconds": 0.25, "tool_calls": [call("lookup", query=f"q{i}")]}
        for i in range(6)
    ]
    ask = {"text": "", "tool_calls": [call("request_approval", question="Watch me?")]}
    task_id = api_stack.submit({**SCRIPTED, "script": {"turns": [ask, *turns, {"text": "watched to the end"}]},
                                "constraints": {"tools": ["lookup", "request_approval"], "max_steps": 20,
                                                "max_tokens": 50_000}})  # fmt: skip
    approved: list[int] = []

    def approve_once_watched(screen: str) -> None:
        # The task waits for approval until watch has drawn it waiting, so watch sees it run
        # however slowly watch starts.
        if not approved and "waiting for approval: Watch me?" in screen:
            approved.append(api_stack.http("POST", f"/tasks/{task_id}/approve", {})[0])

    env = api_stack.cli_env(TERM="xterm-256color", COLUMNS="110", LINES="40")
    argv = [sys.executable, "-m", "agentq", "watch", task_id, "--interval", "0.2"]
    code, screen = _run_in_pty(argv, env, timeout=90, on_output=approve_once_watched)
    assert approved == [200] and code == 0, screen[-2000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "\x1b[2K" in screen and "\x1b[1A" in screen  # redrawn in place, not scrolled
    assert "\x1b[" in screen and "━" in plain  # colours and the bars
    assert f"agentq watch {task_id}" in plain
    assert re.search(r"\d+ / 20 LLM turns", plain) and re.search(r"[\d,]+ / 50,000 tokens \(\d+\.\d%\)", plain)
    assert re.search(r"now\s+(running tools: lookup|waiting for the model)", plain)  # a frame while it ran
    assert "finished succeeded" in plain and "8 / 20 LLM turns" in plain
    assert re.search(r"tool lookup · [\d,]+ ms · ok", plain)  # recent trace events
    assert "answer (succeeded):" in plain and "watched to the end" in plain  # the answer, once it ended


def test_events_prints_each_committed_event_until_the_task_ends_and_resumes_after_one(
    api_stack: ApiStack, cli: Callable[..., Ran]
) -> None:
    task_id = api_stack.submit({**SCRIPTED, "script": {"turns": [{"text": "one", "tool_calls": [call("lookup", query="q")]},
                                                                 {"text": "two"}]}, "constraints": {"tools": ["lookup"]}})  # fmt: skip
    run = cli("events", task_id, "--json")
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert [e["type"] for e in events] == ["task.created", "task.status", "agent.message", "agent.tool_results",
                                           "agent.message", "task.status"]  # fmt: skip
    assert events[-1]["data"]["status"] == "succeeded"
    rest = cli("events", task_id, "--json", "--after", events[2]["id"])
    assert [json.loads(line)["id"] for line in rest.stdout.splitlines()] == [e["id"] for e in events[3:]]
    text = cli("events", task_id)
    assert text.returncode == 0 and "finished succeeded" in text.stdout and "tool lookup" in text.stdout
    assert text.stdout.endswith("answer (succeeded):\ntwo\n")  # the answer closes the stream's lines
    assert "answer" not in "".join(json.loads(line)["type"] for line in run.stdout.splitlines())  # --json: events only
    bad = cli("events", task_id, "--after", "nonsense")
    assert bad.returncode == 2 and "after" in bad.stderr


def test_events_of_a_tree_name_each_task_by_its_place_and_resume_after_a_sub_agents_event(
    api_stack: ApiStack, cli: Callable[..., Ran]
) -> None:
    children = [{"goal": f"c{i}", "script": {"turns": [{"text": f"child {i}"}]}} for i in range(2)]
    task_id = api_stack.submit({"goal": "fan out", "provider": "scripted", "constraints": {"tools": ["spawn_subagents"]},
                                "script": {"turns": [{"text": "", "tool_calls": [call("spawn_subagents", subagents=children)]},
                                                     {"text": "summary"}]}})  # fmt: skip
    run = cli("events", task_id, "--tree", "--json")
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    first_child = next(i for i, e in enumerate(events) if e["tree_path"] == "1")
    rest = cli("events", task_id, "--tree", "--json", "--after", events[first_child]["id"])
    assert rest.returncode == 0, rest.stderr
    assert [json.loads(line)["id"] for line in rest.stdout.splitlines()] == [e["id"] for e in events[first_child + 1 :]]
    text = cli("events", task_id, "--tree")
    labels = [m[1] for m in re.finditer(r"^(\S+)\s+\+\s*\d", text.stdout, re.MULTILINE)]
    assert len(labels) == len(events) and set(labels) == {"root", "1", "2"}  # the ids share their first 12 characters
    assert [label for label, e in zip(labels, events, strict=True) if e["task_id"] == task_id] == ["root"] * sum(
        e["task_id"] == task_id for e in events
    )


def test_watch_of_an_unknown_task_exits_1_without_drawing(cli: Callable[..., Ran]) -> None:
    run = cli("watch", "no-such-task")
    assert run.returncode == 1 and "no task 'no-such-task'" in run.stderr and run.stdout == ""


def test_dev_prints_what_another_shell_needs_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    proc = agentq_process(["dev", "--workers", "0", "--auth"], dict(os.environ), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    exports: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip().startswith("export "):
                key, _, value = line.strip()[len("export ") :].partition("=")
                exports[key] = value
            if line.startswith("Ctrl-C stops everything"):
                break
        assert exports["AGENTQ_URL"].startswith("http://127.0.0.1:") and exports["AGENTQ_API_KEY"].startswith("aq_")
        assert {"AGENTQ_TABLE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"} <= set(exports)
        shell = {**os.environ, **exports, "XDG_CONFIG_HOME": str(tmp_path)}
        listed = run_agentq(["list", "--json"], shell, timeout=60)
        assert listed.returncode == 0 and json.loads(listed.stdout) == {"tasks": [], "next_cursor": None}
        refused = run_agentq(["list"], {**shell, "AGENTQ_API_KEY": ""}, timeout=60)
        assert refused.returncode == 2 and "unauthorized" not in refused.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0
