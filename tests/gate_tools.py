"""A tool for tests that hold tasks running until the test says: ``hold(label)`` blocks until
the file ``<AGENTQ_TEST_GATE_DIR>/<label>`` exists. A test orders events with it (a burst's tasks hold
their slots while another tenant's task is claimed) without timing anything."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentq.core.tools import tool


@tool(timeout_seconds=600)
def hold(label: str) -> str:
    """Wait until the test opens the gate (a file), then answer."""
    gate = Path(os.environ["AGENTQ_TEST_GATE_DIR"]) / label
    while not gate.exists():
        time.sleep(0.05)
    return f"released {label}"


TOOLS = [hold]
