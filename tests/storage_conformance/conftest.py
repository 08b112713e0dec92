"""Every test in this folder runs twice: on the in-memory table and on DynamoDB (moto server).

One suite for every backend (as langgraph's checkpoint conformance suite does): a rule the
repositories rely on that one backend honours and the other does not fails here.
"""

from __future__ import annotations

import pytest

from agentq.runtime import Settings, build_store
from agentq.storage.container import Storage, memory_storage


@pytest.fixture(params=["memory", "dynamodb"])
def backend(request: pytest.FixtureRequest) -> Storage:
    if request.param == "memory":
        return memory_storage()
    settings: Settings = request.getfixturevalue("settings")
    return build_store(settings)
