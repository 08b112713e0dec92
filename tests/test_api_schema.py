"""schemathesis against the OpenAPI document the API generates from its own code.

Generated requests, valid and invalid (schemathesis' coverage, explicit and fuzzing phases),
go through the real handler with auth on: an in-process WSGI adapter turns each into the API
Gateway proxy event the Lambda gets, after the same authorizer check the local server makes.
They find no 5xx, no undocumented status or content type, no response that breaks its schema,
and no invalid input accepted."""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import AcceptedNegativeData, FailureGroup
from schemathesis.pytest import _test_builder
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agentq.api.app import build_app, openapi_document
from agentq.api.auth import authorize
from agentq.api.http_server import wsgi_app
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_registry, session
from agentq.storage.container import memory_storage
from agentq_dev.moto_server import MotoServer

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Invalid input may also be answered 413 (a generated body over the size limit).
CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 409, 413, 415, 422]}}}
)
# The document depends on the routes only, not on the store behind them.
DOCUMENT = openapi_document(build_app(None, None, None))  # type: ignore[arg-type]
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)


def _built_when_run(**how: Any) -> Any:
    """schemathesis' pytest plugin builds each operation's test at collection: its coverage
    phase draws the cases then (~3.7 CPU-s for this API), in every xdist worker (six in make
    test), although one runs them. This builds it, with the same arguments, when the test first
    runs: the same cases, in one worker. (schemathesis' own lazy loader, ``from_fixture``, does
    not run on pytest 9.) What pytest reads at collection is the test's signature: the fixtures
    the built test asks for, i.e. the test function's arguments less the generated ``case``."""
    built: Any = None

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal built
        if built is None:
            built = _build_at_collection(**how)
            run.__dict__.update(built.__dict__)  # the marks schemathesis reads when a run fails
        return built(*args, **kwargs)

    arguments = inspect.signature(how["test_func"]).parameters.values()
    run.__signature__ = inspect.Signature([a for a in arguments if a.name != "case"])  # type: ignore[attr-defined]
    run.__name__ = run.__qualname__ = how["test_func"].__name__
    run.pytestmark = list(getattr(how["test_func"], "pytestmark", []))  # type: ignore[attr-defined]  # its marks, read at collection
    return run


_build_at_collection = _test_builder.build_operation_test
_test_builder.build_operation_test = _built_when_run  # read by the plugin when it collects this module


@dataclass
class Api:
    wsgi: Any
    key: str


@pytest.fixture(scope="module")
def api(moto_server: MotoServer) -> Iterator[Api]:
    s = Settings.for_prefix(
        f"s{uuid.uuid4().hex[:10]}", moto_server.endpoint_url, tool_modules=("agentq.core.tools.examples",)
    )
    provision(session(s), s.names, endpoint_url=s.endpoint_url, queues=QueueSettings())
    # The table is the in-memory twin (tests/storage_conformance holds it to DynamoDB's answers):
    # what is tested here is the API's HTTP contract, and moto's DynamoDB cost ~4 ms of CPU a
    # call, two processes' worth, for each of the ~2,700 requests. Submits still go to SQS on moto.
    store = memory_storage()
    app = build_app(store, build_registry(s), build_queues(s))
    keys = store.api_keys
    yield Api(
        wsgi=wsgi_app(app.resolve, authorizer=lambda header: authorize(keys, header).tenant), key=keys.create("fuzz")[0]
    )


# What a negative case may change that is no violation here: the test sends the key whatever the
# case left out, and a query parameter a route does not declare is passed on by design
# (``api/route_input.py``). A case whose every violation is one of these is a valid request: a
# fresh clone's run drew one (GET /caps with only unknown query names left) and took its 200 for
# invalid data accepted.
TAKEN = frozenset({"query: violates `additionalProperties`", "header: violates `required` (was Authorization)"})


def _violations(failure: AcceptedNegativeData) -> set[str]:
    """The "Invalid component" lines of ``failure``'s message."""
    _, _, listed = failure.message.partition("Invalid component:")
    return {line.strip(" -") for line in listed.splitlines() if line.strip(" -")}


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_generated_requests_get_documented_answers_and_never_a_5xx(case: Any, api: Api) -> None:
    response = case.call(app=api.wsgi, headers={"Authorization": f"Bearer {api.key}"})
    try:
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as group:
        failures = group.exceptions
        if not all(isinstance(f, AcceptedNegativeData) and _violations(f) <= TAKEN for f in failures):
            raise
    except AcceptedNegativeData as failure:
        if not _violations(failure) <= TAKEN:
            raise


def test_the_served_document_is_the_generated_one_and_valid_openapi(api: Api) -> None:
    from openapi_spec_validator import validate
    from werkzeug.test import Client

    response = Client(api.wsgi).get("/openapi.json")  # public: no key needed
    assert response.status_code == 200
    served = json.loads(response.data)
    validate(served)
    assert served == json.loads(json.dumps(DOCUMENT))
    assert served["components"]["securitySchemes"] == {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": served["components"]["securitySchemes"]["bearer"]["description"],
        }
    }
    operations = {(m.upper(), p) for p, ops in served["paths"].items() for m in ops}
    # /mcp is not among them: it speaks JSON-RPC (MCP), not the REST API's shapes.
    assert operations == {
        ("POST", "/tasks"), ("GET", "/tasks"), ("GET", "/tasks/{task_id}"), ("GET", "/tasks/{task_id}/result"),
        ("GET", "/tasks/{task_id}/trace"), ("GET", "/tasks/{task_id}/compare/{other_id}"), ("GET", "/tasks/{task_id}/files"),
        ("GET", "/tasks/{task_id}/files/{path}"),
        ("GET", "/tasks/{task_id}/diff"), ("POST", "/workspace-uploads"), ("GET", "/tasks/{task_id}/events"), ("POST", "/tasks/{task_id}/cancel"), ("POST", "/tasks/{task_id}/approve"),
        ("POST", "/tasks/{task_id}/reject"), ("POST", "/tasks/{task_id}/budget"), ("POST", "/tasks/{task_id}/fork"),
        ("POST", "/tasks/{task_id}/messages"), ("GET", "/tasks/{task_id}/messages"),
        ("POST", "/tasks/{task_id}/interrupt"), ("POST", "/tasks/{task_id}/close"),
        ("GET", "/health"), ("GET", "/dead-letters"), ("POST", "/dead-letters/{tier}/redrive"), ("GET", "/breakers"),
        ("POST", "/agents"), ("GET", "/agents"), ("GET", "/agents/{name}"), ("GET", "/agents/{name}/versions"), ("PUT", "/agents/{name}/aliases/{alias}"),
        ("GET", "/agents/{name}/aliases/{alias}"), ("DELETE", "/agents/{name}/aliases/{alias}"),
        ("GET", "/agents/{name}/aliases"), ("GET", "/agents/{name}/quality"), ("POST", "/tasks/{task_id}/agent"), ("GET", "/webhooks/secret"),
        ("GET", "/policies"), ("GET", "/policies/schema"), ("POST", "/policies/test"), ("PUT", "/policies/{scope}"),
        ("GET", "/policies/{scope}"), ("GET", "/policies/{scope}/history"),
        ("POST", "/schedules"), ("GET", "/schedules"), ("GET", "/schedules/{name}"), ("DELETE", "/schedules/{name}"),
        ("POST", "/memory-stores"), ("GET", "/memory-stores"), ("GET", "/memory-stores/{name}"),
        ("PATCH", "/memory-stores/{name}"), ("DELETE", "/memory-stores/{name}"),
        ("GET", "/memory-stores/{name}/documents"), ("GET", "/memory-stores/{name}/document"),
        ("PUT", "/memory-stores/{name}/document"), ("DELETE", "/memory-stores/{name}/document"),
        ("GET", "/memory-stores/{name}/versions"), ("POST", "/memory-stores/{name}/versions/{version}/redact"),
        ("GET", "/memory-stores/{name}/search"), ("GET", "/usage"), ("GET", "/usage/tenants"), ("GET", "/usage/spend"),
        ("PUT", "/vault/credentials/{name}"), ("GET", "/vault/credentials"), ("DELETE", "/vault/credentials/{name}"),
        ("POST", "/stops"), ("GET", "/stops"), ("POST", "/stops/resume"),
        ("PUT", "/caps/{scope}/{name}"), ("GET", "/caps"), ("GET", "/caps/{scope}/{name}"), ("DELETE", "/caps/{scope}/{name}"),
    }  # fmt: skip
    for path, ops in served["paths"].items():
        for method, op in ops.items():
            errors = {code for code in op["responses"] if code.startswith(("4", "5"))}
            for code in errors:
                assert op["responses"][code]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorResponse"
                }, (method, path, code)
            if path != "/health":
                assert "401" in errors, (method, path)


def _param(path: str, method: str, name: str) -> dict[str, Any]:
    return next(p["schema"] for p in DOCUMENT["paths"][path][method]["parameters"] if p["name"] == name)


def test_the_document_states_the_rules_the_server_enforces() -> None:
    """What the server refuses is in the document a client generates from: a pattern, a bound, or
    in words where a pattern cannot say it (issue 39, item 9)."""
    import re

    from agentq.core.memory import PATH_PATTERN, check_path
    from agentq.core.schedules import next_fire

    def search(pattern: str, value: str) -> bool:
        """A JSON Schema (ECMA-262) match: its ``$`` is the end, where Python's also takes a final newline."""
        return re.search(pattern.replace("$", r"\Z"), value) is not None

    schemas = DOCUMENT["components"]["schemas"]
    # Memory paths: the pattern, and every path it admits that check_path refuses only for what
    # the description says in words ('.' or '..' segments).
    path = _param("/memory-stores/{name}/document", "get", "path")
    assert path["pattern"] == PATH_PATTERN and "'..'" in path["description"]
    for good in ("/a.md", "/customers/ann@shop+1.md", "/" + "/".join(["s"] * 20)):
        assert search(PATH_PATTERN, good) and check_path(good)
    for bad in ("a.md", "/a.md\n", "/a b", "/a//b", "/" + "/".join(["s"] * 21), "/a#b"):
        assert not search(PATH_PATTERN, bad), bad
    assert "pattern" in _param("/memory-stores/{name}/documents", "get", "path_prefix")
    # Page cursors: base64url of at most 1,024 characters (2,048 for a documents cursor, which names
    # a path of up to 1,010 bytes); metadata filters: key=value.
    for route, longest in (("/tasks", 1024), ("/tasks/{task_id}/trace", 1024), ("/memory-stores", 1024),
                           ("/memory-stores/{name}/documents", 2048)):  # fmt: skip
        cursor = _param(route, "get", "cursor")
        assert cursor["maxLength"] == longest and cursor["pattern"] == "^[A-Za-z0-9_-]*$"
    assert _param("/tasks", "get", "metadata")["items"]["pattern"] == "^[^=]+="
    assert "<task_id>:<step>.<seq>.<rank>.<sub>" in _param("/tasks/{task_id}/events", "get", "after")["description"]
    # Schedule expressions: every one next_fire takes matches the pattern, and what it does not, not.
    expression = schemas["ScheduleSpec"]["properties"]["expression"]["pattern"]
    for good in ("rate(1 minute)", "rate(5 minutes)", "rate(2 days)", "cron(0 8 * * ? *)", "cron(*/5 * * * ? *)"):
        next_fire(good, 0.0)
        assert search(expression, good), good
    for bad in ("rate(5 minutes)\n", "every 5 minutes", "rate(\u0665 minutes)", "cron()"):
        assert not search(expression, bad), bad
    # In words: script with provider, the budget raise's amounts, fork's at_step.
    assert "provider `scripted`" in schemas["TaskSubmission"]["properties"]["script"]["description"]
    assert len(schemas["BudgetRequest"]["anyOf"]) == 3
    assert "at most the source's step" in schemas["ForkRequest"]["properties"]["at_step"]["description"]
    # 414 and 431 are the server's on every operation, JSON like every error.
    for ops in DOCUMENT["paths"].values():
        for op in ops.values():
            assert {"414", "431"} <= set(op["responses"]), op["operationId"]


def test_every_request_body_of_the_api_refuses_a_field_it_does_not_know() -> None:
    """Every object a request body holds, at any depth, is strict (``additionalProperties:
    false``, a model with ``extra="forbid"``): a misspelt or imagined field is a 422 naming it,
    never dropped while the request goes through. ``POST /tasks/{id}/agent``'s body was read
    leniently (a response model's base), and ``{"version": 2, "keep_outcome": true}`` moved the
    task. This walks the document the routes generate, so a body added later is held to it."""
    schemas = DOCUMENT["components"]["schemas"]
    lenient: set[str] = set()
    seen: set[str] = set()

    def walk(schema: Any, where: str) -> None:
        if isinstance(schema, list):
            for item in schema:
                walk(item, where)
            return
        if not isinstance(schema, dict):
            return
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            if name not in seen:
                seen.add(name)
                walk(schemas[name], name)
            return
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and schema.get("additionalProperties") is not False
        ):
            lenient.add(where)
        for value in schema.values():
            walk(value, where)

    bodies = []
    for path, ops in DOCUMENT["paths"].items():
        for method, op in ops.items():
            if "requestBody" in op:
                bodies.append(f"{method.upper()} {path}")
                walk(op["requestBody"], bodies[-1])
    assert len(bodies) >= 20 and "POST /tasks/{task_id}/agent" in bodies, bodies  # the walk reads them all
    assert lenient == set(), f"request bodies that drop a field they do not know: {sorted(lenient)}"
