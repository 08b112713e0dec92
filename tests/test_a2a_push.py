"""A2A push notification configs (``api/a2a_push.py``, ``queueing/a2a_push.py``) against the local
stack with real workers: created, read, listed and deleted per task (deleting twice is deleting
once); a task's changes reach a real receiving HTTP server on loopback, signed as every callback,
with the config's own credentials and token, as A2A ``StreamResponse`` status updates (the task
with its artifacts at ``completed``), each with a
delivery id that stays the same across attempts; an internal URL is the protocol's invalid-params
error naming ``url``, nothing stored; another tenant's task takes no config. A config given with
a send is in place before its task can run: a task that pauses at once, or ends within its own
submission, is notified, and a refused send leaves no config behind. A task of the agent started
outside A2A (``POST /tasks``) takes a config as well, and is heard: a config set while it runs
too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentq.api.models import MAX_NOTE_CHARS
from agentq.core.webhooks import SIGNATURE_HEADER, verify

from tests.api_support import ApiStack
from tests.helpers import call as tool_call
from tests.helpers import dynamo, wait_for
from tests.test_a2a_server import APPROVAL_TURNS, _agent, _rpc, _send
from tests.webhook_receiver import Receiver

SENDS_AT_ONCE = 16

TWO_APPROVALS: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [tool_call("request_approval", question="Build it?")]},
    {"text": "", "tool_calls": [tool_call("request_approval", question="Ship it?")]},
    {"text": "shipped"},
]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver(fail=1, path="/a2a-push")
    # The webhooks' development allowance: the API's check and the stack's deliverer run here.
    monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", f"127.0.0.1:{r.server.server_address[1]}")
    yield r
    r.server.shutdown()


def _call(api_stack: ApiStack, name: str, method: str, params: dict[str, Any], key: str | None = "default") -> Any:
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, key=key)
    assert status == 200, data
    return data


def _paused(api_stack: ApiStack, name: str) -> str:
    data = _call(api_stack, name, "SendMessage", _send("build and ship")["params"])
    assert data["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", data
    return str(data["result"]["task"]["id"])


def test_push_configs_are_created_read_listed_and_deleted_and_deleting_twice_is_deleting_once(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    auth = {"scheme": "Bearer", "credentials": "receiver-secret"}
    made = _call(api_stack, name, "CreateTaskPushNotificationConfig",
                 {"taskId": task_id, "url": receiver.url, "token": "t1", "authentication": auth})["result"]  # fmt: skip
    assert made["taskId"] == task_id and made["url"] == receiver.url and made["id"]
    assert made["token"] == "t1" and made["authentication"] == auth
    named = _call(api_stack, name, "CreateTaskPushNotificationConfig",
                  {"taskId": task_id, "id": "mine", "url": receiver.url})["result"]  # fmt: skip
    assert named["id"] == "mine"
    got = _call(api_stack, name, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": made["id"]})["result"]
    assert got == made
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]["configs"]
    assert sorted(c["id"] for c in listed) == sorted([made["id"], "mine"])
    for _ in range(2):  # the same effect each time
        data = _call(api_stack, name, "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "mine"})
        assert "error" not in data, data
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]["configs"]
    assert [c["id"] for c in listed] == [made["id"]]
    gone = _call(api_stack, name, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "mine"})
    assert gone["error"]["code"] == -32001, gone


def test_each_change_the_task_waits_or_ends_at_is_posted_signed_with_the_configs_auth_and_a_stable_delivery_id(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    name = _agent(api_stack, TWO_APPROVALS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    auth = {"scheme": "Bearer", "credentials": "receiver-secret"}
    _call(api_stack, name, "CreateTaskPushNotificationConfig",
          {"taskId": task_id, "url": receiver.url, "token": "tok-1", "authentication": auth})  # fmt: skip
    second = _call(api_stack, name, "SendMessage", _send("approve", taskId=task_id)["params"])
    assert second["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", second  # the next question
    wait_for(lambda: len(receiver.taken()) >= 1, timeout=60, what="the input-required notification")
    done = _call(api_stack, name, "SendMessage", _send("approve", taskId=task_id)["params"])
    assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", done
    wait_for(lambda: len(receiver.taken()) >= 2, timeout=60, what="the completed notification")

    secret = api_stack.http("GET", "/webhooks/secret")[1]["secret"]
    taken = receiver.taken()
    # A StreamResponse, exactly one of its fields: a status update, and at the end the task with its artifacts.
    assert [set(body) for _, body in taken] == [{"statusUpdate"}, {"task"}]
    update, ended = taken[0][1]["statusUpdate"], taken[1][1]["task"]
    assert update["status"]["state"] == "TASK_STATE_INPUT_REQUIRED" and update["taskId"] == task_id
    assert ended["status"]["state"] == "TASK_STATE_COMPLETED" and ended["id"] == task_id
    assert update["contextId"] and ended["contextId"] == update["contextId"]
    got = _call(api_stack, name, "GetTask", {"id": task_id})["result"]
    assert ended["artifacts"] == got["artifacts"] and got["artifacts"][0]["parts"][0]["text"] == "shipped"
    for headers, _ in taken:
        assert headers["authorization"] == "Bearer receiver-secret" and headers["x-a2a-notification-token"] == "tok-1"
    for headers, raw, _ in receiver.received:
        assert verify(secret, headers[SIGNATURE_HEADER], raw)
    # The first POST was refused (500) and tried again: the same delivery id, so the receiver dedupes.
    assert receiver.received[0][2] == 500
    assert receiver.received[0][0]["agentq-delivery"] == receiver.received[1][0]["agentq-delivery"]
    assert receiver.received[0][1] == receiver.received[1][1]
    assert len({h["agentq-delivery"] for h, _ in taken}) == 2  # two changes, two ids


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://localhost:8443/x",
        "https://10.1.2.3/x",
        "https://192.168.0.7/x",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/x",
        "http://example.com/hook",
        "ftp://example.com/x",
    ],
)
def test_a_push_url_that_leads_inside_or_is_not_https_is_invalid_params_naming_url_and_nothing_is_stored(
    api_stack: ApiStack, url: str
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    refused = _call(api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url})
    assert refused["error"]["code"] == -32602 and refused["error"]["message"].startswith("url: "), refused
    with_send = {**_send("hi")["params"], "configuration": {"taskPushNotificationConfig": {"url": url}}}
    assert _call(api_stack, name, "SendMessage", with_send)["error"]["code"] == -32602
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]
    assert not listed.get("configs")
    tasks = _call(api_stack, name, "ListTasks", {})["result"].get("tasks", [])
    assert [t["id"] for t in tasks] == [task_id]  # the refused send started no task


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"token": "t\r\nX-Injected: 1"}, "token"),
        ({"token": "caf\u00e9-\u20ac"}, "token"),  # beyond Latin-1
        ({"authentication": {"scheme": "Bearer\r\nX-Injected: 1", "credentials": "c"}}, "authentication.scheme"),
        ({"authentication": {"scheme": "Bearer realm", "credentials": "c"}}, "authentication.scheme"),
        ({"authentication": {"scheme": "Bearer", "credentials": "c\nX-Injected: 1"}}, "authentication.credentials"),
        ({"authentication": {"scheme": "Bearer", "credentials": "c\x00"}}, "authentication.credentials"),
    ],
    ids=["token-crlf", "token-not-latin-1", "scheme-crlf", "scheme-not-a-token", "credentials-lf", "credentials-nul"],
)
def test_a_push_config_no_push_could_send_as_headers_is_invalid_params_naming_the_field_and_nothing_is_stored(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], field: str
) -> None:
    """A token and an authentication are sent with each push as headers (``X-A2A-Notification-Token``,
    ``Authorization: <scheme> <credentials>``). One holding CR/LF, another control character or a
    character beyond Latin-1 was stored, and every push of it was dead-lettered (http.client:
    'Invalid header value'), the client told nothing: now invalid params naming the field, by
    Create and with a send alike, nothing stored and no task started."""
    monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", "127.0.0.1:9")
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    config = {"url": "http://127.0.0.1:9/hook", **config}
    refused = _call(api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": task_id, **config})
    assert refused.get("error", {}).get("code") == -32602, refused
    assert refused["error"]["message"].startswith(f"{field}: "), refused
    with_send = {**_send("hi")["params"], "configuration": {"taskPushNotificationConfig": config}}
    assert _call(api_stack, name, "SendMessage", with_send).get("error", {}).get("code") == -32602
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]
    assert not listed.get("configs")
    tasks = _call(api_stack, name, "ListTasks", {})["result"].get("tasks", [])
    assert [t["id"] for t in tasks] == [task_id]  # the refused send started no task


def test_another_tenants_task_takes_no_push_config_and_shows_none(api_stack: ApiStack) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    other = api_stack.other_key
    # The other tenant with an agent of the same name: its endpoint exists, the task is not its.
    status, data, _ = api_stack.http(
        "POST", "/agents", {"name": name, "provider": "scripted", "script": {"turns": [{"text": "x"}]}}, key=other
    )
    assert status == 201, data
    params = {"taskId": task_id, "id": "theirs", "url": f"https://example.com/{uuid.uuid4().hex}"}
    for method in ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig",
                   "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig"):  # fmt: skip
        answer = _call(api_stack, name, method, params, key=other)
        assert answer["error"]["code"] == -32001, (method, answer)
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]
    assert not listed.get("configs")


def test_a_task_that_ended_takes_a_push_config_as_the_protocol_keeps_one_until_the_end(api_stack: ApiStack) -> None:
    """Clients (the TCK among them) set a config on whatever task they hold, an ended one too:
    it is stored and listed, and nothing more is sent for the task."""
    name = _agent(api_stack, [{"text": "done"}])
    data = _call(api_stack, name, "SendMessage", _send("hi")["params"])
    task_id = data["result"]["task"]["id"]
    assert data["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", data
    made = _call(
        api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": "https://example.com/h"}
    )
    assert made["result"]["taskId"] == task_id, made
    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]["configs"]
    assert [c["id"] for c in listed] == [made["result"]["id"]]


def test_a_push_config_given_with_the_send_is_in_place_before_the_task_runs_so_a_pause_at_once_notifies(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    """The config of ``configuration.taskPushNotificationConfig`` is stored under the task's id
    before the task is submitted: a task that asks for approval in its first turn (on a worker that
    took it within milliseconds) still has its ``input-required`` sent, every one of many sent at once."""
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    def send(i: int) -> str:
        params = _send(f"ship release {i}")["params"]
        params["configuration"] = {"returnImmediately": True,
                                   "taskPushNotificationConfig": {"url": receiver.url, "token": f"n{i}"}}  # fmt: skip
        return str(_call(api_stack, name, "SendMessage", params)["result"]["task"]["id"])

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(send, range(SENDS_AT_ONCE)))
    assert len(ids) == SENDS_AT_ONCE
    for task_id in ids:  # every task paused: each is input-required now
        api_stack.until(task_id, lambda view: view["status"] == "paused")

    def notified() -> set[str]:
        return {b["statusUpdate"]["taskId"] for _, b in receiver.taken()
                if b.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_INPUT_REQUIRED"}  # fmt: skip

    wait_for(lambda: notified() >= ids, timeout=60, what="an input-required notification of every task")
    for task_id in ids:  # and the config is the task's, readable as any
        listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]["configs"]
        assert [c["url"] for c in listed] == [receiver.url]


def test_a_push_config_given_with_the_send_hears_of_a_task_that_ends_within_its_submission(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    """The sharpest case of the above, without a race: a task whose concurrency key is full and
    whose agent says ``skip`` ends ``canceled`` inside its own submission, before the send
    returns; its config was stored first, so the end is posted."""
    key = {"key": f"k-{uuid.uuid4().hex[:8]}", "limit": 1, "on_conflict": "skip"}
    name = _agent(api_stack, [{"text": "slow", "latency_seconds": 30}], concurrency=key)
    immediately = {"returnImmediately": True}
    holder = _call(api_stack, name, "SendMessage", {**_send("hold the key")["params"], "configuration": immediately})
    holder_id = holder["result"]["task"]["id"]
    params = _send("skipped")["params"]
    params["configuration"] = {**immediately, "taskPushNotificationConfig": {"url": receiver.url, "token": "s"}}
    skipped = _call(api_stack, name, "SendMessage", params)["result"]["task"]
    assert skipped["status"]["state"] == "TASK_STATE_CANCELED", skipped  # ended before the answer
    try:
        wait_for(lambda: any(b.get("statusUpdate", {}).get("taskId") == skipped["id"] for _, b in receiver.taken()),
                 timeout=30, what="the canceled notification of the task skipped at its submission")  # fmt: skip
        (update,) = [b["statusUpdate"] for _, b in receiver.taken() if "statusUpdate" in b]
        assert update["status"]["state"] == "TASK_STATE_CANCELED" and update["taskId"] == skipped["id"]
    finally:
        _call(api_stack, name, "CancelTask", {"id": holder_id})


def test_a_send_refused_after_its_config_was_stored_leaves_no_config(api_stack: ApiStack, receiver: Receiver) -> None:
    """A submission refused once the config is in place (here: the agent's scope is stopped)
    takes the config away: nothing is stored for a task that does not exist."""
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    before = _push_items(api_stack)
    status, data, _ = api_stack.http("POST", "/stops", {"agent": name})
    assert status in (200, 201), data
    params = _send("ship it")["params"]
    params["configuration"] = {"taskPushNotificationConfig": {"url": receiver.url}}
    refused = _call(api_stack, name, "SendMessage", params)
    assert "error" in refused, refused
    assert _push_items(api_stack) == before


def _push_items(api_stack: ApiStack) -> list[Any]:
    """Every push config item in the stack's table (a scan: the test's only way to see one stored
    under a task id nobody was told)."""
    stack = api_stack.stack
    assert stack.settings is not None
    items = dynamo(stack.store()).client.scan(TableName=stack.settings.table, ConsistentRead=True)["Items"]
    return sorted((i["pk"]["S"], i["sk"]["S"]) for i in items if i["pk"]["S"].startswith("A2APUSH#"))


def test_a_refused_message_to_a_task_takes_back_the_config_it_came_with_and_keeps_the_one_it_replaced(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    task_id = _paused(api_stack, name)
    _call(api_stack, name, "CreateTaskPushNotificationConfig",
          {"taskId": task_id, "id": "kept", "url": receiver.url, "token": "old"})  # fmt: skip
    for config in ({"id": "new", "url": receiver.url}, {"id": "kept", "url": receiver.url, "token": "replacing"}):
        params = _send("x" * (MAX_NOTE_CHARS + 1), taskId=task_id)["params"]  # a note too long: refused
        params["configuration"] = {"taskPushNotificationConfig": config}
        refused = _call(api_stack, name, "SendMessage", params)
        assert refused["error"]["code"] == -32602 and "message.parts" in refused["error"]["message"], refused
        listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id})["result"]["configs"]
        assert [(c["id"], c.get("token")) for c in listed] == [("kept", "old")]


def test_a_push_config_the_server_accepts_on_a_task_started_outside_a2a_is_delivered(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    """Over A2A a client sees every task of the agent (ListTasks, GetTask), one started with
    ``POST /tasks`` too, and may set a config on it: the config is heard, the next question as
    the end, as for a task the A2A server started."""
    name = _agent(api_stack, TWO_APPROVALS, tools=["request_approval"])
    status, made, _ = api_stack.http("POST", "/tasks", {"agent": name, "goal": "build and ship"})
    assert status in (200, 201, 202), made
    task_id = made["task_id"]
    api_stack.until(task_id, lambda v: v["status"] == "paused")
    shown = _call(api_stack, name, "GetTask", {"id": task_id})["result"]
    assert shown["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    created = _call(api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": receiver.url})
    assert "result" in created, created
    assert api_stack.http("POST", f"/tasks/{task_id}/approve", {})[0] == 200
    wait_for(lambda: len(receiver.taken()) >= 1, timeout=60, what="the input-required notification")
    assert api_stack.http("POST", f"/tasks/{task_id}/approve", {})[0] == 200
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    wait_for(lambda: len(receiver.taken()) >= 2, timeout=60, what="the completed notification")
    update, ended = (body for _, body in receiver.taken())
    assert update["statusUpdate"]["taskId"] == task_id
    assert update["statusUpdate"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert ended["task"]["id"] == task_id and ended["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


def test_a_push_config_set_while_a_task_started_outside_a2a_runs_hears_of_its_end(
    api_stack: ApiStack, receiver: Receiver
) -> None:
    """The config is read when the task ends, not from the worker's copy of the task, which was
    read before the run the config was set in."""
    name = _agent(api_stack, [{"text": "done", "latency_seconds": 4}])
    status, made, _ = api_stack.http("POST", "/tasks", {"agent": name, "goal": "take your time"})
    assert status in (200, 201, 202), made
    task_id = made["task_id"]
    api_stack.until(task_id, lambda v: v["status"] == "running")
    created = _call(api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": receiver.url})
    assert "result" in created, created
    assert api_stack.until(task_id, lambda v: v["status"] == "succeeded")["status"] == "succeeded"
    wait_for(lambda: len(receiver.taken()) >= 1, timeout=60, what="the completed notification")
    ((_, ended),) = receiver.taken()
    assert ended["task"]["id"] == task_id and ended["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.fixture
def two_receivers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Receiver, Receiver]]:
    """The tenant's backend and a server of the end user's own, both let in by the webhooks'
    development allowance (loopback)."""
    backend, users = Receiver(path="/tenant-backend"), Receiver(path="/users-own-server")
    ports = [r.server.server_address[1] for r in (backend, users)]
    monkeypatch.setenv("AGENTQ_WEBHOOK_ALLOW", ",".join(f"127.0.0.1:{p}" for p in ports))
    yield backend, users
    backend.server.shutdown()
    users.server.shutdown()


def _no_push(answer: dict[str, Any], field: str) -> None:
    """The protocol's PushNotificationNotSupported (the card a token reads says
    ``pushNotifications: false``), naming the field."""
    error = answer.get("error") or {}
    named = [d.get("metadata", {}).get("field") for d in error.get("data") or [] if isinstance(d, dict)]
    assert error.get("code") == -32003 and named == [field], answer  # the field in the ErrorInfo's metadata
    assert error["message"].startswith(f"{field}: "), answer


def test_an_end_users_token_gets_nothing_signed_with_its_tenants_callback_secret_through_an_a2a_push_config(
    api_stack: ApiStack, two_receivers: tuple[Receiver, Receiver]
) -> None:
    """A token may not set ``notify`` (tests/test_end_user_auth.py::
    test_an_end_users_token_may_not_redirect_or_drop_its_agents_callback): a callback is signed
    with the tenant's secret for the tenant's backend. A push config is the same thing by another
    door: a token set one on its own task (with the send, or CreateTaskPushNotificationConfig)
    and the task's end was POSTed to a server of its own, signed with the tenant's secret. Both
    doors are the protocol's PushNotificationNotSupported naming the field, nothing stored, no
    task started; the tenant's key still sets one on the user's task, and hears its end."""
    backend, users = two_receivers
    tenant = f"a2a-push-eu-{uuid.uuid4().hex[:6]}"
    key = api_stack.stack.create_api_key(tenant)
    token = api_stack.stack.token(user="mallory", tenant=tenant)
    name = _agent(api_stack, [{"text": "done", "latency_seconds": 4}], key=key)
    secret = api_stack.http("GET", "/webhooks/secret", key=key)[1]["secret"]
    before = _push_items(api_stack)

    params = {**_send("hello")["params"], "configuration": {"taskPushNotificationConfig": {"url": users.url}}}
    sent = _call(api_stack, name, "SendMessage", params, key=token)
    if "error" not in sent:  # the config was taken: wait for what it was sent
        wait_for(lambda: bool(users.received), timeout=30, what="the push to the user's server")
    signed = [raw for headers, raw, _ in users.received if verify(secret, headers.get(SIGNATURE_HEADER, ""), raw)]
    assert signed == [], f"the token's server got {len(signed)} POST(s) signed with the tenant's secret"
    _no_push(sent, "configuration.taskPushNotificationConfig")
    assert _call(api_stack, name, "ListTasks", {}, key=token)["result"].get("tasks", []) == []  # none started

    mine = _call(api_stack, name, "SendMessage", {**_send("hello")["params"], "configuration":
                 {"returnImmediately": True}}, key=token)["result"]["task"]["id"]  # fmt: skip
    theirs = _call(api_stack, name, "CreateTaskPushNotificationConfig", {"taskId": mine, "url": backend.url}, key=key)
    assert "result" in theirs, theirs
    for config in ({"taskId": mine, "url": users.url}, {"taskId": mine, "id": "own", "url": users.url, "token": "t"}):
        _no_push(_call(api_stack, name, "CreateTaskPushNotificationConfig", config, key=token), "url")
    with_message = {**_send("and more", taskId=mine)["params"],
                    "configuration": {"taskPushNotificationConfig": {"url": users.url}}}  # fmt: skip
    _no_push(_call(api_stack, name, "SendMessage", with_message, key=token), "configuration.taskPushNotificationConfig")
    wait_for(lambda: len(backend.taken()) >= 1, timeout=60, what="the tenant's push of the task's end")
    assert [b["task"]["id"] for _, b in backend.taken()] == [mine]
    assert users.received == []
    stored = [sk for pk, sk in _push_items(api_stack) if (pk, sk) not in before]
    assert stored == [theirs["result"]["id"]]


def test_a_push_config_its_tenant_set_on_a_users_task_is_neither_read_nor_replaced_nor_deleted_by_that_users_token(
    api_stack: ApiStack,
) -> None:
    """The tenant's backend (its key) sets a push config on a user's task (any task of the agent
    takes one), with the credentials its own receiver checks (``authentication``, ``token``). The
    user's token listed and got it, credentials and all, and could replace it (the same ``id``,
    its URL now the user's, so the tenant's signed pushes went there) or delete it (the tenant
    heard nothing more): what a token may not do to an agent's ``notify``. A token's card says
    ``pushNotifications: false``, so its Create, Get, List and Delete are all
    PushNotificationNotSupported naming the field (A2A 1.0 3.3.4: MUST), as Create and Delete
    were, where Get and List answered as if supported (the config without its credentials); the
    key reads it whole, as it set it."""
    tenant = f"a2a-pushcfg-eu-{uuid.uuid4().hex[:6]}"
    key = api_stack.stack.create_api_key(tenant)
    alice = api_stack.stack.token(user="alice", tenant=tenant)
    name = _agent(api_stack, [{"text": "done"}], key=key)
    task_id = api_stack.submit({"goal": "hi", "agent": name}, key=alice)
    api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=alice)
    theirs = {"taskId": task_id, "id": "tenant-backend", "url": "https://backend.example.com/a2a-hooks",
              "token": "tenant-notification-token",
              "authentication": {"scheme": "Bearer", "credentials": "tenant-backend-secret"}}  # fmt: skip
    made = _call(api_stack, name, "CreateTaskPushNotificationConfig", theirs, key=key)["result"]
    card = api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json", key=alice)[1]
    assert card["capabilities"]["pushNotifications"] is False

    listed = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id}, key=alice)
    got = _call(
        api_stack, name, "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "tenant-backend"}, key=alice
    )
    for shown in (str(listed), str(got)):
        assert "tenant-backend-secret" not in shown and "tenant-notification-token" not in shown, shown
        assert "backend.example.com" not in shown, shown
    _no_push(listed, "taskId")
    _no_push(got, "id")
    mine = {"taskId": task_id, "id": "tenant-backend", "url": "https://users-own.example.net/hook"}
    _no_push(_call(api_stack, name, "CreateTaskPushNotificationConfig", mine, key=alice), "url")
    deleted = _call(api_stack, name, "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "tenant-backend"},
                    key=alice)  # fmt: skip
    _no_push(deleted, "id")
    kept = _call(api_stack, name, "ListTaskPushNotificationConfigs", {"taskId": task_id}, key=key)["result"]["configs"]
    assert kept == [made] and made["authentication"] == theirs["authentication"] and made["token"] == theirs["token"]


def test_an_end_users_token_reads_a_card_without_push_notifications_and_a_key_reads_one_with(
    api_stack: ApiStack,
) -> None:
    """The card says what its reader may do: push notifications are the tenant's (its key's), so
    a token's card says ``pushNotifications: false``, as its push methods answer; the card varies
    by who asks (``Vary: Authorization``), so no cache hands one reader's to the other."""
    tenant = f"a2a-card-eu-{uuid.uuid4().hex[:6]}"
    key = api_stack.stack.create_api_key(tenant)
    token = api_stack.stack.token(user="alice", tenant=tenant)
    name = _agent(api_stack, [{"text": "done"}], key=key)
    path = f"/a2a/{name}/.well-known/agent-card.json"
    for who, pushes in ((key, True), (token, False)):
        status, card, headers = api_stack.http("GET", path, key=who)
        assert status == 200, card
        assert card["capabilities"] == {"streaming": True, "pushNotifications": pushes, "extendedAgentCard": False}
        assert "authorization" in {h.strip().lower() for h in headers.get("Vary", "").split(",")}, headers
