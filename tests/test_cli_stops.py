"""`agentq stop|resume --user U | --agent NAME | --key K | --tenant T` and `agentq stops`, run as a
person runs them (a process of their own, the URL and key in the environment) against the local
stack's HTTP API: each scope's stop cancels its tasks and says how many, the scope is refused until
`agentq resume`, and bad input exits 2 (a request that found nothing to resume, 1) with a message
naming what is wrong, and stores nothing. The API's own behaviour: tests/test_stops_api.py.

Every test uses a tenant of its own (a stop refuses a whole scope: the shared stack's other tests
must never meet one)."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

from tests.api_support import ROOT, ApiStack
from tests.helpers import run_agentq
from tests.test_stops_api import _key_id, _status

# A task that stays unfinished while the test looks: a long first turn.
SLOW = {"goal": "slow", "provider": "scripted", "script": {"turns": [{"text": "zzz", "latency_seconds": 20}]}}


def _tenant(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _agentq(api: ApiStack, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_agentq(list(args), env=api.cli_env(AGENTQ_API_KEY=key), timeout=120, cwd=ROOT)


def _stops(api: ApiStack, key: str) -> list[dict[str, Any]]:
    status, listed, _ = api.http("GET", "/stops", key=key)
    assert status == 200, listed
    return list(listed["stops"])


def test_agentq_stop_user_cancels_its_tasks_and_refuses_new_ones_until_agentq_resume(api_stack: ApiStack) -> None:
    tenant = _tenant("cli-stop-user")
    key = api_stack.stack.create_api_key(tenant, act_for_users=True)
    alice = [api_stack.submit({**SLOW, "user": "alice"}, key=key) for _ in range(2)]
    bob = api_stack.submit({**SLOW, "user": "bob"}, key=key)

    stopped = _agentq(api_stack, key, "stop", "--user", "alice", "--reason", "runaway")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped user alice: 2 tasks cancelled, "), stopped.stdout
    assert "new tasks of it are refused until: agentq resume --user alice" in stopped.stderr
    assert all(_status(api_stack, t, key) == "cancelled" for t in alice)
    assert _status(api_stack, bob, key) in ("queued", "running")
    assert api_stack.http("POST", "/tasks", {**SLOW, "user": "alice"}, key=key)[0] == 423

    listed = _agentq(api_stack, key, "stops")
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    assert line.split()[:2] == ["user", "alice"] and line.endswith(f"by {_key_id(api_stack, key)}: runaway"), line

    again = _agentq(api_stack, key, "stop", "--user", "alice")
    assert again.returncode == 0 and "stopped user alice (already stopped: swept again): 0 tasks" in again.stdout

    resumed = _agentq(api_stack, key, "resume", "--user", "alice")
    assert resumed.returncode == 0 and resumed.stdout.strip() == "resumed user alice", resumed
    assert api_stack.http("POST", "/tasks", {**SLOW, "user": "alice"}, key=key)[0] == 202
    assert _stops(api_stack, key) == []
    nothing = _agentq(api_stack, key, "stops")
    assert nothing.returncode == 0 and nothing.stdout == "" and "nothing is stopped" in nothing.stderr

    gone = _agentq(api_stack, key, "resume", "--user", "alice")  # not stopped: the operation did not succeed
    assert gone.returncode == 1 and "user 'alice' is not stopped (user)" in gone.stderr, gone
    _agentq(api_stack, key, "stop", "--tenant", tenant)  # leave nothing running behind


def test_agentq_stop_agent_key_and_tenant_each_cancel_only_their_own_tasks(api_stack: ApiStack) -> None:
    tenant = _tenant("cli-stop-scopes")
    key, second = api_stack.stack.create_api_key(tenant), api_stack.stack.create_api_key(tenant)
    spec = {"name": "shopper", "provider": "scripted", "script": SLOW["script"]}
    assert api_stack.http("POST", "/agents", spec, key=key)[0] in (200, 201)
    shopper = api_stack.submit({"goal": "buy", "agent": "shopper"}, key=key)
    by_second = api_stack.submit(SLOW, key=second)
    plain = api_stack.submit(SLOW, key=key)

    agent = _agentq(api_stack, key, "stop", "--agent", "shopper")
    assert agent.returncode == 0 and agent.stdout.startswith("stopped agent shopper: 1 tasks cancelled"), agent
    assert _status(api_stack, shopper, key) == "cancelled"
    assert _status(api_stack, by_second, key) in ("queued", "running")

    second_id = _key_id(api_stack, second)
    by_key = _agentq(api_stack, key, "stop", "--key", second_id)
    assert by_key.returncode == 0 and by_key.stdout.startswith(f"stopped key {second_id}: 1 tasks cancelled"), by_key
    assert _status(api_stack, by_second, key) == "cancelled"
    assert _status(api_stack, plain, key) in ("queued", "running")
    assert api_stack.http("POST", "/tasks", SLOW, key=second)[0] == 423
    assert api_stack.http("POST", "/tasks", SLOW, key=key)[0] == 202  # the other key of the tenant submits on

    everything = _agentq(api_stack, key, "stop", "--tenant", tenant)
    assert everything.returncode == 0 and everything.stdout.startswith(f"stopped tenant {tenant}: 2 tasks cancelled")
    assert _status(api_stack, plain, key) == "cancelled"
    assert api_stack.http("POST", "/tasks", SLOW, key=key)[0] == 423
    assert sorted(s["kind"] for s in _stops(api_stack, key)) == ["agent", "key", "tenant"]

    for kind, value in (("agent", "shopper"), ("key", second_id), ("tenant", tenant)):
        resumed = _agentq(api_stack, key, "resume", f"--{kind}", value)
        assert resumed.returncode == 0 and resumed.stdout.strip() == f"resumed {kind} {value}", resumed
    assert _stops(api_stack, key) == []
    assert api_stack.http("POST", "/tasks", {"goal": "buy", "agent": "shopper"}, key=second)[0] == 202
    _agentq(api_stack, key, "stop", "--tenant", tenant)


def test_agentq_stop_or_resume_naming_no_single_valid_scope_exits_2_naming_it_and_stores_nothing(
    api_stack: ApiStack,
) -> None:
    tenant = _tenant("cli-stop-bad")
    key = api_stack.stack.create_api_key(tenant)
    other = _tenant("cli-stop-other")
    task = api_stack.submit(SLOW, key=key)
    one_scope = "agentq: name exactly one scope: --user, --agent, --key or --tenant (scope)"
    cases = [
        (("stop",), one_scope),  # none: refused before any request
        (("stop", "--user", "alice", "--agent", "shop"), one_scope),  # two
        (("stop", "--reason", "why"), one_scope),
        (("resume",), one_scope),
        (("resume", "--key", "key_0123456789abcdef", "--tenant", tenant), one_scope),
        # not a name of its kind: the server's 422, saying what one may hold (not its regex)
        (
            ("stop", "--user", "bad user"),
            "agentq: user: 1-128 characters: a letter or digit, then letters, digits "
            "or . _ - @ + : |, not 'bad user' (user)",
        ),
        (
            ("stop", "--agent", "Shop!"),
            "agentq: agent: an agent's name: 1-64 lowercase letters, digits, '-' and '_', not 'Shop!' (agent)",
        ),
        (("stop", "--tenant", other), "(tenant)"),  # another tenant: 403
    ]
    for args, message in cases:
        ran = _agentq(api_stack, key, *args)
        assert ran.returncode == 2, (args, ran)
        assert message in ran.stderr and ran.stdout == "", (args, ran.stderr)
    assert _stops(api_stack, key) == []
    assert _status(api_stack, task, key) in ("queued", "running")
    api_stack.http("POST", "/stops", {"tenant": tenant}, key=key)
