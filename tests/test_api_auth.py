"""API keys and the Lambda TOKEN authorizer: keys stored as hashes, a live key -> its tenant in
an Allow policy's context, anything else -> "Unauthorized" (API Gateway's 401). The two
Lambdas chained as API Gateway chains them, and `agentq keys` run as a person would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.api.auth import Unauthorized, bearer_token
from agentq.api.http_server import proxy_event
from agentq.cli.main import main
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_store, client, session
from agentq.storage.api_keys import KeyStore, key_hash
from agentq_dev.moto_server import MotoServer

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import run_agentq
from tests.lambda_support import ROOT, FakeLambdaContext, load_handler

METHOD_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/GET/tasks/xyz"


@pytest.fixture(scope="module")
def deployment(moto_server: MotoServer) -> Iterator[tuple[Settings, Any, Any, KeyStore]]:
    """Both Lambdas, loaded the way the Lambda service loads them, over one table."""
    settings = Settings.for_prefix(f"k{uuid.uuid4().hex[:10]}", moto_server.endpoint_url)
    provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
    mp = pytest.MonkeyPatch()
    for key, value in settings.env().items():
        mp.setenv(key, value)
    try:
        keys = build_store(settings).api_keys
        yield settings, load_handler("authorizer"), load_handler("api"), keys
    finally:
        mp.undo()


def _token_event(header: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "TOKEN", "methodArn": METHOD_ARN}
    if header is not None:
        event["authorizationToken"] = header
    return event


def test_a_key_is_stored_only_as_its_hash(deployment: tuple[Settings, Any, Any, KeyStore]) -> None:
    settings, _, _, keys = deployment
    token, record = keys.create("acme")
    assert token.startswith("aq_") and len(token) > 40 and record.tenant == "acme" and record.key_id.startswith("key_")
    dump = json.dumps(client(settings, "dynamodb").scan(TableName=settings.table)["Items"])
    assert token not in dump and token[3:] not in dump and key_hash(token) in dump
    assert keys.lookup(token) == record
    assert [k.key_id for k in keys.list("acme")][:1] == [record.key_id]


@pytest.mark.parametrize("bad", ["", "nope", "Basic abc", "Bearer", "Bearer aq_short", "Bearer " + "aq_" + "x" * 300])
def test_malformed_authorization_headers_are_refused(bad: str) -> None:
    with pytest.raises(Unauthorized) as err:
        bearer_token(bad)
    assert str(err.value) == "Unauthorized"  # what API Gateway turns into a 401


def _jwt(header: Any, claims: Any) -> str:
    """A token of any parts (unsigned): what a caller may send."""
    import base64

    def part(value: Any) -> str:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part(header)}.{part(claims)}.c2ln"


ISSUER = "https://login.example.com/"
FORGED = 'x", "code": "forged'  # what a caller would like between the quotes of the 401 and the log line


@pytest.mark.parametrize(
    "token",
    [
        _jwt({"alg": FORGED, "typ": "JWT"}, {"iss": ISSUER}),
        _jwt({"alg": 'x"}} forged', "typ": "JWT"}, {"iss": ISSUER}),
        _jwt({"alg": "forged\\", "typ": "JWT"}, {"iss": ISSUER}),
        _jwt({"alg": "forged\n\u2028", "typ": "JWT"}, {"iss": ISSUER}),
        _jwt({"alg": "RS256", "kid": {"forged": FORGED}}, {"iss": ISSUER}),
        _jwt({"alg": "RS256"}, FORGED.encode()),
        _jwt(FORGED, {"iss": ISSUER}),
    ],
    ids=[
        "alg-quotes",
        "alg-braces",
        "alg-backslash",
        "alg-line-ends",
        "kid-object",
        "claims-not-json",
        "header-not-object",
    ],
)
def test_a_refused_tokens_reason_is_our_own_words_never_the_tokens(token: str) -> None:
    """A token's refusal is public (api.oidc) and API Gateway puts it unescaped into the 401's
    JSON and the access log line (infra/api.py): it names what is wrong, never what the token
    holds (its alg, a claim) nor PyJWT's message about it."""
    from agentq.api.oidc import OidcSettings, OidcVerifier

    verifier = OidcVerifier(OidcSettings(issuer=ISSUER, audience="agentq-api"))  # refused before any JWKS fetch
    with pytest.raises(Unauthorized) as refused:
        verifier.verify(token)
    reason = refused.value.reason
    assert refused.value.public and "forged" not in reason, reason
    assert not set(reason) & {'"', "\\", "\n", "\u2028"}, reason
    assert reason.startswith(("malformed token", "token algorithm not accepted")), reason


def test_the_authorizer_maps_a_live_key_to_its_tenant_and_refuses_the_rest(
    deployment: tuple[Settings, Any, Any, KeyStore],
) -> None:
    _, authorizer, _, keys = deployment
    token, record = keys.create("acme")
    answer = authorizer.lambda_handler(_token_event(f"Bearer {token}"), FakeLambdaContext(3))
    assert answer["principalId"] == record.key_id
    assert answer["context"] == {"tenant": "acme", "key_id": record.key_id, "operator": False, "act_for_users": False}
    assert answer["policyDocument"]["Statement"] == [
        {
            "Action": "execute-api:Invoke",
            "Effect": "Allow",
            "Resource": "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/*",
        }
    ]  # the whole stage, so API Gateway's cached answer serves every route
    unknown, _ = KeyStore(keys.table).create("acme")
    keys.revoke(keys.lookup(unknown).key_id)  # type: ignore[union-attr]
    for header in (None, "", "Bearer aq_" + "y" * 43, f"Bearer {unknown}"):
        with pytest.raises(Exception) as err:
            authorizer.lambda_handler(_token_event(header), FakeLambdaContext(3))
        assert str(err.value) == "Unauthorized", header
    # A header of another form (API Gateway's validation regex answers it before the authorizer
    # runs; were it let through) is a Deny saying so: about the header, not about any key.
    denied = authorizer.lambda_handler(_token_event(f"Basic {token}"), FakeLambdaContext(3))
    assert denied["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    assert denied["context"] == {"error": "expected 'Bearer <key>': not a Basic credential", "field": "Authorization"}


def test_revoking_a_key_refuses_it_from_then_on(deployment: tuple[Settings, Any, Any, KeyStore]) -> None:
    _, authorizer, _, keys = deployment
    token, record = keys.create("acme")
    authorizer.lambda_handler(_token_event(f"Bearer {token}"), FakeLambdaContext(3))
    revoked = keys.revoke(record.key_id)
    assert revoked.revoked and revoked.revoked_at is not None
    assert keys.revoke(record.key_id).revoked  # idempotent
    with pytest.raises(Unauthorized, match="Unauthorized"):
        authorizer.lambda_handler(_token_event(f"Bearer {token}"), FakeLambdaContext(3))
    assert next(k for k in keys.list("acme") if k.key_id == record.key_id).revoked


def test_the_authorizer_s_context_is_the_tenant_the_api_acts_for(
    deployment: tuple[Settings, Any, Any, KeyStore],
) -> None:
    """API Gateway: authorizer answer -> requestContext.authorizer of the API Lambda's event."""
    settings, authorizer, api, keys = deployment
    token_a, _ = keys.create("tenant-one")
    token_b, _ = keys.create("tenant-two")

    def through_gateway(token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        context = authorizer.lambda_handler(_token_event(f"Bearer {token}"), FakeLambdaContext(3))["context"]
        event = proxy_event(
            method, path, {"Content-Type": "application/json"}, json.dumps(body) if body else None, tenant=None
        )
        event["requestContext"]["authorizer"] = {**context, "principalId": "x", "integrationLatency": 3}
        resp = api.lambda_handler(event, FakeLambdaContext(30))
        return resp["statusCode"], json.loads(resp["body"])

    status, created = through_gateway(token_a, "POST", "/tasks", SCRIPTED)
    assert status == 202
    assert through_gateway(token_a, "GET", f"/tasks/{created['task_id']}")[0] == 200
    assert through_gateway(token_b, "GET", f"/tasks/{created['task_id']}")[0] == 404
    assert client(settings, "dynamodb").get_item(
        TableName=settings.table, Key={"pk": {"S": f"TASK#{created['task_id']}"}, "sk": {"S": "META"}}
    )["Item"]["tenant"] == {"S": "tenant-one"}


def test_an_operator_keys_context_as_api_gateway_hands_it_on_opens_every_tenants_usage(
    deployment: tuple[Settings, Any, Any, KeyStore],
) -> None:
    """API Gateway gives a REST API the authorizer's boolean context values as strings: the
    API reads "true" as an operator and "false" (a tenant's key) as none."""
    _, authorizer, api, keys = deployment
    operator_token, operator_key = keys.create("ops", operator=True)
    tenant_token, tenant_key = keys.create("tenant-three")
    assert operator_key.operator and not tenant_key.operator and keys.lookup(operator_token) == operator_key

    def usage_of_all(token: str) -> tuple[int, Any]:
        context = authorizer.lambda_handler(_token_event(f"Bearer {token}"), FakeLambdaContext(3))["context"]
        as_gateway = {k: str(v).lower() if isinstance(v, bool) else v for k, v in context.items()}
        event = proxy_event("GET", "/usage/tenants", {}, None, tenant=None)
        event["requestContext"]["authorizer"] = {**as_gateway, "principalId": "x"}
        resp = api.lambda_handler(event, FakeLambdaContext(30))
        return resp["statusCode"], json.loads(resp["body"])

    status, data = usage_of_all(operator_token)
    assert status == 200 and isinstance(data["tenants"], list), data
    status, data = usage_of_all(tenant_token)
    assert status == 403 and data["error"]["code"] == "forbidden" and "operator" in data["error"]["message"], data


def test_keys_create_and_revoke_from_the_cli_against_the_local_stack(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = api_stack.cli_env(AGENTQ_API_KEY="")

    def person(*args: str) -> subprocess.CompletedProcess[str]:
        return run_agentq(list(args), env=env, timeout=60)

    def agentq(*args: str, key: str = "") -> tuple[int, str, str]:  # the same main(), in this process
        for name, value in {**env, "AGENTQ_API_KEY": key}.items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    created = person("keys", "create", "--tenant", "cli-tenant")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("aq_") and "cannot be shown again" in created.stderr
    key_id = created.stderr.split("key ", 1)[1].split()[0]
    code, out, _ = agentq("keys", "list", "--tenant", "cli-tenant", "--json")
    assert [k["key_id"] for k in json.loads(out)] == [key_id]
    code, out, _ = agentq("list", "--json", key=key)
    assert code == 0 and json.loads(out)["tasks"] == []  # a new tenant sees nothing
    code, _, err = agentq("stop", "--tenant", "another-tenant", key=key)  # a 403: the key is fine, the request not
    assert code == 2 and "stops only its own tenant" in err and "check the API key" not in err, err
    revoked = person("keys", "revoke", key_id)
    assert revoked.returncode == 0 and f"revoked {key_id}" in revoked.stdout
    code, _, err = agentq("list", key=key)
    assert code == 2 and "missing, unknown or revoked API key" in err and "check the API key" in err
    code, _, err = agentq("keys", "revoke", "key_0000000000000000")
    assert code == 1 and "no key 'key_0000000000000000'" in err
    code, _, err = agentq("keys", "create", "--tenant", "has spaces")
    assert code == 2 and "(tenant)" in err
    code, out, _ = agentq("keys", "create", "--tenant", "cli-ops", "--operator", "--json")
    operator = json.loads(out)
    assert code == 0 and operator["operator"] is True
    code, out, _ = agentq("keys", "list", "--tenant", "cli-ops", "--json")
    assert [(k["key_id"], k["operator"]) for k in json.loads(out)] == [(operator["key_id"], True)]
    assert api_stack.http("GET", "/usage/tenants", key=operator["api_key"])[0] == 200


def test_the_authorizer_s_cold_import_and_first_call_stay_light(
    deployment: tuple[Settings, Any, Any, KeyStore],
) -> None:
    """The authorizer Lambda loads the key lookup, the table seam and the policy, not the rest of
    agentq, boto3 or pydantic (its cold start is every uncached request's latency), neither at
    import nor in its first call: bench/import_time.py has the figures."""
    settings, _, _, keys = deployment
    token, record = keys.create("light")
    script = (
        "import json, sys\n"
        f"sys.path[:0] = {json.dumps([str(ROOT / 'functions'), str(ROOT / 'layers' / 'agentq' / 'python')])}\n"
        "import authorizer.handler\n"
        "imported = sorted(sys.modules)\n"
        f"answer = authorizer.handler.lambda_handler({json.dumps(_token_event(f'Bearer {token}'))}, None)\n"
        "print(json.dumps([imported, sorted(sys.modules), answer['context']]))\n"
    )
    env = {**os.environ, **settings.env(), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported, after_call, context = json.loads(proc.stdout.strip().splitlines()[-1])
    assert context == {"tenant": "light", "key_id": record.key_id, "operator": False, "act_for_users": False}
    heavy = {
        "boto3",
        "s3transfer",
        "pydantic",
        "anthropic",
        "agentq.runtime",
        "agentq.resources",
        "agentq.core.models",
        "agentq.core.engine",
        "agentq.storage.serdes",
        "agentq.storage.container",
        "agentq.observe.emf",
        "agentq.observe.tracing",
        "jwt",
        "cryptography",
    }  # fmt: skip (PyJWT: only with an OIDC issuer)
    assert not heavy & set(after_call)
    assert {m for m in imported if m.startswith("agentq.")} == {
        "agentq.api", "agentq.api.auth", "agentq.api.oidc", "agentq.aws", "agentq.core", "agentq.core.endusers",
        "agentq.core.errors", "agentq.core.status",
        "agentq.observe", "agentq.observe.correlation", "agentq.observe.logs", "agentq.observe.redaction",
        "agentq.observe.redaction_bytes",
        "agentq.storage", "agentq.storage.api_keys",
        "agentq.storage.dynamodb", "agentq.storage.keys", "agentq.storage.table",
    }  # fmt: skip
    assert {m for m in after_call if m.startswith("agentq.")} == {m for m in imported if m.startswith("agentq.")}
