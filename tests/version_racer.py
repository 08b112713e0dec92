"""A racer process for agent versions (tests/test_agents.py), run by tests/racers.py: it prints
``ready``, waits for the gun, creates one version of an agent, prints one JSON report.

    create TENANT NAME I          create one version of NAME (its system prompt says I)
"""

from __future__ import annotations

import json
import sys

from agentq.core.agents import AgentSpec
from agentq.core.errors import AgentqError
from agentq.runtime import Settings, build_store


def main(argv: list[str]) -> None:
    settings = Settings.from_env()
    store = build_store(settings)
    mode, tenant, name = argv[0], argv[1], argv[2]
    assert mode == "create", mode
    spec = AgentSpec(name=name, provider="scripted", script="research", system=f"writer {argv[3]}")
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        version, created = store.agents.create(tenant, spec)
        print(json.dumps({"version": version.version, "created": created, "system": version.system}))
    except AgentqError as exc:  # a refusal (agent_conflict): the report says which
        print(json.dumps({"error": exc.code, "message": exc.message}))
    except Exception as exc:  # anything else that escaped: the report says what
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))


if __name__ == "__main__":
    main(sys.argv[1:])
