"""Memory stores for people, against the local stack with auth on: the HTTP routes (statuses,
error bodies naming the field, tenant isolation), the Python client and `agentq memory`; and a
task reading what a person wrote, through the stack's own workers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import agentq
from agentq.api.client import Client, Conflict, InvalidRequest, NotFound
from agentq.api.cursors import encode_cursor
from agentq.cli.main import main
from agentq.core.memory import content_sha256

from tests.api_support import ApiStack
from tests.helpers import call, dynamo
from tests.lambda_support import LAMBDA_RESPONSE_BYTES, FakeLambdaContext, lambda_pages
from tests.test_api_routes import A, Api, api

__all__ = ["api"]  # the deployment of tests/test_api_routes.py: the Lambda handler, its own table


def _name() -> str:
    return f"mem-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(api_stack: ApiStack) -> Client:
    return agentq.Client(api_stack.url, api_stack.key)


def test_a_store_is_created_written_read_and_audited_over_http_and_another_tenant_gets_404(
    api_stack: ApiStack,
) -> None:
    name = _name()
    status, made, headers = api_stack.http("POST", "/memory-stores", {"name": name, "max_documents": 5})
    assert status == 201 and made["documents"] == 0 and headers["Location"] == f"/memory-stores/{name}"
    assert api_stack.http("POST", "/memory-stores", {"name": name})[0] == 409
    doc = f"/memory-stores/{name}/document?path=/customers/ann.md"
    status, written, _ = api_stack.http("PUT", doc, {"content": "ordered: blue lamp"})
    assert status == 200 and written["written"] and written["document"]["version"] == 1
    sha = written["document"]["content_sha256"]
    status, stale, _ = api_stack.http("PUT", doc, {"content": "x", "expected_content_sha256": "0" * 64})
    assert status == 409 and stale["error"]["code"] == "memory_conflict" and sha in stale["error"]["message"]
    assert (
        api_stack.http("PUT", doc, {"content": "ordered: blue lamp, red shade", "expected_content_sha256": sha})[0]
        == 200
    )
    status, history, _ = api_stack.http("GET", f"/memory-stores/{name}/versions?path=/customers/ann.md")
    assert status == 200 and [v["version"] for v in history["versions"]] == [2, 1]
    assert history["versions"][0]["created_by"]["type"] == "api"
    # Another tenant sees none of it.
    assert api_stack.http("GET", f"/memory-stores/{name}", key=api_stack.other_key)[0] == 404
    status, foreign, _ = api_stack.http("GET", doc, key=api_stack.other_key)
    assert status == 404 and foreign["error"]["code"] == "memory_store_not_found"
    assert name not in json.dumps(api_stack.http("GET", "/memory-stores", key=api_stack.other_key)[1])


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        ("POST", "/memory-stores", {"name": "Bad Name"}, 422, "name"),
        ("POST", "/memory-stores", {"name": "ok", "max_document_bytes": 200_000}, 422, "max_document_bytes"),
        ("PUT", "/memory-stores/{store}/document?path=no-slash", {"content": "x"}, 422, "path"),
        ("PUT", "/memory-stores/{store}/document?path=/a/../b", {"content": "x"}, 422, "path"),
        ("PUT", "/memory-stores/{store}/document?path=/big", {"content": "x" * 11}, 422, "content"),
        ("PUT", "/memory-stores/{store}/document?path=/a", {"content": "x", "expected_content_sha256": "nope"}, 422,
         "expected_content_sha256"),
        ("GET", "/memory-stores/{store}/search?query=", None, 422, "query"),
        ("GET", "/memory-stores/{store}/search?query=" + "+".join(f"w{i}" for i in range(17)), None, 422, "query"),
        ("POST", "/tasks", {"goal": "g", "provider": "scripted", "script": "research",
                            "memory": [{"store": "Bad Name"}]}, 422, "memory[0].store"),
        ("POST", "/tasks", {"goal": "g", "provider": "scripted", "script": "research",
                            "memory": [{"store": "{store}", "access": "sometimes"}]}, 422, "memory[0].access"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    api_stack: ApiStack, method: str, path: str, body: Any, status: int, field: str
) -> None:
    name = _name()
    assert api_stack.http("POST", "/memory-stores", {"name": name, "max_document_bytes": 10})[0] == 201
    sent = json.loads(json.dumps(body).replace("{store}", name)) if body is not None else None
    got, data, _ = api_stack.http(method, path.format(store=name), sent)
    assert (got, data["error"]["field"]) == (status, field), data
    assert api_stack.http("GET", f"/memory-stores/{name}")[1]["documents"] == 0


def test_the_client_reads_edits_redacts_searches_and_deletes(client: Client) -> None:
    name = _name()
    client.memory.create_store(name, description="customers")
    first = client.memory.write(name, "/c/ann.md", "card 4242; ordered a lamp").document
    second = client.memory.write(name, "/c/ann.md", "card on file; ordered a lamp",
                                 expected_content_sha256=first.content_sha256).document  # fmt: skip
    with pytest.raises(Conflict):
        client.memory.write(name, "/c/ann.md", "lost", expected_content_sha256=first.content_sha256)
    with pytest.raises(Conflict):
        client.memory.redact(name, "/c/ann.md", second.version)
    assert client.memory.redact(name, "/c/ann.md", first.version).content is None
    assert [h.path for h in client.memory.search(name, "LAMP")] == ["/c/ann.md"]
    assert [d.path for d in client.memory.documents(name, "/c/")] == ["/c/ann.md"]
    client.memory.write(name, "/c/bob.md", "ordered a shade")
    client.memory.write(name, "/d.md", "not under /c/")
    assert [d.path for d in client.memory.documents(name, "/c/", page_size=1)] == ["/c/ann.md", "/c/bob.md"]
    assert name in [s.name for s in client.memory.list_stores(page_size=1)]
    client.memory.delete(name, "/c/bob.md")
    client.memory.delete(name, "/d.md")
    with pytest.raises(InvalidRequest) as bad:
        client.memory.read(name, "relative")
    assert bad.value.field == "path"
    client.memory.delete(name, "/c/ann.md", expected_content_sha256=second.content_sha256)
    with pytest.raises(NotFound):
        client.memory.read(name, "/c/ann.md")
    assert client.memory.delete_store(name).name == name
    assert name not in [s.name for s in client.memory.list_stores()]


def test_a_task_reads_what_a_person_wrote_and_its_write_is_audited_with_its_step(client: Client) -> None:
    name = _name()
    client.memory.create_store(name)
    client.memory.write(name, "/prefs.md", "likes: blue")
    script = {
        "turns": [
            {"tool_calls": [call("memory_read", store=name, path="/prefs.md")]},
            {"tool_calls": [call("memory_write", store=name, path="/prefs.md", content="likes: blue, red",
                                 expected_sha256=content_sha256("likes: blue"))]},
            {"text": "remembered"},
        ]
    }  # fmt: skip
    accepted = client.submit(goal="remember", provider="scripted", script=script, memory=[{"store": name}])
    assert client.wait(accepted.task_id, timeout=60, poll=0.05).status.value == "succeeded"
    assert client.memory.read(name, "/prefs.md").content == "likes: blue, red"
    latest = client.memory.versions(name, "/prefs.md")[0].created_by
    assert (latest.type, latest.task_id, latest.step) == ("task", accepted.task_id, 3)
    with pytest.raises(InvalidRequest) as missing:
        client.submit(goal="x", provider="scripted", script=script, memory=[{"store": "no-such-store"}])
    assert missing.value.field == "memory[0].store"


@pytest.fixture
def cli(api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    def run(*args: str) -> tuple[int, str, str]:
        for key, value in api_stack.cli_env().items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_agentq_memory_creates_puts_cats_and_shows_history_and_a_conflict_exits_1(cli: Callable[..., Any]) -> None:
    name = _name()
    assert cli("memory", "create", name, "--description", "notes")[0] == 0
    code, out, _ = cli("memory", "put", name, "/a.md", "--content", "one")
    assert code == 0 and "as v1" in out
    code, out, err = cli("memory", "cat", name, "/a.md")
    assert (code, out) == (0, "one") and content_sha256("one") in err
    code, _, err = cli("memory", "put", name, "/a.md", "--content", "two", "--expect", "0" * 64)
    assert code == 1 and "memory store" in err
    code, out, _ = cli("memory", "history", name, "/a.md", "--json")
    assert code == 0 and [v["version"] for v in json.loads(out)] == [1]
    assert cli("memory", "put", name, "/a.md")[0] == 2  # no content given
    code, out, _ = cli("memory", "ls", name)
    assert code == 0 and out.startswith("/a.md  v1")


def test_a_person_s_write_records_the_api_key_that_made_it(api_stack: ApiStack) -> None:
    """As in AWS, where the authorizer's context names the key (``authorizer_context``)."""
    name = _name()
    assert api_stack.http("POST", "/memory-stores", {"name": name})[0] == 201
    key = api_stack.stack.keys().lookup(api_stack.key)
    assert key is not None
    doc = f"/memory-stores/{name}/document?path=/a.md"
    status, written, _ = api_stack.http("PUT", doc, {"content": "one"})
    assert status == 200 and written["document"]["updated_by"]["type"] == "api"
    assert written["document"]["updated_by"]["key_id"] == key.key_id
    status, gone, _ = api_stack.http("DELETE", doc)
    assert status == 200 and gone["created_by"]["key_id"] == key.key_id


@pytest.mark.parametrize("char", ["a", "é", "\U0001f600"], ids=["ascii", "two bytes", "four bytes"])
def test_content_over_the_store_s_byte_limit_is_memory_limit_exceeded_however_it_is_spelled(
    api_stack: ApiStack, char: str
) -> None:
    name = _name()
    assert api_stack.http("POST", "/memory-stores", {"name": name})[0] == 201  # the default, the most: 100 kB
    doc = f"/memory-stores/{name}/document?path=/a.md"
    limit = 102_400
    at_limit = char * (limit // len(char.encode()))

    def put(content: str) -> tuple[int, Any, Any]:  # as UTF-8, not \u escapes (which would pass 256 KB)
        return api_stack.http("PUT", doc, raw=json.dumps({"content": content}, ensure_ascii=False).encode())

    assert put(at_limit)[0] == 200
    over = at_limit + "a" * (limit - len(at_limit.encode()) + 1)
    status, body, _ = put(over)
    assert status == 422 and body["error"]["code"] == "memory_limit_exceeded" and body["error"]["field"] == "content"


def test_a_failed_precondition_names_expected_content_sha256_the_field_the_caller_sent(api_stack: ApiStack) -> None:
    name = _name()
    assert api_stack.http("POST", "/memory-stores", {"name": name})[0] == 201
    doc = f"/memory-stores/{name}/document?path=/a.md"
    assert api_stack.http("PUT", doc, {"content": "one"})[0] == 200
    stale = "0" * 64
    for method, path, body in (
        ("PUT", doc, {"content": "two", "expected_content_sha256": stale}),
        ("DELETE", f"{doc}&expected_content_sha256={stale}", None),
    ):
        status, answer, _ = api_stack.http(method, path, body)
        assert status == 409 and answer["error"]["field"] == "expected_content_sha256", answer
        assert "expected_sha256" not in answer["error"]["message"]


def test_an_end_users_token_attaches_no_store_itself_and_its_agents_store_still_serves_its_tasks(
    api_stack: ApiStack,
) -> None:
    """A store is the tenant's, shared by every user's tasks: a token (403 on /memory-stores) must
    not reach it by attaching it to a task it submits, read-only or read-write, nor widen the
    attachment of an agent it names; an agent the tenant defined with the store keeps working."""
    api, name = api_stack, _name()
    assert api.http("POST", "/memory-stores", {"name": name})[0] == 201
    assert api.http("PUT", f"/memory-stores/{name}/document?path=/faq.md", {"content": "returns: 30 days"})[0] == 200
    token = api.stack.token(user=f"mallory-{uuid.uuid4().hex[:6]}", tenant="team-a")
    read = {"turns": [{"tool_calls": [call("memory_read", store=name, path="/faq.md")]}, {"text": "read"}]}
    agent = f"faq-{uuid.uuid4().hex[:6]}"
    made = {"name": agent, "provider": "scripted", "script": read, "memory": [{"store": name, "access": "read_only"}]}
    assert api.http("POST", "/agents", made)[0] == 201
    for body in (
        {"goal": "x", "provider": "scripted", "script": read, "memory": [{"store": name, "access": "read_write"}]},
        {"goal": "x", "provider": "scripted", "script": read, "memory": [{"store": name, "access": "read_only"}]},
        {"goal": "x", "agent": agent, "memory": [{"store": name, "access": "read_write"}]},
    ):
        status, answer, _ = api.http("POST", "/tasks", body, key=token)
        assert (status, answer["error"]["code"], answer["error"]["field"]) == (403, "forbidden", "memory"), answer
    assert api.http("GET", "/tasks", key=token)[1]["tasks"] == []  # nothing was created
    task_id = api.submit({"goal": "x", "agent": agent}, key=token)
    assert api.until(task_id, lambda v: v["status"] in ("succeeded", "failed"), key=token)["status"] == "succeeded"
    assert "returns: 30 days" in json.dumps(api.http("GET", f"/tasks/{task_id}/trace", key=token)[1])


def _seed_documents(api: Api, store: str, count: int) -> list[str]:
    """``count`` documents of long (valid) paths written straight to the table, as that many PUTs
    would leave them (thousands of PUTs would take minutes): content "x", version 1."""
    import boto3

    from agentq.core.memory import check_path
    from agentq.storage import keys

    table = boto3.resource("dynamodb", endpoint_url=api.settings.endpoint_url, region_name="us-east-1",
                           aws_access_key_id="x", aws_secret_access_key="x").Table(dynamo(api.store).name)  # fmt: skip
    paths = ["/" + f"{i:05d}" + "a" * 195 + ("/" + "a" * 200) * 4 for i in range(count)]  # 1,005 bytes each
    with table.batch_writer() as batch:
        for path in paths:
            assert check_path(path)
            batch.put_item(Item={
                "pk": keys.memory_store_pk(A, store), "sk": keys.memory_doc_sk(path), "path": path, "version": 1,
                "content": "x", "content_sha256": content_sha256("x"), "content_size_bytes": 1,
                "created_at": 1, "updated_at": 1, "updated_by": {"type": "api"},
            })  # fmt: skip
    return paths


def _lambda_get(api: Api, path: str) -> tuple[int, Any, int]:
    """A GET through the Lambda handler: status, body, and the answer's size in bytes."""
    from agentq.api.http_server import proxy_event

    answer = api.handler.lambda_handler(proxy_event("GET", path, {}, None, tenant=A), FakeLambdaContext(30))
    return answer["statusCode"], json.loads(answer["body"]), len(answer["body"].encode())


def test_a_store_s_documents_are_listed_in_pages_each_within_one_lambda_answer(api: Api) -> None:
    """5,000 documents of 1,005-byte paths (a store may hold 10,000) answered 6.5 MB in one
    listing, past the 6 MB a Lambda may answer (API Gateway's 502), having read all their content.
    Pages, of the default size or the largest, stay under it, and following next_cursor lists
    each document once, in path order."""
    assert api.call("POST", "/memory-stores", {"name": "big", "max_documents": 10_000})[0] == 201
    paths = _seed_documents(api, "big", 5_000)
    status, page, size = _lambda_get(api, "/memory-stores/big/documents")
    assert status == 200 and size < LAMBDA_RESPONSE_BYTES, size
    assert len(page["documents"]) == 100
    from agentq.api.memory_models import MAX_DOCUMENTS_PAGE

    listed: list[str] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        status, page, size = _lambda_get(
            api, f"/memory-stores/big/documents?limit={MAX_DOCUMENTS_PAGE}" + (f"&cursor={cursor}" if cursor else "")
        )
        assert status == 200, page
        listed += [d["path"] for d in page["documents"]]
        assert all(d["content"] is None for d in page["documents"])
        sizes.append(size)
        if (cursor := page["next_cursor"]) is None:
            break
    assert listed == paths and max(sizes) < LAMBDA_RESPONSE_BYTES / 3


def test_stores_and_documents_pages_follow_their_cursors_and_another_listing_s_cursor_is_a_400(api: Api) -> None:
    me = f"t-{uuid.uuid4().hex[:8]}"  # a tenant of its own: the deployment is the module's

    def get(path: str, tenant: str = me) -> tuple[int, Any, Any]:
        return api.call("GET", path, tenant=tenant)

    for name in ("a", "b", "c"):
        assert api.call("POST", "/memory-stores", {"name": name}, tenant=me)[0] == 201
    for path in ("/c/1.md", "/c/2.md", "/c/3.md", "/d.md"):
        assert api.call("PUT", f"/memory-stores/a/document?path={path}", {"content": path}, tenant=me)[0] == 200
    names, cursor = [], None
    while True:
        status, page, _ = get("/memory-stores?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, page
        names.append([s["name"] for s in page["stores"]])
        if (cursor := page["next_cursor"]) is None:
            break
    assert names == [["a", "b"], ["c"]]
    assert get("/memory-stores", tenant="tenant-b")[1] == {"stores": [], "next_cursor": None}
    status, first, _ = get("/memory-stores/a/documents?path_prefix=/c/&limit=2")
    assert status == 200 and [d["path"] for d in first["documents"]] == ["/c/1.md", "/c/2.md"]
    cursor = first["next_cursor"]
    status, rest, _ = get(f"/memory-stores/a/documents?path_prefix=/c/&limit=2&cursor={cursor}")
    assert (status, [d["path"] for d in rest["documents"]], rest["next_cursor"]) == (200, ["/c/3.md"], None)
    stores_cursor = get("/memory-stores?limit=1")[1]["next_cursor"]
    for other in (
        f"/memory-stores/b/documents?path_prefix=/c/&cursor={cursor}",  # another store's
        f"/memory-stores/a/documents?path_prefix=/d&cursor={cursor}",  # another prefix's
        f"/memory-stores/a/documents?cursor={stores_cursor}",  # another listing's
        "/memory-stores/a/documents?cursor=" + "A" * 2049,
        "/memory-stores?cursor=not!base64",
    ):
        status, body, _ = get(other)
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", "cursor"), other
    for too_many in ("/memory-stores?limit=101", "/memory-stores/a/documents?limit=1001", "/memory-stores?limit=0"):
        status, body, _ = get(too_many)
        assert (status, body["error"]["field"]) == (422, "limit"), body


def test_a_bad_store_name_in_the_url_is_refused_in_words_about_a_memory_store(api: Api) -> None:
    # The API said a refused pattern in words keyed by the pattern alone, and a memory store's
    # name has an agent's pattern: GET /memory-stores/SHOP was "name: an agent's name: ...".
    status, body, _ = api.call("GET", "/memory-stores/SHOP")
    assert status == 422 and body["error"]["field"] == "name"
    assert body["error"]["message"] == "name: 1-64 lowercase letters, digits, '-' and '_', not 'SHOP'"
    status, body, _ = api.call("POST", "/memory-stores", {"name": "Shop"})
    assert (status, body["error"]["field"]) == (422, "name") and "agent" not in body["error"]["message"]
    sent = {"goal": "g", "provider": "scripted", "script": "research", "memory": [{"store": "Shop"}]}
    status, body, _ = api.call("POST", "/tasks", sent)
    assert (status, body["error"]["field"]) == (422, "memory[0].store")
    assert body["error"]["message"].startswith("memory[0].store: a memory store's name: 1-64 lowercase letters")
    # A field that names its concept keeps its words: a stop's agent is an agent's name.
    status, body, _ = api.call("POST", "/stops", {"agent": "Shop!"})
    assert (status, body["error"]["field"]) == (422, "agent")
    assert body["error"]["message"].startswith("agent: an agent's name: 1-64 lowercase letters")


def test_a_document_s_versions_are_listed_in_pages_each_within_one_lambda_answer(api: Api) -> None:
    """A 100 KB document written 62 times within its retention (an agent's notes, written by each
    task) answered all its versions with their content at once, 6.35 MB: past the 6 MB a Lambda
    may answer (API Gateway's 502, and no cursor to read less). Pages stop at ?limit= or 2 MB,
    and following next_cursor lists each version once, newest first, with its content."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assert api.call("POST", "/memory-stores", {"name": "notes"}, tenant=tenant)[0] == 201
    for i in range(62):
        put = api.call("PUT", "/memory-stores/notes/document?path=/notes.md",
                       {"content": f"{i}\n" + "n" * 102_000}, tenant=tenant)  # fmt: skip
        assert put[0] == 200, put[1]
    url = "/memory-stores/notes/versions?path=/notes.md"
    listed, sizes = lambda_pages(api, url, "versions", tenant)
    assert [v["version"] for v in listed] == list(range(62, 0, -1))
    assert [v["content"].split("\n")[0] for v in listed] == [str(i) for i in range(61, -1, -1)]
    assert len(sizes) > 1 and max(sizes) < LAMBDA_RESPONSE_BYTES / 2, sizes
    listed, sizes = lambda_pages(api, url + "&limit=20", "versions", tenant)
    assert [v["version"] for v in listed] == list(range(62, 0, -1)) and len(sizes) == 4
    for limit in (0, 101, "x"):
        status, body, _ = api.call("GET", f"{url}&limit={limit}", tenant=tenant)
        assert (status, body["error"]["field"]) == (422, "limit"), body
    assert api.call("PUT", "/memory-stores/notes/document?path=/other.md", {"content": "x"}, tenant=tenant)[0] == 200
    ours = api.call("GET", f"{url}&limit=1", tenant=tenant)[1]["next_cursor"]
    for cursor in (ours, encode_cursor("memory_documents", ["notes", "/notes.md"]), "e30", "no!"):
        status, body, _ = api.call(
            "GET", f"/memory-stores/notes/versions?path=/other.md&cursor={cursor}", tenant=tenant
        )
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", "cursor"), body
