"""The vault (``core.vault``, docs/VAULTS.md): credentials bound to hosts, sealed with envelope
encryption (a key file, and KMS on the moto server), used by reference only (``http_fetch``'s
headers, a tool's ``ctx.credential`` client, MCP headers, the egress proxy), redacted from every
result, and a missing one a pause that the user's write ends. The API's refusals and the
cross-tenant and cross-user probes are at the end; the marker scan with real processes is
tests/test_vault_marker.py."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import string
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentq.control import vault as control_vault
from agentq.core.approval import credential_request_spec
from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.models import TaskStatus, ToolOutcome, ToolsStep
from agentq.core.tools import ToolContext, ToolRegistry, tool
from agentq.core.tools.builtin import http_fetch_tool
from agentq.core.tools.credentials import FORBIDDEN_HEADERS, CredentialHandle
from agentq.core.tools.egress import DROPPED_HEADERS, EgressProxy
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.tools.mcp import McpServerConfig, McpServers
from agentq.core.vault import (
    Credential,
    CredentialRefused,
    CredentialUnavailable,
    CredentialWrite,
    HostBinding,
    VaultUnavailable,
    context_for,
)
from agentq.core.vault_crypto import EnvelopeCipher, KmsDataKeys, LocalDataKeys
from agentq.observe.redaction import REDACTED, REDACTOR, Redactor, spellings
from agentq.storage.container import Storage, memory_storage

from tests.api_support import ApiStack
from tests.helpers import scripted
from tests.vault_support import EchoServer, echo_server

MATCH_ALL = ["*", "*.*", "*.com", "*.io", "**.example.com", "a*.example.com", "*.exa*mple.com", "*:443", "*.", ""]
NARROW = ["api.github.com", "*.github.example.com", "*.example.com", "10.0.0.7:8080", "[::1]:9000", "svc:8443"]


def _marker() -> str:
    return "MRK" + uuid.uuid4().hex + "Z"


class Queues:
    """What control.vault.put sends its woken tasks to (the tests' stand-in for SQS)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, *_: Any, **__: Any) -> None:
        self.sent.append(task_id)


@pytest.fixture
def cipher(tmp_path: Path) -> EnvelopeCipher:
    return EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with echo_server() as server:
        yield server


def _put(store: Storage, cipher: EnvelopeCipher, name: str, value: str, hosts: list[str], **fields: Any) -> None:
    write = CredentialWrite.model_validate({"value": value, "hosts": hosts, **fields})
    control_vault.put(store, Queues(), cipher, "t", name, write)  # type: ignore[arg-type]


def _results(store: Storage, task_id: str) -> list[ToolOutcome]:
    return [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]


def _use(tool_name: str, **inputs: Any) -> dict[str, Any]:
    return {"name": tool_name, "input": inputs}


# --- hosts and values ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", MATCH_ALL)
def test_a_binding_that_matches_everything_or_a_whole_top_level_domain_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        HostBinding.parse(pattern)


@pytest.mark.parametrize(
    "url", ["https://api.github.com", "http://api.github.com/", "https://api.github.com:443/v3", "api.github.com/v3"]
)
def test_a_url_where_a_host_belongs_is_refused_saying_to_name_the_host(url: str) -> None:
    """The URL a person copies from the API's docs (it used to say "the port must be 1..65535")."""
    with pytest.raises(ValueError, match="a host, not a URL: name only the host"):
        HostBinding.parse(url)


def test_a_narrow_binding_matches_its_hosts_only_on_its_ports() -> None:
    rng = random.Random(7)
    for _ in range(300):
        label = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 8)))
        exact = HostBinding.parse("api.github.com")
        pattern = HostBinding.parse("*.example.com")
        assert pattern.matches(f"{label}.example.com", 443) and pattern.matches(f"{label}.x.example.com", 80)
        assert not pattern.matches(f"{label}example.com", 443) and not pattern.matches("example.com", 443)
        assert not pattern.matches(f"{label}.example.com.evil.io", 443)
        assert not exact.matches(f"{label}.api.github.com", 443) and not exact.matches("api.github.com", 8443)
    assert HostBinding.parse("10.0.0.7:8080").matches("10.0.0.7", 8080)
    assert not HostBinding.parse("10.0.0.7:8080").matches("10.0.0.7", 80)
    assert [str(HostBinding.parse(h)) for h in NARROW] == NARROW


# A value around which a server trims whitespace (a field value excludes it, RFC 9110 5.5), and one
# it reads otherwise: a Latin-1 letter (one byte a UTF-8 reader echoes as U+FFFD), one past Latin-1
# (no header carries it), a space inside (where a server may end a token).
PADDED = ["s3cr3t-value-123 ", " s3cr3t-value-123", "s3cr3t-value-123\u3000", "\u00a0s3cr3t-value-123"]
NOT_VISIBLE = ["s3cr3t-v\u00e4lue-123", "s3cr3t-v\u4e01lue-123", "s3cr3t value-123"]
KINDS = [("bearer", {}), ("api_key", {}), ("basic", {"username": "ann"})]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"hosts": []}, "hosts"),
        ({"hosts": ["*"]}, "hosts"),
        ({"hosts": ["*.com"]}, "hosts"),
        ({"value": "short"}, "value"),
        ({"value": "x" * 4097}, "value"),
        ({"value": "line\nbreak-value"}, "value"),
        ({"kind": "basic"}, "username"),
        ({"header": "X-Key"}, "header"),
        ({"value": " " * 8}, "value"),
        ({"value": "function"[:4] * 4}, "value"),
        ({"value": "\u00a0-=-=\u3000=-=-\u2003"}, "value"),
        *(({"kind": kind, "value": value}, "value") for kind in ("bearer", "api_key") for value in PADDED),
        *(({"kind": kind, "value": value}, "value") for kind in ("bearer", "api_key") for value in NOT_VISIBLE),
    ],
)
def test_a_bad_write_is_refused_naming_the_field_and_never_echoes_the_value(fields: dict[str, Any], field: str) -> None:
    body = {"value": "s3cr3t-value-123", "hosts": ["api.github.com"], **fields}
    with pytest.raises(Exception) as caught:
        CredentialWrite.model_validate(body)
    assert field in str(caught.value) and str(body["value"]) not in str(caught.value)
    assert "\u4e01" not in str(caught.value) and "\u00e9" not in str(caught.value)


def test_a_basic_auth_password_may_hold_any_letter_and_a_space_inside_which_base64_carries_as_it_is() -> None:
    """A bearer token or an API key goes into its header as it is, so it is visible ASCII only
    (``PADDED``, ``NOT_VISIBLE``); a password goes base64-encoded, which every server decodes as
    it was sent."""
    for value in ("p\u00e4ss w\u00f6rd-\u4e01", "pass word-1234"):
        write = CredentialWrite.model_validate({"kind": "basic", "username": "ann", "value": value, "hosts": ["a.io"]})
        assert write.value.get_secret_value() == value


@pytest.mark.parametrize("value", PADDED)
def test_a_basic_password_with_whitespace_around_it_is_taken_and_sent_whole_inside_its_base64(value: str) -> None:
    """Whitespace around a value is refused for the kinds that go into a header as they are
    (a server reads a field value without it); a basic password travels base64-encoded, so the
    server decodes it whole, spaces and all. Refused at write while one stored before was still
    sent, the rule said one thing and the sending another; now a write takes it, and it goes
    (``header`` and ``${vault:NAME}`` alike) as it was written, its trimmed spelling redacted too
    in case an application trims what it decoded."""
    write = CredentialWrite.model_validate(
        {"kind": "basic", "username": "deploy", "value": value, "hosts": ["api.example.com"]}
    )
    assert write.value.get_secret_value() == value
    stored = Credential("svc", "basic", (HostBinding.parse("api.example.com"),), value, username="deploy")
    whole = base64.b64encode(f"deploy:{value}".encode()).decode()
    assert stored.header() == ("Authorization", f"Basic {whole}") and stored.reference_value() == whole
    assert value.strip() in stored.secret_forms() and value in stored.secret_forms()


# Every header a client or the egress proxy sets itself, or drops from a process's request, and
# more of the same kinds, in the spellings a write may use; then names an API reads a key from.
FRAMING_OR_ROUTING = sorted(
    {n.decode() for n in DROPPED_HEADERS} | FORBIDDEN_HEADERS
    | {"expect", "proxy-authenticate", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-server", "via"}
)  # fmt: skip
KEY_HEADERS = ["Authorization", "X-Api-Key", "X-Crm-Key", "Private-Token", "Api-Key", "X-Hostname", "Proxied-By"]


@pytest.mark.parametrize("name", FRAMING_OR_ROUTING)
def test_an_api_key_may_not_name_a_header_that_frames_or_routes_a_request(name: str) -> None:
    """The egress proxy drops a process's ``Host``, framing and routing headers and frames the body
    itself, then adds the credential's header: one named so would reach the upstream after those
    checks (a second ``Host``, ``Transfer-Encoding`` beside the proxy's ``Content-Length``)."""
    for spelling in (name, name.upper(), "-".join(part.capitalize() for part in name.split("-"))):
        body = {"kind": "api_key", "header": spelling, "value": "s3cr3t-value-123", "hosts": ["api.example.com"]}
        with pytest.raises(ValueError) as caught:
            CredentialWrite.model_validate(body)
        assert "header" in str(caught.value) and "frames or routes" in str(caught.value)
        assert "s3cr3t-value-123" not in str(caught.value)
    for header in KEY_HEADERS:
        CredentialWrite.model_validate({"kind": "api_key", "header": header, "value": "s3cr3t-value-123",
                                        "hosts": ["api.example.com"]})  # fmt: skip


def test_a_value_of_fewer_than_five_different_characters_besides_spaces_is_refused() -> None:
    """Such a value (eight spaces, ``--------``, ``abababab``) is no secret, and would be redacted
    wherever that run of characters stands in its user's own results and files: indentation, a
    rule line. Five different characters or more, whatever else the value holds, are taken."""
    rng = random.Random(11)
    spaces = " \u00a0\u2003\u3000"  # a tab, a control character, is refused anyway
    for _ in range(400):
        distinct = rng.randint(1, 6)
        letters = rng.sample(string.ascii_letters + string.digits + string.punctuation + "\u00e9\u4e01", distinct)
        body = letters + rng.choices(letters + list(spaces), k=rng.randint(8, 40))
        rng.shuffle(body)
        value = letters[0] + "".join(body) + letters[0]  # no space around it (refused too, for another reason)
        # a password: basic auth's may hold spaces and any letter (a token's is visible ASCII only)
        write = {"value": value, "hosts": ["api.example.com"], "kind": "basic", "username": "ann"}
        if distinct >= 5:
            CredentialWrite.model_validate(write)
            continue
        with pytest.raises(ValueError, match="different characters besides spaces") as caught:
            CredentialWrite.model_validate(write)
        assert "value" in str(caught.value) and value not in str(caught.value)


# --- sealing --------------------------------------------------------------------------------------


def test_a_sealed_credential_opens_only_under_its_owners_name(cipher: EnvelopeCipher) -> None:
    secret = _marker().encode()
    sealed = cipher.seal(secret, context_for("t", "ann", "github"))
    assert secret not in sealed.ciphertext + sealed.wrapped_key + sealed.nonce
    assert cipher.open(sealed, context_for("t", "ann", "github")) == secret
    for other in (context_for("t", "bob", "github"), context_for("u", "ann", "github"), context_for("t", "ann", "x")):
        with pytest.raises(VaultUnavailable):
            EnvelopeCipher(cipher.keys).open(sealed, other)


def test_kms_envelope_on_the_moto_server_binds_the_owner_and_caches_the_data_key(moto_server: Any) -> None:
    kms = boto3.client("kms", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    key_id = kms.create_key(Description="agentq vault test")["KeyMetadata"]["KeyId"]
    keys = KmsDataKeys(kms, key_id)
    cipher = EnvelopeCipher(keys)
    secret = _marker().encode()
    sealed = cipher.seal(secret, context_for("t", "ann", "github"))
    assert keys.calls == 1 and secret not in sealed.ciphertext
    fresh = EnvelopeCipher(keys)
    assert fresh.open(sealed, context_for("t", "ann", "github")) == secret
    assert fresh.open(sealed, context_for("t", "ann", "github")) == secret
    assert keys.calls == 2 and (fresh.hits, fresh.misses) == (1, 1)  # the second use made no KMS call
    with pytest.raises(VaultUnavailable, match="KMS would not unwrap"):
        EnvelopeCipher(keys).open(sealed, context_for("t", "bob", "github"))


def test_the_table_holds_no_value_in_the_clear(cipher: EnvelopeCipher) -> None:
    store = memory_storage()
    marker = _marker()
    _put(store, cipher, "github", marker, ["api.github.com"], user="ann")
    dumped = json.dumps(list(store.table._items.values()), default=str)  # type: ignore[attr-defined]
    assert marker not in dumped and base64.b64encode(marker.encode()).decode() not in dumped
    [info] = store.vault.listing("t", "ann")
    assert info.name == "github" and info.hosts == ["api.github.com"] and marker not in info.model_dump_json()


# --- redaction ------------------------------------------------------------------------------------


def test_every_spelling_of_a_value_is_redacted_wherever_it_sits_in_a_text() -> None:
    rng = random.Random(11)
    for _ in range(200):
        value = "".join(rng.choices(string.ascii_letters + string.digits + "-_+/=:.", k=rng.randint(8, 60)))
        redactor = Redactor()
        redactor.add(value)
        prefix = "".join(rng.choices(string.printable, k=rng.randint(0, 20)))
        raw = f"{prefix}{value}{prefix}"
        carriers = [
            raw,
            urllib.parse.quote(raw, safe=""),
            urllib.parse.quote_plus(raw),
            json.dumps({"x": raw}),
            base64.b64encode(raw.encode()).decode(),
            base64.urlsafe_b64encode(raw.encode()).decode(),
        ]
        for text in carriers:
            cleaned = redactor.redact(text)
            assert REDACTED in cleaned, (value, text)
            assert not any(s in cleaned for s in spellings(value)), (value, text)
    assert Redactor().redact("nothing to hide here") == "nothing to hide here"


def test_a_value_stored_with_whitespace_around_it_is_redacted_as_a_reader_trims_it() -> None:
    """A value written before whitespace around it was refused: a basic auth password goes
    base64-encoded, and a server that decodes and trims it echoes it without the whitespace,
    which is no spelling of the stored value; the redactor gets that spelling too."""
    redactor = Redactor()
    credential = Credential("c", "basic", (), " pw-S3cr3t-99\t", username="ann")
    redactor.add(*credential.secret_forms())
    for echo in ("pw-S3cr3t-99", "ann: pw-S3cr3t-99", json.dumps({"password": "pw-S3cr3t-99"})):
        assert "pw-S3cr3t-99" not in redactor.redact(echo) and REDACTED in redactor.redact(echo), echo


@pytest.mark.parametrize("value", [*PADDED, *NOT_VISIBLE])
@pytest.mark.parametrize("kind", ["bearer", "api_key"])
def test_a_token_stored_before_it_was_refused_is_sent_by_nothing_in_words_that_quote_none_of_it(
    kind: Any, value: str, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bearer token or API key that is not visible ASCII, written before writes refused it,
    would reach a server that reads it otherwise (trimmed, re-decoded) or none at all (an
    encoding error naming its character and offset): ``http_fetch``'s reference, a tool's client
    and the egress proxy's header (``Credential.header``) refuse it, nothing sent."""
    credential = Credential("github", kind, (HostBinding.parse(echo.host),), value)
    for use in (credential.header, credential.reference_value):
        with pytest.raises(CredentialRefused, match="not sent") as caught:
            use()
        assert value.strip() not in str(caught.value) and "position" not in str(caught.value)
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)
    with pytest.raises(CredentialRefused):
        CredentialHandle(credential).get(echo.url("/a"))
    assert echo.requests == []


# --- use at egress --------------------------------------------------------------------------------


def _engine(store: Storage, cipher: EnvelopeCipher, echo: EchoServer, *extra: Any) -> Engine:
    policy = FetchPolicy(allow=(HostRule.parse(echo.host), HostRule.parse("127.0.0.1")))
    tools = ToolRegistry([http_fetch_tool(policy), credential_request_spec(), *extra])
    return Engine(store, worker_id="w", tools=tools, config=EngineConfig(lease_seconds=10), cipher=cipher)


def test_http_fetch_sends_a_referenced_credential_to_its_host_and_the_echo_comes_back_redacted(
    cipher: EnvelopeCipher, echo: EchoServer
) -> None:
    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    fetch = _use("http_fetch", url=echo.url("/me"), headers={"Authorization": "Bearer ${vault:github}"})
    sub = scripted([{"text": "", "tool_calls": [fetch]}, {"text": "done"}], tools=["http_fetch"])
    task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
    held = REDACTOR.held
    assert _engine(store, cipher, echo).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert REDACTOR.held == held  # the run's values, held while it ran, released when it ended
    assert echo.requests[0]["authorization"] == f"Bearer {marker}"
    [result] = _results(store, task.task_id)
    assert not result.is_error and "Bearer [redacted credential]" in result.content
    assert marker not in result.content and base64.b64encode(marker.encode()).decode()[:16] not in result.content


def test_a_redirect_to_a_host_the_credential_is_not_bound_to_carries_no_credential(
    cipher: EnvelopeCipher, echo: EchoServer
) -> None:
    store, marker = memory_storage(), _marker()
    with echo_server() as elsewhere:
        _put(store, cipher, "github", marker, [echo.host])
        away = echo.url("/redirect?to=" + urllib.parse.quote(elsewhere.url("/landed"), safe=""))
        fetch = _use("http_fetch", url=away, headers={"Authorization": "Bearer ${vault:github}", "X-Plain": "kept"})
        policy = FetchPolicy(allow=(HostRule.parse(echo.host), HostRule.parse(elsewhere.host)))
        tools = ToolRegistry([http_fetch_tool(policy)])
        task = store.tasks.create(scripted([{"text": "", "tool_calls": [fetch]}, {"text": "ok"}],
                                           tools=["http_fetch"]), tenant="t")  # fmt: skip
        Engine(store, worker_id="w", tools=tools, cipher=cipher).run(task.task_id)
        assert echo.requests[0]["authorization"] == f"Bearer {marker}"
        assert "authorization" not in elsewhere.requests[0] and elsewhere.requests[0]["x-plain"] == "kept"
    # To a host it is not bound to at all: refused, nothing sent.
    source = TaskCredentials(store.vault, cipher, "t", None)
    from agentq.core.vault import expand

    with pytest.raises(CredentialRefused, match="not sent"):
        expand("Bearer ${vault:github}", source, "evil.example.com", 443)


def test_a_header_http_cannot_carry_is_a_tool_error_in_fixed_words_that_quote_none_of_it(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model writes a letter past Latin-1 after a reference (``Bearer ${vault:github}\u4e01``):
    http.client's ``UnicodeEncodeError``, which the model read, named the letter and its offset,
    the length of the value before it. A tool's client's header likewise."""
    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    fetch = _use("http_fetch", url=echo.url("/me"), headers={"Authorization": "Bearer ${vault:github}\u4e01"})
    sub = scripted([{"text": "", "tool_calls": [fetch]}, {"text": "done"}], tools=["http_fetch"])
    task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
    assert _engine(store, cipher, echo).run(task.task_id).status is TaskStatus.SUCCEEDED
    [result] = _results(store, task.task_id)
    assert result.is_error and "cannot carry" in result.content and "nothing sent" in result.content, result
    assert "\u4e01" not in result.content and "position" not in result.content  # nor the offset, the value's length
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)
    handle = CredentialHandle(TaskCredentials(store.vault, cipher, "t", "ann").get("github"))
    with pytest.raises(ValueError, match="cannot carry") as caught:
        handle.get(echo.url("/a"), headers={"X-Note": "\u4e01"})
    assert "\u4e01" not in str(caught.value) and "position" not in str(caught.value)
    assert echo.requests == []


@tool
def leaky(url: str, ctx: ToolContext) -> str:
    """Calls a URL with the user's github credential and returns what came back, and its repr."""
    handle = ctx.credential("github")
    response = handle.get(url)
    return f"{handle!r} {response.status} {response.body.decode()}"


def test_a_tools_credential_client_sends_only_to_its_hosts_and_its_echo_is_redacted(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    with echo_server() as other:
        # The client goes through the deployment's SSRF guard: loopback only where it allows it.
        monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", f"{echo.host},{other.host}")
        calls = [_use("leaky", url=echo.url("/ok")), _use("leaky", url=other.url("/nope"))]
        sub = scripted([{"text": "", "tool_calls": calls}, {"text": "done"}], tools=["leaky"])
        task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
        _engine(store, cipher, echo, leaky).run(task.task_id)
        assert other.requests == []  # refused before anything was sent
    ok, refused = _results(store, task.task_id)
    assert echo.requests[0]["authorization"] == f"Bearer {marker}"
    assert "CredentialHandle('github'" in ok.content and marker not in ok.content and REDACTED in ok.content
    assert refused.is_error and "credential_refused" not in refused.content and "not sent" in refused.content


def test_a_tools_credential_client_asks_for_no_range_or_recoding_and_refuses_an_answer_it_cannot_redact_whole(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the egress proxy and ``http_fetch``: a tool's headers (which may be the model's words)
    lose ``Range`` and the other ``TRANSFORMING_HEADERS`` in any case, agentq's ``identity``
    replaces a lowercase ``accept-encoding``, and a ``206`` or an encoded answer is refused before
    a byte of its body is read."""
    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)
    handle = CredentialHandle(TaskCredentials(store.vault, cipher, "t", "ann").get("github"))
    asked = {"range": "bytes=0-9", "accept-encoding": "gzip", "TE": "gzip", "If-Range": "x", "Accept-Charset": "x"}
    body = handle.get(echo.url("/headers"), headers={**asked, "X-Kept": "1"}).body.decode()
    assert json.loads(body)["headers"]["Accept-Encoding"] == "identity" and "X-Kept" in body, body
    assert not [k for k in json.loads(body)["headers"] if k.lower() in {n.lower() for n in asked} - {"accept-encoding"}]
    assert "gzip" not in body and marker not in body
    for query, why in (("status=206", "a 206"), ("coding=gzip", "Content-Encoding")):
        with pytest.raises(ValueError, match="not returned") as caught:
            handle.get(echo.url(f"/headers?{query}"))
        assert why in str(caught.value) and marker not in str(caught.value)


def test_another_users_or_tenants_credential_is_unavailable_to_a_task(cipher: EnvelopeCipher) -> None:
    store = memory_storage()
    _put(store, cipher, "github", _marker(), ["api.github.com"], user="ann")
    for tenant, user in (("t", "bob"), ("other", "ann"), ("t", None)):
        with pytest.raises(CredentialUnavailable, match="credential_unavailable"):
            TaskCredentials(store.vault, cipher, tenant, user).get("github")
    assert TaskCredentials(store.vault, cipher, "t", "ann").get("github").name == "github"
    _put(store, cipher, "crm", _marker(), ["crm.example.com"])  # the tenant's own: every user's tasks
    assert TaskCredentials(store.vault, cipher, "t", "bob").get("crm").name == "crm"


def test_the_egress_proxy_adds_the_credential_to_plain_http_and_refuses_to_inject_into_a_tunnel(
    cipher: EnvelopeCipher, echo: EchoServer
) -> None:
    import socket

    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    source = TaskCredentials(store.vault, cipher, "t", "ann")
    proxy = EgressProxy([HostRule.parse(echo.host)], FetchPolicy(allow=(HostRule.parse(echo.host),)),
                        credentials=source)  # fmt: skip
    try:
        for head in (
            f"GET {echo.url('/a')} HTTP/1.1\r\nHost: {echo.host}\r\nAuthorization: Bearer forged\r\n\r\n",
            f"CONNECT {echo.host} HTTP/1.1\r\nHost: {echo.host}\r\n\r\n",
        ):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(proxy.path)
                sock.sendall(head.encode())
                if head.startswith("CONNECT"):
                    assert sock.recv(100).startswith(b"HTTP/1.1 200")
                    sock.sendall(f"GET /tunnelled HTTP/1.1\r\nHost: {echo.host}\r\nConnection: close\r\n\r\n".encode())
                while sock.recv(65536):
                    pass
    finally:
        proxy.close()
    plain, tunnelled = echo.requests
    assert plain["authorization"] == f"Bearer {marker}"  # the process's own header was replaced
    assert "authorization" not in tunnelled and proxy.injected == 1
    assert any("not added to a CONNECT tunnel" in r for r in proxy.refused)


@pytest.mark.parametrize("tunnels", [1, 5])
def test_a_connect_tunnel_which_carries_no_credential_reads_no_credential_item(
    cipher: EnvelopeCipher, echo: EchoServer, tunnels: int
) -> None:
    """An https request is a CONNECT tunnel, which never carries the credential: the proxy only
    notes that it did not add it, by the name the run's listing (read once) gives. Before, each
    tunnel read the credential's item as a credentialed call does (a strongly consistent
    GetItem, two for a tenant's credential) for nothing."""
    import socket

    store = memory_storage()
    _put(store, cipher, "github", _marker(), [echo.host], user="ann")
    source = TaskCredentials(store.vault, cipher, "t", "ann")
    reads: list[Any] = []
    listings: list[Any] = []
    get, listing = store.vault.get, store.vault.listing

    def counted_get(*args: Any) -> Any:
        reads.append(args)
        return get(*args)

    def counted_listing(*args: Any) -> Any:
        listings.append(args)
        return listing(*args)

    store.vault.get = counted_get  # type: ignore[method-assign,assignment]
    store.vault.listing = counted_listing  # type: ignore[method-assign,assignment]
    proxy = EgressProxy([HostRule.parse(echo.host)], FetchPolicy(allow=(HostRule.parse(echo.host),)),
                        credentials=source)  # fmt: skip
    try:
        for _ in range(tunnels):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(proxy.path)
                sock.sendall(f"CONNECT {echo.host} HTTP/1.1\r\nHost: {echo.host}\r\n\r\n".encode())
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        proxy.close()
    assert reads == [], f"{len(reads)} credential item reads for {tunnels} CONNECT tunnel(s), none of which sent it"
    assert len(listings) == 2  # the user's listing and the tenant's, once for the run
    notes = [r for r in proxy.refused if "'github' not added to a CONNECT tunnel" in r]
    assert len(notes) == tunnels and proxy.injected == 0


def test_the_egress_proxy_sends_a_credential_only_under_its_bound_hosts_name_whatever_host_the_process_names(
    cipher: EnvelopeCipher, echo: EchoServer
) -> None:
    """On a shared front end (a CDN, virtual hosting) the Host header, or a header it trusts to
    override it, picks the site: the request URL's authority is the only one sent upstream."""
    import socket

    store, marker = memory_storage(), _marker()
    _put(store, cipher, "github", marker, [echo.host], user="ann")
    proxy = EgressProxy([HostRule.parse(echo.host)], FetchPolicy(allow=(HostRule.parse(echo.host),)),
                        credentials=TaskCredentials(store.vault, cipher, "t", "ann"))  # fmt: skip
    steer = ["Host: attacker.example.net", "host: attacker.example.net", "X-Forwarded-Host: attacker.example.net",
             "Forwarded: host=attacker.example.net", "X-Host: attacker.example.net",
             "X-Original-Host: attacker.example.net", "X-HTTP-Host-Override: attacker.example.net"]  # fmt: skip
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(proxy.path)
            head = "".join(f"{h}\r\n" for h in steer)
            sock.sendall(f"GET {echo.url('/a')} HTTP/1.1\r\n{head}X-Kept: 1\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        proxy.close()
    [seen] = echo.requests
    assert seen["host"] == echo.host and seen["authorization"] == f"Bearer {marker}" and seen["x-kept"] == "1"
    echoed = answer.decode("latin-1").split("\r\n\r\n", 1)[1].split("\nbase64:")[0]  # the head the server read
    assert "attacker" not in echoed and echoed.lower().count("\nhost:") == 1, echoed


@pytest.mark.parametrize("change", ["rebound", "deleted"])
def test_a_credential_deleted_rebound_or_written_again_while_a_run_holds_it_is_sent_as_it_is_now(
    cipher: EnvelopeCipher, echo: EchoServer, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The run kept what it opened (``TaskCredentials._opened``) and the egress proxy the listing
    it read (``_infos``) until the run ended, hours for a long-running agent: after the user bound
    the credential to another host, or deleted it, the proxy's next request still carried the old
    value to the old host, as did a tool's client handed out before. Each use reads the item again
    now: bound elsewhere or gone, it is sent by neither; written again, its new value is."""
    import socket

    store, old, new = memory_storage(), _marker(), _marker()
    _put(store, cipher, "github", old, [echo.host], user="ann")
    source = TaskCredentials(store.vault, cipher, "t", "ann")
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)
    handle = ToolContext("t1", "toolu_1", "k", credentials=source).credential("github")
    proxy = EgressProxy([HostRule.parse(echo.host)], FetchPolicy(allow=(HostRule.parse(echo.host),)),
                        credentials=source)  # fmt: skip

    def both(step: str) -> None:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(proxy.path)
            sock.sendall(f"GET {echo.url(f'/proxy-{step}')} HTTP/1.1\r\nHost: {echo.host}\r\n\r\n".encode())
            while sock.recv(65536):
                pass
        with contextlib.suppress(CredentialRefused, CredentialUnavailable):
            handle.get(echo.url(f"/tool-{step}"))

    try:
        both("opened")
        _put(store, cipher, "github", new, [echo.host], user="ann")  # written again: a new value
        both("rewritten")
        if change == "rebound":
            _put(store, cipher, "github", new, ["api.example.com"], user="ann")
        else:
            store.vault.delete("t", "ann", "github")
        both(change)
    finally:
        proxy.close()
    sent = {r["path"].strip("/"): r.get("authorization") for r in echo.requests}
    assert sent == {"proxy-opened": f"Bearer {old}", "tool-opened": f"Bearer {old}", "proxy-rewritten": f"Bearer {new}",
                    "tool-rewritten": f"Bearer {new}", f"proxy-{change}": None}, sent  # fmt: skip


@pytest.mark.parametrize("header", ["Host", "Transfer-Encoding", "Content-Length", "X-Forwarded-Host", "Connection",
                                    "Proxy-Authorization"])  # fmt: skip
def test_a_credential_stored_naming_a_routing_or_framing_header_is_sent_nowhere(
    cipher: EnvelopeCipher, echo: EchoServer, header: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A credential stored before writes refused such a header: the egress proxy answers 502
    naming it and the upstream gets no byte (never a second ``Host`` or conflicting framing), and
    a tool's client raises before contacting anyone."""
    import socket
    import threading

    store = memory_storage()
    upstream = socket.socket()
    upstream.bind(("127.0.0.1", 0))
    upstream.listen(1)
    host = f"127.0.0.1:{upstream.getsockname()[1]}"
    for name, at in (("k", host), ("h", echo.host)):  # as a write stored it before the rule
        sealed = cipher.seal(json.dumps({"value": "attacker.example.net"}).encode(), context_for("t", "ann", name))
        store.vault.put("t", "ann", name, kind="api_key", hosts=[at], header=header, sealed=sealed)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                data += chunk
            got.append(data)  # the request's head, or nothing

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    proxy = EgressProxy([HostRule.parse(host)], FetchPolicy(allow=(HostRule.parse(host),)),
                        credentials=TaskCredentials(store.vault, cipher, "t", "ann"))  # fmt: skip
    answer = b""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(proxy.path)
            sock.sendall(f"POST http://{host}/a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".encode())
            while chunk := sock.recv(65536):
                answer += chunk
        server.join(10)
    finally:
        proxy.close()
        upstream.close()
    assert got == [b""], got[0].decode("latin-1")  # the proxy connected (an allowed destination), sent nothing
    assert answer.startswith(b"HTTP/1.1 502") and b"'k'" in answer and b"frames or routes" in answer, answer
    assert proxy.injected == 0 and any("frames or routes" in r for r in proxy.refused)
    monkeypatch.setenv("AGENTQ_HTTP_FETCH_ALLOW", echo.host)
    handle = CredentialHandle(TaskCredentials(store.vault, cipher, "t", "ann").get("h"))
    with pytest.raises(CredentialRefused, match="frames or routes"):
        handle.get(echo.url("/a"))
    assert echo.requests == []


def test_an_mcp_servers_header_takes_a_vault_reference_for_its_host_only(cipher: EnvelopeCipher) -> None:
    store, marker = memory_storage(), _marker()
    _put(store, cipher, "crm", marker, ["mcp.example.com"], user="ann")
    source = TaskCredentials(store.vault, cipher, "t", "ann")
    servers = McpServers({
        "crm": McpServerConfig(url="https://mcp.example.com/mcp", headers={"Authorization": "Bearer ${vault:crm}"}),
        "evil": McpServerConfig(url="https://evil.example.org/mcp", headers={"Authorization": "Bearer ${vault:crm}"}),
    })  # fmt: skip
    assert servers._headers(servers.get("crm"), source, for_call=True) == {"Authorization": f"Bearer {marker}"}
    assert servers._headers(servers.get("crm"), None, for_call=False) == {}  # a listing acts for no user
    with pytest.raises(CredentialRefused):
        servers._headers(servers.get("evil"), source, for_call=True)
    with pytest.raises(ValueError, match="only in an http server's headers"):
        McpServerConfig(command=["srv"], env={"TOKEN": "${vault:crm}"})


@pytest.mark.parametrize(
    "reference", ["${secret:billing-key}", "${vault:billing}", "x${secret:billing-key}${vault:billing}"]
)
def test_a_value_put_into_a_header_is_sent_as_it_is_never_read_for_references_again(
    cipher: EnvelopeCipher, reference: str
) -> None:
    """A credential's value is its end user's text (an end user's token may write its own): one
    that holds ``${secret:...}`` or ``${vault:...}`` is sent as it is, so it never pulls the
    deployment's secret, or another credential, into a header bound elsewhere. So is a secret's
    value: an MCP server's header fills both kinds in one pass over the operator's text, and
    ``http_fetch``'s headers fill credentials only."""
    from agentq.core.secrets import Secrets
    from agentq.core.tools.credentials import vault_headers
    from agentq.core.tools.fetch import parse_target

    store, billing = memory_storage(), _marker()
    _put(store, cipher, "crm", reference, ["mcp.example.com"], user="mallory")  # what mallory's token may write
    _put(store, cipher, "billing", billing, ["billing.example.net"], user="mallory")
    deployment = {"billing-key": "sk_live_" + billing, "crm-key": reference}
    servers = McpServers(
        {
            "crm": McpServerConfig(url="https://mcp.example.com/mcp", headers={
                "Authorization": "Bearer ${vault:crm}", "X-Both": "${secret:crm-key}/${vault:crm}",
                "X-Secret": "${secret:crm-key}"}),
            "billing": McpServerConfig(url="https://billing.example.net/mcp", headers={"X-Key": "${secret:billing-key}"}),
        },
        Secrets(deployment.get, frozenset(deployment)),
    )  # fmt: skip
    source = TaskCredentials(store.vault, cipher, "t", "mallory")
    try:
        sent = servers._headers(servers.get("crm"), source, for_call=True)  # what McpServers.call sends
        fetched = vault_headers({"Authorization": "Bearer ${vault:crm}"}, source)(
            parse_target("https://mcp.example.com/"), 0
        )
    finally:
        source.close()
    assert sent == {"Authorization": f"Bearer {reference}", "X-Both": f"{reference}/{reference}", "X-Secret": reference}
    assert fetched == {"Authorization": f"Bearer {reference}"}
    assert servers._headers(servers.get("billing"), None, for_call=False) == {"X-Key": "sk_live_" + billing}


# --- a missing credential is a pause --------------------------------------------------------------


def test_a_missing_credential_is_a_tool_error_then_a_pause_that_the_users_write_ends(
    cipher: EnvelopeCipher, echo: EchoServer
) -> None:
    store, marker, queues = memory_storage(), _marker(), Queues()
    fetch = _use("http_fetch", url=echo.url("/x"), headers={"Authorization": "Bearer ${vault:github}"})
    ask = _use("request_credential", name="github", host=echo.host)
    turns = [{"text": "", "tool_calls": [fetch]}, {"text": "", "tool_calls": [ask]},
             {"text": "", "tool_calls": [fetch]}, {"text": "done"}]  # fmt: skip
    sub = scripted(turns, tools=["http_fetch", "request_credential"]).model_copy(update={"user": "ann"})
    task = store.tasks.create(sub, tenant="t")
    engine = _engine(store, cipher, echo)
    assert engine.run(task.task_id).status is TaskStatus.PAUSED
    [missing] = _results(store, task.task_id)
    assert missing.is_error and "credential_unavailable" in missing.content and "'github'" in missing.content
    assert echo.host in missing.content
    [asked] = store.approvals.list(task.task_id)
    assert asked.state == "pending" and asked.credential == {"name": "github", "host": echo.host}
    head = store.events.head(task.task_id)
    assert head is not None
    events = [e for e in store.events.read(task.task_id, head, None) if e.type == "approval.requested"]
    assert events and events[-1].data["credential"] == {"name": "github", "host": echo.host}
    # Another user's write wakes nothing; ann's does.
    write = CredentialWrite.model_validate({"value": _marker(), "hosts": [echo.host], "user": "bob"})
    control_vault.put(store, queues, cipher, "t", "github", write)  # type: ignore[arg-type]
    assert queues.sent == [] and store.tasks.get(task.task_id).status is TaskStatus.PAUSED
    write = CredentialWrite.model_validate({"value": marker, "hosts": [echo.host], "user": "ann"})
    control_vault.put(store, queues, cipher, "t", "github", write)  # type: ignore[arg-type]
    assert queues.sent == [task.task_id] and store.tasks.get(task.task_id).status is TaskStatus.QUEUED
    assert store.vault.waiters("t", "ann", "github") == [] and store.vault.waiters("t", None, "github") == []
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    _, granted, fetched = _results(store, task.task_id)
    assert "available now" in granted.content and not fetched.is_error
    assert echo.requests[-1]["authorization"] == f"Bearer {marker}"


def test_asking_for_a_credential_the_user_already_has_does_not_pause(cipher: EnvelopeCipher, echo: EchoServer) -> None:
    store = memory_storage()
    _put(store, cipher, "github", _marker(), [echo.host], user="ann")
    sub = scripted([{"text": "", "tool_calls": [_use("request_credential", name="github")]}, {"text": "ok"}],
                   tools=["request_credential"]).model_copy(update={"user": "ann"})  # fmt: skip
    task = store.tasks.create(sub, tenant="t")
    assert _engine(store, cipher, echo).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert store.approvals.list(task.task_id) == []


# --- the API --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/vault/credentials/github", {"hosts": ["api.github.com"]}, 422, "value"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret", "hosts": []}, 422, "hosts"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret", "hosts": ["*"]}, 422, "hosts"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret", "hosts": ["*.com"]}, 422, "hosts"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret" * 500, "hosts": ["a.example.com"]}, 422, "value"),
        ("/vault/credentials/github", {"value": " " * 8, "hosts": ["a.example.com"]}, 422, "value"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret ", "hosts": ["a.example.com"]}, 422, "value"),
        ("/vault/credentials/github", {"value": "v3ry-s3cr\u00e9t", "hosts": ["a.example.com"]}, 422, "value"),
        (
            "/vault/credentials/github",
            {"value": "v3ry-s3cr\u4e01t", "hosts": ["a.example.com"], "kind": "api_key"},
            422,
            "value",
        ),
        ("/vault/credentials/Not%20A%20Name", {"value": "v3ry-s3cret", "hosts": ["a.example.com"]}, 422, "name"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret", "hosts": ["a.example.com"], "user": "a#b"}, 422, "user"),
        ("/vault/credentials/github", {"value": "v3ry-s3cret", "hosts": ["a.example.com"], "extra": 1}, 422, "extra"),
        (
            "/vault/credentials/github",
            {"value": "v3ry-s3cret", "hosts": ["a.example.com"], "kind": "api_key", "header": "Host"},
            422,
            "header",
        ),
    ],
)
def test_a_bad_write_over_http_is_a_4xx_naming_the_field_and_stores_nothing(
    api_stack: ApiStack, path: str, body: dict[str, Any], status: int, field: str
) -> None:
    tenant_key = api_stack.stack.create_api_key(f"vault-{uuid.uuid4().hex[:8]}")
    got, answer, _ = api_stack.http("PUT", path, body, key=tenant_key)
    assert got == status and answer["error"]["field"] == field, answer
    assert str(body.get("value", "")) not in json.dumps(answer) or not body.get("value")
    assert api_stack.http("GET", "/vault/credentials", key=tenant_key)[1]["credentials"] == []


def test_no_tenant_or_user_reads_lists_or_deletes_anothers_credentials_and_no_answer_holds_a_value(
    api_stack: ApiStack,
) -> None:
    """Probes with real keys and real tokens of the stack's OIDC issuer: a key that may name users
    writes ann's credential; bob's token, another tenant's key and a key that may not name users
    neither list, read nor delete it; ann's token sees it and may name no one else."""
    stack, marker = api_stack.stack, _marker()
    backend = stack.create_api_key("team-a", act_for_users=True)
    ann, bob = f"ann-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    status, made, _ = api_stack.http("PUT", "/vault/credentials/github",
                                     {"value": marker, "hosts": ["api.github.com"], "user": ann}, key=backend)  # fmt: skip
    assert status == 200 and made["name"] == "github" and made["user"] == ann and marker not in json.dumps(made)
    mine = api_stack.http("GET", f"/vault/credentials?user={ann}", key=backend)[1]
    assert [c["name"] for c in mine["credentials"]] == ["github"] and marker not in json.dumps(mine)
    assert api_stack.http("GET", f"/vault/credentials?user={bob}", key=backend)[1]["credentials"] == []
    assert api_stack.http("GET", "/vault/credentials", key=backend)[1]["credentials"] == []  # the tenant's own: none
    # Another tenant (even one allowed to name users) sees and deletes nothing.
    foreign = stack.create_api_key("team-b", act_for_users=True)
    assert api_stack.http("GET", f"/vault/credentials?user={ann}", key=foreign)[1]["credentials"] == []
    status, gone, _ = api_stack.http("DELETE", f"/vault/credentials/github?user={ann}", key=foreign)
    assert status == 404 and gone["error"]["code"] == "credential_not_found"
    # A key that may not name users: 403 naming user.
    status, refused, _ = api_stack.http("GET", f"/vault/credentials?user={ann}")
    assert status == 403 and refused["error"]["field"] == "user"
    # Tokens: bob's sees none of ann's and may not name her; ann's sees hers.
    bob_token, ann_token = stack.token(user=bob, tenant="team-a"), stack.token(user=ann, tenant="team-a")
    assert api_stack.http("GET", "/vault/credentials", key=bob_token)[1]["credentials"] == []
    status, refused, _ = api_stack.http("GET", f"/vault/credentials?user={ann}", key=bob_token)
    assert status == 403 and refused["error"]["field"] == "user"
    assert api_stack.http("DELETE", "/vault/credentials/github", key=bob_token)[0] == 404
    assert [c["name"] for c in api_stack.http("GET", "/vault/credentials", key=ann_token)[1]["credentials"]] == [
        "github"
    ]
    assert api_stack.http("GET", "/openapi.json")[1]["paths"]["/vault/credentials"]  # documented
    status, deleted, _ = api_stack.http("DELETE", "/vault/credentials/github", key=ann_token)
    assert status == 200 and deleted["name"] == "github"
    assert api_stack.http("GET", f"/vault/credentials?user={ann}", key=backend)[1]["credentials"] == []


def test_a_caller_whose_token_names_a_user_acts_for_that_user_only(tmp_path: Path) -> None:
    from agentq.api.app import build_app
    from agentq.core.tools import default_registry

    store = memory_storage()
    app = build_app(store, default_registry(), Queues(), cipher=EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "k")))  # type: ignore[arg-type]

    def call(method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
        event = {
            "httpMethod": method, "path": path, "resource": path, "headers": {"Content-Type": "application/json"},
            "queryStringParameters": query, "body": json.dumps(body) if body is not None else None,
            "requestContext": {"authorizer": {"tenant": "t", "user": "ann"}, "httpMethod": method, "path": path,
                               "resourcePath": path, "stage": "v1"},
        }  # fmt: skip
        answer = app.resolve(event, None)
        return answer["statusCode"], json.loads(answer["body"])

    body = {"value": _marker(), "hosts": ["api.github.com"]}
    assert call("PUT", "/vault/credentials/github", {**body, "user": "bob"})[0] == 403
    status, made = call("PUT", "/vault/credentials/github", body)
    assert status == 200 and made["user"] == "ann"  # no user named: the token's
    assert call("GET", "/vault/credentials", query={"user": "bob"})[0] == 403
    assert [c["name"] for c in call("GET", "/vault/credentials")[1]["credentials"]] == ["github"]
    assert store.vault.listing("t", "bob") == []


def test_agentq_vault_put_list_delete_reads_the_value_from_stdin_never_the_command_line(
    api_stack: ApiStack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from agentq.cli.main import main

    marker, user = _marker(), f"cli-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr("sys.stdin", io.StringIO(marker + "\n"))
    target = ["--url", api_stack.url, "--api-key", api_stack.stack.create_api_key("team-a", act_for_users=True)]
    assert main(["vault", "put", "github", "--user", user, "--host", "api.github.com", *target]) == 0
    assert main(["vault", "list", "--user", user, *target]) == 0
    monkeypatch.setenv("VAULT_TEST_VALUE", _marker())
    assert main(["vault", "put", "crm", "--user", user, "--host", "*.crm.example.com", "--kind", "api-key",
                 "--header", "X-Crm-Key", "--value-env", "VAULT_TEST_VALUE", *target]) == 0  # fmt: skip
    assert main(["vault", "delete", "crm", "--user", user, *target]) == 0
    out = capsys.readouterr().out
    assert main(["vault", "put", "crm", "--user", user, "--host", "crm.example.com", "--kind", "api-key",
                 "--header", "Host", "--value-env", "VAULT_TEST_VALUE", *target]) != 0  # fmt: skip
    refused = capsys.readouterr().err
    assert "frames or routes" in refused and "(header)" in refused and os.environ["VAULT_TEST_VALUE"] not in refused
    assert "stored github (bearer)" in out and "github  bearer  api.github.com" in out and marker not in out
    assert "deleted crm" in out
    assert [c.name for c in __import__("agentq").Client(api_stack.url, target[-1]).list_credentials(user)] == ["github"]
    assert os.environ["VAULT_TEST_VALUE"] not in out


def _key_of(path: str, start: Any, keys: Any) -> None:
    start.wait()
    keys.put(LocalDataKeys.from_file(path).key_id)


def test_processes_starting_on_a_new_key_file_at_once_all_read_the_one_whole_key(tmp_path: Path) -> None:
    """``agentq dev`` starts its workers and API at once on a key file none has made yet: each
    must read the same 32 bytes (a process that read the file between another's create and its
    write got 0 bytes and exited). Eight processes, released together by a barrier, on each of
    40 new paths."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for round_ in range(40):
        path = tmp_path / f"k{round_}" / "vault.key"
        start, keys = ctx.Barrier(8), ctx.Queue()
        racers = [ctx.Process(target=_key_of, args=(str(path), start, keys)) for _ in range(8)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)
        assert [racer.exitcode for racer in racers] == [0] * 8, f"round {round_}: a process failed to read the key"
        seen = {keys.get(timeout=5) for _ in racers}
        assert seen == {LocalDataKeys.from_file(path).key_id}
        assert len(path.read_bytes()) == 32 and [p.name for p in path.parent.iterdir()] == ["vault.key"]


def test_a_key_file_on_a_filesystem_without_hard_links_is_still_made_whole_and_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``os.link`` is refused (EPERM: some FUSE, SMB and vfat mounts), the key is created in
    place instead; the next start reads the same key, and no draft file is left."""
    import errno

    def no_links(*_: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "vault.key"
    first = LocalDataKeys.from_file(path)
    assert len(path.read_bytes()) == 32 and first.key_id == LocalDataKeys.from_file(path).key_id
    assert [p.name for p in tmp_path.iterdir()] == ["vault.key"]


def test_a_declined_credential_names_the_end_user_who_declined_it_beside_the_tenant() -> None:
    """What ``request_credential`` tells the model names who declined, as an approval's answer
    does: the end user whose token declined, with their tenant; the tenant for a key."""
    from agentq.core.approval import credential_outcome
    from agentq.core.records import ApprovalRecord

    use = {"id": "toolu_1", "name": "request_credential", "input": {"name": "github"}}

    def said(**decided: Any) -> str:
        record = ApprovalRecord(use_id="toolu_1", state="rejected", question="q", asked_at=1.0, note="not now",
                                decided_at=2.0, **decided)  # fmt: skip
        return credential_outcome(use, record, 1.0, 2.0).content

    assert said(decided_by="team-a", decided_by_user="alice").startswith("DECLINED by alice (an end user of team-a)")
    assert said(decided_by="team-a").startswith("DECLINED by team-a: not now")
    assert said().startswith("DECLINED by the user: not now")
