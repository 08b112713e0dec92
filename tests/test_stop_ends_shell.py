"""A stop ends a workspace shell that was running when it came (ARCHITECTURE invariant 17): the
stop button must not leave a runaway agent acting, with the user's credentials, until its command
hits its own limit (``MAX_SHELL_SECONDS``, ten minutes).

A live stack with auth and one real worker process, a bubblewrap shell running a loop of ``curl``
against an echo server the task may reach, ``POST /stops`` once the loop is seen at work. Each
test waits on events, not on a fixed time: the loop's processes are found on this host (their
command line holds a tag of the test's own) before the stop, and then found gone; only once they
are gone can no request of theirs be on its way, and the requests the echo got are counted.

- With the user's credential bound to the host, the proxy reads the task's META with the
  credential (one BatchGetItem, ``storage.vault.Vault.get_running``): the first request after
  the stop is refused, no credential added, and the refusal tells the worker, which kills the
  shell (``core.engine._credentials``, ``sandbox.supervise``).
- Without one, nothing the proxy reads tells it: the heartbeat looks at the META of each task
  whose shell may reach the network every ``stop_look_seconds`` (``queueing.heartbeat``), finds
  the mark, and the worker kills the shell.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.queueing._tuning import WorkerConfig
from agentq_dev.stack import LocalStack

from tests.sandbox_support import processes_with
from tests.vault_support import EchoServer, echo_server

# A stop's mark is met by the shell's next credentialed request (every half second here), or by
# the heartbeat's look (every stop_look_seconds, on a round of heartbeat_seconds); the rest is a
# loaded CI host's slack.
GONE_WITHIN = 20.0


class Live:
    def __init__(self, stack: LocalStack, key: str, echo: EchoServer) -> None:
        self.stack, self.key, self.echo = stack, key, echo
        assert stack.api_server is not None
        self.url = stack.api_server.url

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode() if body is not None else None,
                                     method=method, headers={"Authorization": f"Bearer {self.key}",
                                                             "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with echo_server() as echo:
        stack = LocalStack(prefix=f"vstop{uuid.uuid4().hex[:8]}", workers=0, auth=True,
                           extra_env={"AGENTQ_HTTP_FETCH_ALLOW": echo.host}).start()  # fmt: skip
        worker = stack.worker_process(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield Live(stack, stack.create_api_key("acme", act_for_users=True), echo)
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=90)
            except subprocess.TimeoutExpired:  # its drain waits for a shell a stop did not end
                worker.kill()
                worker.wait(timeout=30)
            stack.stop()


def wait_for(done: Any, seconds: float) -> float | None:
    """Seconds until ``done()`` was true; None if it was not within ``seconds``."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start >= seconds:
            return None
        time.sleep(0.05)
    return time.monotonic() - start


def start_loop(live: Live, user: str, tag: str) -> str:
    """A task of ``user`` whose one shell call requests the echo every half second for ten
    minutes (its limit, MAX_SHELL_SECONDS), each request's path carrying ``tag``."""
    echo = live.echo
    loop = f"for i in $(seq 1 1200); do curl -s -o /dev/null '{echo.url('/headers')}?{tag}='$i; sleep 0.5; done"
    shell = {"name": "shell", "input": {"command": loop, "timeout_seconds": 600}}
    body = {"goal": "g", "user": user, "provider": "scripted",
            "constraints": {"tools": ["shell"], "timeout_seconds": 900},
            "script": {"turns": [{"text": "", "tool_calls": [shell]}, {"text": "ok"}]},
            "workspace": {"allow_hosts": [echo.host]}}  # fmt: skip
    status, made = live.http("POST", "/tasks", body)
    assert status == 202, made
    reached = wait_for(lambda: any(tag in r["path"] for r in echo.requests), 90)
    assert reached is not None, "the shell never reached the host"
    assert processes_with(tag), "the loop's processes are not found on this host: the test cannot see them end"
    return str(made["task_id"])


def stop(live: Live, user: str, task: str) -> None:
    status, stopped = live.http("POST", "/stops", {"user": user, "reason": "runaway agent"})
    assert status in (200, 201), stopped
    assert live.http("GET", f"/tasks/{task}")[1]["status"] == "cancelled"


def test_a_users_stop_kills_their_running_shell_and_no_request_after_it_carries_their_credential(
    live: Live,
) -> None:
    user, tag = f"ann-{uuid.uuid4().hex[:6]}", f"cred{uuid.uuid4().hex[:10]}"
    marker = "VAULTMARK" + uuid.uuid4().hex + "END"
    echo = live.echo
    assert (
        live.http("PUT", "/vault/credentials/github", {"user": user, "value": marker, "hosts": [echo.host]})[0] == 200
    )
    task = start_loop(live, user, tag)
    assert any(marker in r.get("authorization", "") for r in echo.requests if tag in r["path"])
    stop(live, user, task)
    returned, before = time.monotonic(), len(echo.requests)
    took = wait_for(lambda: not processes_with(tag), GONE_WITHIN)
    after = [r["path"] for r in echo.requests[before:] if marker in r.get("authorization", "")]
    assert not after, (f"{len(after)} requests carried {user}'s credential in the {time.monotonic() - returned:.1f} s "
                       f"after the stop returned (the task already 'cancelled'): {after[:3]} ...")  # fmt: skip
    assert took is not None, f"the shell still ran {GONE_WITHIN:.0f} s after the stop returned"
    print(f"\nshell gone {took:.2f} s after the stop returned; {len(echo.requests) - before} requests reached the host")


def test_a_stop_kills_a_running_shell_that_sends_no_credential_at_the_heartbeats_look(live: Live) -> None:
    """Nothing the proxy reads for this loop tells the worker of the stop: the heartbeat's look
    does, within ``stop_look_seconds`` and a round."""
    user, tag = f"bob-{uuid.uuid4().hex[:6]}", f"bare{uuid.uuid4().hex[:10]}"
    task = start_loop(live, user, tag)
    stop(live, user, task)
    took = wait_for(lambda: not processes_with(tag), GONE_WITHIN)
    assert took is not None, f"the shell still ran {GONE_WITHIN:.0f} s after the stop returned"
    config = WorkerConfig()
    print(
        f"\nshell gone {took:.2f} s after the stop returned (look every {config.stop_look_seconds} s, "
        f"rounds every {config.heartbeat_seconds} s)"
    )
    assert took <= config.stop_look_seconds + config.heartbeat_seconds + 5.0
