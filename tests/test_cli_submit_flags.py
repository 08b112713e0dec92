"""`agentq submit` flags for the constraints that used to need a JSON --file: --tool-policy,
--output-schema, --max-cost-usd, --economy, --context-threshold. A good value reaches the task
(read back from the store of the local stack); a bad one is refused by the CLI itself, naming
the flag, with exit 2 and no request (the URL given points at nothing that answers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from agentq.cli.main import build_parser
from agentq.cli.submit import build_submission

from tests import test_cli
from tests.api_support import ApiStack
from tests.helpers import call
from tests.test_cli import Ran

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
cli = test_cli.cli  # the fixture: `agentq ...` in this process, against the local API
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request would exit 1 "cannot reach", not 2


def test_the_flags_reach_the_task_and_its_answer_validates_against_the_schema(
    api_stack: ApiStack, cli: Callable[..., Ran], tmp_path: Path
) -> None:
    schema_file = tmp_path / "answer.schema.yaml"
    schema_file.write_text("type: object\nproperties:\n  answer: {type: string}\nrequired: [answer]\n")
    turns = [
        {"text": "noting", "tool_calls": [call("note_write", key="k", value="v")]},
        {"tool_calls": [call("final_answer", answer={"answer": "42"})]},  # final_answer takes {"answer": <schema>}
    ]
    done = cli("submit", "answer in a schema", "--script", json.dumps({"turns": turns}),
               "--tools", "note_write,note_read", "--tool-policy", "note_read=deny", "--tool-policy", "note_write=allow",
               "--output-schema", str(schema_file), "--max-cost-usd", "2.5", "--context-threshold", "0.5",
               "--wait", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "succeeded" and json.loads(view["result"]) == {"answer": "42"}
    assert view["budget"]["money"]["cap_usd"] == "2.500000"
    constraints = api_stack.stack.store().tasks.get(view["task_id"]).submission.constraints
    assert constraints.tool_policies == {"note_read": "deny", "note_write": "allow"}
    assert constraints.max_cost_usd == Decimal("2.5") and constraints.context_threshold == 0.5


FANOUT = {
    "turns": [
        {"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "research A", "tools": ["note_write"],
             "script": {"turns": [{"tool_calls": [call("note_write", key="a", value="A")]}, {"text": "A"}]}},
            {"goal": "research B", "script": "first_task"},  # a built-in: note_write, then note_read
        ])]},
        {"text": "done"},
    ]
}  # fmt: skip


def test_a_script_that_spawns_sub_agents_with_tools_is_allowed_those_tools_when_no_tools_flag_is_given() -> None:
    """docs/SCRIPTED_PROVIDER.md: a sub-agent's tools are a subset of the parent's, and a script
    that calls spawn_subagents may go without --tools. The CLI allowed only the tools of the
    parent's own turns (`spawn_subagents`), so every sub-agent given a tool was refused by the
    spawn and the parent ended `succeeded` with no sub-agent run."""
    body = build_submission(build_parser().parse_args(["submit", "compare", "--script", json.dumps(FANOUT)]))
    # the parent's own call, the tools named for sub-agent A, and those its and B's built-in script call
    assert body["constraints"]["tools"] == ["spawn_subagents", "note_write", "note_read"]


def test_a_fan_out_script_submitted_without_tools_runs_its_sub_agents(cli: Callable[..., Ran]) -> None:
    done = cli("submit", "compare", "--script", json.dumps(FANOUT), "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert "allowing the tools the script calls: spawn_subagents, note_write, note_read" in done.stderr
    view = json.loads(done.stdout)
    assert view["status"] == "succeeded" and view["children"]["by_status"] == {"succeeded": 2}, view["children"]


def test_economy_is_sent_as_the_constraint_the_api_checks(cli: Callable[..., Ran]) -> None:
    # The scripted provider has no batch API: the API's refusal names the constraint the flag set.
    refused = cli("submit", "cheaply", "--script", "research", "--economy")
    assert refused.returncode == 2 and "constraints.economy" in refused.stderr, refused.stderr


def test_the_flags_override_a_file_and_merge_its_tool_policies(tmp_path: Path) -> None:
    base = tmp_path / "task.json"
    base.write_text(
        json.dumps({"goal": "g", "constraints": {"tool_policies": {"a": "ask", "b": "ask"}, "max_cost_usd": "9"}})
    )
    args = build_parser().parse_args(["submit", "--file", str(base), "--tool-policy", "b=deny", "--max-cost-usd", "0.25",
                                      "--economy", "--output-schema", json.dumps(SCHEMA)])  # fmt: skip
    body = build_submission(args)
    assert body["constraints"]["tool_policies"] == {"a": "ask", "b": "deny"}
    assert body["constraints"]["max_cost_usd"] == "0.25" and body["constraints"]["economy"] is True
    assert body["output_schema"] == SCHEMA


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tool-policy", "note_read"],
            "argument --tool-policy: takes NAME=allow|ask|ask_tenant|deny, not 'note_read'",
        ),
        (
            ["--tool-policy", "note_read=maybe"],
            "argument --tool-policy: the policy of 'note_read' is allow, ask, ask_tenant or deny",
        ),
        (["--max-cost-usd", "-1"], "argument --max-cost-usd: Input should be greater than 0 (got '-1')"),
        (["--max-cost-usd", "lots"], "argument --max-cost-usd: Input should be a valid decimal (got 'lots')"),
        (["--max-cost-usd", "0.0000001"], "argument --max-cost-usd: Decimal input should have no more than 6 decimal"),
        (["--context-threshold", "0.99"], "argument --context-threshold: Input should be less than or equal to 0.95"),
        (["--output-schema", "{not json"], "--output-schema: the inline JSON is not JSON"),
        (["--output-schema", "no-such-file.json"], "--output-schema: cannot read no-such-file.json"),
        (["--output-schema", '{"type": "nonsense"}'], "--output-schema: not a valid JSON Schema at"),
        (["--output-schema", "[1, 2]"], "--output-schema: cannot read [1, 2]"),
    ],
)
def test_a_bad_value_names_its_flag_exits_2_and_sends_nothing(
    cli: Callable[..., Ran], flags: list[str], message: str
) -> None:
    ran = cli("submit", "x", "--script", "research", "--url", NOWHERE, *flags)
    assert ran.returncode == 2, ran.stderr
    assert message in ran.stderr and "cannot reach" not in ran.stderr


def test_a_schema_file_that_holds_no_object_is_refused(cli: Callable[..., Ran], tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    ran = cli("submit", "x", "--script", "research", "--url", NOWHERE, "--output-schema", str(listed))
    assert ran.returncode == 2 and f"--output-schema: {listed} must hold a JSON object" in ran.stderr
