"""A new user's first task of their own, without an API key (docs/SCRIPTED_PROVIDER.md): the
example script submitted to a real `agentq dev` ends `succeeded` with its tools allowed and
run; `agentq run GOAL` without ANTHROPIC_API_KEY says it will play a script before it starts,
then runs that goal with it (not the canned research demo)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from agentq.control.defaults import fair_limit
from agentq.core.providers.scripted import load_script

from tests.api_support import ROOT
from tests.helpers import agentq_process, run_agentq

EXAMPLE = ROOT / "examples" / "scripts" / "first_task.yaml"
LAST_TURN = load_script(str(EXAMPLE)).turns[-1].text


def _keyless(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(("ANTHROPIC_", "AGENTQ_"))} | {"COLUMNS": "200"}


def test_the_example_script_parses_and_is_the_built_in_first_task() -> None:
    example = load_script(str(EXAMPLE))
    assert example == load_script("first_task")  # the copy to edit says what `agentq run` plays
    assert [c.name for turn in example.turns for c in turn.tool_calls] == ["note_write", "note_read"]
    assert not example.turns[-1].tool_calls and LAST_TURN


def test_the_example_script_runs_a_goal_of_your_own_to_succeeded_on_agentq_dev(tmp_path: Path) -> None:
    env = _keyless(dict(os.environ)) | {"XDG_CONFIG_HOME": str(tmp_path)}
    dev = agentq_process(
        ["dev", "--workers", "1"], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        exports: dict[str, str] = {}
        assert dev.stdout is not None
        for line in dev.stdout:  # the shell of a person who exported what `agentq dev` printed
            if line.strip().startswith("export "):
                key, _, value = line.strip()[len("export ") :].partition("=")
                exports[key] = value
            if line.startswith("Ctrl-C stops everything"):
                break
        shell = env | exports
        # Fair by default (issue 44): one worker of 256 is the fleet, and a tenant may take all but its reserve.
        assert exports["AGENTQ_FLEET_CAPACITY"] == "256"
        assert exports["AGENTQ_DEFAULT_TENANT_MAX_RUNNING"] == str(fair_limit(256)) == "243"

        def agentq(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
            return run_agentq(list(args), env=shell, timeout=120, cwd=cwd)

        done = agentq("submit", "plan my week", "--provider", "scripted", "--script", str(EXAMPLE.relative_to(ROOT)),
                      "--wait")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == LAST_TURN
        assert "no --tools: allowing the tools the script calls: note_write, note_read" in done.stderr
        task_id = re.search(r"submitted ([0-9a-f]{32})", done.stderr).group(1)  # type: ignore[union-attr]

        view = json.loads(agentq("status", task_id, "--json").stdout)
        assert view["status"] == "succeeded" and view["goal"] == "plan my week" and view["step"] == 5
        trace = agentq("trace", task_id)
        assert re.search(r"tool note_write · [\d,]+ ms · ok", trace.stdout), trace.stdout
        assert re.search(r"tool note_read · [\d,]+ ms · ok .*1\) write the plan down", trace.stdout), trace.stdout

        anywhere = agentq("submit", "my own goal", "--script", "first_task", "--wait", cwd=tmp_path)  # the built-in
        assert anywhere.returncode == 0 and anywhere.stdout.strip() == LAST_TURN, anywhere.stderr
        assert "allowing the tools the script calls: note_write, note_read" in anywhere.stderr
    finally:
        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0


def test_agentq_run_without_a_key_says_it_plays_a_script_first_then_runs_your_goal_with_it() -> None:
    ran = run_agentq(["run", "plan my week"], _keyless(dict(os.environ)), timeout=300, cwd=ROOT)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    first = ran.stdout.splitlines()[0]
    assert first.startswith("agentq run: no ANTHROPIC_API_KEY: running your goal with the scripted provider")
    assert "script: first_task" in first and "docs/SCRIPTED_PROVIDER.md" in first
    assert "set ANTHROPIC_API_KEY for a real model" in first
    assert "status: succeeded" in ran.stdout and LAST_TURN in ran.stdout
    assert "Signups" not in ran.stdout and "send_report" not in ran.stdout  # not the canned research demo
