"""Aliases of agents over real HTTP on the local stack (auth on, two tenants, real worker
processes): a task submitted as ``name@alias`` pins the version the alias gave it, and keeps it
across a move of the alias while it runs and for its follow-ups, until its owner moves it; new
tasks get the new version at once; a rollback is a move back; a canary split is the one
``core.aliases.pick`` computes from the task id the task got; every bad alias, weight, name or
reference is a 4xx naming the field with nothing stored, and another tenant's alias never
resolves."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

from agentq.core.aliases import AliasSpec, pick

from tests.api_support import ApiStack
from tests.helpers import call, run_agentq

# A first turn long enough that what a test does while the task runs (the calls after it is seen
# running) lands before the turn ends, also on a loaded machine.
RUNNING_SECONDS = 10.0


def _agent(name: str, tag: str, *, first_latency: float = 0.0) -> dict[str, Any]:
    """A scripted agent whose every answer says which version played it: a first turn that looks
    something up (slowly, to be caught running), then four answers for four exchanges."""
    first: dict[str, Any] = {"text": f"{tag} looking", "tool_calls": [call("lookup", query="q")]}
    if first_latency:
        first["latency_seconds"] = first_latency
    turns = [first, *({"text": f"{tag} answer {i}"} for i in range(1, 5))]
    return {"name": name, "provider": "scripted", "script": {"turns": turns}, "system": f"You are {tag}.",
            "tools": ["lookup"]}  # fmt: skip


def _name() -> str:
    return f"support-{uuid.uuid4().hex[:8]}"


def _result(api_stack: ApiStack, task_id: str) -> str:
    status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/result")
    assert status == 200, body
    return str(body["result"])


def _answered(api_stack: ApiStack, task_id: str, answers: int) -> dict[str, Any]:
    """The task once it has answered ``answers`` exchanges (its result is the latest answer)."""
    return api_stack.until(task_id, lambda v: v["status"] == "succeeded" and (v.get("result") or "").endswith(
        f"answer {answers}"), timeout=90)  # fmt: skip


def _put_alias(api_stack: ApiStack, name: str, alias: str, *pairs: tuple[int, int], key: str | None = "default") -> Any:
    body = {"versions": [{"version": v, "weight": w} for v, w in pairs]}
    return api_stack.http("PUT", f"/agents/{name}/aliases/{alias}", body, key=key)


def test_a_running_task_keeps_its_version_across_an_alias_move_and_its_follow_ups_too(api_stack: ApiStack) -> None:
    name = _name()
    for tag in ("v1", "v2"):
        status, body, _ = api_stack.http("POST", "/agents", _agent(name, tag, first_latency=RUNNING_SECONDS))
        assert status == 201, body
    status, prod, _ = _put_alias(api_stack, name, "prod", (1, 100))
    assert status == 200 and prod["revision"] == 1, prod

    task_id = api_stack.submit({"goal": "where is my order?", "agent": f"{name}@prod"})
    running = api_stack.until(task_id, lambda v: v["status"] == "running")
    assert running["agent"] == f"{name}@1"
    status, moved, _ = _put_alias(api_stack, name, "prod", (2, 100))  # while a worker runs it on 1
    assert status == 200 and moved["revision"] == 2
    _, during, _ = api_stack.http("GET", f"/tasks/{task_id}")
    assert during["status"] in ("running", "queued") and during["step"] == 0, during  # moved mid-run, not after

    newer = api_stack.submit({"goal": "a new customer", "agent": f"{name}@prod"})  # new tasks: 2, at once
    assert api_stack.until(newer, lambda v: v["agent"] == f"{name}@2")

    view = _answered(api_stack, task_id, 1)
    assert view["agent"] == f"{name}@1" and _result(api_stack, task_id) == "v1 answer 1"
    status, sent, _ = api_stack.http("POST", f"/tasks/{task_id}/messages", {"text": "any news?"})
    assert status == 202, sent
    assert _answered(api_stack, task_id, 2)["agent"] == f"{name}@1"
    assert _result(api_stack, task_id) == "v1 answer 2"  # the follow-up ran on 1, the alias says 2

    _answered(api_stack, newer, 1)
    assert _result(api_stack, newer) == "v2 answer 1"

    # Its owner moves it explicitly: its next exchange runs 2, and the stream says so.
    status, repinned, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", {"version": 2})
    assert status == 200 and (repinned["previous"], repinned["agent"]) == (f"{name}@1", f"{name}@2"), repinned
    api_stack.http("POST", f"/tasks/{task_id}/messages", {"text": "and now?"})
    assert _answered(api_stack, task_id, 3)["agent"] == f"{name}@2"
    assert _result(api_stack, task_id) == "v2 answer 3"
    status, page, _ = api_stack.http("GET", f"/tasks/{task_id}/events?wait=0")
    assert status == 200, page
    moves = [e["data"] for e in page["events"] if e["type"] == "agent.moved"]
    assert moves == [{"from": f"{name}@1", "to": f"{name}@2"}], page

    # Rollback is moving the alias back: the next task runs 1 again.
    _put_alias(api_stack, name, "prod", (1, 100))
    back = api_stack.submit({"goal": "after the rollback", "agent": f"{name}@prod"})
    assert api_stack.until(back, lambda v: v["agent"] == f"{name}@1")


def test_a_canary_split_gives_each_task_the_version_its_id_picks(api_stack: ApiStack) -> None:
    name = _name()
    for tag in ("v1", "v2"):
        api_stack.http("POST", "/agents", _agent(name, tag))
    status, alias, _ = _put_alias(api_stack, name, "prod", (1, 50), (2, 50))
    assert status == 200, alias
    spec = AliasSpec.model_validate({"versions": alias["versions"]})
    got: dict[str, str] = {}
    for i in range(16):
        task_id = api_stack.submit({"goal": f"customer {i}", "agent": f"{name}@prod"})
        _, view, _ = api_stack.http("GET", f"/tasks/{task_id}")
        got[task_id] = view["agent"]
    want = {t: f"{name}@{pick(spec, tenant='team-a', agent=name, key=f'task:{t}')}" for t in got}
    assert got == want
    assert len(set(got.values())) == 2  # 16 ids on one side of a 50/50 split: 2^-15


def test_bad_aliases_weights_and_references_are_refused_naming_the_field_and_store_nothing(
    api_stack: ApiStack,
) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "v1"))
    path = f"/agents/{name}/aliases/prod"
    cases: list[tuple[str, Any, str]] = [
        (path, {"versions": [{"version": 9, "weight": 100}]}, "versions[0].version"),
        (path, {"versions": [{"version": 1, "weight": 90}, {"version": 9, "weight": 10}]}, "versions[1].version"),
        (path, {"versions": [{"version": 1, "weight": 90}]}, "versions"),
        (path, {"versions": [{"version": 1, "weight": 60}, {"version": 1, "weight": 40}]}, "versions"),
        (path, {"versions": [{"version": 1, "weight": 0}, {"version": 1, "weight": 100}]}, "versions[0].weight"),
        (path, {"versions": [{"version": 1, "weight": 101}]}, "versions[0].weight"),
        (path, {"versions": [{"version": 1, "weight": True}]}, "versions[0].weight"),
        (path, {"versions": [{"version": "1", "weight": 100}]}, "versions[0].version"),
        (path, {"versions": [{"version": 1, "weight": 40}] * 3}, "versions"),
        (path, {"versions": []}, "versions"),
        (path, {"version": 1}, "versions"),  # required, and named first
        (f"/agents/{name}/aliases/7", {"versions": [{"version": 1, "weight": 100}]}, "alias"),
        (f"/agents/{name}/aliases/Prod", {"versions": [{"version": 1, "weight": 100}]}, "alias"),
        (f"/agents/{name}-gone/aliases/prod", {"versions": [{"version": 1, "weight": 100}]}, "versions[0].version"),
    ]
    for where, body, field in cases:
        status, answer, _ = api_stack.http("PUT", where, body)
        assert (status, answer["error"]["field"]) == (422, field), (where, body, answer)
    status, listing, _ = api_stack.http("GET", f"/agents/{name}/aliases")
    assert status == 200 and listing == {"agent": name, "aliases": []}  # nothing stored by any refusal

    _, before, _ = api_stack.http("GET", "/tasks?limit=100")
    for ref in (f"{name}@prod", f"{name}@Prod", f"{name}@", f"{name}@prod@1"):
        status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": ref})
        assert (status, answer["error"]["field"]) == (422, "agent"), (ref, answer)
    _, after, _ = api_stack.http("GET", "/tasks?limit=100")
    assert [t["task_id"] for t in after["tasks"]] == [t["task_id"] for t in before["tasks"]]  # no task was made

    status, answer, _ = api_stack.http("GET", f"{path}")
    assert status == 404 and answer["error"]["code"] == "alias_not_found"
    status, answer, _ = api_stack.http("DELETE", f"{path}")
    assert status == 404 and answer["error"]["field"] == "alias"


def test_two_callers_moving_an_alias_at_once_are_each_answered_the_move_they_made(api_stack: ApiStack) -> None:
    """Two callers PUT prod at once, one to 1 and one to 2, 30 times: each answer is the alias as
    its own write made it (its targets), and each move has a revision of its own, 1 to 60. The
    answer was a read after the write, which a racing move could land in between: 17 of 60
    answers named the other caller's targets, and revisions were answered twice."""
    name = _name()
    for tag in ("v1", "v2"):
        api_stack.http("POST", "/agents", _agent(name, tag))
    answers: list[tuple[int, int, Any]] = []
    lock = threading.Lock()

    def put(version: int) -> None:
        status, body, _ = _put_alias(api_stack, name, "prod", (version, 100))
        with lock:
            answers.append((version, status, body))

    for _ in range(30):
        threads = [threading.Thread(target=put, args=(v,)) for v in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wrong = [(v, body) for v, status, body in answers if status != 200 or body["versions"] != [
        {"version": v, "weight": 100}]]  # fmt: skip
    assert wrong == [], wrong[:3]
    assert sorted(body["revision"] for _, _, body in answers) == list(range(1, 61))
    _, now, _ = api_stack.http("GET", f"/agents/{name}/aliases/prod")
    last = max(answers, key=lambda a: a[2]["revision"])
    assert (now["revision"], now["versions"]) == (60, last[2]["versions"])


def test_a_move_from_a_revision_another_move_has_passed_is_refused_naming_expected_revision(
    api_stack: ApiStack,
) -> None:
    """A canary bump computed from what its caller read (revision 1: 90/10) must not land on the
    rollback another caller made since (revision 2: all on 1), silently giving the canary its
    traffic back: with ``expected_revision`` it is 409 ``alias_conflict`` naming it, and the
    alias keeps the rollback. 0 expects no alias yet; a bad value is a 422 naming the field."""
    name = _name()
    for tag in ("v1", "v2"):
        api_stack.http("POST", "/agents", _agent(name, tag))
    path = f"/agents/{name}/aliases/prod"
    canary = {"versions": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}
    status, made, _ = api_stack.http("PUT", path, {**canary, "expected_revision": 0})
    assert (status, made["revision"]) == (200, 1), made
    status, again, _ = api_stack.http("PUT", path, {**canary, "expected_revision": 0})  # it exists now
    assert (status, again["error"]["code"], again["error"]["field"]) == (409, "alias_conflict", "expected_revision")
    assert "at revision 1, not 0" in again["error"]["message"]
    assert _put_alias(api_stack, name, "prod", (1, 100))[1]["revision"] == 2  # the rollback
    bump = {"versions": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}], "expected_revision": 1}
    status, refused, _ = api_stack.http("PUT", path, bump)
    assert (status, refused["error"]["code"], refused["error"]["field"]) == (409, "alias_conflict", "expected_revision")
    _, now, _ = api_stack.http("GET", path)
    assert (now["revision"], now["versions"]) == (2, [{"version": 1, "weight": 100}])  # the rollback stands
    status, moved, _ = api_stack.http("PUT", path, {**bump, "expected_revision": 2})
    assert (status, moved["revision"], moved["versions"]) == (200, 3, bump["versions"])
    for bad in (-1, "3", True, 1.5, None):
        status, answer, _ = api_stack.http("PUT", path, {**canary, "expected_revision": bad})
        if bad is None:  # null: none expected, as if left out
            assert status == 200 and answer["revision"] == 4, answer
            continue
        assert (status, answer["error"]["field"]) == (422, "expected_revision"), (bad, answer)
    stale = run_agentq(["agents", "alias", "set", name, "prod", "2", "--expected-revision", "3"],
                       env=api_stack.cli_env(), timeout=120)  # fmt: skip
    assert stale.returncode == 1 and "expected_revision: alias" in stale.stderr, (stale.returncode, stale.stderr)
    assert "at revision 4, not 3" in stale.stderr and "Traceback" not in stale.stderr
    assert api_stack.http("GET", path)[1]["revision"] == 4


def test_another_tenants_alias_never_resolves_nor_shows(api_stack: ApiStack) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "v1"))
    assert _put_alias(api_stack, name, "prod", (1, 100))[0] == 200
    other = api_stack.other_key
    status, answer, _ = api_stack.http("GET", f"/agents/{name}/aliases/prod", key=other)
    assert status == 404, answer
    status, listing, _ = api_stack.http("GET", f"/agents/{name}/aliases", key=other)
    assert (status, listing["error"]["code"]) == (404, "agent_not_found"), listing  # it has no such agent
    status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": f"{name}@prod"}, key=other)
    assert (status, answer["error"]["field"]) == (422, "agent")
    # with an agent of the same name of its own, still its own aliases only
    api_stack.http("POST", "/agents", _agent(name, "theirs"), key=other)
    status, answer, _ = api_stack.http("POST", "/tasks", {"goal": "g", "agent": f"{name}@prod"}, key=other)
    assert (status, answer["error"]["field"]) == (422, "agent")
    status, answer, _ = api_stack.http("DELETE", f"/agents/{name}/aliases/prod", key=other)
    assert status == 404
    assert _put_alias(api_stack, name, "prod", (2, 100), key=other)[0] == 422  # its agent has 1 version
    _, mine, _ = api_stack.http("GET", f"/agents/{name}/aliases/prod")
    assert mine["versions"] == [{"version": 1, "weight": 100}] and mine["revision"] == 1


def test_moving_a_task_is_refused_when_it_cannot_be_moved_naming_why(api_stack: ApiStack) -> None:
    name = _name()
    api_stack.http("POST", "/agents", _agent(name, "v1", first_latency=RUNNING_SECONDS))
    plain = api_stack.submit()
    api_stack.until(plain, lambda v: v["status"] == "succeeded")
    status, answer, _ = api_stack.http("POST", f"/tasks/{plain}/agent", {"version": 1})
    assert (status, answer["error"]["field"]) == (422, "task_id"), answer  # runs no agent definition
    task_id = api_stack.submit({"goal": "g", "agent": f"{name}@1"})
    api_stack.until(task_id, lambda v: v["status"] == "running")
    status, answer, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", {"version": 1})
    assert status == 409, answer  # a run in flight is never changed under its worker
    status, answer, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", {"version": 5})
    assert (status, answer["error"]["field"]) == (422, "version"), answer
    for body, field in (({"version": 0}, "version"), ({"version": "2"}, "version"), ({}, "version")):
        status, answer, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", body)
        assert (status, answer["error"]["field"]) == (422, field), (body, answer)
    status, answer, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", {"version": 1}, key=api_stack.other_key)
    assert status == 404, answer
    _answered(api_stack, task_id, 1)
    _, events, _ = api_stack.http("GET", f"/tasks/{task_id}/events?wait=0")
    assert not [e for e in events["events"] if e["type"] == "agent.moved"]


def test_a_move_with_an_unknown_field_is_refused_naming_it_and_moves_nothing(api_stack: ApiStack) -> None:
    name = f"mover-{uuid.uuid4().hex[:8]}"
    for text in ("v1", "v2"):
        agent = {"name": name, "provider": "scripted", "script": {"turns": [{"text": text}] * 3}}
        assert api_stack.http("POST", "/agents", agent)[0] == 201
    task_id = api_stack.submit({"goal": "g", "agent": f"{name}@1"})
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    # a client that believes it can keep the old version's outcome, or misspells a field
    status, answer, _ = api_stack.http("POST", f"/tasks/{task_id}/agent", {"version": 2, "keep_outcome": True})
    assert (status, (answer.get("error") or {}).get("field")) == (422, "keep_outcome"), answer
    _, view, _ = api_stack.http("GET", f"/tasks/{task_id}")
    assert view["agent"] == f"{name}@1", view  # not moved
    _, events, _ = api_stack.http("GET", f"/tasks/{task_id}/events?wait=0")
    assert not [e for e in events["events"] if e["type"] == "agent.moved"], events


def test_the_cli_sets_splits_lists_and_deletes_an_alias(api_stack: ApiStack) -> None:
    name = _name()
    for tag in ("v1", "v2"):
        api_stack.http("POST", "/agents", _agent(name, tag))

    def agentq(*args: str) -> Any:
        return run_agentq(["agents", "alias", *args], env=api_stack.cli_env(), timeout=120)

    made = agentq("set", name, "prod", "1", "--canary", "2:10%")
    assert made.returncode == 0 and "v1 90% + v2 10%" in made.stdout, made.stderr
    shown = agentq("show", name, "prod", "--json")
    assert json.loads(shown.stdout)["versions"] == [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]
    assert agentq("set", name, "canary", "2").returncode == 0
    assert agentq("set", name, "spare", "1").returncode == 0
    listed = agentq("list", name)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        f"{name}@canary",
        f"{name}@prod",
        f"{name}@spare",
    ]
    for bad, field in ((["--canary", "2:0%"], "--canary"), (["--canary", "2"], "--canary")):
        refused = agentq("set", name, "prod", "1", *bad)
        assert refused.returncode == 2 and field in refused.stderr and "Traceback" not in refused.stderr
    missing = agentq("set", name, "prod", "9")
    assert missing.returncode == 2 and "versions[0].version" in missing.stderr, missing.stderr
    assert agentq("delete", name, "spare").returncode == 0
    gone = agentq("show", name, "spare")
    assert gone.returncode == 1 and "no alias" in gone.stderr

    task_id = api_stack.submit({"goal": "g", "agent": f"{name}@canary"})
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    moved = run_agentq(["agents", "move", task_id, "1"], env=api_stack.cli_env(), timeout=120)
    assert moved.returncode == 0 and f"{name}@2 -> {name}@1" in moved.stdout, moved.stderr
    refused = run_agentq(["agents", "move", task_id, "9"], env=api_stack.cli_env(), timeout=120)
    assert refused.returncode == 2 and "version" in refused.stderr and "Traceback" not in refused.stderr
