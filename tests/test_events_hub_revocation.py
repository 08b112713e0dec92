"""A stream held open on the events hub outlives the key that opened it. The hub authorised a
stream once, when it opened; a Fargate server holds it for as long as the task runs (hours, days
with approvals or a conversation left idle). docs/DEPLOY.md: a revoked key keeps working for
``api.authorizer_cache_seconds`` (60 s) at most. Here a key is revoked (a token expires) while its
stream is open and the task goes on committing: nothing committed more than that window after
may reach the stream, which ends without ``event: end`` (the task runs on: a client resumes from
its last id, and is refused 401).

The window is the hub's ``authorize_every`` (the deployment's ``api.authorizer_cache_seconds``,
``agentq.api.event_hub.authorize_seconds``), 2 s here so the test runs in seconds."""

from __future__ import annotations

import http.client
import threading
import time
from typing import Any

from agentq.api.app import build_app
from agentq.api.auth import header_authorizer
from agentq.api.event_hub import EventHub
from agentq.api.http_server import ApiServer
from agentq.core.tools.builtin import default_registry
from agentq.storage.container import Storage, memory_storage
from agentq_dev.oidc_issuer import LocalIssuer

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step

WINDOW = 2.0  # the hub's authorize_every: api.authorizer_cache_seconds (60 s deployed)
MARGIN = 1.0


class Watcher:
    """One client of a task's stream: when each committed step reached it, and whether it ended."""

    def __init__(self, port: int, task_id: str, header: str) -> None:
        self.port, self.task_id, self.header = port, task_id, header
        self.received: list[float] = []
        self.body: list[bytes] = []
        self.ended = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        resp = self.get()
        assert resp.status == 200
        try:
            for line in resp:
                self.body.append(line)
                if line.startswith(b"event: agent.message"):
                    self.received.append(time.monotonic())
        except OSError:
            pass
        self.ended.set()

    def get(self) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", f"/tasks/{self.task_id}/events",
                     headers={"Accept": "text/event-stream", "Authorization": self.header})  # fmt: skip
        return conn.getresponse()


def _commit_past_the_window(store: Storage, lease: Any, watcher: Watcher, since: float, first: int) -> list[float]:
    """Steps committed every 0.1 s until the window and two margins have passed (or the stream
    ended): of those committed later than the window and a margin, counted from ``since``, when
    each was committed, for each that reached the stream. Judged by when a step was committed,
    not when it arrived: one committed inside the window may arrive late on a loaded machine."""
    step, committed = first, {}
    while time.monotonic() - since < WINDOW + 2 * MARGIN and not watcher.ended.is_set():
        step += 1
        store.steps.commit(lease, step, llm_step(text=f"after {step}."), root_id=lease.task_id)
        committed[step] = time.monotonic() - since
        time.sleep(0.1)
    assert watcher.ended.wait(5), "the stream was still open"
    body = b"".join(watcher.body).decode()
    return [at for n, at in committed.items() if at > WINDOW + MARGIN and f"after {n}." in body]


def _server(store: Storage, authorizer: Any) -> ApiServer:
    hub = EventHub(store, interval=0.05, keepalive=1.0, authorize_every=WINDOW)
    app = build_app(store, default_registry(), None, default_tenant=None)  # type: ignore[arg-type]  # reads only
    return ApiServer(app.resolve, authorizer=authorizer, hub=hub).start()


def _delivered(store: Storage, lease: Any, watcher: Watcher) -> None:
    """A step committed before the change reaches the stream: it was open and followed the task."""
    store.steps.commit(lease, 1, llm_step(text="before"), root_id=lease.task_id)
    deadline = time.monotonic() + 10
    while not watcher.received and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watcher.received, "the stream never delivered a step"


def test_a_revoked_keys_open_stream_receives_nothing_committed_after_its_revocation_window() -> None:
    store = memory_storage()
    key, record = store.api_keys.create("alpha")
    lease = claimed(store, tenant="alpha")
    server = _server(store, header_authorizer(store.api_keys, None))
    try:
        watcher = Watcher(server.httpd.server_port, lease.task_id, f"Bearer {key}")
        _delivered(store, lease, watcher)
        store.api_keys.revoke(record.key_id)
        late = _commit_past_the_window(store, lease, watcher, time.monotonic(), 1)
        again = watcher.get()  # the client resumes: refused at the door
    finally:
        server.stop()
    assert not late, f"{len(late)} steps committed {late[-1]:.1f} s after the revocation reached its stream"
    assert b"event: end\n" not in watcher.body  # the task runs on: not its end
    assert again.status == 401


def test_an_expired_tokens_open_stream_receives_nothing_committed_after_it_expired() -> None:
    issuer = LocalIssuer().start()
    import jwt

    from agentq.api.oidc import LEEWAY_SECONDS, OidcVerifier

    store = memory_storage()
    task = store.tasks.create(scripted([{"text": "x"}]).model_copy(update={"user": "ann"}), tenant="alpha")
    got = store.tasks.claim(task.task_id, "w1", 30)
    assert got is not None
    lease = got[0]
    token = issuer.mint(user="ann", tenant="alpha", ttl=3 - LEEWAY_SECONDS)  # refused 3 s from now
    server = _server(store, header_authorizer(store.api_keys, OidcVerifier(issuer.settings)))
    try:
        watcher = Watcher(server.httpd.server_port, lease.task_id, f"Bearer {token}")
        _delivered(store, lease, watcher)
        expires = (
            time.monotonic()
            + jwt.decode(token, options={"verify_signature": False})["exp"]
            + LEEWAY_SECONDS
            - time.time()
        )
        late = _commit_past_the_window(store, lease, watcher, expires, 1)
    finally:
        server.stop()
        issuer.stop()
    assert not late, f"{len(late)} steps committed {late[-1]:.1f} s after the token expired reached its stream"
