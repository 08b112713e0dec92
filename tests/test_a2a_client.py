"""agentq as an A2A client: an agent definition's remote A2A agents as tools whose calls send one
message and wait for the remote task without a worker (docs/PROTOCOLS.md). Real processes
throughout: worker processes of a local stack, a second agentq stack on loopback as one remote
(its A2A server, its own workers), and a minimal ``a2a-sdk`` server (tests/a2a_servers/desk.py)
as the other; the remote's received messages are counted where it received them."""

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
from agentq.queueing.sweeper import sweep
from agentq_dev.stack import LocalStack

from tests.helpers import agentq_process, call, queue_depth, run_agentq, wait_for

ROOT = Path(__file__).resolve().parent.parent
DESK_TOKEN = "desk-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@dataclass
class Site:
    """One local stack with its API, and a key of one tenant on it."""

    stack: LocalStack
    key: str

    @property
    def url(self) -> str:
        assert self.stack.api_server is not None
        return self.stack.api_server.url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return _http(self.url, self.key, method, path, body)

    def task(self, task_id: str) -> dict[str, Any]:
        status, view = self.http("GET", f"/tasks/{task_id}")
        assert status == 200, view
        return dict(view)

    def results(self, task_id: str) -> list[Any]:
        steps = self.stack.store().steps.load(task_id)
        return [r for s in steps if isinstance(s.body, ToolsStep) for r in s.body.results]


@dataclass
class Desk:
    """The a2a-sdk server: its port, its ledger of received messages."""

    port: int
    ledger: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, **extra: str) -> None:
        env = {**os.environ, "DESK_TOKEN": DESK_TOKEN, "DESK_LEDGER": str(self.ledger), "PYTHONPATH": str(ROOT),
               **extra}  # fmt: skip
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.a2a_servers.desk", "--port", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(up, timeout=30, what="the a2a-sdk desk server")

    def received(self, text: str | None = None) -> list[dict[str, Any]]:
        lines = self.ledger.read_text().splitlines() if self.ledger.exists() else []
        got = [json.loads(line) for line in lines]
        return [m for m in got if text is None or m["text"] == text]

    def release(self) -> None:
        self.ledger.with_name(self.ledger.name + ".release").touch()

    @property
    def card(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/agent-card.json"


@dataclass
class World:
    here: Site  # the delegating stack: workers started by each test
    remote: Site  # the second agentq stack: one worker of its own
    desk: Desk


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    desk = Desk(port=_free_port(), ledger=tmp_path_factory.mktemp("desk") / "received.jsonl")
    desk.start()
    remote_stack = LocalStack(prefix=f"a2r{uuid.uuid4().hex[:8]}", workers=1, auth=True).start()
    remote = Site(remote_stack, remote_stack.create_api_key("team-r"))
    allow = f"127.0.0.1:{desk.port},127.0.0.1:{remote.port}"
    before = os.environ.get("AGENTQ_A2A_ALLOW")
    os.environ["AGENTQ_A2A_ALLOW"] = allow  # the API of this process checks definitions with it
    here_stack = LocalStack(
        prefix=f"a2c{uuid.uuid4().hex[:8]}",
        workers=0,
        auth=True,
        extra_env={"AGENTQ_A2A_ALLOW": allow, "AGENTQ_A2A_POLL_SECONDS": "1", "PYTHONPATH": str(ROOT)},
    ).start()
    here = Site(here_stack, here_stack.create_api_key("team-h"))
    for name, value, port in (("desk-token", DESK_TOKEN, desk.port), ("remote-key", remote.key, remote.port)):
        status, body = here.http("PUT", f"/vault/credentials/{name}",
                                 {"kind": "bearer", "value": value, "hosts": [f"127.0.0.1:{port}"]})  # fmt: skip
        assert status in (200, 201), body
    try:
        yield World(here, remote, desk)
    finally:
        if desk.proc is not None:
            desk.proc.kill()
            desk.proc.wait()
        here_stack.stop()
        remote_stack.stop()
        if before is None:
            os.environ.pop("AGENTQ_A2A_ALLOW", None)
        else:
            os.environ["AGENTQ_A2A_ALLOW"] = before


def _delegator(world: World, turns: list[dict[str, Any]], remote_agents: list[dict[str, Any]]) -> str:
    name = f"boss-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": turns}, "remote_agents": remote_agents}
    status, created = world.here.http("POST", "/agents", body)
    assert status == 201, created
    return name


def _desk_ref(world: World) -> dict[str, Any]:
    return {"name": "desk", "card_url": world.desk.card, "host": f"127.0.0.1:{world.desk.port}",
            "credential": "desk-token"}  # fmt: skip


def _submit(site: Site, agent: str) -> str:
    status, accepted = site.http("POST", "/tasks", {"goal": "delegate it", "agent": agent})
    assert status == 202, accepted
    return str(accepted["task_id"])


def _parked_with_its_look_sent(site: Site, task_id: str) -> bool:
    """The task is ``waiting`` and the worker is done with it: its message deleted, the delayed
    look (``remote_poll``) in the queue."""
    if site.task(task_id)["status"] != "waiting":
        return False
    queues = site.stack.queues()
    attrs = queues.sqs.get_queue_attributes(QueueUrl=queues.url("normal"), AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"]) == 0 and queue_depth(queues, queues.url("normal")) >= 1


def _kill(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_delegated_call_waits_without_a_worker_and_a_sigkilled_worker_never_sends_twice(world: World) -> None:
    """The worker sends the message, records the remote task, parks the task in ``waiting`` and
    lets it go; SIGKILLed then, with the remote still working, no worker holds the task. Another
    worker, woken by the delayed look once the remote ended, re-attaches to the same remote task:
    the remote received exactly one message, and its answer is the tool's result."""
    text = f"file report {uuid.uuid4().hex[:6]}"
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [call("a2a__desk", message=text)]}, {"text": "done"}]
    task_id = _submit(world.here, _delegator(world, turns, [_desk_ref(world)]))
    first = world.here.stack.spawn_worker()
    try:
        wait_for(lambda: world.desk.received(text), timeout=60, what="the remote task to exist")
        wait_for(lambda: _parked_with_its_look_sent(world.here, task_id), timeout=60,
                 what="the task to park with its look queued")  # fmt: skip
    finally:
        _kill(first)
    effect = world.here.stack.store().effects.get(task_id, _tool_use_id(world.here, task_id))
    assert effect is not None and effect.state == "started" and effect.remote is not None
    assert effect.remote["task_id"] == world.desk.received(text)[0]["task_id"]
    world.desk.release()
    second = world.here.stack.spawn_worker()
    try:
        view = _ended(world.here, task_id, timeout=90)
    finally:
        _kill(second)
    assert view["status"] == "succeeded", view
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__desk"]
    assert result.content.endswith(f"echo: {text}") and not result.is_error
    assert "not instructions" in result.content  # marked as another agent's words
    assert len(world.desk.received(text)) == 1


def _ended(site: Site, task_id: str, *, timeout: float) -> dict[str, Any]:
    """The task's view once it has succeeded or failed."""
    ended: dict[str, Any] = wait_for(lambda: (v := site.task(task_id))["status"] in ("succeeded", "failed") and v,
                                     timeout=timeout, what="the task to end")  # fmt: skip
    return ended


def _tool_use_id(site: Site, task_id: str, tool: str = "a2a__desk") -> str:
    for step in site.stack.store().steps.load(task_id):
        for block in getattr(step.body, "content", []):
            if block.get("type") == "tool_use" and block["name"] == tool:
                return str(block["id"])
    raise AssertionError("no such call")


@pytest.mark.parametrize("point", ["after_remote_send", "after_remote_recorded"])
def test_a_worker_killed_between_the_send_and_the_park_sends_nothing_again(world: World, point: str) -> None:
    """Killed after the remote took the message but before its task's id was recorded, the call is
    ``unknown_outcome`` (never sent again); killed after the id was recorded, the resumed worker
    re-attaches to that task. Either way the remote received one message."""
    text = f"count me {uuid.uuid4().hex[:6]}"
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [call("a2a__desk", message=text)]}, {"text": "done"}]
    task_id = _submit(world.here, _delegator(world, turns, [_desk_ref(world)]))
    world.desk.release()  # the remote ends its tasks at once
    env = world.here.stack.env(AGENTQ_CRASH_AT=point)
    proc = agentq_process(["run-task", task_id, "--lease", "2"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert len(world.desk.received(text)) == 1
    done = run_agentq(["run-task", task_id, "--lease", "2", "--wait", "20"], env=world.here.stack.env(), timeout=120)
    report = json.loads(done.stdout.splitlines()[-1])
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__desk"]
    if point == "after_remote_send":
        assert report["status"] == "succeeded", done.stderr[-2000:]
        assert result.status == "unknown_outcome" and result.is_error
    else:
        if report["status"] == "waiting":  # looked before the remote ended: look again, as a poll would
            world.here.stack.store().tasks.transition(task_id, TaskStatus.QUEUED)
            done = run_agentq(["run-task", task_id, "--lease", "2"], env=world.here.stack.env(), timeout=120)
            report = json.loads(done.stdout.splitlines()[-1])
            (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__desk"]
        assert report["status"] == "succeeded", done.stderr[-2000:]
        assert result.content.endswith(f"echo: {text}")
    assert len(world.desk.received(text)) == 1


def test_the_remotes_question_is_this_tasks_approval_and_its_answer_goes_back_to_the_sdk_server(
    world: World,
) -> None:
    text = f"ask: which {uuid.uuid4().hex[:6]}"
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [call("a2a__desk", message=text)]}, {"text": "done"}]
    task_id = _submit(world.here, _delegator(world, turns, [_desk_ref(world)]))
    worker = world.here.stack.spawn_worker()
    try:
        paused = wait_for(lambda: (v := world.here.task(task_id))["status"] == "paused" and v, timeout=60,
                          what="the remote's question to pause the task")  # fmt: skip
        assert "Which color?" in json.dumps(paused)
        status, body = world.here.http("POST", f"/tasks/{task_id}/approve", {"note": "blue"})
        assert status == 200, body
        view = _ended(world.here, task_id, timeout=60)
    finally:
        _kill(worker)
    assert view["status"] == "succeeded", view
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__desk"]
    assert result.content.endswith("you chose blue")
    (sent,) = world.desk.received(text)
    assert [m["text"] for m in world.desk.received() if m["task_id"] == sent["task_id"]] == [text, "blue"]


def test_an_agentq_agent_on_a_second_stack_is_delegated_to_its_approval_answered_from_here(world: World) -> None:
    """The remote is another agentq stack's agent (its A2A server): its approval is
    ``input-required`` there, an approval of this task here; the note sent back approves it,
    and its answer is the result. The remote task received the message once, and the answer."""
    shipper = f"ship-{uuid.uuid4().hex[:6]}"
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call("request_approval", question="Ship it?")]},
        {"text": "shipped v2"},
    ]
    status, created = world.remote.http("POST", "/agents", {"name": shipper, "provider": "scripted",
                                                             "script": {"turns": turns}, "tools": ["request_approval"]})  # fmt: skip
    assert status == 201, created
    ref = {"name": "shipper", "host": f"127.0.0.1:{world.remote.port}", "credential": "remote-key",
           "card_url": f"{world.remote.url}/a2a/{shipper}/.well-known/agent-card.json"}  # fmt: skip
    mine: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call("a2a__shipper", message="ship the release")]},
        {"text": "done"},
    ]
    task_id = _submit(world.here, _delegator(world, mine, [ref]))
    worker = world.here.stack.spawn_worker()
    try:
        paused = wait_for(lambda: (v := world.here.task(task_id))["status"] == "paused" and v, timeout=90,
                          what="the remote's approval to pause this task")  # fmt: skip
        assert "Ship it?" in json.dumps(paused)
        status, body = world.here.http("POST", f"/tasks/{task_id}/approve", {"note": "approve go ahead"})
        assert status == 200, body
        view = _ended(world.here, task_id, timeout=90)
    finally:
        _kill(worker)
    assert view["status"] == "succeeded", view
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__shipper"]
    assert result.content.endswith("shipped v2"), result.content
    status, page = world.remote.http("GET", f"/tasks?agent={shipper}")
    assert status == 200, page
    (remote_task,) = page["tasks"]
    status, events = world.remote.http("GET", f"/tasks/{remote_task['task_id']}/events?limit=200")
    decided = [e for e in events["events"] if e["type"] == "approval.decided"]
    assert len(decided) == 1 and decided[0]["data"]["approved"], decided


@pytest.mark.parametrize(
    ("ref", "field", "says"),
    [
        ({"card_url": "https://a.example.com/card", "host": "b.example.com"}, "remote_agents[0].card_url",
         "not on the agent's host"),
        ({"card_url": "https://10.1.2.3/card", "host": "10.1.2.3"}, "remote_agents[0].card_url", "private address"),
        ({"card_url": "https://127.0.0.1:9/card", "host": "127.0.0.1:9"}, "remote_agents[0].card_url", "loopback"),
        ({"card_url": "http://example.com/card", "host": "example.com"}, "remote_agents[0].card_url", "https://"),
        ({"card_url": "ftp://example.com/card", "host": "example.com"}, "remote_agents[0].card_url", "pattern"),
        ({"card_url": "https://example.com/card", "host": "example.com", "credential": "Bad Name"},
         "remote_agents[0].credential", "vault credential name"),
        ({"card_url": "https://example.com/card", "host": "example.com", "name": "Not OK"}, "remote_agents[0].name",
         "pattern"),
    ],
)  # fmt: skip
def test_a_bad_remote_agent_is_refused_when_the_agent_is_defined_naming_the_field(
    world: World, ref: dict[str, Any], field: str, says: str
) -> None:
    body = {"name": f"bad-{uuid.uuid4().hex[:6]}", "provider": "scripted", "script": "research",
            "remote_agents": [{"name": "r", **ref}]}  # fmt: skip
    status, refused = world.here.http("POST", "/agents", body)
    assert status == 422 and refused["error"]["field"] == field, refused
    assert says in refused["error"]["message"], refused


def test_remote_agents_come_only_from_an_agent_and_a_name_twice_is_refused(world: World) -> None:
    ref = {"name": "r", "card_url": "https://example.com/card", "host": "example.com"}
    status, refused = world.here.http("POST", "/tasks", {"goal": "g", "provider": "scripted", "script": "research",
                                                          "remote_agents": [ref]})  # fmt: skip
    assert status == 422 and refused["error"]["field"] == "remote_agents", refused
    status, refused = world.here.http("POST", "/agents", {"name": f"dup-{uuid.uuid4().hex[:6]}", "provider": "scripted",
                                                           "script": "research", "remote_agents": [ref, ref]})  # fmt: skip
    assert status == 422 and refused["error"]["field"] == "remote_agents[1].name", refused


def test_an_unreachable_card_is_the_calls_tool_error_and_nothing_is_waited_for(world: World) -> None:
    port = _free_port()  # nothing listens there
    os.environ["AGENTQ_A2A_ALLOW"] += f",127.0.0.1:{port}"
    try:
        ref = {"name": "gone", "card_url": f"http://127.0.0.1:{port}/card", "host": f"127.0.0.1:{port}"}
        turns: list[dict[str, Any]] = [
            {"text": "", "tool_calls": [call("a2a__gone", message="hello")]},
            {"text": "done"},
        ]
        task_id = _submit(world.here, _delegator(world, turns, [ref]))
    finally:
        os.environ["AGENTQ_A2A_ALLOW"] = os.environ["AGENTQ_A2A_ALLOW"].rsplit(",", 1)[0]
    env = world.here.stack.env(AGENTQ_A2A_ALLOW=world.here.stack.extra_env["AGENTQ_A2A_ALLOW"] + f",127.0.0.1:{port}")
    done = run_agentq(["run-task", task_id, "--lease", "2"], env=env, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "succeeded", done.stderr[-2000:]
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__gone"]
    assert result.is_error and "cannot read the Agent Card" in result.content and "nothing sent" in result.content


def test_a_card_that_names_an_endpoint_off_the_agents_host_is_refused_and_nothing_is_sent(
    world: World, tmp_path: Path
) -> None:
    """The card is the remote's word: an endpoint it names elsewhere (here the other agentq stack's
    API, a host the deployment allows) is refused before any message goes there."""
    liar = Desk(port=_free_port(), ledger=tmp_path / "liar.jsonl")
    os.environ["AGENTQ_A2A_ALLOW"] += f",127.0.0.1:{liar.port}"
    liar.start(DESK_ENDPOINT=f"{world.remote.url}/a2a/anything", DESK_TOKEN="")  # its card needs no key
    try:
        ref = {"name": "liar", "card_url": liar.card, "host": f"127.0.0.1:{liar.port}"}
        turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [call("a2a__liar", message="hi")]}, {"text": "ok"}]
        task_id = _submit(world.here, _delegator(world, turns, [ref]))
        allow = world.here.stack.extra_env["AGENTQ_A2A_ALLOW"] + f",127.0.0.1:{liar.port}"
        done = run_agentq(["run-task", task_id, "--lease", "2"], env=world.here.stack.env(AGENTQ_A2A_ALLOW=allow),
                          timeout=120)  # fmt: skip
    finally:
        os.environ["AGENTQ_A2A_ALLOW"] = os.environ["AGENTQ_A2A_ALLOW"].rsplit(",", 1)[0]
        if liar.proc is not None:
            liar.proc.kill()
            liar.proc.wait()
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "succeeded", done.stderr[-2000:]
    (result,) = [r for r in world.here.results(task_id) if r.name == "a2a__liar"]
    assert result.is_error and "the card's endpoint" in result.content and "not on the agent's host" in result.content
    assert liar.received() == []


def test_a_remote_wait_whose_look_was_lost_is_found_by_the_sweeper_and_finishes_with_one_message(world: World) -> None:
    """``agentq run-task`` parks the task as a worker does but queues no look: the look a worker
    that died between its park and its send would have lost. The sweeper sends one once it is
    overdue, a worker takes it, re-attaches to the same remote task, and the remote got one message."""
    text = f"lost look {uuid.uuid4().hex[:6]}"
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [call("a2a__desk", message=text)]}, {"text": "done"}]
    task_id = _submit(world.here, _delegator(world, turns, [_desk_ref(world)]))
    parked = run_agentq(["run-task", task_id, "--lease", "2"], env=world.here.stack.env(), timeout=120)
    assert json.loads(parked.stdout.splitlines()[-1])["status"] == "waiting", parked.stderr[-2000:]
    store = world.here.stack.store()
    due = store.tasks.get(task_id).look_due
    assert due is not None
    world.desk.release()
    report = sweep(store, world.here.stack.queues(), stale_after=60, now=due + 61)
    assert task_id in report.looked
    worker = world.here.stack.spawn_worker()
    try:
        view = _ended(world.here, task_id, timeout=90)
    finally:
        _kill(worker)
    assert view["status"] == "succeeded", view
    assert len(world.desk.received(text)) == 1
