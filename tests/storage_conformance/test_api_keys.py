"""API keys (``storage.api_keys.KeyStore``) on every backend: stored only as a hash, created
whole or not at all, revoked once, listed newest first per tenant."""

from __future__ import annotations

import secrets
import time

import pytest

from agentq.core.errors import ValidationError
from agentq.storage.api_keys import ApiKey, KeyNotFound, KeyStore, key_hash
from agentq.storage.container import Storage
from agentq.storage.table import TransactionCancelled


def test_a_key_is_stored_as_its_hash_and_looked_up_by_the_key(backend: Storage) -> None:
    keys = backend.api_keys
    token, record = keys.create("acme")
    assert token.startswith("aq_") and record.tenant == "acme" and record.key_id.startswith("key_")
    assert keys.lookup(token) == record
    assert keys.lookup(token + "x") is None and keys.lookup("aq_" + "y" * 43) is None
    by_hash = backend.table.get({"pk": f"APIKEY#{key_hash(token)}", "sk": "META"})
    by_id = backend.table.get({"pk": f"APIKEYID#{record.key_id}", "sk": "META"})
    assert by_hash is not None and by_id is not None and by_id["key_hash"] == key_hash(token)
    assert token[3:] not in repr([by_hash, by_id])  # the secret part of the key is nowhere


def test_a_bad_tenant_is_refused_and_writes_nothing(backend: Storage) -> None:
    with pytest.raises(ValidationError) as err:
        backend.api_keys.create("has spaces")
    assert err.value.field == "tenant"
    assert backend.api_keys.list("has spaces") == []


def test_a_key_whose_hash_exists_is_refused_whole(backend: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both items are one transaction, each only if absent: a second key with the same secret
    overwrites nothing and leaves no by-id item of its own."""
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: "same-secret-" + "z" * 31)
    token, first = backend.api_keys.create("acme")
    with pytest.raises(TransactionCancelled) as refused:
        backend.api_keys.create("other")
    assert refused.value.failed == frozenset({"key"})
    assert backend.api_keys.lookup(token) == first
    assert backend.api_keys.list("other") == []


def test_a_revoked_key_stays_revoked_and_keeps_its_first_revocation_time(backend: Storage) -> None:
    keys = backend.api_keys
    token, record = keys.create("acme")
    revoked = keys.revoke(record.key_id)
    assert revoked.revoked and revoked.revoked_at is not None and revoked.tenant == "acme"
    looked_up = keys.lookup(token)
    assert looked_up is not None and looked_up.revoked and looked_up.revoked_at == pytest.approx(revoked.revoked_at)
    time.sleep(0.01)
    again = keys.revoke(record.key_id)
    assert again.revoked_at == pytest.approx(revoked.revoked_at)


def test_revoking_an_unknown_or_malformed_id_is_refused(backend: Storage) -> None:
    with pytest.raises(KeyNotFound) as missing:
        backend.api_keys.revoke("key_0000000000000000")
    assert missing.value.field == "key_id"
    with pytest.raises(ValidationError) as malformed:
        backend.api_keys.revoke("not-a-key-id")
    assert malformed.value.field == "key_id"


def test_a_tenant_lists_its_own_keys_newest_first_across_pages(backend: Storage) -> None:
    keys = KeyStore(backend.table, list_page=2)
    made: list[ApiKey] = []
    for _ in range(5):
        made.append(keys.create("lister")[1])
        time.sleep(0.002)  # distinct creation milliseconds: the index sorts on them
    keys.create("someone-else")
    keys.revoke(made[1].key_id)
    listed = keys.list("lister")
    assert [k.key_id for k in listed] == [k.key_id for k in reversed(made)]
    assert [k.revoked for k in listed] == [False, False, False, True, False]
    assert {k.tenant for k in listed} == {"lister"}
