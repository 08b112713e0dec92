"""The HTTP API alone in a process of its own, over a stack's table and queues named by the
environment (``Settings.from_env``; ``tests.conftest.child_env`` builds it): what a test kills
with SIGKILL and starts again to show that nothing the API answered lived only in its memory.
No authorizer: every request is tenant ``local``, as under `agentq dev` without ``--auth``.

    python -m tests.api_process PORT      # prints "listening <url>" once it answers
"""

from __future__ import annotations

import sys
import threading

from agentq.api.app import build_app
from agentq.api.http_server import ApiServer
from agentq.runtime import Settings, build_fanout, build_queues, build_registry, build_store


def main(port: int) -> None:
    settings = Settings.from_env()
    app = build_app(build_store(settings), build_registry(settings), build_queues(settings), build_fanout(settings),
                    defaults=settings.defaults)  # fmt: skip
    server = ApiServer(app.resolve, port=port).start()
    print(f"listening {server.url}", flush=True)
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main(int(sys.argv[1]))
