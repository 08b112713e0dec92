"""Chaos on the events hub: workers are SIGKILLed (and replaced by the supervisor) while many
watchers follow their tasks through the hub (``agentq dev``'s, fed by moto's DynamoDB Streams);
every watcher receives every committed event of its task exactly once, in commit order, the
takeovers included. ``AGENTQ_CHAOS_WATCHERS`` watchers (default 200, what this 2-core machine
bears beside the workers: each is a client thread here and a server thread in the hub) over
``AGENTQ_CHAOS_TASKS`` tasks (default 20).
"""

from __future__ import annotations

import os
import signal
import threading
from functools import partial

from agentq.api.client import Client
from agentq_dev.stack import LocalStack

from tests.helpers import call, wait_for

WATCHERS = int(os.environ.get("AGENTQ_CHAOS_WATCHERS", "200"))
TASKS = int(os.environ.get("AGENTQ_CHAOS_TASKS", "20"))
KILLS = 3
TURNS = [
    {"text": f"turn {i}", "latency_seconds": 0.4, "tool_calls": [call("lookup", query=str(i), size=20)]}
    for i in range(10)
] + [{"text": "finished"}]
BODY = {"goal": "look things up", "provider": "scripted", "script": {"turns": TURNS},
        "constraints": {"tools": ["lookup"]}}  # fmt: skip
PYTHONPATH = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))


def test_watchers_on_the_hub_get_every_committed_event_once_in_order_while_workers_are_killed() -> None:
    with LocalStack(prefix="hubchaos", workers=3, supervise=True, events_hub=True, tool_modules=("tests.effect_tools",),
                    extra_env={"PYTHONPATH": PYTHONPATH}) as stack:  # fmt: skip
        assert stack.api_server is not None and stack.hub_server is not None
        client = Client(stack.api_server.url)
        assert client.health().live is not None
        tasks = [client.submit(BODY).task_id for _ in range(TASKS)]
        received: dict[int, list[str]] = {}
        errors: list[BaseException] = []
        steps = threading.Semaphore(0)  # released per committed model step any watcher sees

        def watch(n: int) -> None:
            ids: list[str] = []
            try:
                for event in Client(stack.api_server.url).iter_events(tasks[n % TASKS]):  # type: ignore[union-attr]
                    if event.committed:
                        ids.append(str(event.id))
                        if event.type == "agent.message" and n < TASKS:
                            steps.release()
            except BaseException as exc:
                errors.append(exc)
            received[n] = ids

        threads = [threading.Thread(target=watch, args=(n,), daemon=True) for n in range(WATCHERS)]
        for t in threads:
            t.start()
        killed = 0

        def replaced(kills: int) -> bool:
            return len(stack.replacements) >= kills

        for _ in range(KILLS):  # a worker dies each time the tasks have made some progress
            for _ in range(TASKS):
                assert steps.acquire(timeout=120)
            alive = [p for p in stack.processes if p.poll() is None]
            os.kill(alive[0].pid, signal.SIGKILL)
            killed += 1
            # The next kill waits for this one's replacement (an observable event), so each lands
            # on a worker the supervisor knows, and a kill it never saw fails here, naming it.
            wait_for(partial(replaced, killed), timeout=60, what=f"kill {killed} (worker {alive[0].pid}) replaced")
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors[:3]
        assert len(received) == WATCHERS and killed == KILLS and len(stack.replacements) == KILLS
        assert stack.api_server.hub is not None and stack.api_server.hub.reads == 0  # all on the hub, none fell back
        takeovers = 0
        for i, task_id in enumerate(tasks):
            log = list(client.iter_events(task_id, stream=False))
            whole = [str(e.id) for e in log]
            assert log[-1].data["status"] == "succeeded"
            takeovers += sum(1 for e in log if e.type == "task.status" and e.data.get("takeover"))
            for n in range(i, WATCHERS, TASKS):
                assert received[n] == whole, f"watcher {n} of task {task_id}"  # all, once, in commit order
        assert takeovers >= 1  # the kills landed on running tasks
        print(
            f"\n{WATCHERS} watchers over {TASKS} tasks, {killed} workers killed, {takeovers} takeovers; "
            f"hub reads {stack.api_server.hub.reads + (stack.hub_server.hub.reads if stack.hub_server.hub else 0)}, stream passes {stack.hub_feed.passes if stack.hub_feed else 0}"
        )
