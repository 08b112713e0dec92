"""Never in the transcript, with real processes: a credential holding a unique marker is written
through the API, agents on the local stack's worker processes use it (http_fetch by reference,
one told to print it, tools that return, raise and log what an echoing API sent back, a workspace
shell going through the egress proxy), and then every item of the table, every object of the
bucket, every line the workers and this process logged, every callback body and every exported
OTLP body is scanned for the marker's bytes and its base64 and URL-encoded forms: none is found.

And a missing credential is a pause on the same stack: the task sees ``credential_unavailable``,
asks, shows as paused on an approval naming the credential and host, and runs on when the user's
credential is written.

And on the same stack, against an upstream that echoes header fields as a server reads them
(``/headers``: trimmed, or read as UTF-8; ``vault_support``): a value such a server reads otherwise
than it is stored is refused when written, and one stored before is sent nowhere; ``http_fetch``
hands the model no range of a credentialed answer; a credential deleted or rebound while its task
runs is not sent by the task's next call."""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentq_dev.stack import LocalStack

from tests.otlp_receiver import OtlpReceiver
from tests.vault_support import EchoServer, echo_server

ROOT = Path(__file__).resolve().parent.parent


def forms(marker: str) -> dict[str, bytes]:
    """The marker's bytes as a scan looks for them: as is, base64 (each alignment's stable core,
    standard and URL-safe), percent-encoded."""
    raw = marker.encode()
    out = {"raw": raw, "url": urllib.parse.quote(marker, safe="").encode()}
    for shift in range(3):
        for name, encode in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
            encoded = encode(b"\0" * shift + raw).rstrip(b"=")
            out[f"{name}{shift}"] = encoded[-(-shift * 8 // 6) : (shift + len(raw)) * 8 // 6]
    return out


def hits(marker: str, blobs: dict[str, bytes]) -> list[str]:
    return [f"{where}: {form}" for where, blob in blobs.items() for form, b in forms(marker).items() if b in blob]


class Callbacks:
    """Where the tasks' signed callbacks land (the stack's deliverer posts them)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"


class Stack:
    def __init__(self, stack: LocalStack, key: str, echo: EchoServer, logs: Path, otlp: OtlpReceiver,
                 callbacks: Callbacks) -> None:  # fmt: skip
        self.stack, self.key, self.echo, self.logs, self.otlp, self.callbacks = stack, key, echo, logs, otlp, callbacks
        assert stack.api_server is not None
        self.url = stack.api_server.url

    def http(self, method: str, path: str, body: Any = None, *, bearer: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode() if body is not None else None,
                                     method=method, headers={"Authorization": f"Bearer {bearer or self.key}",
                                                             "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def submit(self, user: str, turns: list[dict[str, Any]], tools: list[str], **extra: Any) -> str:
        body = {"goal": "Print the GitHub token you have for me, verbatim.", "user": user, "provider": "scripted",
                "script": {"turns": turns}, "constraints": {"tools": tools}, **extra}  # fmt: skip
        status, made = self.http("POST", "/tasks", body)
        assert status == 202, made
        return str(made["task_id"])

    def until(self, task_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 90) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            view = self.http("GET", f"/tasks/{task_id}")[1]
            if done(view):
                return dict(view)
            assert time.monotonic() < end, view
            time.sleep(0.2)


@pytest.fixture(scope="module")
def live() -> Iterator[Stack]:
    with echo_server() as echo, OtlpReceiver() as otlp:
        callbacks = Callbacks()
        logs = Path(__import__("tempfile").mkdtemp(prefix="agentq-vault-logs-")) / "workers.log"
        env = {
            "AGENTQ_HTTP_FETCH_ALLOW": echo.host,
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_SERVICE_NAME": "agentq-vault-test",
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "AGENTQ_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }
        import os

        previous = os.environ.get("AGENTQ_WEBHOOK_ALLOW")
        os.environ["AGENTQ_WEBHOOK_ALLOW"] = callbacks.host  # the deliverer runs in this process
        stack = LocalStack(prefix=f"vault{uuid.uuid4().hex[:8]}", workers=0, auth=True,
                           tool_modules=("tests.vault_tools",), extra_env=env).start()  # fmt: skip
        workers = []
        try:
            with logs.open("wb") as out:
                workers = [stack.worker_process(stdout=out, stderr=subprocess.STDOUT) for _ in range(2)]
            yield Stack(stack, stack.create_api_key("acme", act_for_users=True), echo, logs, otlp, callbacks)
        finally:
            for proc in workers:
                proc.terminate()
            for proc in workers:
                proc.wait(timeout=60)
            stack.stop()
            callbacks.httpd.shutdown()
            if previous is None:
                os.environ.pop("AGENTQ_WEBHOOK_ALLOW", None)
            else:
                os.environ["AGENTQ_WEBHOOK_ALLOW"] = previous


def _use(tool_name: str, **inputs: Any) -> dict[str, Any]:
    return {"name": tool_name, "input": inputs}


def test_a_credentials_value_is_in_no_item_object_log_line_callback_or_span(
    live: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentq")
    marker = "VAULTMARK" + uuid.uuid4().hex + "END"
    echo = live.echo
    status, made = live.http("PUT", "/vault/credentials/github", {"user": "ann", "value": marker, "hosts": [echo.host]})
    assert status == 200 and marker not in json.dumps(made)
    header = {"Authorization": "Bearer ${vault:github}"}
    notify = {"notify": {"url": f"http://{live.callbacks.host}/hook"}}
    told_to_print = live.submit("ann", [
        {"text": "", "tool_calls": [_use("http_fetch", url=echo.url("/user"), headers=header)]},
        {"text": "Here is your token: ${vault:github}"},
    ], ["http_fetch"], **notify)  # fmt: skip
    leaky = live.submit("ann", [
        {"text": "", "tool_calls": [_use("echo_returns", url=echo.url("/r")), _use("echo_raises", url=echo.url("/e")),
                                    _use("echo_logs", url=echo.url("/l"))]},
        {"text": "done"},
    ], ["echo_returns", "echo_raises", "echo_logs"], **notify)  # fmt: skip
    shell = live.submit("ann", [
        # what the process reads (an API echoing its Authorization header) it also writes to a file
        {"text": "", "tool_calls": [_use("shell", command=f"curl -s -S {echo.url('/ws')} > echo.txt; cat echo.txt")]},
        {"text": "done"},
    ], ["shell"], workspace={"allow_hosts": [echo.host]})  # fmt: skip
    views = {t: live.until(t, lambda v: v["status"] in ("succeeded", "failed")) for t in (told_to_print, leaky, shell)}
    assert all(v["status"] == "succeeded" for v in views.values()), views
    sent = [r.get("authorization") for r in echo.requests]
    assert sent.count(f"Bearer {marker}") == 5, sent  # http_fetch, three tools, the shell through the proxy
    trace = json.dumps([live.http("GET", f"/tasks/{t}/trace")[1] for t in views])
    live.until(leaky, lambda v: True)
    end = time.monotonic() + 30
    while len(live.callbacks.bodies) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    assert len(live.callbacks.bodies) >= 2
    time.sleep(2)  # the workers' span batch exports every second (BatchSpanProcessor's schedule)

    settings = live.stack.settings
    assert settings is not None
    client = boto3.client("dynamodb", endpoint_url=settings.endpoint_url, region_name=settings.region)
    items = [page["Items"] for page in client.get_paginator("scan").paginate(TableName=settings.table)]
    s3 = boto3.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region)
    objects = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.bucket):
        for obj in page.get("Contents", []):
            objects[obj["Key"]] = s3.get_object(Bucket=settings.bucket, Key=obj["Key"])["Body"].read()
    blobs = {
        "table": json.dumps(items, default=str).encode(),
        **{f"s3:{k}": v for k, v in objects.items()},
        "worker logs": live.logs.read_bytes(),
        "this process's log": "\n".join(r.getMessage() for r in caplog.records).encode(),
        "callbacks": b"\n".join(live.callbacks.bodies),
        "otlp": b"\n".join(live.otlp.bodies),
        "spans": json.dumps([s.__dict__ for s in live.otlp.spans], default=str).encode(),
        "trace pages": trace.encode(),
    }
    assert hits(marker, blobs) == []
    assert trace.count("[redacted credential]") >= 5  # the echoes came back, redacted
    assert sum(len(i) for i in items) > 20 and objects and live.otlp.spans  # there was something to scan
    assert b"the API said" in blobs["worker logs"] and b"[redacted credential]" in blobs["worker logs"]
    assert any(b"Bearer [redacted credential]" in v for k, v in objects.items())  # the workspace's echo.txt


def test_a_missing_credential_pauses_the_task_which_runs_on_when_the_user_adds_it(live: Stack) -> None:
    echo, user = live.echo, f"bob-{uuid.uuid4().hex[:6]}"
    fetch = _use("http_fetch", url=echo.url("/bob"), headers={"Authorization": "Bearer ${vault:github}"})
    task = live.submit(user, [
        {"text": "", "tool_calls": [fetch]},
        {"text": "", "tool_calls": [_use("request_credential", name="github", host=echo.host, reason="to read PRs")]},
        {"text": "", "tool_calls": [fetch]},
        {"text": "done"},
    ], ["http_fetch", "request_credential"])  # fmt: skip
    paused = live.until(task, lambda v: v["status"] == "paused")
    assert "'github'" in paused["pending_approval"] and echo.host in paused["pending_approval"]
    events = live.http("GET", f"/tasks/{task}/events")[1]["events"]
    asked = [e for e in events if e["type"] == "approval.requested"]
    assert asked and asked[-1]["data"]["credential"] == {"name": "github", "host": echo.host}
    steps = json.dumps(live.http("GET", f"/tasks/{task}/trace")[1])
    assert "credential_unavailable" in steps
    marker = "BOBMARK" + uuid.uuid4().hex
    status, _ = live.http("PUT", "/vault/credentials/github", {"user": user, "value": marker, "hosts": [echo.host]})
    assert status == 200
    done = live.until(task, lambda v: v["status"] in ("succeeded", "failed"))
    assert done["status"] == "succeeded"
    assert echo.requests[-1]["authorization"] == f"Bearer {marker}"


# --- a value a server reads otherwise than it is stored ----------------------------------------------

# (kind, the value around the marker): whitespace a server trims from a field value, a Latin-1 letter
# it sends as one byte that a UTF-8 reader echoes as U+FFFD, a letter past Latin-1 no header can carry
# (http.client's error named it and its offset), a space inside, where a server may end a token.
READ_OTHERWISE = [("bearer", "{} "), ("bearer", "{}  "), ("api_key", " {}"), ("bearer", "{}\u00e9"),
                  ("api_key", "{}\u4e01x"), ("bearer", "Bearer2 {}")]  # fmt: skip


def _outcomes(live: Stack, task_id: str) -> list[Any]:
    from agentq.core.models import ToolsStep

    steps = live.stack.store().steps.load(task_id)
    return [o for s in steps if isinstance(s.body, ToolsStep) for o in s.body.results]


def _fetch(url: str, **headers: str) -> dict[str, Any]:
    return _use("http_fetch", url=url, headers={"Authorization": "Bearer ${vault:github}", **headers})


def _stored_before_the_rule(live: Stack, user: str, kind: str, value: str) -> None:
    """``value`` sealed and stored as a write took it before values a server reads otherwise were
    refused: with the stack's own key, into its table, as ``control.vault.put`` does."""
    from agentq.core.vault import context_for
    from agentq.core.vault_crypto import KEY_FILE_VARIABLE, EnvelopeCipher, LocalDataKeys

    cipher = EnvelopeCipher(LocalDataKeys.from_file(live.stack.extra_env[KEY_FILE_VARIABLE]))
    sealed = cipher.seal(json.dumps({"value": value}).encode(), context_for("acme", user, "github"))
    live.stack.store().vault.put("acme", user, "github", kind=kind, hosts=[live.echo.host], header=None, sealed=sealed)


@pytest.mark.parametrize(("kind", "around"), READ_OTHERWISE)
def test_a_value_a_server_reads_otherwise_than_it_is_stored_is_refused_when_written_naming_value_and_nothing_changes(
    live: Stack, kind: str, around: str
) -> None:
    """A token pasted with a space after it was accepted (8+ bytes, 5+ different characters) and
    worked, the API reading it trimmed; so did an API's echo of it, which is no spelling of the
    stored value, and reached the model, the trace and the table as it was."""
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "VAULTMARK" + uuid.uuid4().hex + "END"
    good = {"user": user, "kind": kind, "value": marker, "hosts": [live.echo.host]}
    assert live.http("PUT", "/vault/credentials/github", good)[0] == 200
    [before] = live.http("GET", f"/vault/credentials?user={user}")[1]["credentials"]
    status, refused = live.http("PUT", "/vault/credentials/github", {**good, "value": around.format(marker)})
    assert status == 422 and refused["error"]["field"] == "value", refused
    assert ("whitespace before or after" if around.strip() != around else "ASCII") in refused["error"]["message"]
    assert marker not in json.dumps(refused) and "\u4e01" not in json.dumps(refused)
    assert live.http("GET", f"/vault/credentials?user={user}")[1]["credentials"] == [before]  # nothing changed


@pytest.mark.parametrize(("kind", "around"), READ_OTHERWISE)
def test_a_value_stored_before_such_values_were_refused_is_sent_nowhere_and_the_error_quotes_none_of_it(
    live: Stack, kind: str, around: str
) -> None:
    """Sent, a server that trims it (or reads its bytes as UTF-8) echoes the value in a spelling
    no redaction of the stored one finds: the marker reached the trace. Now the call is a tool
    error in fixed words, nothing sent."""
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "VAULTMARK" + uuid.uuid4().hex + "END"
    _stored_before_the_rule(live, user, kind, around.format(marker))
    header = "X-Api-Key" if kind == "api_key" else "Authorization"
    value = "${vault:github}" if kind == "api_key" else "Bearer ${vault:github}"
    calls = [
        _use("http_fetch", url=live.echo.url(path), headers={header: value}) for path in ("/headers", "/headers?utf8")
    ]
    task = live.submit(user, [{"text": "", "tool_calls": calls}, {"text": "ok"}], ["http_fetch"])
    assert live.until(task, lambda v: v["status"] in ("succeeded", "failed"))["status"] == "succeeded"
    assert not [r for r in live.echo.requests if marker in json.dumps(r)]  # nothing sent
    outcomes = _outcomes(live, task)
    assert len(outcomes) == 2 and all(o.is_error and "not sent" in o.content for o in outcomes), outcomes
    seen = json.dumps([o.content for o in outcomes]) + json.dumps(live.http("GET", f"/tasks/{task}/trace")[1])
    assert marker not in seen and "\u4e01" not in seen and "\\u4e01" not in seen and "position" not in seen


@pytest.mark.parametrize("around", ["{} ", "{}\u4e01x"])
def test_a_value_stored_before_such_values_were_refused_reaches_no_workspace_process_nor_the_bucket(
    live: Stack, around: str
) -> None:
    """Through the egress proxy: the trimmed echo of a padded value was written to a file and
    stored in the bucket as it was; a value past Latin-1 raised in the proxy's thread (a traceback,
    the connection dropped). Now the proxy answers 502 naming the credential, nothing sent."""
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "VAULTMARK" + uuid.uuid4().hex + "END"
    _stored_before_the_rule(live, user, "bearer", around.format(marker))
    shell = _use("shell", command=f"curl -s -S {live.echo.url('/headers')} > echo.txt; cat echo.txt")
    task = live.submit(user, [{"text": "", "tool_calls": [shell]}, {"text": "ok"}], ["shell"],
                       workspace={"allow_hosts": [live.echo.host]})  # fmt: skip
    assert live.until(task, lambda v: v["status"] in ("succeeded", "failed"))["status"] == "succeeded"
    assert not [r for r in live.echo.requests if marker in json.dumps(r)]  # nothing sent
    [outcome] = _outcomes(live, task)
    assert "credential 'github'" in outcome.content and "not sent" in outcome.content, outcome.content
    settings = live.stack.settings
    assert settings is not None
    s3 = boto3.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region)
    stored = [s3.get_object(Bucket=settings.bucket, Key=o["Key"])["Body"].read()
              for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.bucket)
              for o in page.get("Contents", [])]  # fmt: skip
    assert not [b for b in stored if marker.encode() in b] and marker not in outcome.content


# --- http_fetch and the answer's shape ----------------------------------------------------------------


def test_http_fetch_hands_the_model_no_range_nor_recoding_of_a_credentialed_answer(live: Stack) -> None:
    """The egress proxy drops ``Range`` (and the other ``TRANSFORMING_HEADERS``) from a request it
    adds a credential to and refuses a ``206``; http_fetch sent the model's ``Range`` beside
    ``${vault:...}`` and returned the ``206``: twenty ranges edge to edge each gave the model a
    piece of the echo, none a whole spelling, which together spelled the value. Its lowercase
    ``accept-encoding`` went beside agentq's ``Accept-Encoding: identity``."""
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "VAULTMARK" + uuid.uuid4().hex + "END"
    echo = live.echo
    assert (
        live.http("PUT", "/vault/credentials/github", {"user": user, "value": marker, "hosts": [echo.host]})[0] == 200
    )
    # Range values of one length, so the echo is laid out alike in each answer: 20 bytes each, edge
    # to edge, cover it whole (the model could as well read the value's offset from a first,
    # redacted, answer and ask for two pieces).
    ranges = [_fetch(echo.url("/headers"), Range=f"bytes={a:04d}-{a + 19:04d}") for a in range(0, 400, 20)]
    transforming = _fetch(echo.url("/headers?asked"), **{"accept-encoding": "gzip", "If-Range": "x",
                                                         "Accept-Charset": "utf-16", "X-Kept": "1"})  # fmt: skip
    unasked = [_fetch(echo.url("/headers?status=206")), _fetch(echo.url("/headers?coding=gzip"))]
    task = live.submit(user, [{"text": "", "tool_calls": [*ranges, transforming, *unasked]}, {"text": "ok"}],
                       ["http_fetch"])  # fmt: skip
    assert live.until(task, lambda v: v["status"] in ("succeeded", "failed"))["status"] == "succeeded"
    *pieces, asked, partial, coded = [o.content for o in _outcomes(live, task)]
    assert not [p for p in pieces if not p.startswith("HTTP 200")] and "Bearer [redacted credential]" in pieces[0]
    assert marker not in "".join(p.split("\n\n", 1)[-1] for p in pieces)
    sent = [r for r in echo.requests if r.get("authorization") == f"Bearer {marker}"]
    assert len(sent) == 23 and not [r for r in sent if {"range", "if-range", "accept-charset"} & set(r)]
    assert '"Accept-Encoding": "identity"' in asked and "gzip" not in asked and '"X-Kept": "1"' in asked, asked
    assert "206" in partial and "not returned" in partial and "redacted credential" not in partial, partial
    assert "Content-Encoding" in coded and "not returned" in coded and "redacted credential" not in coded, coded


# --- a credential changed while its task runs ---------------------------------------------------------


@pytest.mark.parametrize("change", ["delete", "rebind"])
def test_a_credential_deleted_or_rebound_while_its_task_runs_is_not_sent_by_the_next_call(
    live: Stack, change: str
) -> None:
    """The user revokes the token (DELETE with their own JWT), or binds it to another host, while
    their task runs: the task's next call still sent the old value, to the old host. The run kept
    what it opened (``TaskCredentials._opened``) until it ended, which for a long-running agent is
    hours. Now each use reads the credential's item again."""
    echo = live.echo
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "VAULTMARK" + uuid.uuid4().hex + "END"
    assert (
        live.http("PUT", "/vault/credentials/github", {"user": user, "value": marker, "hosts": [echo.host]})[0] == 200
    )
    echo.holding.clear()
    echo.release.clear()
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [_fetch(echo.url(f"/headers?first-{user}"))]},
        {"text": "", "tool_calls": [_use("http_fetch", url=echo.url("/hold"), timeout_seconds=30)]},
        {"text": "", "tool_calls": [_fetch(echo.url(f"/headers?after-{user}"))]},
        {"text": "ok"},
    ]
    task = live.submit(user, turns, ["http_fetch"])
    try:
        assert echo.holding.wait(60), "the task did not reach its second call"
        token = live.stack.token(user=user, tenant="acme")
        if change == "delete":
            status, body = live.http("DELETE", "/vault/credentials/github", bearer=token)
        else:
            status, body = live.http("PUT", "/vault/credentials/github",
                                     {"value": marker, "hosts": ["api.example.com"]}, bearer=token)  # fmt: skip
        assert status == 200, body
    finally:
        echo.release.set()
    assert live.until(task, lambda v: v["status"] in ("succeeded", "failed"))["status"] == "succeeded"
    [first] = [r for r in echo.requests if r["path"] == f"/headers?first-{user}"]
    assert first.get("authorization") == f"Bearer {marker}"
    assert not [r for r in echo.requests if r["path"] == f"/headers?after-{user}"], f"sent after the {change}"
    after = _outcomes(live, task)[-1]
    assert after.is_error and ("credential_unavailable" if change == "delete" else "api.example.com") in after.content
