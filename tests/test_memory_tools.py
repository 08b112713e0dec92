"""The memory tools in the engine, on the in-memory twin: what one task writes the next reads;
each version records the task, step and call that made it; a stale precondition is an error the
model reads with the current hash; a read-only attachment refuses writes; a resumed task never
writes twice; a fork reads the store as it is now; any document the store accepts is read whole
in pages, and any store listed whole in pages, no result cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig, task_tools
from agentq.core.memory import Author, MemoryStoreSpec, content_sha256
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import call

STORAGE = "memory"
PERSON = Author(type="api", key_id="k1")


def _submission(turns: list[Any], memory: list[dict[str, Any]], **fields: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {"goal": "g", "provider": "scripted", "script": {"turns": turns}, "memory": memory, **fields}
    )


def _run(store: Storage, registry: ToolRegistry, submission: TaskSubmission, tenant: str = "t") -> tuple[str, Any]:
    task = store.tasks.create(submission, tenant=tenant)
    result = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5)).run(task.task_id)
    return task.task_id, result


def _results(store: Storage, task_id: str) -> list[Any]:
    return [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]


def _shop(store: Storage, tenant: str = "t") -> None:
    store.memory_stores.create_store(tenant, MemoryStoreSpec(name="shop"))


def _answer(store: Storage, registry: ToolRegistry, tool: str, **inputs: Any) -> Any:
    """The result of one call of ``tool`` by a task with the store ``shop`` attached."""
    ask = call(tool, store="shop", **inputs)
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [ask]}, {"text": "ok"}], [{"store": "shop"}]))
    [outcome] = _results(store, task_id)
    return outcome


@pytest.mark.parametrize(
    "content",
    [
        "line of notes\n" * 7_000,  # 98,000 bytes, 105,000 characters as JSON: cut at 100,000, its end lost
        "\x01" * 90_000,  # each character 6 as JSON ("\u0001"); (the twin's item measure refuses 102,400)
        '"' * 102_400,
        "\U0001f4e6" * 25_600,  # 4 bytes each: 25,600 characters
    ],
    ids=["newlines", "control", "quotes", "emoji"],
)
def test_memory_read_gives_the_whole_of_any_document_the_store_accepts_with_its_hash(
    store: Storage, registry: ToolRegistry, content: str
) -> None:
    # A tool's result is cut at 100,000 characters (core.tools._core.MAX_RESULT_CHARS), and
    # memory_read's JSON put the content before its hash: the model read a cut document, and,
    # with the hash memory_list gives, wrote back its start as the whole, the precondition met.
    _shop(store)
    assert len(content.encode()) <= store.memory_stores.get_store("t", "shop").max_document_bytes
    store.memory_stores.write("t", "shop", "/big.md", content, author=PERSON)
    pages: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None and len(pages) < 10:
        more = {"offset": offset, "expected_sha256": content_sha256(content)} if offset else {}
        outcome = _answer(store, registry, "memory_read", path="/big.md", **more)
        assert not outcome.is_error and "[result truncated" not in outcome.content, outcome.content[-200:]
        assert outcome.content.index('"content_sha256"') < outcome.content.index('"content":')
        pages.append(json.loads(outcome.content))
        offset = pages[-1]["next_offset"]
    assert "".join(p["content"] for p in pages) == content and len(pages) <= 8
    assert {(p["content_sha256"], p["version"], p["content_chars"]) for p in pages} == {
        (content_sha256(content), 1, len(content))
    }
    assert [p["truncated"] for p in pages] == [True] * (len(pages) - 1) + [False]


def test_a_page_after_the_first_is_refused_once_the_document_changed_or_without_the_hash_it_began_with(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    first = "a" * 60_000
    store.memory_stores.write("t", "shop", "/big.md", first, author=PERSON)
    page = json.loads(_answer(store, registry, "memory_read", path="/big.md").content)
    assert page["truncated"] and page["next_offset"] == 51_200
    unnamed = _answer(store, registry, "memory_read", path="/big.md", offset=page["next_offset"])
    assert unnamed.is_error and "expected_sha256" in unnamed.content
    now, _ = store.memory_stores.write(
        "t", "shop", "/big.md", "b" * 60_000, author=PERSON, expected_sha256=content_sha256(first)
    )
    moved = _answer(
        store,
        registry,
        "memory_read",
        path="/big.md",
        offset=page["next_offset"],
        expected_sha256=page["content_sha256"],
    )
    assert moved.is_error and "MemoryConflict" in moved.content and now.content_sha256 in moved.content
    assert "bbb" not in moved.content


def test_no_page_of_a_document_holding_a_secret_gives_part_of_it_wherever_the_model_ends_the_page(
    store: Storage, registry: ToolRegistry
) -> None:
    # A result is redacted whole before the registry cuts it; a page is a cut the model places
    # (offset, length): each page redacted alone would give a secret in two pieces, each too
    # short to be found. The document is redacted whole first, then paged.
    import uuid

    from agentq.observe.redaction import MIN_CHARS, REDACTED, keep_secret

    secret = f"sk-live-{uuid.uuid4().hex[:16]}"
    keep_secret(secret)  # a deployment secret the worker read: every run's output is redacted of it
    _shop(store)
    store.memory_stores.write("t", "shop", "/notes.md", "a" * 100 + secret + "b" * 100, author=PERSON)
    pieces = {secret[i : i + MIN_CHARS] for i in range(len(secret) - MIN_CHARS + 1)}
    leaks, shown = [], set()
    for end in range(100, 100 + len(secret) + 1, 3):  # a first page ending at each place across the secret
        first = json.loads(_answer(store, registry, "memory_read", path="/notes.md", length=end).content)
        rest = json.loads(
            _answer(store, registry, "memory_read", path="/notes.md", offset=first["next_offset"],
                    expected_sha256=first["content_sha256"]).content
        )  # fmt: skip
        pages = (first["content"], rest["content"])
        leaks += [(end, piece) for piece in pieces if any(piece in page for page in pages)]
        shown.add((first["content"] + rest["content"], first["content_chars"]))
    assert leaks == []
    whole = "a" * 100 + REDACTED + "b" * 100
    assert shown == {(whole, len(whole))}


def test_no_search_snippet_gives_part_of_a_secret_wherever_the_query_word_sits_near_it(
    store: Storage, registry: ToolRegistry
) -> None:
    # A snippet is a cut around the query's first word, and the registry redacts only whole
    # spellings: cut over the document as stored, a snippet ending or starting inside a secret
    # gave its piece to the model. Search shows the document as memory_read does: redacted whole.
    import uuid

    from agentq.core.providers.keys import keep_out_of_text
    from agentq.observe.redaction import MIN_CHARS, REDACTED

    secret = f"sk-ant-api03-{uuid.uuid4().hex}"
    keep_out_of_text(secret)  # a provider's key, kept as every provider keeps its own
    _shop(store)
    # The snippet runs from 80 characters before "lamp" to 160 after: a secret across each end.
    written = {
        f"/n/{i}.md": "." * 100 + before + "lamp" + after
        for i, (before, after) in enumerate(
            [(secret + "." * (80 - k), "") for k in (3, 9, 20)]
            + [("", "." * (160 - len("lamp") - k) + secret) for k in (3, 9, 20)]
        )
    }
    for path, content in written.items():
        store.memory_stores.write("t", "shop", path, content, author=PERSON)
    outcome = _answer(store, registry, "memory_search", query="lamp", limit=20)
    pieces = {secret[i : i + MIN_CHARS] for i in range(len(secret) - MIN_CHARS + 1)}
    assert not outcome.is_error and [p for p in pieces if p in outcome.content] == []
    hits = {hit["path"]: hit["snippet"] for hit in json.loads(outcome.content)}
    assert set(hits) == set(written)
    for path, content in written.items():
        shown = content.replace(secret, REDACTED)
        assert hits[path].strip("…") in shown and "lamp" in hits[path]


def test_memory_search_is_no_oracle_for_a_secret_in_a_document_its_matches_counted_as_memory_read_shows_it(
    store: Storage, registry: ToolRegistry
) -> None:
    # Matched over the document as stored, a query word inside a secret found its document (and
    # counted): the model confirmed guesses of a credential, a piece at a time, that memory_read
    # would never show it. Path and content are matched as shown, redacted.
    import uuid

    from agentq.observe.redaction import REDACTED, keep_secret

    secret = f"live-{uuid.uuid4().hex[:20]}"
    keep_secret(secret)  # a deployment secret the worker read: every run's output is redacted of it
    _shop(store)
    store.memory_stores.write("t", "shop", "/keys.md", f"live token: {secret}\n", author=PERSON)
    store.memory_stores.write("t", "shop", f"/by-key/{secret}.md", "pinned", author=PERSON)

    def search(query: str) -> list[dict[str, Any]]:
        outcome = _answer(store, registry, "memory_search", query=query, limit=20)
        assert not outcome.is_error, outcome.content
        found: list[dict[str, Any]] = json.loads(outcome.content)
        return found

    for guess in (secret, secret[:12], secret[5:14].upper(), secret[-9:]):
        assert search(guess) == [], guess
    [hit] = search("live")
    assert (hit["path"], hit["matches"]) == ("/keys.md", 1)  # "live token", not the secret's "live-"
    assert hit["snippet"] == f"live token: {REDACTED}\n"
    assert [(h["path"], h["matches"]) for h in search("by-key pinned")] == [(f"/by-key/{REDACTED}.md", 2)]
    assert {h["path"] for h in search("redacted credential")} == {"/keys.md", f"/by-key/{REDACTED}.md"}


def test_memory_list_reaches_every_document_of_a_store_within_its_default_limit(
    store: Storage, registry: ToolRegistry
) -> None:
    # A store holds 1,000 documents by default; memory_list answered them all in one result,
    # cut at 100,000 characters (about 600 of them), and took no cursor: the rest was unseen.
    _shop(store)
    paths = [f"/customers/customer-{i:04d}.md" for i in range(1_000)]
    for path in paths:
        store.memory_stores.write("t", "shop", path, "x", author=PERSON)
    listed = _listing(store, registry)
    assert listed == paths


def test_memory_list_pages_stay_whole_with_the_longest_paths_and_a_foreign_cursor_is_refused_naming_it(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    paths = [f"/{'a' * 200}/{'b' * 200}/{'c' * 200}/{'d' * 200}/{'e' * 202}{i:03d}" for i in range(150)]
    assert len(paths[0].encode()) == 1010
    for path in paths:
        store.memory_stores.write("t", "shop", path, "x", author=PERSON)
    assert _listing(store, registry, limit=200) == paths  # 150 of ~1,100 characters: more than a result holds
    foreign = _answer(store, registry, "memory_list", path_prefix="/customers/", cursor=paths[0])
    assert foreign.is_error and "cursor" in foreign.content


def _listing(store: Storage, registry: ToolRegistry, **inputs: Any) -> list[str]:
    """Every path memory_list gives, following next_cursor; each page a whole result."""
    paths: list[str] = []
    cursor: str | None = None
    for _ in range(30):
        outcome = _answer(store, registry, "memory_list", **inputs, **({"cursor": cursor} if cursor else {}))
        assert not outcome.is_error and "[result truncated" not in outcome.content, outcome.content[-200:]
        page = json.loads(outcome.content)
        paths += [d["path"] for d in page["documents"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return paths
    raise AssertionError("memory_list never reached its end")


def test_what_one_task_writes_the_next_task_reads_and_the_version_names_its_call(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    write = call("memory_write", store="shop", path="/customers/ann.md", content="ordered: blue lamp")
    first, result = _run(
        store, registry, _submission([{"tool_calls": [write]}, {"text": "noted"}], [{"store": "shop"}])
    )
    assert result.status is TaskStatus.SUCCEEDED
    [written] = _results(store, first)
    assert not written.is_error and json.loads(written.content)["version"] == 1 and written.side_effects
    read = call("memory_read", store="shop", path="/customers/ann.md")
    second, _ = _run(store, registry, _submission([{"tool_calls": [read]}, {"text": "ok"}], [{"store": "shop"}]))
    [answer] = _results(store, second)
    assert json.loads(answer.content)["content"] == "ordered: blue lamp"
    [version] = store.memory_stores.versions("t", "shop", "/customers/ann.md")
    step_one = store.steps.load(first)[0].body
    assert isinstance(step_one, LLMStep)
    assert version.created_by == Author(type="task", task_id=first, step=1, tool_use_id=step_one.tool_uses()[0]["id"])


def test_a_stale_precondition_is_a_tool_error_giving_the_current_hash_and_writes_nothing(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    now, _ = store.memory_stores.write("t", "shop", "/x", "changed by another task", author=PERSON)
    stale = call(
        "memory_write", store="shop", path="/x", content="mine", expected_sha256=content_sha256("as I read it")
    )
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [stale]}, {"text": "ok"}], [{"store": "shop"}]))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "MemoryConflict" in outcome.content and now.content_sha256 in outcome.content
    assert store.memory_stores.read("t", "shop", "/x").content == "changed by another task"


def test_a_read_only_attachment_refuses_writes_and_alone_offers_no_memory_write(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="catalog"))
    only_read = _submission([{"text": "x"}], [{"store": "catalog", "access": "read_only"}])
    assert task_tools(only_read) == ["memory_list", "memory_read", "memory_search"]
    assert task_tools(_submission([{"text": "x"}], [])) == []
    write = call("memory_write", store="catalog", path="/x", content="no")
    both = [{"store": "catalog", "access": "read_only"}, {"store": "shop"}]
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [write]}, {"text": "ok"}], both))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "read-only" in outcome.content
    assert store.memory_stores.list_documents("t", "catalog") == []


def test_a_store_not_attached_or_of_another_tenant_is_not_reachable(store: Storage, registry: ToolRegistry) -> None:
    _shop(store, tenant="other")
    store.memory_stores.write("other", "shop", "/secret", "theirs", author=PERSON)
    read = call("memory_read", store="shop", path="/secret")
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [read]}, {"text": "ok"}], [{"store": "shop"}]))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "MemoryStoreNotFound" in outcome.content and "theirs" not in outcome.content


def test_a_resumed_task_does_not_write_again_after_a_write_whose_worker_died(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    write = call("memory_write", store="shop", path="/x", content="once")
    submission = _submission([{"tool_calls": [write]}, {"text": "ok"}], [{"store": "shop"}])
    task = store.tasks.create(submission, tenant="t")
    # A first worker commits the LLM step, begins the effect and writes, then dies unrecorded.
    from agentq.core.engine import conversation
    from agentq.core.providers import LLMRequest, default_provider_factory

    lease, claimed = store.tasks.claim(task.task_id, "crashed", 0.01)  # type: ignore[misc]
    response = default_provider_factory(claimed.submission).complete(
        LLMRequest(model="m", messages=conversation("g", []), max_tokens=100, task_id=task.task_id)
    )
    step = LLMStep(content=response.content, stop_reason="tool_use", model="m", usage=response.usage,
                   started_at=0, duration_ms=0)  # fmt: skip
    store.steps.commit(lease, 1, step, root_id=task.task_id)
    use = step.tool_uses()[0]
    assert store.effects.begin(lease, use["id"], "memory_write") is None
    store.memory_stores.write("t", "shop", "/x", "once", author=PERSON, lease=lease)
    import time

    time.sleep(0.05)
    result = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=5)).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    [outcome] = _results(store, task.task_id)
    assert outcome.status == "unknown_outcome"
    assert len(store.memory_stores.versions("t", "shop", "/x")) == 1


def test_a_fork_reads_the_store_as_it_is_now_not_as_at_the_fork_point(store: Storage, registry: ToolRegistry) -> None:
    _shop(store)
    store.memory_stores.write("t", "shop", "/x", "before", author=PERSON)
    read = call("memory_read", store="shop", path="/x")
    turns = [{"tool_calls": [read]}, {"tool_calls": [read]}, {"text": "done"}]
    source_id, _ = _run(store, registry, _submission(turns, [{"store": "shop"}]))
    now = store.memory_stores.read("t", "shop", "/x")
    store.memory_stores.write("t", "shop", "/x", "after", author=PERSON, expected_sha256=now.content_sha256)
    source = store.tasks.get(source_id)
    fork = store.tasks.fork(source, source.submission, store.steps.load(source_id)[:2], tenant="t")
    Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5)).run(fork.task_id)
    copied, fresh = (json.loads(r.content)["content"] for r in _results(store, fork.task_id))
    assert (copied, fresh) == ("before", "after")


def test_a_submission_attaching_a_store_that_does_not_exist_is_refused_naming_the_field(
    store: Storage, registry: ToolRegistry
) -> None:
    import pytest

    from agentq.control.submit import prepare_submission
    from agentq.core.errors import ValidationError

    _shop(store, tenant="other")
    with pytest.raises(ValidationError) as refused:
        prepare_submission(store, registry, _submission([{"text": "x"}], [{"store": "shop"}]), tenant="t")
    assert refused.value.field == "memory[0].store"


def test_an_agent_versions_attachments_are_merged_with_the_submissions_own(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.agents import create_agent
    from agentq.control.submit import prepare_submission

    _shop(store)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="catalog"))
    store.memory_stores.create_store("t", MemoryStoreSpec(name="ann"))
    agent = {
        "name": "support",
        "provider": "scripted",
        "script": {"turns": [{"text": "x"}]},
        "memory": [{"store": "catalog", "access": "read_only"}, {"store": "shop", "instructions": "orders"}],
    }
    create_agent(store, registry, agent, tenant="t")
    sent = TaskSubmission.model_validate(
        {"goal": "g", "agent": "support", "memory": [{"store": "shop", "access": "read_only"}, {"store": "ann"}]}
    )
    resolved = prepare_submission(store, registry, sent, tenant="t")
    assert [(a.store, a.access) for a in resolved.memory] == [
        ("catalog", "read_only"),
        ("shop", "read_only"),
        ("ann", "read_write"),
    ]


def test_sub_agents_get_their_parents_stores_read_only(store: Storage) -> None:
    from agentq.core.fanout import SpawnInput, plan_children

    _shop(store)
    parent = store.tasks.create(_submission([{"text": "x"}], [{"store": "shop"}]), tenant="t")
    spec = SpawnInput.model_validate({"subagents": [{"goal": "a", "script": {"turns": [{"text": "x"}]}}]})
    [child] = plan_children(parent, "toolu_1", spec, available=10_000)
    assert [(a.store, a.access) for a in child.submission.memory] == [("shop", "read_only")]


def test_memory_write_may_be_named_to_get_a_policy_and_then_waits_for_approval(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.submit import prepare_submission

    _shop(store)
    write = call("memory_write", store="shop", path="/x", content="asked first")
    sent = _submission(
        [{"tool_calls": [write]}, {"text": "ok"}],
        [{"store": "shop"}],
        constraints={"tools": ["memory_write"], "tool_policies": {"memory_write": "ask"}},
    )
    submission = prepare_submission(store, registry, sent, tenant="t")
    _, result = _run(store, registry, submission)
    assert result.status is TaskStatus.PAUSED
    assert store.memory_stores.list_documents("t", "shop") == []


def test_an_agent_without_memory_keeps_the_digest_it_had_before_agents_could_attach_stores() -> None:
    import hashlib

    from agentq.core.agents import AgentSpec

    spec = AgentSpec(name="helper", provider="scripted", script="research", system="s")
    before = spec.model_dump_json(exclude_none=True).replace(',"memory":[]', "")
    assert spec.digest() == hashlib.sha256(before.encode()).hexdigest()
    assert AgentSpec(**{**spec.model_dump(), "memory": [{"store": "shop"}]}).digest() != spec.digest()


def test_a_request_without_memory_keeps_the_idempotency_hash_it_had_before_memory_existed() -> None:
    import hashlib

    from agentq.control.submit import legacy_request_hash, request_hash

    sent = _submission([{"text": "x"}], [])
    before = sent.model_dump_json(exclude_none=True).replace(',"memory":[]', "")
    assert legacy_request_hash(sent) == hashlib.sha256(before.encode()).hexdigest()
    assert request_hash(_submission([{"text": "x"}], [{"store": "shop"}])) != request_hash(sent)
