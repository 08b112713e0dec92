"""A minimal A2A agent built from the ``a2a-sdk``'s own server classes (``DefaultRequestHandler``,
``InMemoryTaskStore``, the Starlette routes), served by uvicorn in a process of its own: the
remote agent of tests/test_a2a_client.py.

It writes every message it receives to a ledger (``DESK_LEDGER``, one JSON line each: its id,
its task and its text), before it answers, so a test counts what it was sent. A message
starting ``ask:`` asks a question (``input-required``) and completes with the answer it is
given; any other message starts a task that works until the file ``<ledger>.release`` exists,
then completes with ``echo: <text>`` as its artifact. A request without ``Authorization: Bearer
$DESK_TOKEN`` is refused (401), the card included. Some messages repeat that header back, as a
remote that echoes its caller's credential would (tests/test_redaction_cuts.py): ``whoami:<pad>``
is answered with a message, ``whoami-task:<pad>`` completes its task with it as the artifact,
``ask-whoami:<pad>`` asks a question that holds it, ``refuse:<pad>`` is refused with the
protocol's error that holds it; each after ``<pad>`` (a number: that many dots), so the caller
chooses where it sits. ``DESK_HEADERS`` names a file it writes each request's path and trace
context headers to (tests/test_a2a_remote_span.py). ``DESK_ENDPOINT`` makes its card name another
endpoint than itself (a card that points elsewhere). ``--tls-cert``/``--tls-key`` serve it over
https (``--host`` the loopback address it listens on), and ``DESK_HOSTNAME`` answers only a
request whose ``Host`` is that name (tests/test_a2a_rebinding.py: a client connecting to an
address keeps the name).

    python -m tests.a2a_servers.desk --port 8765
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

LEDGER = Path(os.environ.get("DESK_LEDGER", "/tmp/desk.jsonl"))
TOKEN = os.environ.get("DESK_TOKEN", "")


def _note(message: Any, task_id: str) -> None:
    from a2a.helpers.proto_helpers import get_message_text

    line = {"message_id": message.message_id, "task_id": task_id, "text": get_message_text(message)}
    with LEDGER.open("a") as f:
        f.write(json.dumps(line) + "\n")


def build(port: int) -> Any:
    from a2a.helpers.proto_helpers import get_message_text, new_task, new_text_artifact, new_text_message
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Role, TaskState
    from a2a.utils.errors import InvalidParamsError
    from starlette.applications import Starlette
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import JSONResponse

    class Desk(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None and context.task_id and context.context_id
            task_id, context_id = context.task_id, context.context_id
            _note(context.message, task_id)
            text = get_message_text(context.message)
            updater = TaskUpdater(event_queue, task_id, context_id)
            verb, _, pad = text.partition(":")
            pad = "." * int(pad) if pad.isdigit() else pad
            echoed = f"{pad}you sent Authorization: Bearer {TOKEN}"
            if verb == "refuse":
                raise InvalidParamsError(message=echoed)
            if verb == "whoami":
                await event_queue.enqueue_event(new_text_message(echoed, role=Role.ROLE_AGENT, context_id=context_id))
                return
            current = context.current_task
            if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                await updater.add_artifact(new_text_artifact("answer", f"you chose {text}").parts)
                await updater.complete()
                return
            await event_queue.enqueue_event(new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED))
            if text.startswith("ask:") or verb == "ask-whoami":
                asked = echoed if verb == "ask-whoami" else "Which color?"
                question = new_text_message(asked, role=Role.ROLE_AGENT, context_id=context_id,
                                            task_id=task_id)  # fmt: skip
                await updater.requires_input(question)
                return
            if verb == "whoami-task":
                await updater.add_artifact(new_text_artifact("echo", echoed).parts)
                await updater.complete()
                return
            await updater.start_work()
            release = LEDGER.with_name(LEDGER.name + ".release")
            while not release.exists():
                await asyncio.sleep(0.05)
            await updater.add_artifact(new_text_artifact("echo", f"echo: {text}").parts)
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.task_id and context.context_id
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()

    url = os.environ.get("DESK_ENDPOINT") or f"http://127.0.0.1:{port}/"  # what its card names
    card = AgentCard(
        name="desk",
        description="answers after a while, or asks a question first",
        version="1",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="desk", name="desk", description="echo or ask", tags=["test"])],
    )
    handler = DefaultRequestHandler(agent_executor=Desk(), task_store=InMemoryTaskStore(), agent_card=card)

    class Bearer(BaseHTTPMiddleware):
        async def dispatch(self, request: Any, call_next: Any) -> Any:
            if os.environ.get("DESK_HEADERS"):  # each request's trace context, as it came
                with Path(os.environ["DESK_HEADERS"]).open("a") as f:
                    seen = {name: request.headers.get(name) for name in ("traceparent", "tracestate", "baggage")}
                    f.write(json.dumps({"path": request.url.path, **seen}) + "\n")
            if TOKEN and request.headers.get("authorization") != f"Bearer {TOKEN}":
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            return await call_next(request)

    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    app.add_middleware(Bearer)
    if os.environ.get("DESK_HOSTNAME"):
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=[os.environ["DESK_HOSTNAME"]])
    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    uvicorn.run(build(args.port), host=args.host, port=args.port, log_level="warning",
                ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key)  # fmt: skip


if __name__ == "__main__":
    main()
