"""A tree's event stream (``GET /tasks/{id}/events?tree=true``) over HTTP on the local stack:
every event id of several trees resumes exactly the rest (live and replayed, tree and one-task
streams, ``Last-Event-ID`` and ``?after=``), an id is the same live and replayed, the order keeps
each task's commit order and puts a parent's ending after its sub-agents' work, and a cursor that
is not one the API issued is a 400 naming the field that carried it, while one naming a sub-agent
purged since resumes the rest of the tree.

Live, every id is resumed over HTTP as it arrives. Replayed, every id is resumed by what both
routes run with it (``Watch.open``, ``read_once``) over the finished tree's items copied into the
in-memory twin, and over HTTP from an id of each form (``_over_http``): a resume over HTTP makes
25-60 DynamoDB calls, and every id of the trees resumed that way, twice, was some 16 of the
file's 54 CPU-s."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.api.client import Client
from agentq.api.events import Watch, read_once
from agentq.api.models import TaskEvent
from agentq.core.fanout import ChildPlan
from agentq.core.models import TaskStatus
from agentq.storage.container import Storage, memory_storage
from agentq.storage.keys import task_pk

from tests.api_support import ApiStack
from tests.helpers import call, scripted
from tests.storage_conformance._builders import claimed, llm_step


def _leaf(name: str, turns: int = 1) -> dict[str, Any]:
    """A sub-agent that looks something up ``turns - 1`` times, slowly enough to overlap its siblings."""
    looks = [{"text": f"{name} {t}", "latency_seconds": 0.15, "tool_calls": [call("lookup", query=f"{name}{t}")]}
             for t in range(turns - 1)]  # fmt: skip
    return {"goal": name, "tools": ["lookup"], "script": {"turns": [*looks, {"text": f"{name} done"}]}}


def _spawning(goal: str, children: list[dict[str, Any]]) -> dict[str, Any]:
    turns = [{"text": "", "tool_calls": [call("spawn_subagents", subagents=children)]}, {"text": f"{goal} done"}]
    return {"goal": goal, "tools": ["spawn_subagents", "lookup"], "script": {"turns": turns}}


def _root(spec: dict[str, Any]) -> dict[str, Any]:
    return {"goal": spec["goal"], "provider": "scripted", "script": spec["script"],
            "constraints": {"tools": spec.get("tools") or ["lookup"]}}  # fmt: skip


TREES = {
    "no sub-agents": _root(_leaf("alone", 3)),
    "two sub-agents": _root(_spawning("fan", [_leaf("a"), _leaf("b", 2)])),
    "nested": _root(_spawning("top", [_spawning("mid", [_leaf("x"), _leaf("y")]), _leaf("z", 2)])),
}


class Follower:
    """``iter_events`` (the client's own reconnecting reader) on a thread, from ``after``."""

    def __init__(self, api: ApiStack, task_id: str, *, tree: bool, after: str | None = None) -> None:
        self.client = Client(api.url, api.key)
        self.events: list[TaskEvent] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(task_id, tree, after), daemon=True)
        self.thread.start()

    def _run(self, task_id: str, tree: bool, after: str | None) -> None:
        try:
            for event in self.client.iter_events(task_id, tree=tree, after=after):
                if event.committed:
                    self.events.append(event)
        except BaseException as exc:  # reported by ids()
            self.error = exc

    def ids(self) -> list[str]:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the stream did not end"
        if self.error is not None:
            raise self.error
        return [str(e.id) for e in self.events]


def _sse(api: ApiStack, path: str, *, last_id: str | None = None) -> tuple[int, str]:
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {api.key}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    req = urllib.request.Request(api.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _blocks(body: str) -> Iterator[dict[str, str]]:
    """Each block of a stream as a generic SSE client reads it: its fields (comments left out)."""
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if fields:
            yield fields


def _ids_of(body: str) -> list[str]:
    return [b["id"] for b in _blocks(body) if "id" in b]


def _twin(api: ApiStack, root: str) -> Storage:
    """The tree of ``root`` (every task its spawn events name, down) as it is in the stack's
    table, each task's partition (META, submission, claims, steps, events) and the S3 payloads
    its items refer to, copied into the in-memory twin, which the storage conformance suite
    holds to the table's behaviour: a finished tree's resumes read there in microseconds."""
    source, twin = api.stack.store(), memory_storage()
    tasks = [root]
    for task_id in tasks:
        head = source.events.head(task_id)
        assert head is not None, task_id
        tasks += [child for spawn in source.events.spawned(task_id, head.position) for child in spawn]
        for item in source.table.query(task_pk(task_id)):
            twin.table.put(item)
            if "ref" in item:
                twin.payloads.put_bytes(item["ref"], source.payloads.get_bytes(item["ref"]))
    return twin


def _over_http(ids: list[str]) -> list[int]:
    """Where in ``[None, *ids]`` a resume is also made over HTTP: from none, from the first id of
    each form (the tasks it names, and how: positions aside) and from the last two (the page
    that is done, the stream that has nothing left)."""
    first: dict[str, int] = {}
    for i, event_id in enumerate(ids, 1):
        first.setdefault(re.sub(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+", "#", event_id), i)
    return sorted({0, *first.values(), max(0, len(ids) - 1), len(ids)})


def _assert_every_id_resumes_the_rest(api: ApiStack, task_id: str, ids: list[str], *, tree: bool) -> None:
    """From every id (and from none) the watch both routes of ``GET /tasks/{id}/events`` open
    with it (``Watch.open``, ``read_once``: api/routes/events.py) reads exactly the events after
    it, and a page of one holds the next one with its id as the cursor, done only at the end:
    over the finished tree copied into the in-memory twin (``_twin``). Over HTTP, on the stack's
    table, from the ids ``_over_http`` picks: the SSE stream with Last-Event-ID returns exactly
    the events after it, and JSON pages of one event, each asked for with ?after= the id before,
    return the next one (a page of the rest after the middle id too)."""
    twin = _twin(api, task_id)
    task = twin.tasks.get(task_id)
    starts: list[str | None] = [None, *ids]
    for i, last in enumerate(starts):
        rest = read_once(Watch.open(twin, task, last, tree=tree, field="after"), limit=len(ids) + 1)
        assert [e["id"] for e in rest] == ids[i:], (task_id, last)
        watch = Watch.open(twin, task, last, tree=tree, field="Last-Event-ID")
        one = read_once(watch, limit=1)
        assert ([e["id"] for e in one], watch.cursor() or None) == (ids[i : i + 1], ids[i] if i < len(ids) else last)
        assert watch.done if i == len(ids) else not watch.done or i == len(ids) - 1, (task_id, last)
    client = Client(api.url, api.key)
    query = "?tree=true" if tree else ""
    for i in _over_http(ids):
        last = starts[i]
        status, body = _sse(api, f"/tasks/{task_id}/events{query}", last_id=last)
        assert (status, _ids_of(body)) == ((200, ids[i:]) if ids[i:] else (204, [])), (task_id, last)
        page = client.events(task_id, after=last, tree=tree, limit=1)
        assert ([e.id for e in page.events], page.next_cursor) == (ids[i : i + 1], ids[i] if i < len(ids) else last), (
            task_id,
            last,
        )
        assert page.done if i == len(ids) else not page.done or i == len(ids) - 1
    middle = ids[len(ids) // 2]
    assert [e.id for e in client.events(task_id, after=middle, tree=tree, limit=200).events] == ids[len(ids) // 2 + 1 :]


@pytest.mark.parametrize("shape", list(TREES))
def test_every_event_id_of_a_tree_live_or_replayed_resumes_exactly_the_rest(api_stack: ApiStack, shape: str) -> None:
    task_id = api_stack.submit(TREES[shape])
    live = Follower(api_stack, task_id, tree=True)
    resumed: dict[str, Follower] = {}  # a live resume from each id, started as the id arrives
    plain: dict[str, Follower] = {task_id: Follower(api_stack, task_id, tree=False)}
    seen = 0
    while live.thread.is_alive() or seen < len(live.events):
        arrived = live.events[seen:]  # the thread appends meanwhile: count what was taken, not the list
        for event in arrived:
            assert event.id is not None
            resumed[event.id] = Follower(api_stack, task_id, tree=True, after=event.id)
            if event.type == "task.spawned":
                for child in event.data["children"]:
                    plain[child] = Follower(api_stack, child, tree=False)
        seen += len(arrived)
        live.thread.join(timeout=0.05)
    ids = live.ids()

    replay = [e for e in Client(api_stack.url, api_stack.key).iter_events(task_id, tree=True) if e.committed]
    assert [e.id for e in replay] == ids  # an id is the same live and replayed
    for i, last in enumerate(ids):
        assert resumed[last].ids() == ids[i + 1 :], f"live resume after event {i}"
    _assert_every_id_resumes_the_rest(api_stack, task_id, ids, tree=True)

    for n, (child, follower) in enumerate(plain.items()):  # each task's own stream: live, and replayed
        own = follower.ids()
        assert own == [e.id for e in Client(api_stack.url, api_stack.key).iter_events(child) if e.committed]
        assert all(i.startswith(f"{child}:") for i in own)
        if n < 2:  # the root's and a sub-agent's: every id (tests/test_task_events.py has more of one task's)
            _assert_every_id_resumes_the_rest(api_stack, child, own, tree=False)
    tasks = {e.task_id for e in replay}
    assert tasks == set(plain)  # the tree stream holds every task of the tree
    assert max(len(i) for i in ids) <= len(f"tree:{task_id}") + 12 * len(tasks)  # short: a path, not a task id


def test_a_tree_larger_than_a_stream_may_name_resumes_exactly_the_rest_of_the_tasks_it_admitted(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream names at most MAX_TREE_TASKS tasks (its ids stay a header): the first ones it
    came to; once full, its ids list every task of the watch, so a resume admits the same ones."""
    import agentq.api.events
    import agentq.api.tree_cursor

    for module in (agentq.api.events, agentq.api.tree_cursor):  # the local API server runs in this process
        monkeypatch.setattr(module, "MAX_TREE_TASKS", 3)
    task_id = api_stack.submit(TREES["nested"])  # five tasks: the root, 1 (with 1.1 and 1.2) and 2
    events = [e for e in Client(api_stack.url, api_stack.key).iter_events(task_id, tree=True) if e.committed]
    assert {e.tree_path for e in events} == {"", "1", "2"}
    ids = [str(e.id) for e in events]
    assert all(i.count("~") <= 3 for i in ids) and any("~2:-" in i for i in ids)  # full, 2 listed before it sent
    _assert_every_id_resumes_the_rest(api_stack, task_id, ids, tree=True)


def test_a_resume_from_the_middle_of_a_tree_after_a_childs_event_returns_exactly_the_rest(
    api_stack: ApiStack,
) -> None:
    task_id = api_stack.submit(TREES["nested"])
    client = Client(api_stack.url, api_stack.key)
    first: list[TaskEvent] = []
    stream = client.iter_events(task_id, tree=True)
    for event in stream:
        if event.committed:
            first.append(event)
        if event.type == "agent.message" and event.tree_path == "2":  # a sub-agent's first answer, mid-tree
            break
    stream.close()  # the connection drops here
    last = first[-1]
    rest = [e for e in client.iter_events(task_id, tree=True, after=last.id) if e.committed]
    replay = [e for e in client.iter_events(task_id, tree=True) if e.committed]
    assert [e.id for e in first + rest] == [e.id for e in replay]
    assert {e.tree_path for e in rest} >= {"", "1", "2"}  # the root and both its sub-agents had more to say
    status, body = _sse(api_stack, f"/tasks/{task_id}/events?tree=true", last_id=last.id)  # as an EventSource resumes
    assert status == 200 and _ids_of(body) == [e.id for e in rest]


def test_the_client_follows_a_tree_across_the_reconnects_of_the_api_lambdas_finite_streams(api_stack: ApiStack) -> None:
    """In AWS the API's Lambda answers a stream with what is committed now and closes it: the
    client reconnects after the last id it received, again and again, until the tree ends."""
    from agentq.api.http_server import ApiServer

    hubbed = api_stack.stack.api_server
    assert hubbed is not None
    lambda_like = ApiServer(hubbed.handler, authorizer=hubbed.authorizer, hub=None).start()
    try:
        task_id = api_stack.submit(TREES["two sub-agents"])
        got = [e for e in Client(lambda_like.url, api_stack.key).iter_events(task_id, tree=True) if e.committed]
    finally:
        lambda_like.stop()
    replay = [e.id for e in Client(api_stack.url, api_stack.key).iter_events(task_id, tree=True) if e.committed]
    assert [e.id for e in got] == replay and got[-1].data["status"] == "succeeded"


def test_a_replayed_tree_keeps_each_tasks_order_in_time_order_with_a_parents_end_after_its_children(
    api_stack: ApiStack,
) -> None:
    task_id = api_stack.submit(TREES["nested"])
    events = [e for e in Client(api_stack.url, api_stack.key).iter_events(task_id, tree=True) if e.committed]
    assert [e.at for e in events] == sorted(e.at for e in events)  # one clock here: times never go backwards
    where = {e.id: i for i, e in enumerate(events)}
    by_path: dict[str, list[TaskEvent]] = {}
    for event in events:
        by_path.setdefault(str(event.tree_path), []).append(event)
    assert sorted(by_path) == ["", "1", "1.1", "1.2", "2"]
    for path, own in by_path.items():
        assert own[0].type == "task.created" and own[-1].data.get("status") == "succeeded", path
        if path:  # after the spawn that named it, and before its parent's end
            parent = by_path[path.rpartition(".")[0]]
            spawn = next(e for e in parent if e.type == "task.spawned" and own[0].task_id in e.data["children"])
            assert where[spawn.id] < where[own[0].id] and where[own[-1].id] < where[parent[-1].id], path


def _other_tree(api: ApiStack) -> tuple[str, list[str]]:
    task_id = api.submit(TREES["two sub-agents"])
    ids = [str(e.id) for e in Client(api.url, api.key).iter_events(task_id, tree=True) if e.committed]
    return task_id, ids


@pytest.fixture(scope="module")
def finished_tree(api_stack: ApiStack) -> tuple[str, list[str]]:
    return _other_tree(api_stack)


@pytest.fixture(scope="module")
def another_tree(api_stack: ApiStack) -> tuple[str, list[str]]:
    """A tree other than ``finished_tree``, whose ids the latter's stream must refuse."""
    return _other_tree(api_stack)


BAD_TREE_IDS = [  # (what is wrong, the id made from a good one, a word the error names)
    ("another tree's", lambda root, good, other: other, "tree of task"),
    ("a sub-agent it never had", lambda root, good, other: good + "~9:0.0.2.0", "no sub-agent 9"),
    ("paths out of order", lambda root, good, other: good + "~2:0.0.2.0~1:0.0.2.0", "out of order"),
    ("a path twice", lambda root, good, other: good + "~1:0.0.2.0~1:0.0.3.1", "named twice"),
    ("a path with a leading zero", lambda root, good, other: good + "~01:0.0.2.0", "path"),
    ("a root position past its end", lambda root, good, other: f"tree:{root}~99.0.0.0", "past its end"),
    ("a sub-agent past its end", lambda root, good, other: good + "~1:99.0.0.0", "sub-agent 1 is past its end"),
    ("a malformed position", lambda root, good, other: good + "~1:0.0.2", "position"),
    ("no position", lambda root, good, other: f"tree:{root}", "tree:<root task id>"),
    ("a one-task id", lambda root, good, other: f"{root}:1.0.0.0", "one task's"),
    ("the old base64 form", lambda root, good, other: "tree:eyJyIjoiYSIsInAiOnt9fQ", "tree:<root task id>"),
    ("too many tasks", lambda root, good, other: good + "".join(f"~{i}:-" for i in range(1, 201)), "more than 200"),
]


@pytest.mark.parametrize("carrier", ["after", "Last-Event-ID"])
@pytest.mark.parametrize("accept", ["text/event-stream", "application/json"])
def test_a_tree_id_the_api_did_not_issue_is_a_400_naming_the_field_that_carried_it(
    api_stack: ApiStack,
    finished_tree: tuple[str, list[str]],
    another_tree: tuple[str, list[str]],
    accept: str,
    carrier: str,
) -> None:
    root, ids = finished_tree
    other = another_tree[1][-1]
    good = ids[ids.index(next(i for i in ids if "~1:" in i)) - 1]  # the last id naming the root alone
    for what, make, word in BAD_TREE_IDS:
        cursor = make(root, good, other)
        headers = {"Accept": accept, "Authorization": f"Bearer {api_stack.key}"}
        path = f"/tasks/{root}/events?tree=true"
        if carrier == "after":
            path += f"&after={urllib.parse.quote(cursor)}"
        else:
            headers["Last-Event-ID"] = cursor
        try:
            with urllib.request.urlopen(urllib.request.Request(api_stack.url + path, headers=headers)) as resp:
                raise AssertionError(f"{what}: {resp.status}")
        except urllib.error.HTTPError as err:
            status, body = err.code, json.loads(err.read())
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", carrier), what
        assert word in body["error"]["message"] and body["error"]["message"].startswith(f"{carrier}: "), (what, body)
    for cursor in (f"tree:{root}~1.1.2.\u0661", f"{ids[0]}\n", good + "~1:0.0.2.0\n"):  # not ASCII digits; a newline
        query = urllib.parse.urlencode({"tree": "true", "after": cursor})
        status, body = _sse(api_stack, f"/tasks/{root}/events?{query}")
        assert status == 400 and json.loads(body)["error"]["field"] == "after", repr(cursor)


def test_a_tree_id_naming_a_sub_agent_purged_since_still_resumes_the_rest_of_the_tree() -> None:
    """A finished sub-agent may be purged (``agentq purge``, its retention's TTL) while the tree
    goes on: an id naming it resumes the rest, instead of a 400 that no resume gets past."""
    store = memory_storage()
    lease = claimed(store, max_tokens=10_000)
    parent = store.tasks.get(lease.task_id)
    plans = [ChildPlan(f"child{i}-{time.time_ns()}", scripted([{"text": "c"}]), 100, 60) for i in range(2)]
    assert store.spawns.create(lease, parent, "sp1", plans, [], 2)
    for plan in plans:
        got = store.tasks.claim(plan.task_id, "w1", 30)
        assert got is not None
        store.steps.commit(got[0], 1, llm_step(), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="x")
    sent = read_once(Watch.open(store, parent, None, tree=True, field="after", settle=0.0), limit=200)
    last_id = sent[-1]["id"]
    assert "~1:" in last_id  # it names the first sub-agent's place
    store.purge.task(plans[0].task_id)
    store.steps.commit(lease, 1, llm_step(text="root goes on"), root_id=lease.task_id)
    root = store.tasks.get(lease.task_id)
    resumed = Watch.open(store, root, last_id, tree=True, field="Last-Event-ID", settle=0.0)
    assert [(e["type"], e["tree_path"]) for e in read_once(resumed, limit=200)] == [("agent.message", "")]
