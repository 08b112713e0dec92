"""One local stack with the HTTP API and auth on (as in AWS), shared by the HTTP, client and
CLI tests of one pytest process: the session fixture `api_stack` (tests/conftest.py) starts it
once, on first use, and hands out an `ApiStack`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentq_dev.stack import LocalStack

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = {"goal": "say hi", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}


@dataclass
class ApiStack:
    stack: LocalStack
    url: str
    key: str  # tenant "team-a"
    other_key: str  # tenant "team-b"

    def http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = "default",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        """A request as any HTTP client makes it; returns (status, JSON body, headers)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        token = self.key if key == "default" else key
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw_body = resp.read()
                return resp.status, (json.loads(raw_body) if raw_body else None), dict(resp.headers)
        except urllib.error.HTTPError as err:
            raw_body = err.read()
            return err.code, (json.loads(raw_body) if raw_body else None), dict(err.headers)

    def greeter(self, tenant: str) -> dict[str, Any]:
        """What an end user's token submits to run SCRIPTED: a token runs the agents its tenant
        defined (api.user_submission.check_user_submission), so ``tenant`` gets the agent
        ``greeter`` (once) and this is a submission naming it."""
        key = self.stack.create_api_key(tenant)
        made = {"name": "greeter", "provider": "scripted", "script": SCRIPTED["script"]}
        status, answer, _ = self.http("POST", "/agents", made, key=key)
        assert status in (201, 409), answer
        return {"goal": SCRIPTED["goal"], "agent": "greeter"}

    def submit(self, body: dict[str, Any] | None = None, key: str | None = "default") -> str:
        status, data, _ = self.http("POST", "/tasks", body or SCRIPTED, key=key)
        assert status == 202, data
        return str(data["task_id"])

    def until(
        self, task_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 60, key: str | None = "default"
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, view, _ = self.http("GET", f"/tasks/{task_id}", key=key)
            assert status == 200, view
            if pred(view):
                return dict(view)
            assert time.monotonic() < deadline, f"task {task_id} stuck: {view['status']} at step {view['step']}"
            time.sleep(0.05)

    def cli_env(self, **extra: str) -> dict[str, str]:
        """The environment of a person's shell after `agentq dev`: the URL and their key."""
        env = {k: v for k, v in self.stack.env().items() if not k.startswith("AGENTQ_PROFILE")}
        env.update({"AGENTQ_URL": self.url, "AGENTQ_API_KEY": self.key, "COLUMNS": "160", "PYTHONPATH": str(ROOT)})
        env.update(extra)
        return env
