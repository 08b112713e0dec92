"""``agentq.Client``: the HTTP API from Python, with the server's errors as exceptions."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from agentq.errors import AgentqError

TERMINAL = {"succeeded", "failed", "cancelled", "cost_exceeded", "timed_out"}


class ApiError(AgentqError):
    """The API answered with an error: ``status`` (HTTP), ``code``, ``message``, ``field``."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.status = status
        self.code = code


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 30) -> None:
        url = url or os.environ.get("AGENTQ_URL")
        if not url:
            raise AgentqError("no API URL: pass url= or set AGENTQ_URL (agentq dev prints it)", field="url")
        self.url = url.rstrip("/")
        self.api_key = api_key or os.environ.get("AGENTQ_API_KEY")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"{}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError as err:
            try:
                error = json.loads(err.read())["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": f"HTTP {err.code}"}
            raise ApiError(err.code, error.get("code", "http_error"), error.get("message", ""), error.get("field")) from None
        except urllib.error.URLError as err:
            raise AgentqError(f"cannot reach {self.url}: {err.reason}", field="url") from None

    def submit(self, submission: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/tasks", submission)

    def get(self, task_id: str) -> dict[str, Any]:
        return self._call("GET", f"/tasks/{task_id}")

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/cancel")

    def approve(self, task_id: str, note: str = "") -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/approve", {"note": note})

    def reject(self, task_id: str, note: str = "") -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/reject", {"note": note})

    def raise_budget(self, task_id: str, add_tokens: int = 0, add_steps: int = 0) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/budget", {"add_tokens": add_tokens, "add_steps": add_steps})

    def fork(self, task_id: str, at_step: int, **overrides: Any) -> dict[str, Any]:
        return self._call("POST", f"/tasks/{task_id}/fork", {"at_step": at_step, **overrides})

    def wait(self, task_id: str, timeout: float = 3600, poll: float = 0.5) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(task_id)
            if view["status"] in TERMINAL:
                return view
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} still {view['status']} after {timeout}s")
            time.sleep(poll)
