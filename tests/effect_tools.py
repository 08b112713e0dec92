"""Tools for tests: a side-effecting tool whose every execution leaves a line in a file, so a
test can count how many times an effect really happened across killed processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from agentq.core.graders import GradeInput, grader
from agentq.core.tools import ToolContext, tool


def ledger_path() -> Path:
    return Path(os.environ.get("AGENTQ_TEST_LEDGER", "/tmp/agentq-test-ledger.jsonl"))


@tool(side_effects=True, timeout_seconds=10)
def charge_card(amount_cents: int, memo: str, ctx: ToolContext) -> str:
    """Charge a card (test double with a real, countable effect)."""
    with ledger_path().open("a") as f:
        f.write(json.dumps({"key": ctx.idempotency_key, "tool_use_id": ctx.tool_use_id, "amount": amount_cents}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return f"charged {amount_cents} cents ({memo}); receipt {ctx.idempotency_key[:12]}"


@tool
def lookup(query: str, size: int = 200) -> str:
    """Read-only lookup returning deterministic text of the requested size."""
    base = f"result for {query}: "
    return (base + "x" * size)[: max(size, len(base))]


TOOLS = [charge_card, lookup]


# Graders an outcome may name (agentq.core.grading): each run leaves a line in the same ledger,
# so a test counts how many times a grader really ran across killed processes.


def _graded(name: str, given: GradeInput) -> None:
    with ledger_path().open("a") as f:
        f.write(json.dumps({"grader": name, "task_id": given.task_id, "attempt": given.attempt}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@grader
def says_done(given: GradeInput) -> tuple[float, str]:
    """Passes an answer that says DONE; else tells the agent so."""
    _graded("says_done", given)
    if "DONE" in given.answer:
        return 1.0, ""
    return 0.2, "The answer must say DONE."


@grader
def report_written(given: GradeInput) -> dict[str, object]:
    """Passes when the workspace holds report.md with a title."""
    _graded("report_written", given)
    if given.files is None or "report.md" not in given.files:
        return {"passed": False, "feedback": "write report.md in the workspace"}
    return {"passed": given.files.text("report.md").startswith("# "), "feedback": "report.md needs a # title"}


@grader
def grader_raises(given: GradeInput) -> float:
    """A grader with a bug."""
    _graded("grader_raises", given)
    raise RuntimeError("the grader's own bug")


@grader
def grader_nonsense(given: GradeInput) -> object:
    """A grader that returns something that is not a grade."""
    _graded("grader_nonsense", given)
    return "looks fine to me"


@grader
def grader_huge(given: GradeInput) -> int:
    """A grader whose score is too large for a float (``math.isfinite`` raised OverflowError on it)."""
    _graded("grader_huge", given)
    return 10**400


class _Unreadable(float):
    """A score no comparison can read: a grader's own type whose ``>=`` raises."""

    def __ge__(self, other: object) -> bool:
        raise ValueError("this score cannot be compared")


@grader
def grader_unreadable(given: GradeInput) -> float:
    """A grader returning a score that raises as it is read: no check foresees it (the safety net)."""
    _graded("grader_unreadable", given)
    return _Unreadable(0.5)


@grader
def grader_slow(given: GradeInput) -> float:
    """A grader that runs past its outcome's timeout."""
    _graded("grader_slow", given)
    time.sleep(float(os.environ.get("AGENTQ_TEST_GRADER_SLEEP", "5")))
    return 1.0
