"""``AGENTQ_SANDBOX=off``: "code execution refused" (agentq.sandbox.config), "every call refused"
(docs/SANDBOX.md, for "deployments that do not offer code execution"). python_exec took its
sandbox from that setting only when the task had no workspace; in a workspace it ran the code in
the workspace's bubblewrap whatever the setting said, and ``shell`` never asked. Now both refuse
with the setting's reason (``core.tools.workspace.check_code_allowed``), and the file tools, which
run no model-written code, keep working."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentq.core.engine._workspace import TaskWorkspace
from agentq.core.tools import ToolContext, ToolExecution, default_registry, idempotency_key_for
from agentq.core.workspace import EMPTY, WORKSPACE_TOOLS
from agentq.sandbox.config import sandbox_from_env
from agentq.sandbox.workspace import WorkspaceSandbox

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
REFUSAL = "ToolError: SandboxUnavailable: code execution is turned off in this deployment"


def _run(tmp_path: Path, setting: str, name: str, raw: dict[str, object]) -> ToolExecution:
    registry = default_registry(sandbox=sandbox_from_env({"AGENTQ_SANDBOX": setting}))
    ws = TaskWorkspace("task-off", tmp_path, EMPTY, set(), WorkspaceSandbox())
    ctx = ToolContext("task-off", "toolu_1", idempotency_key_for("task-off", "toolu_1"), workspace=ws)
    return registry.execute(name, raw, ctx, [*WORKSPACE_TOOLS, "python_exec"])


def test_python_exec_runs_nothing_when_the_deployment_turned_code_execution_off(tmp_path: Path) -> None:
    out = _run(tmp_path, "off", "python_exec", {"code": "open('ran.txt', 'w').write('ran')"})
    assert out.is_error and out.content == REFUSAL, out.content
    assert not (tmp_path / "ran.txt").exists()


def test_shell_runs_nothing_when_the_deployment_turned_code_execution_off(tmp_path: Path) -> None:
    out = _run(tmp_path, "off", "shell", {"command": "echo ran > ran.txt"})
    assert out.is_error and out.content == REFUSAL, out.content
    assert not (tmp_path / "ran.txt").exists()


def test_a_sandbox_setting_the_worker_cannot_use_runs_no_shell_either(tmp_path: Path) -> None:
    """Fail closed: a setting that is no sandbox refuses in the workspace as it does outside."""
    out = _run(tmp_path, "bwarp", "shell", {"command": "echo ran > ran.txt"})
    assert out.is_error and "AGENTQ_SANDBOX='bwarp' is not a sandbox this worker knows" in out.content, out.content
    assert not (tmp_path / "ran.txt").exists()


def test_the_file_tools_run_no_model_code_and_keep_working_when_code_execution_is_off(tmp_path: Path) -> None:
    assert _run(tmp_path, "off", "write_file", {"path": "notes.txt", "content": "kept\n"}).status == "ok"
    read = _run(tmp_path, "off", "read_file", {"path": "notes.txt"})
    assert read.status == "ok" and "kept" in read.content, read.content


def test_with_the_default_setting_shell_and_python_exec_still_run_in_the_workspace(tmp_path: Path) -> None:
    assert _run(tmp_path, "bwrap", "shell", {"command": "echo a > a.txt"}).status == "ok"
    assert _run(tmp_path, "bwrap", "python_exec", {"code": "open('b.txt', 'w').write('b')"}).status == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
