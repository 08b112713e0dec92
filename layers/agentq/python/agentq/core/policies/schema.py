"""The Cedar schema a rule is validated against: what a rule sees of a call, published.

Every call the engine checks is one Cedar request:

- ``principal``: ``Agent::"<name>"`` (the task's agent; ``Agent::""`` for a task without one);
- ``action``: ``Action::"tool"`` (a registered tool), ``Action::"mcp"`` (an MCP server's tool),
  ``Action::"spawn"`` (``spawn_subagents``) or ``Action::"model"`` (a model call);
- ``resource``: ``Tool::"<tool name>"``, or ``Model::"<model id>"`` for a model call;
- ``context``: the record ``CONTEXT`` below (the principal's other attributes, the call, the
  task's history).

A tool's arguments differ per tool, so the schema cannot name them: ``context.args`` is declared
an empty record, and a rule reads an argument behind a ``has`` guard
(``context.args has amount && context.args.amount > 100``), which Cedar's validator accepts and
which is how Cedar reads any attribute that may be absent. Money is in millionths of a dollar
(``Long``; Cedar has no floating point), as the ledger keeps it. docs/POLICIES.md lists the
attributes with what each means and what reading it costs.
"""

from __future__ import annotations

import json
from typing import Any

ACTIONS = ("tool", "mcp", "spawn", "model")

_LONG = {"type": "Long"}
_STRING = {"type": "String"}


def _record(attributes: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "Record",
        "attributes": {k: ({**v, "required": False} if k in optional else v) for k, v in attributes.items()},
    }


TOOL_RUN = _record({"name": _STRING, "status": _STRING})

CONTEXT = _record(
    {
        "tenant": _STRING,
        "agent": _STRING,  # "" for a task without an agent
        "agent_version": _LONG,  # 0 for a task without an agent
        "user": _STRING,  # the end user the task acts for: absent for a task that acts for none
        "api_key": _STRING,  # the id of the API key that submitted the task: absent until tasks carry it
        "task": _record({"id": _STRING, "root_id": _STRING, "depth": _LONG, "step": _LONG}),
        "call": _record(
            {
                "kind": _STRING,  # tool | mcp | spawn | model
                "tool": _STRING,  # the tool's name ("" for a model call)
                "mcp_server": _STRING,  # the MCP server of an mcp call ("" otherwise)
                "model": _STRING,  # the task's model (a model call: the model called)
                "estimated_tokens": _LONG,  # a model call: the tokens held for it; 0 for a tool call
                "estimated_usd_micros": _LONG,  # a model call: the dollars held for it; 0 for a tool call
            }
        ),
        "args": _record({}),  # the tool's input, per tool: read behind `has`
        "history": _record(
            {
                "tools": {"type": "Set", "element": TOOL_RUN},  # every tool call committed, with its status
                "ok_tools": {"type": "Set", "element": _STRING},  # the tools that returned status ok
                "tool_calls": _LONG,
                "task_tokens": _LONG,
                "task_spend_micros": _LONG,
                "tree_tokens": _LONG,
                "tree_spend_micros": _LONG,
                "user_spend_today_micros": _LONG,  # what the end user's tasks spent today (UTC), held included
            },
            optional=("user_spend_today_micros",),
        ),
    },
    optional=("user", "api_key"),
)

SCHEMA: dict[str, Any] = {
    "": {
        "entityTypes": {"Agent": {}, "Tool": {}, "Model": {}},
        "actions": {
            name: {
                "appliesTo": {
                    "principalTypes": ["Agent"],
                    "resourceTypes": ["Model" if name == "model" else "Tool"],
                    "context": CONTEXT,
                }
            }
            for name in ACTIONS
        },
    }
}

SCHEMA_JSON = json.dumps(SCHEMA, sort_keys=True)

# The attributes whose value costs a read to know: a rule set that names none of them is
# evaluated without the read (its value is then 0, or absent, and no rule can see it).
TREE_ATTRIBUTES = ("tree_tokens", "tree_spend_micros")
USER_SPEND_ATTRIBUTE = "user_spend_today_micros"  # a read of the user's day item (``storage.scope_caps``)
# The task's tool calls: known from the steps a run holds, and (for a compaction written before it
# carried them: ``core.engine._history``) a read of the steps before it, once a run. A turn's
# call is checked as often as the outcomes of the calls before it in the turn need
# (``core.engine._policy``), only when a rule names one of these.
TOOL_ATTRIBUTES = ("tools", "ok_tools", "tool_calls")
