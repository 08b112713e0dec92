"""The EC2 workspace tier's worker, run as its systemd unit says (``infra/workspace_unit.py``, the
text the launch template's user data installs), as real processes against moto server.

- The unit's ``ExecStart`` with its environment file's variables (the interpreter, the install
  directory and the workspace root swapped for this machine's; the resource names the local
  stack's) starts a worker that claims a task with a workspace from ``{prefix}-workspace-{tier}``
  and runs its ``shell`` call in bubblewrap, and leaves a task without one on the default queues.
- The same command on a host without user namespaces (a user namespace whose
  ``max_user_namespaces`` is 0, as Lambda and Fargate forbid them) refuses to start: it exits
  ``SANDBOX_EXIT`` with a ``sandbox_unavailable`` line naming the reason, and claims nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.cli.local import SANDBOX_EXIT
from agentq.control.submit import submit
from agentq.core.models import TaskStatus, ToolsStep
from agentq.queueing.queues import WORKSPACE_POOL, TaskQueues
from agentq.resources import QueueSettings, provision_queues
from agentq.runtime import Settings, build_registry, build_store, client
from agentq_dev.moto_server import LOCAL_CREDENTIALS
from infra import workspace_unit as u

from tests.helpers import call, deployment, scripted, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def pooled(moto_server: Any) -> Settings:
    settings: Settings = deployment(moto_server)
    provision_queues(client(settings, "sqs"), settings.names, QueueSettings(), pool=WORKSPACE_POOL)
    return settings


def _unit_command(settings: Settings, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The unit's argv and environment, as systemd would give them, from the texts the stack installs."""
    install = tmp_path / "opt-agentq"
    for name in u.ARTIFACTS:
        (install / name).mkdir(parents=True)
    (install / "core" / "python").symlink_to(REPO / "layers" / "agentq" / "python")  # the core layer's asset
    (install / "user" / "python").symlink_to(REPO)  # "your tools": the tests' tool modules
    for name in ("deps", "boto"):
        (install / name / "python").mkdir()  # the venv's site-packages stand in for these two
    text = u.unit(u.worker_args(concurrency=8, heartbeat=1, lease=3, visibility=4, max_receive_count=5))
    argv = u.exec_start(text)
    assert argv[0] == u.PYTHON and argv[1:4] == ["-m", "agentq", "worker"]
    env = u.parse_environment_file(u.environment_file(u.environment(settings.env(), install_dir=str(install))))
    assert env["PYTHONPATH"].startswith(str(install)) and env["AGENTQ_QUEUE_POOL"] == WORKSPACE_POOL
    env["AGENTQ_WORKSPACE_ROOT"] = str(tmp_path / "workspaces")
    return [sys.executable, *argv[1:]], {**LOCAL_CREDENTIALS, **env, "PATH": os.environ["PATH"]}


def _shell_task() -> Any:
    return scripted(
        [{"text": "r", "tool_calls": [call("shell", command="echo built > out.txt && cat out.txt && id -u")]},
         {"text": "done"}], tools=["shell"],
    )  # fmt: skip


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_units_command_line_starts_a_worker_that_claims_and_runs_workspace_tasks_from_the_workspace_pool(
    pooled: Settings, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    argv, env = _unit_command(pooled, tmp_path)
    worker = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started.append(worker)
    store, registry = build_store(pooled), build_registry(pooled)
    api = TaskQueues(client(pooled, "sqs"), pooled.names, workspace_pool=WORKSPACE_POOL)
    plain = submit(store, registry, scripted([{"text": "done"}], tools=["lookup"]), tenant="t", queues=api)
    task = submit(store, registry, _shell_task(), tenant="t", queues=api)
    final = wait_for(lambda: (t := store.tasks.get(task.task_id)).status.terminal and t, 60, "the workspace task ends")
    assert final.status is TaskStatus.SUCCEEDED, final.error
    (claim,) = store.tasks.claims(task.task_id)
    assert claim.worker.endswith(f":{worker.pid}")  # the unit's process claimed it
    (tools,) = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)]
    assert tools.results[0].content.startswith("exit code 0\n--- stdout ---\nbuilt\n")  # its shell ran
    assert tools.workspace is not None  # and its file was checkpointed with the step
    assert store.tasks.get(plain.task_id).claim_count == 0  # the default pool's, left for the executor
    waiting = api.sqs.get_queue_attributes(QueueUrl=api.url("normal", None), AttributeNames=["All"])["Attributes"]
    assert int(waiting["ApproximateNumberOfMessages"]) + int(waiting["ApproximateNumberOfMessagesNotVisible"]) == 1
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


def _no_user_namespaces_available() -> bool:
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", "echo 0 > /proc/sys/user/max_user_namespaces"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _no_user_namespaces_available(), reason="needs unshare --user to model a host without them")
def test_a_workspace_pool_worker_on_a_host_without_user_namespaces_refuses_to_start_and_claims_nothing(
    pooled: Settings, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    argv, env = _unit_command(pooled, tmp_path)
    store, registry = build_store(pooled), build_registry(pooled)
    api = TaskQueues(client(pooled, "sqs"), pooled.names, workspace_pool=WORKSPACE_POOL)
    task = submit(store, registry, _shell_task(), tenant="t", queues=api)
    # A host whose kernel lets no process make a user namespace: the unit's command in a user
    # namespace whose max_user_namespaces is 0 (what bwrap needs and Lambda and Fargate refuse).
    no_userns = ["unshare", "--user", "--map-root-user", "sh", "-c",
                 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh", *argv]  # fmt: skip
    worker = subprocess.Popen(
        no_userns, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    started.append(worker)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == SANDBOX_EXIT, stderr
    assert u.SANDBOX_UNAVAILABLE in stderr and f"refusing to claim from queue pool {WORKSPACE_POOL!r}" in stderr
    assert "namespace" in stderr  # bwrap's own reason is in the line
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.QUEUED and meta.claim_count == 0
    attrs = api.sqs.get_queue_attributes(QueueUrl=api.url("normal", WORKSPACE_POOL), AttributeNames=["All"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"  # never received: still there for a host that can
