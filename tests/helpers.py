"""Small builders shared by tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentq.core.models import TaskSubmission
from agentq.storage.container import Storage
from agentq.storage.dynamodb import DynamoTable
from agentq.storage.serdes import PayloadStore
from agentq.storage.table import plain
from agentq.storage.tier_slots import tier_pk
from agentq_dev import forkserver

if TYPE_CHECKING:
    from agentq.core.engine import Engine


def scripted(turns: Sequence[object], *, tools: list[str] | None = None, **constraints: Any) -> TaskSubmission:
    """A scripted-provider submission. ``turns`` are JSON-shaped dicts (mixed value types, so
    a literal list of them infers as ``list[object]``); TaskSubmission validates them."""
    return TaskSubmission.model_validate(
        {
            "goal": "test goal",
            "provider": "scripted",
            "script": {"turns": turns},
            "constraints": {"tools": tools or [], **constraints},
        }
    )


def call(name: str, **inputs: Any) -> dict[str, Any]:
    return {"name": name, "input": inputs}


def deployment(moto_server: Any, **queue_settings: Any) -> Any:
    """Table, bucket, tier queues (with DLQs) and the fan-out machine under a prefix of the
    caller's own, on the shared moto server."""
    import uuid

    from agentq.resources import QueueSettings, provision
    from agentq.runtime import Settings, session

    settings = Settings.for_prefix(
        f"t{uuid.uuid4().hex[:12]}", moto_server.endpoint_url, tool_modules=("tests.effect_tools",)
    )
    provision(
        session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings(**queue_settings)
    )
    return settings


def wait_for(predicate: Any, timeout: float = 60, what: str = "condition", interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; returns that value or fails naming ``what``. The
    default wait is long: it costs nothing when things are fast, and a real process on a busy
    two-core machine can take many seconds to get going."""
    import time

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not reached within {timeout}s"
        time.sleep(interval)
    return value


def live_texts_while_it_runs(store: Storage, engine: Engine, task_id: str) -> set[str]:
    """Run the task on ``engine`` in a thread and return every live text its view showed
    meanwhile (what `agentq watch` shows as the model writes), read every 0.1 s until the run
    returned."""
    import threading
    import time

    from agentq.api.views import task_view

    runner = threading.Thread(target=engine.run, args=(task_id,))
    runner.start()
    seen: set[str] = set()
    while runner.is_alive():
        live = task_view(store, store.tasks.get(task_id)).live_text
        if live:
            seen.add(live)
        time.sleep(0.1)
    runner.join()
    return seen


def dynamo(store: Storage) -> DynamoTable:
    """The DynamoDB table under a store from ``build_store``, for tests that read or write the
    table around the repositories (``Storage.table`` is typed by its protocol)."""
    assert isinstance(store.table, DynamoTable), type(store.table)
    return store.table


def s3_payloads(store: Storage) -> PayloadStore:
    """The S3 payload store under a store from ``build_store`` (its client and bucket)."""
    assert isinstance(store.payloads, PayloadStore), type(store.payloads)
    return store.payloads


def tier_running(store: Storage, tenant: str, tier: str = "normal") -> int:
    """The tenant's tasks holding its slot of ``tier``, as the slot item counts them."""
    return int(plain(store.table.get({"pk": tier_pk(tenant, tier), "sk": "RUNNING"}) or {}).get("running", 0))


def queue_depth(queues: Any, url: str) -> int:
    """Every message the queue holds: visible, in flight and delayed."""
    attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return sum(
        int(attrs[k])
        for k in (
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        )
    )


def _tables_of(params: dict[str, Any]) -> set[str]:
    """The tables a DynamoDB request names."""
    if "TableName" in params:
        return {params["TableName"]}
    if "RequestItems" in params:
        return set(params["RequestItems"])
    return {op["TableName"] for item in params.get("TransactItems", []) for op in item.values()}


def dynamodb_partitions(monkeypatch: Any, table: str) -> list[tuple[str, set[str]]]:
    """Every DynamoDB call on ``table`` this process makes from here on (through botocore,
    unchanged; whatever else the process runs has tables of its own), with the partition keys it
    names: ``pk`` of its keys and items, ``:pk`` of its key condition. What IAM's
    ``dynamodb:LeadingKeys`` condition sees, for the tests that a role restricted to some
    partitions does all its code needs."""
    import botocore.client

    calls: list[tuple[str, set[str]]] = []
    original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]

    def walk(value: Any, into: set[str]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k in ("pk", ":pk") and isinstance(v, dict) and "S" in v:
                    into.add(v["S"])
                else:
                    walk(v, into)
        elif isinstance(value, list):
            for v in value:
                walk(v, into)

    def recording(client: Any, operation: str, params: dict[str, Any]) -> Any:
        if client.meta.service_model.service_name == "dynamodb" and table in _tables_of(params):
            pks: set[str] = set()
            walk(params, pks)
            calls.append((operation, pks))
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return calls


def python_process(argv: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    """``python ARGV`` (``-m MODULE ...``, ``-c CODE ...``, ``SCRIPT ...``) as a process of its own
    (``popen``: stdin, stdout, stderr, text, cwd as for ``Popen``): forked warm from the test
    process's fork server (tests/conftest.py), which saves it the interpreter's start and the
    imports of agentq, moto, boto3 and the model SDKs; started as a program without one."""
    server = os.environ.get(forkserver.ENV_VAR)
    if server:
        return forkserver.ForkedProcess(server, argv, env, **popen)
    return subprocess.Popen([sys.executable, *argv], env=env, start_new_session=True, **popen)


def run_python(
    argv: list[str], env: dict[str, str], timeout: float, cwd: Any = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, *argv], capture_output=True, text=True)`` through ``python_process``."""
    proc = python_process(argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def agentq_process(args: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
    """``python -m agentq ARGS`` through ``python_process``."""
    return python_process(["-m", "agentq", *args], env, **popen)


def run_agentq(
    args: list[str], env: dict[str, str], timeout: float, cwd: Any = None
) -> subprocess.CompletedProcess[str]:
    """``python -m agentq ARGS`` through ``run_python``."""
    return run_python(["-m", "agentq", *args], env, timeout, cwd)


def sent_key(request: Any) -> str | None:
    """The key as the SDK sent it: ``x-api-key`` (older SDKs) or ``Authorization: Bearer``."""
    bearer = request.headers.get("authorization", "")
    return request.headers.get("x-api-key") or (
        bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
    )


def in_forked_child(body: Callable[[], object], *, seconds: float = 60) -> None:
    """Run ``body`` in a child forked from this process, threads and locks as they are now, and
    fail unless it returns within ``seconds`` (a child still running then is killed); what it
    raised, an assertion included, is printed from the child and fails the caller."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + seconds
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child did not end within {seconds} s")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(ended[1]) == 0, "the forked child failed: its traceback is above"


def api_json(base_url: str, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to a local stack's API with a tenant key: its status and its JSON body,
    an error status's too."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
