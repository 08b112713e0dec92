"""What an instance of the EC2 workspace tier runs, as text: the systemd unit, its environment
file and the boot script that installs them (``infra/workspace_tier.py`` puts the script in the
launch template's user data).

Pure functions of plain values, no CDK: ``tests/test_workspace_tier_unit.py`` builds the same
unit with the local stack's values and runs its ``ExecStart`` (the interpreter and the install
directory swapped for this machine's) as a real process against moto, so the command line the
instances run is the one the test proved claims from the workspace pool's queues.

The worker is the same ``agentq worker`` the Fargate tier runs, reading the workspace pool
(``AGENTQ_QUEUE_POOL``) with bubblewrap from the distribution (``AGENTQ_SANDBOX=bwrap``), as
an unprivileged system user, so bwrap builds its sandboxes in user namespaces (Amazon Linux
2023 allows them). Before it claims anything it runs a sandbox (``agentq.worker``); when it
cannot, it exits ``SANDBOX_EXIT`` with a ``sandbox_unavailable`` line, which the tier's log
metric filter turns into an alarm, and systemd tries again after ``RESTART_SECONDS``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from agentq.scale_in import GROUP_VARIABLE, HOOK_VARIABLE, TERMINATING_EXIT

__all__ = ["GROUP_VARIABLE", "HOOK_VARIABLE", "TERMINATING_EXIT"]  # the tier's user data names them through this module

SERVICE = "agentq-worker"
PYTHON = "/usr/bin/python3.12"  # Amazon Linux 2023's python3.12 package: the layers' Python
INSTALL_DIR = "/opt/agentq"
# The stack's own artifacts, unpacked where the unit's PYTHONPATH finds them, first wins: your
# tools, the core library (the Lambda core layer's asset), its pinned dependencies (the
# dependencies layer's), and boto3 (pinned; Lambda's runtime brings its own, an instance does not).
ARTIFACTS = ("user", "core", "deps", "boto")
STATE_DIR = "/var/lib/agentq"  # the service user's home; workspaces live under it, on the root volume
WORKSPACE_ROOT = f"{STATE_DIR}/workspaces"
ENV_FILE = "/etc/agentq/worker.env"
LOG_DIR = "/var/log/agentq"
LOG_FILE = f"{LOG_DIR}/worker.log"
USER = "agentq"
RESTART_SECONDS = 30
STOP_TIMEOUT_SECONDS = 120  # the graceful drain: steps in flight commit, messages are handed back
# Scale-in (agentq.scale_in): the lifecycle hook's name and the group's reach the worker in these
# variables; it drains when IMDSv2 says the instance is being terminated, completes the hook's
# action, and exits TERMINATING_EXIT, which systemd does not restart (RestartPreventExitStatus).
DRAIN_SECONDS = STOP_TIMEOUT_SECONDS + 180  # the hook's heartbeat timeout: the drain, then terminate anyway
SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # the line a worker that cannot sandbox logs (agentq.cli.local)
DISTRO_PACKAGES = ("bubblewrap", "python3.12", "git", "unzip", "amazon-cloudwatch-agent")


def group_name(prefix: str) -> str:
    return f"{prefix}-workspace"


def lifecycle_hook_name(prefix: str) -> str:
    return f"{prefix}-workspace-drain"


def python_path(install_dir: str = INSTALL_DIR) -> str:
    return ":".join(f"{install_dir}/{name}/python" for name in ARTIFACTS)


def worker_args(
    *, concurrency: int, heartbeat: float, lease: float, visibility: int, max_receive_count: int
) -> list[str]:
    """``agentq worker``'s options, as the Fargate task definition passes them."""
    return [
        "-m", "agentq", "worker",
        "--concurrency", str(concurrency),
        "--heartbeat", str(heartbeat),
        "--lease", str(lease),
        "--visibility", str(visibility),
        "--max-receive-count", str(max_receive_count),
    ]  # fmt: skip


def unit(args: Sequence[str], *, python: str = PYTHON) -> str:
    """The systemd unit. No ``RestrictNamespaces``/``PrivateUsers``: bwrap needs user namespaces."""
    return "\n".join([
        "[Unit]",
        "Description=agentq worker (workspace pool: shell and file tools in bubblewrap)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        f"User={USER}",
        f"Group={USER}",
        f"EnvironmentFile={ENV_FILE}",
        f"ExecStart={shlex.join([python, *args])}",
        "Restart=always",
        f"RestartSec={RESTART_SECONDS}",
        f"RestartPreventExitStatus={TERMINATING_EXIT}",  # drained for scale-in: the instance is going
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={STOP_TIMEOUT_SECONDS}",
        f"StandardOutput=append:{LOG_FILE}",
        f"StandardError=append:{LOG_FILE}",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=full",
        "ProtectHome=yes",
        "LimitNOFILE=65536",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])  # fmt: skip


def environment(resources: Mapping[str, str], *, install_dir: str = INSTALL_DIR) -> dict[str, str]:
    """The unit's environment: the stack's resource names and a task runner's settings
    (``resources``), and what makes this worker the workspace pool's."""
    from agentq.queueing.queues import POOL_VARIABLE, WORKSPACE_POOL, WORKSPACE_POOL_VARIABLE
    from agentq.sandbox.config import SANDBOX_VARIABLE

    return {
        **resources,
        POOL_VARIABLE: WORKSPACE_POOL,  # read {prefix}-workspace-{tier}
        WORKSPACE_POOL_VARIABLE: WORKSPACE_POOL,  # ... and know it is that pool: check the sandbox first
        SANDBOX_VARIABLE: "bwrap",  # python_exec too runs on this host, in bubblewrap
        "AGENTQ_WORKSPACE_ROOT": WORKSPACE_ROOT,
        "PYTHONPATH": python_path(install_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HOME": STATE_DIR,
    }


def environment_file(env: Mapping[str, str]) -> str:
    """systemd's ``EnvironmentFile`` syntax: one ``KEY="value"`` a line, quotes and backslashes escaped."""
    lines = []
    for key, value in env.items():
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def parse_environment_file(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        env[key] = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return env


def exec_start(unit_text: str) -> list[str]:
    """The unit's ``ExecStart`` as argv."""
    (line,) = [ln for ln in unit_text.splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def boot_script(
    *, unit_text: str, env_text: str, downloads: Mapping[str, str], log_group: str, region: str
) -> list[str]:
    """The instance's first boot, as shell lines (user data): bubblewrap, Python and the
    CloudWatch agent from the distribution; the artifacts (``downloads``: name -> the zip the
    launch template's S3 download put there) unpacked read-only for root; the service user; the
    unit, its environment (0640, root:agentq) and the log shipping; then the service."""
    lines = [
        f"dnf install -y {' '.join(DISTRO_PACKAGES)}",
        f"useradd --system --home-dir {STATE_DIR} --shell /sbin/nologin {USER}",
        f"install -d -o {USER} -g {USER} -m 0700 {STATE_DIR} {WORKSPACE_ROOT}",
        f"install -d -o {USER} -g {USER} -m 0750 {LOG_DIR}",
        f"install -d -m 0755 {INSTALL_DIR} /etc/agentq",
    ]
    for name in ARTIFACTS:
        if name in downloads:
            lines.append(f"unzip -q -o {shlex.quote(downloads[name])} -d {INSTALL_DIR}/{name}")
        else:
            lines.append(f"install -d -m 0755 {INSTALL_DIR}/{name}/python")
    lines += [
        f"chmod -R go-w {INSTALL_DIR}",
        f"cat > {ENV_FILE} <<'AGENTQ_ENV'\n{env_text}AGENTQ_ENV",
        f"chown root:{USER} {ENV_FILE} && chmod 0640 {ENV_FILE}",
        f"cat > /etc/systemd/system/{SERVICE}.service <<'AGENTQ_UNIT'\n{unit_text}AGENTQ_UNIT",
        "cat > /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json <<'AGENTQ_LOGS'\n"
        + _log_agent_config(log_group, region)
        + "\nAGENTQ_LOGS",
        "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s "
        "-c file:/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json",
        "systemctl daemon-reload",
        f"systemctl enable --now {SERVICE}",
    ]
    return lines


def _log_agent_config(log_group: str, region: str) -> str:
    import json

    return json.dumps({
        "agent": {"region": region, "run_as_user": "root"},
        "logs": {"logs_collected": {"files": {"collect_list": [
            {"file_path": LOG_FILE, "log_group_name": log_group, "log_stream_name": "{instance_id}"},
        ]}}},
    })  # fmt: skip
