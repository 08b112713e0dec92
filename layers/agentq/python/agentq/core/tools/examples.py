"""Example tools for the demo: a side-effecting ``send_report`` whose deliveries land in an
outbox file, so you can see that a crash and a resume still deliver exactly once."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from agentq.core.tools import ToolContext, tool


def outbox_path() -> Path:
    return Path(os.environ.get("AGENTQ_OUTBOX") or Path(tempfile.gettempdir()) / "agentq-outbox.jsonl")


@tool(side_effects=True, timeout_seconds=10)
def send_report(to: str, subject: str, body: str, ctx: ToolContext) -> str:
    """Send a report by email (demo: appends the message to the outbox file)."""
    message = {"to": to, "subject": subject, "body": body, "idempotency_key": ctx.idempotency_key, "at": time.time()}
    with outbox_path().open("a") as f:
        f.write(json.dumps(message) + "\n")
    return f"sent to {to} (message id {ctx.idempotency_key[:16]})"


TOOLS = [send_report]
