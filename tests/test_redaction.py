"""The redactor (``observe.redaction``) under load: what adding values costs, that what it finds
is redacted whole, that a live run's values stay in it whatever other runs (another tenant's,
on the same worker) add, and that no other run's values change a run's results or files. The spellings of one value are tested in tests/test_vault.py."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import threading
import types
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentq.control import vault as control_vault
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.vault import MAX_REFERENCES, CredentialRefused, CredentialWrite, expand
from agentq.core.vault_crypto import EnvelopeCipher, LocalDataKeys
from agentq.observe import redaction
from agentq.observe.redaction import REDACTED, Redactor, spellings
from agentq.storage.container import Storage, memory_storage

PER_SPELLING = 12  # dictionary updates one spelling may cost to file, whatever is filed already


class Budget(Exception):
    pass


def _counting_re(budget: list[int]) -> Any:
    """``re`` as the redactor module sees it, the characters of every pattern it compiles
    spent from ``budget`` (a pattern rebuilt on each add spends it quadratically)."""

    def compile(pattern: Any, flags: int = 0) -> Any:
        budget[0] -= len(pattern)
        if budget[0] < 0:
            raise Budget("adding values compiled more pattern than the linear budget")
        return re.compile(pattern, flags)

    names = {k: getattr(re, k) for k in dir(re) if not k.startswith("__")}
    return types.SimpleNamespace(**{**names, "compile": compile})


def _work(count: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The work spent adding ``count`` values one by one (as runs open them), and their spellings."""
    values = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(count)]
    filed = sum(len(spellings(v)) for v in values)
    budget = [PER_SPELLING * filed * 64]  # 64 characters a spelling, the longest here
    monkeypatch.setattr(redaction, "re", _counting_re(budget))
    redactor = Redactor()
    for value in values:
        redactor.add(value)
    spent = PER_SPELLING * filed * 64 - budget[0]
    return getattr(redactor, "work", 0) + spent, filed


def test_adding_values_costs_work_linear_in_their_number_whatever_the_redactor_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small, filed_small = _work(1000, monkeypatch)
    large, filed_large = _work(4000, monkeypatch)
    assert small <= PER_SPELLING * filed_small and large <= PER_SPELLING * filed_large
    # Four times the values: at most four times the work, twice over (past MAX_VALUES each
    # spelling filed is unfiled once), not sixteen times.
    assert large / filed_large <= 2 * small / filed_small


def test_values_whose_echoes_overlap_are_both_redacted_whole() -> None:
    redactor = Redactor()
    first, second = "abcdefgh12", "h12345678xyz"  # in the text, the second starts inside the first
    redactor.add(first, second)
    cleaned = redactor.redact(f"echo: abcdefgh12345678xyz and {second} and {first}.")
    assert cleaned == f"echo: {REDACTED} and {REDACTED} and {REDACTED}."
    assert redactor.redact_bytes(b"-abcdefgh12345678xyz-") == f"-{REDACTED}-".encode()


def test_a_value_at_any_offset_and_at_either_end_of_a_text_is_redacted() -> None:
    redactor = Redactor()
    value = "Zq9/+=wJalrXUtnFEMI"
    redactor.add(value)
    for before in range(9):
        for after in ("", "x", "xyz"):
            text = "." * before + value + after
            assert redactor.redact(text) == "." * before + REDACTED + after, text
            assert redactor.redact_bytes(text.encode()) == ("." * before + REDACTED + after).encode()
    accented = "clé-secrète-de-test"
    redactor.add(accented)
    assert redactor.redact_bytes(f"[{accented}]".encode()) == f"[{REDACTED}]".encode()
    assert redactor.redact("nothing to hide here") == "nothing to hide here"


WIDE = ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"]


def test_a_value_at_a_bodys_end_whose_longer_spelling_starts_as_it_does_is_replaced_not_cut_off() -> None:
    """A value with a ``+`` past its eighth character: its percent-encoded spelling (``%2B``) is
    longer and starts as it does. At the very end of a text, that longer spelling's slice is the
    value itself: its span must end at the text's end, or ``redact_encoded`` takes it for one that
    runs past the bytes and drops it, with the mark, from the body (seen failing: the body cut
    before the value, no REDACTED)."""
    value = "MRK/0123456789abcdef+Z"
    redactor = Redactor()
    redactor.add(value)
    for encoding in ["utf-8", *WIDE]:
        for before in ("", "you sent: "):
            data = "\ufeff".encode(encoding) + (before + value).encode(encoding)
            cleaned = redactor.redact_encoded(data)
            assert cleaned.decode(encoding) == "\ufeff" + before + REDACTED, (encoding, before, cleaned)
    assert redactor.redact(value) == REDACTED and redactor.redact_bytes(value.encode()) == REDACTED.encode()


@pytest.mark.parametrize(
    "value", ["Zq9/+=wJalrXUtnFEMI", "clé-secrète-de-test", "密码是秘密的口令啊", "key-\U0001f511-\U0001f600-x"]
)
def test_a_value_in_utf16_or_utf32_is_redacted_in_that_encoding_at_any_offset(value: str) -> None:
    """``redact_encoded`` (http_fetch's bodies): a value's spelling in UTF-16 or UTF-32 of either
    byte order, after any number of bytes, becomes REDACTED in that encoding, so the body decodes
    as before around it; after an odd number of bytes of a UTF-8 text, where it reads as the value
    with NULs between its characters, too. No view of what is left holds a spelling (the CJK value
    has no NUL byte in UTF-16; the emoji are two units each)."""
    redactor = Redactor()
    redactor.add(value)
    forms = {f for s in spellings(value) for f in (s, s.encode().decode("latin-1"))}
    for encoding in WIDE:
        for before in range(5):
            text = "\u4e01" * before + value + "." * before
            data = "\ufeff".encode(encoding) + text.encode(encoding)
            cleaned = redactor.redact_encoded(data)
            assert cleaned.decode(encoding) == "\ufeff" + "\u4e01" * before + REDACTED + "." * before, (
                encoding,
                before,
            )
            stray = b"x" * before + value.encode(encoding) + b"y"  # the value at any alignment in bytes
            cleaned = redactor.redact_encoded(stray)
            assert cleaned == b"x" * before + REDACTED.encode(encoding) + b"y", (encoding, before, cleaned)
            for codec in [*WIDE, "latin-1"]:
                for shift in range(4):
                    seen = cleaned[shift:].decode(codec, errors="replace")
                    assert not [f for f in forms if f in seen], (encoding, before, codec, shift)
    assert redactor.redact_encoded(b"nothing to hide here") == b"nothing to hide here"


@pytest.mark.parametrize("encoding", WIDE)
def test_a_shortest_value_in_utf16_or_utf32_among_binary_bytes_is_redacted_at_any_offset(encoding: str) -> None:
    """Bytes with a NUL are read as UTF-16 or UTF-32 only where their shape holds that many units
    of that encoding (``redaction._SHAPES``, which spares a binary file's NULs twelve decodes): a
    value of exactly MIN_CHARS characters, one of them past ASCII, between NULs, control bytes and
    runs of zeros, at every offset, is redacted exactly as when every view is read (a redactor
    that also holds a value past U+00FF reads them all), and no view of the result holds it."""
    value = "k\xe9y-V4l/"
    assert len(value) == redaction.MIN_CHARS
    redactor, every_view = Redactor(), Redactor()
    redactor.add(value)
    every_view.add(value, "\u5bc6\u7801\u662f\u79d8\u5bc6\u7684\u53e3\u4ee4")
    forms = {f for s in spellings(value) for f in (s, s.encode().decode("latin-1"))}
    noise = b"\x00\x01\x00\x00\x00\xff\x7f\x00\x00\x00\x00\x00"
    for before in range(len(noise) + 1):
        data = noise[:before] + value.encode(encoding) + noise[before:]
        cleaned = redactor.redact_encoded(data)
        assert cleaned == every_view.redact_encoded(data) != data, (encoding, before)
        for codec in [*WIDE, "latin-1"]:
            for shift in range(4):
                seen = cleaned[shift:].decode(codec, errors="replace")
                assert not [f for f in forms if f in seen], (encoding, before, codec, shift)


def test_a_cut_read_keeps_what_its_first_bytes_became_and_no_redaction_that_holds_the_cut() -> None:
    """``upto`` (http_fetch's read that stopped in a long body): what the first ``upto`` bytes
    became; a value that holds byte ``upto`` is left out whole, one that ends before it is shown
    redacted."""
    redactor = Redactor()
    value = "Zq9/+=wJalrXUtnFEMI"
    redactor.add(value)
    for encoding in ["utf-8", *WIDE]:
        one, dot, marked = value.encode(encoding), ".".encode(encoding), REDACTED.encode(encoding)
        data = dot + one + dot + one + dot
        first_end, second = len(dot + one), len(dot + one + dot)
        assert redactor.redact_encoded(data) == dot + marked + dot + marked + dot
        assert redactor.redact_encoded(data, upto=first_end) == dot + marked
        assert redactor.redact_encoded(data, upto=first_end + 1) == dot + marked + dot[:1]
        for upto in range(second, second + len(one)):  # in the second value, or at its first byte
            assert redactor.redact_encoded(data, upto=upto) == dot + marked + dot, (encoding, upto)
        assert redactor.redact_encoded(data, upto=0) == b""


def _lower_hex(text: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), text)


def _each(value: str, form: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else form.format(ord(c)) for c in value)


ENCODINGS: dict[str, Any] = {
    "quote (keeps /)": urllib.parse.quote,
    "quote, nothing safe": lambda v: urllib.parse.quote(v, safe=""),
    "quote, lowercase hex": lambda v: _lower_hex(urllib.parse.quote(v)),
    "quote, nothing safe, lowercase hex": lambda v: _lower_hex(urllib.parse.quote(v, safe="")),
    "form (+ for a space)": lambda v: urllib.parse.urlencode({"k": v})[2:],
    "form, lowercase hex": lambda v: _lower_hex(urllib.parse.urlencode({"k": v})[2:]),
    "json": lambda v: json.dumps(v)[1:-1],
    "json, not ascii-only": lambda v: json.dumps(v, ensure_ascii=False)[1:-1],
    "json as PHP writes it (\\/)": lambda v: json.dumps(v)[1:-1].replace("/", "\\/"),
    "json, every symbol \\u (uppercase)": lambda v: _each(v, "\\u{:04X}"),
    "json, every symbol \\u (lowercase)": lambda v: _each(v, "\\u{:04x}"),
    "hex": lambda v: v.encode().hex(),
    "hex, uppercase": lambda v: v.encode().hex().upper(),
    "html.escape": html.escape,
    "html, decimal entities": lambda v: _each(v, "&#{};"),
    "html, hex entities": lambda v: _each(v, "&#x{:x};"),
    "html, uppercase hex entities": lambda v: _each(v, "&#x{:X};"),
    "base64": lambda v: base64.b64encode(v.encode()).decode(),
    "base64, unpadded": lambda v: base64.b64encode(v.encode()).decode().rstrip("="),
    "base64 url-safe": lambda v: base64.urlsafe_b64encode(v.encode()).decode(),
    "base64 url-safe, unpadded": lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
}
AWKWARD = ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY+a=", "Zx/+=ab CD&é<\"'9f/x"]


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("secret", AWKWARD)
def test_each_common_encoding_of_a_secret_with_awkward_characters_is_redacted(encoding: str, secret: str) -> None:
    redactor = Redactor()
    redactor.add(secret)
    for around in ("", "x", "xy", "Authorization: Bearer "):  # base64 of it at each alignment
        encoded = ENCODINGS[encoding](around + secret + around[::-1])
        echo = f"echo: {encoded} done"
        cleaned = redactor.redact(echo)
        assert REDACTED in cleaned, (encoding, echo)
        core = ENCODINGS[encoding](secret)[2:-2] if "base64" not in encoding else None
        assert core is None or core not in cleaned, (encoding, cleaned)
        assert secret not in cleaned


# --- a live run's values, whatever other runs add ---------------------------------------------------


@pytest.fixture
def cipher(tmp_path: Path) -> EnvelopeCipher:
    return EnvelopeCipher(LocalDataKeys.from_file(tmp_path / "vault.key"))


class _Queues:
    def send(self, *_: Any, **__: Any) -> None:
        pass


def _put(store: Storage, cipher: EnvelopeCipher, tenant: str, name: str, value: str, host: str) -> None:
    write = CredentialWrite.model_validate({"value": value, "hosts": [host]})
    control_vault.put(store, _Queues(), cipher, tenant, name, write)  # type: ignore[arg-type]


def _awkward() -> str:
    return base64.b64encode(os.urandom(33)).decode()  # with / and +: a dozen spellings a value


def test_a_live_runs_value_stays_redacted_however_many_values_another_tenants_run_opens_meanwhile(
    cipher: EnvelopeCipher,
) -> None:
    store, secret = memory_storage(), "VIC" + uuid.uuid4().hex
    put = CredentialWrite.model_validate({"value": secret, "hosts": ["api.github.com"], "user": "ann"})
    control_vault.put(store, _Queues(), cipher, "t", "github", put)  # type: ignore[arg-type]
    values, per = [_awkward() for _ in range(1200)], MAX_REFERENCES
    for i, value in enumerate(values):
        _put(store, cipher, "attacker", f"c{i}", value, "evil.example.net")
    headers = ["".join(f"${{vault:c{i}}}" for i in range(at, at + per)) for at in range(0, len(values), per)]
    assert sum(len(spellings(v)) for v in values) > redaction.MAX_VALUES  # enough to evict all else

    victim = TaskCredentials(store.vault, cipher, "t", "ann")
    assert victim.get("github").secret == secret  # the victim's run is live from here on
    opened, leaks, checks = threading.Event(), [], 0

    def attacker() -> None:
        try:
            run = TaskCredentials(store.vault, cipher, "attacker", None)
            for header in headers:  # the http_fetch calls of the attacker's run
                expand(header, run, "evil.example.net", 443)
            run.close()
        finally:
            opened.set()

    thread = threading.Thread(target=attacker)
    thread.start()
    while not opened.is_set() or checks == 0:  # the victim's echoes, while the attacker adds
        text = redaction.redact(f"echo: Bearer {secret}")
        checks += 1
        if secret in text:
            leaks.append(text)
    thread.join()
    assert leaks == [] and secret not in redaction.redact(f"echo: Bearer {secret}")
    assert victim.get("github").secret == secret  # still sent by the run: still redacted
    victim.close()


def test_a_runs_values_are_held_until_it_ends_then_kept_among_the_recent(cipher: EnvelopeCipher) -> None:
    store, value = memory_storage(), _awkward()
    _put(store, cipher, "t", "crm", value, "crm.example.com")
    held = redaction.REDACTOR.held
    run = TaskCredentials(store.vault, cipher, "t", None)
    run.get("crm")
    assert redaction.REDACTOR.held > held and value not in redaction.redact(value)
    run.close()
    assert redaction.REDACTOR.held == held and value not in redaction.redact(value)


def test_a_run_the_garbage_collector_frees_inside_a_redactor_write_gives_its_values_back_without_waiting_on_itself(
    cipher: EnvelopeCipher,
) -> None:
    """A run's credentials release their hold when collected (``weakref.finalize``), and the
    collector runs wherever an allocation triggers it: inside the redactor's locked writes too.
    There a release that took the lock again waited on its own thread for ever (seen: workers
    and test processes hung in ``_unpin``). The release waits for the redactor's next write."""
    import gc

    store, value = memory_storage(), _awkward()
    _put(store, cipher, "t", "crm", value, "crm.example.com")
    held = redaction.REDACTOR.held
    run = TaskCredentials(store.vault, cipher, "t", None)
    run.get("crm")
    cycle: list[Any] = [run]
    cycle.append(cycle)  # only the collector frees it
    del run, cycle
    done = threading.Event()

    def collect_inside_a_write() -> None:
        with redaction.REDACTOR._lock:  # where an allocation in a write would trigger the collector
            gc.collect()
        done.set()

    worker = threading.Thread(target=collect_inside_a_write, daemon=True)
    worker.start()
    assert done.wait(10), "the finalizer waited on the lock its own thread held"
    redaction.REDACTOR.add("a-later-write-of-another-run")  # the next write unpins it
    assert redaction.REDACTOR.held == held and value not in redaction.redact(value)


class _CountingCipher:
    def __init__(self, cipher: EnvelopeCipher) -> None:
        self.cipher, self.opened = cipher, 0

    def open(self, sealed: Any, context: Any) -> bytes:
        self.opened += 1
        return self.cipher.open(sealed, context)


def test_a_reference_to_a_credential_not_bound_to_the_requests_host_opens_nothing(cipher: EnvelopeCipher) -> None:
    store, value = memory_storage(), _awkward()
    _put(store, cipher, "t", "crm", value, "crm.example.com")
    counting, held = _CountingCipher(cipher), redaction.REDACTOR.held
    run = TaskCredentials(store.vault, counting, "t", None)  # type: ignore[arg-type]
    with pytest.raises(CredentialRefused, match="not sent"):
        expand("Bearer ${vault:crm}", run, "evil.example.net", 443)
    assert counting.opened == 0 and redaction.REDACTOR.held == held  # never decrypted nor held
    assert expand("${vault:crm}", run, "crm.example.com", 443) == value and counting.opened == 1
    run.close()


def test_a_value_with_more_credential_references_than_the_limit_is_refused_before_any_is_opened(
    cipher: EnvelopeCipher,
) -> None:
    store = memory_storage()
    for i in range(MAX_REFERENCES + 1):
        _put(store, cipher, "t", f"c{i}", _awkward(), "api.example.com")
    counting = _CountingCipher(cipher)
    run = TaskCredentials(store.vault, counting, "t", None)  # type: ignore[arg-type]
    many = "".join(f"${{vault:c{i}}}" for i in range(MAX_REFERENCES + 1))
    with pytest.raises(CredentialRefused, match=f"more than {MAX_REFERENCES}"):
        expand(many, run, "api.example.com", 443)
    assert counting.opened == 0
    assert len(expand(many[: many.rindex("$")], run, "api.example.com", 443)) > 0
    assert counting.opened == MAX_REFERENCES
    run.close()


def test_a_value_another_live_run_still_holds_takes_no_recent_slot_when_one_run_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs hold the same value; the first to end leaves it held by the other, so it does not
    yet join the recent values no run holds, and pushes none of those out early."""
    first, second, shared = "first-value-0001", "second-value-002", "shared-value-03"
    monkeypatch.setattr(redaction, "MAX_VALUES", len(redaction._forms((first,)) | redaction._forms((second,))))
    r = redaction.Redactor()
    r.add(first)
    r.add(second)  # the recent values: full
    a, b = r.hold(), r.hold()
    a.add(shared)
    b.add(shared)
    a.release()
    assert r.redact(f"{first} {shared}") == f"{redaction.REDACTED} {redaction.REDACTED}"
    b.release()  # now no run holds it: it joins the recent values and the oldest goes
    assert r.redact(f"{first} {second} {shared}") == f"{first} {redaction.REDACTED} {redaction.REDACTED}"


def test_a_kept_secret_is_redacted_in_every_runs_output_and_no_number_of_other_values_evicts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deployment secret (``Redactor.keep``) is sent for any run: a run live when it is read, a
    run opened after, a run already ended and released, all redact it, and the process's set (its
    logs') keeps it however many values other runs add and release after it."""
    secret, other = "kept-secret-0001", "other-value-0002"
    monkeypatch.setattr(redaction, "MAX_VALUES", len(redaction._forms((other,))))
    r = redaction.Redactor()
    before = r.hold()
    r.keep(secret)
    after = r.hold()
    after.add(other)
    for finder in (before, after, r):
        assert finder.redact(f"echo {secret}") == f"echo {REDACTED}", finder
    assert before.redact(other) == other  # a run's own values stay its own
    before.release()
    after.release()
    for i in range(20):  # values no run holds any more, each pushing the oldest out
        churn = r.hold()
        churn.add(f"churned-value-{i:04d}")
        churn.release()
    assert r.redact(f"echo {secret} {other}") == f"echo {REDACTED} {other}"
    assert r.hold().redact(secret) == REDACTED


SOURCE = "export function main() {\n        return fetch('https://example.com/api', {password})\n}\n"


@pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
def test_no_value_another_run_opens_on_the_worker_changes_a_runs_results_or_files(
    cipher: EnvelopeCipher, tmp_path: Path
) -> None:
    """The redactor is the worker's, shared by every tenant's runs, and a credential's value is
    whatever its writer chose: an end user (its token may write its own) stores ``function``, and
    its task opens it once. Every 8-character piece of another tenant's file is, here, a value
    another run opened: one run's that ended (the recent values) and one's still live. The
    other tenant's run, which opens a credential of its own, gets its shell's, its file reads'
    and its writes' results, and its checkpointed file, exactly as they are; its own credential's
    echo is still redacted. Only log lines (the process's set) lose the others' values."""
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.models import TaskStatus, ToolsStep
    from agentq.core.tools import default_registry
    from agentq.core.tools.fetch import FetchPolicy, HostRule
    from agentq.core.workspace import Manifest

    from tests.helpers import call, scripted
    from tests.vault_support import echo_server

    store, own = memory_storage(), "VIC" + uuid.uuid4().hex
    mallory = CredentialWrite.model_validate({"user": "mallory", "value": "function", "hosts": ["api.evil.example"]})
    control_vault.put(store, _Queues(), cipher, "evil-tenant", "k", mallory)  # type: ignore[arg-type]
    ended = TaskCredentials(store.vault, cipher, "evil-tenant", "mallory")
    expand("Bearer ${vault:k}", ended, "api.evil.example", 443)  # mallory's run uses it once, and ends
    ended.close()
    live = redaction.REDACTOR.hold()  # runs still going, which opened every piece of the file
    live.add(*{SOURCE[i : i + size] for size in (8, 13, 21) for i in range(len(SOURCE) - size + 1)})
    with echo_server() as echo:
        ann = CredentialWrite.model_validate({"user": "ann", "value": own, "hosts": [echo.host]})
        control_vault.put(store, _Queues(), cipher, "t", "github", ann)  # type: ignore[arg-type]
        turns = [
            {"text": "", "tool_calls": [
                call("write_file", path="app.js", content=SOURCE), call("shell", command="cat app.js"),
                call("http_fetch", url=echo.url("/me"), headers={"Authorization": "Bearer ${vault:github}"})]},
            {"text": "", "tool_calls": [call("read_file", path="app.js")]},
            {"text": "done"},
        ]  # fmt: skip
        sub = scripted(turns, tools=["write_file", "shell", "http_fetch", "read_file"])
        task = store.tasks.create(sub.model_copy(update={"user": "ann"}), tenant="t")
        registry = default_registry(fetch_policy=FetchPolicy(allow=(HostRule.parse(echo.host),)))
        config = EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"))
        try:
            result = Engine(store, worker_id="w", tools=registry, config=config, cipher=cipher).run(task.task_id)
        finally:
            assert redaction.REDACTOR.redact(SOURCE) != SOURCE  # the worker's set (its logs') holds them
            live.release()
            # The pieces would stay among the process's recent values ("function", "https://"): a
            # later test of this process that redacts outside any run would lose them from its text.
            redaction.REDACTOR.clear()
    assert result.status is TaskStatus.SUCCEEDED
    with redaction.run_scope():  # read back as the task's next run on this worker reads it
        steps = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)]
    (written, shell, fetched), (read,) = (step.results for step in steps)
    assert SOURCE in shell.content and SOURCE.split("\n")[1] in read.content, (shell.content, read.content)
    assert redaction.REDACTED not in written.content + shell.content + read.content
    assert f"Bearer {redaction.REDACTED}" in fetched.content and own not in fetched.content  # its own: redacted
    ref = steps[-1].workspace or steps[0].workspace
    assert ref is not None
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task.task_id, ref.manifest))
    [app] = [e for e in manifest.entries if e.path == "app.js"]
    assert store.workspaces.get_blob(task.task_id, app.digest).decode() == SOURCE


def test_redacting_a_large_text_allocates_about_its_size_not_an_object_per_four_characters() -> None:
    """A workspace file is redacted whole before each checkpoint of a run that opened a
    credential: the memory it takes at the peak stays of the order of the text (and the answer),
    where a list of the text's grams took ~60 bytes per 4 characters (~60 MB for this 4 MB)."""
    import tracemalloc

    r = redaction.Redactor()
    r.add("a-credential-value-0001")
    text = "".join(f"line {i:07d} of an ordinary file with nothing secret in it\n" for i in range(64_000))
    tracemalloc.start()
    try:
        assert r.redact(text) is text  # nothing to redact: the same text back
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(text), (peak, len(text))
    secret = text[: len(text) // 2] + "a-credential-value-0001" + text[len(text) // 2 :]
    assert r.redact(secret) == text[: len(text) // 2] + redaction.REDACTED + text[len(text) // 2 :]
