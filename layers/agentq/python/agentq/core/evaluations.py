"""An offline evaluation: a dataset of goals run through two versions of an agent, each item
an ordinary task (``agentq eval run``, docs/AGENTS.md).

Why the evaluation needs no record of its own: its durable state is its tasks. Each item of
each version is submitted with an ``Idempotency-Key`` derived from (evaluation id, item id,
agent version) (``item_key``), so however often the submission is repeated (the CLI killed and
run again, ``--resume EVAL_ID``) the API answers with the task the first request created, and
a request that differs (the dataset's line edited since) is refused (409), never run twice.
The invariant: for as long as the key lives (``storage.tasks.IDEMPOTENCY_TTL_SECONDS``, 24 h
from the item's first submission), every (evaluation, item, version) has exactly one task. A
worker killed mid-run is the queue's business (invariant 1: the task resumes from its step).

The evaluation's id is by default a digest of the dataset's bytes and the two versions
(``evaluation_id``): running the same command again re-attaches to the same tasks.

This module reads a dataset (JSONL; every bad line is an error naming its number and field,
before anything is submitted) and builds each item's submission; ``core.evaluation_report``
computes the report from the tasks' views.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError as PydanticError

from agentq.core.agents import DEFINED_BY_AGENT, DEFINED_CONSTRAINTS
from agentq.core.errors import ValidationError
from agentq.core.models import MAX_JSON_DEPTH, SET_BY_AGENTQ, TaskSubmission

# name@N: an evaluation compares fixed versions (an alias may move while it runs).
PINNED_REF = re.compile(r"^([a-z0-9][a-z0-9_-]{0,63})@([1-9][0-9]{0,8})$")
EVAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ITEM_FIELDS = ("id", "goal", "inputs", "outcome", "rubric", "expected")
# What an item's ``inputs`` may not set, each with why: what the item or the evaluation sets
# itself; what the API refuses in every submission naming an agent (the version's fields and
# constraints, ``core.agents``, and what agentq sets, ``core.models.SET_BY_AGENTQ``: the same
# names, so the two cannot drift apart). What it refuses only for some versions (an
# ``output_schema`` or ``workspace.allow_hosts`` where the version sets one) is the API's to say,
# as that line is submitted.
NOT_INPUTS = {
    "goal": "the item's goal",
    "outcome": "the item's outcome or rubric",
    "agent": "the version the evaluation runs it on",
    "depends_on": "an item runs on its own",
    **dict.fromkeys(DEFINED_BY_AGENT, "set by the agent version: the API refuses it from a submission"),
    **dict.fromkeys(
        (f"constraints.{name}" for name in DEFINED_CONSTRAINTS),
        "set by the agent version: the API refuses it from a submission",
    ),
    **{name: f"{why}: the API refuses it from a submission" for name, why in SET_BY_AGENTQ.items()},
}
META_EVAL, META_ITEM, META_VERSION = "agentq_eval", "agentq_eval_item", "agentq_eval_version"


@dataclass(frozen=True)
class EvalItem:
    """One line of a dataset: its id (``id``, else its line number), the goal, the submission
    fields it adds (``inputs``), its outcome (``outcome``, or ``rubric`` for one with only a
    rubric) and the exact answer it expects (``expected``, compared stripped)."""

    item_id: str
    line: int
    goal: str
    inputs: dict[str, Any]
    outcome: dict[str, Any] | None
    expected: str | None

    def passed(self, status: str, result: str | None) -> bool:
        """Ended ``succeeded`` (with an outcome: graded at or above its bar) and, with
        ``expected``, answered exactly that (stripped)."""
        if status != "succeeded":
            return False
        return self.expected is None or (result or "").strip() == self.expected.strip()


def pinned(ref: str, field: str) -> tuple[str, int]:
    """``name@N`` as (name, N), or a ValidationError naming ``field``."""
    match = PINNED_REF.match(ref or "")
    if match is None:
        raise ValidationError(
            f"{field}: an agent version, name@N (e.g. support@7), not {ref!r}: an evaluation compares fixed "
            "versions (an alias may move while it runs)",
            field=field,
        )
    return match.group(1), int(match.group(2))


def evaluation_id(dataset: bytes, agent: str, against: str) -> str:
    """The default id: the same dataset and versions are the same evaluation."""
    digest = hashlib.sha256(b"\0".join([dataset, agent.encode(), against.encode()])).hexdigest()
    return f"ev-{digest[:20]}"


def item_key(eval_id: str, item_id: str, agent: str) -> str:
    """The Idempotency-Key of one item's task for one version (visible ASCII, < 255)."""
    digest = hashlib.sha256(f"{item_id}\0{agent}".encode()).hexdigest()[:32]
    return f"eval-{eval_id}-{digest}"


def parse_dataset(text: str) -> list[EvalItem]:
    """Every item of a JSONL dataset (blank lines skipped), or a ValidationError naming the
    first bad line and its field: nothing is submitted from a dataset with one bad line."""
    items: list[EvalItem] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        item = _item(number, raw)
        if item.item_id in seen:
            raise _bad(number, "id", f"the item id {item.item_id!r} is line {seen[item.item_id]}'s too")
        seen[item.item_id] = number
        items.append(item)
    if not items:
        raise ValidationError("dataset: no items (one JSON object a line, each with a goal)", field="dataset")
    return items


def _bad(line: int, field: str, why: str) -> ValidationError:
    return ValidationError(f"dataset line {line}: {field}: {why}", field=f"dataset:{line}:{field}")


def _item(number: int, raw: str) -> EvalItem:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _bad(number, "json", f"not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:  # deeper than Python's parser goes (about 1,000 levels)
        raise _bad(number, "json", f"nests deeper than {MAX_JSON_DEPTH} levels, the most the API accepts") from None
    if not isinstance(data, dict):
        raise _bad(number, "json", f"a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(ITEM_FIELDS))
    if unknown:
        raise _bad(number, unknown[0], f"not a field of an item (fields: {', '.join(ITEM_FIELDS)})")
    goal = data.get("goal")
    if not isinstance(goal, str) or not goal.strip():
        raise _bad(number, "goal", "required, a non-empty string")
    item_id = data.get("id", str(number))
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool) or not str(item_id):
        raise _bad(number, "id", "a non-empty string or an integer")
    inputs = data.get("inputs", {})
    if not isinstance(inputs, dict):
        raise _bad(number, "inputs", "an object of submission fields (e.g. constraints, workspace, metadata)")
    if not isinstance(inputs.get("metadata", {}), dict):
        raise _bad(number, "inputs.metadata", "an object of strings")
    for name, why in NOT_INPUTS.items():
        top, _, inner = name.partition(".")
        within = inputs.get(top) if inner else inputs
        if isinstance(within, dict) and (inner or name) in within:
            raise _bad(number, f"inputs.{name}", f"not an input ({why})")
    outcome = data.get("outcome")
    if "rubric" in data:
        if outcome is not None:
            raise _bad(number, "rubric", "give an outcome or a rubric, not both")
        outcome = {"rubric": data["rubric"]}
    expected = data.get("expected")
    if expected is not None and not isinstance(expected, str):
        raise _bad(number, "expected", "the exact answer, a string")
    item = EvalItem(str(item_id), number, goal, dict(inputs), outcome, expected)
    deep = _too_deep(submission(item, "agent@1", "check"))
    if deep is not None:
        raise _bad(number, deep, f"nests deeper than {MAX_JSON_DEPTH} levels, the most the API accepts")
    try:  # the submission as sent, with a stand-in version: what the API will check of it
        TaskSubmission.model_validate(submission(item, "agent@1", "check"))
    except PydanticError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "goal"
        field = where if where.startswith("outcome") or where == "goal" else f"inputs.{where}"
        raise _bad(number, field, error["msg"]) from None
    return item


def _too_deep(body: dict[str, Any]) -> str | None:
    """The line's field under which ``body`` nests deeper than the API accepts (counted as
    ``api.body_guard`` counts it), else None. Why here: such a line would be refused only as it
    is submitted, after the lines before it, and one deep enough (~1,000 levels) would not even
    be encoded (``RecursionError``). Walked without recursion."""
    stack: list[tuple[Any, str, int]] = [(value, key, 1) for key, value in body.items()]
    while stack:
        value, top, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return top if top in ("goal", "outcome") else f"inputs.{top}"
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, top, depth + 1) for child in children)
    return None


def submission(item: EvalItem, agent: str, eval_id: str) -> dict[str, Any]:
    """The body of the item's task for ``agent`` (name@N): the same for every try, so its
    idempotency key finds the first one's task."""
    body: dict[str, Any] = {**item.inputs, "goal": item.goal, "agent": agent}
    if item.outcome is not None:
        body["outcome"] = item.outcome
    body["metadata"] = {
        **dict(item.inputs.get("metadata") or {}),
        META_EVAL: eval_id,
        META_ITEM: item.item_id[:1024],
        META_VERSION: agent,
    }
    return body
