"""A workspace's git clone goes through the egress proxy, which adds the task's user's credential
for its host: a server that echoes the credential back (a benign one might: "invalid token
...") has it redacted by the proxy before git reads it (``core.tools.egress_answer``: each mark
as long as the value, so git's pkt-lines still frame and git still prints the server's reason,
which failed with marks of their own length), and git's words become the task's error. That
error is served by the API, the console and callbacks, so it is recorded redacted besides
(``storage.task_transitions``; each way a failure is recorded: tests/storage_conformance).

Real parts: a loopback HTTP server speaking git's smart protocol far enough to answer with an
``ERR`` line, real git in the workspace's bubblewrap sandbox, the real egress proxy and vault,
the engine with the scripted provider."""

from __future__ import annotations

import http.server
import os
import threading
from pathlib import Path

import pytest

from agentq.control import vault as control_vault
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission
from agentq.core.tools.egress import egress_factory
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.vault import CredentialWrite
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.storage.container import memory_storage

from tests.helpers import scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace's git needs bubblewrap")

SECRET = "sk-live-ECHOED-7f3a9c1e55d0b2"


class EchoingGitServer(http.server.BaseHTTPRequestHandler):
    """Refuses the clone with an ``ERR`` pkt-line that quotes the request's Authorization."""

    def do_GET(self) -> None:
        def pkt(text: str) -> bytes:
            return b"%04x" % (len(text) + 4) + text.encode()

        said = f"ERR invalid credentials: {self.headers.get('Authorization')}\n"
        body = pkt("# service=git-upload-pack\n") + b"0000" + pkt(said)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-git-upload-pack-advertisement")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None: ...


class NoQueues:
    def send(self, *_: object, **__: object) -> None: ...


def test_a_git_servers_echo_of_the_users_credential_never_reaches_the_tasks_error(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoingGitServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    store = memory_storage()
    cipher = EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))
    write = CredentialWrite.model_validate({"user": "ann", "value": SECRET, "hosts": [host]})
    control_vault.put(store, NoQueues(), cipher, "t", "git", write)  # type: ignore[arg-type]
    submission = TaskSubmission.model_validate(
        {
            **scripted([{"text": "done"}], tools=["shell"]).model_dump(mode="json"),
            "user": "ann",
            "workspace": {"git": {"url": f"http://{host}/repo.git"}, "allow_hosts": [host]},
        }
    )
    task = store.tasks.create(submission, tenant="t")
    policy = FetchPolicy(allow=(HostRule.parse(host),))  # the deployment lets this loopback server through
    engine = Engine(store, worker_id="w", config=EngineConfig(workspace_root=str(tmp_path / "w")),
                    egress=egress_factory(policy), cipher=cipher)  # fmt: skip
    try:
        engine.run(task.task_id)
    finally:
        server.shutdown()
    error = store.tasks.get(task.task_id).error
    assert error is not None and error["code"] == "workspace_git_failed", error
    assert "invalid credentials" in error["message"]  # the server's words are kept: they say why
    assert SECRET not in str(error), error
