"""The local moto server (agentq_dev.moto_app) answers as moto does, faster.

Transactions roll back from copies of the items they name (moto_rollback), not whole-table
copies. All or nothing must still hold exactly: items the transaction created are gone again,
items it deleted or changed are back as they were, wherever in it the failing action is (moto
carries on applying the actions after a failed condition before rolling back), and a stream
keeps no record of it. A Query by partition key reads only that partition (moto_query): its
results must be those of moto's whole-table path. The backend for a host is looked up once.
The fast paths of moto_speed (responses, update expressions) answer as moto's own paths do.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from agentq_dev.moto_app import Dispatcher
from agentq_dev.moto_server import MotoServer

S = "S"


@pytest.fixture
def ddb(moto_server: MotoServer) -> Any:
    return boto3.session.Session(region_name="us-east-1").client("dynamodb", endpoint_url=moto_server.endpoint_url)


def _table(ddb: Any, *, sort_key: bool = True, stream: bool = False) -> str:
    name = f"rollback-{uuid.uuid4().hex[:10]}"
    keys = [("pk", "HASH"), ("sk", "RANGE")] if sort_key else [("pk", "HASH")]
    extra: dict[str, Any] = {}
    if stream:
        extra["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": a, "KeyType": k} for a, k in keys],
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": S} for a, _ in keys],
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )
    return name


def _key(pk: str, sk: str | None = None) -> dict[str, Any]:
    return {"pk": {S: pk}} | ({"sk": {S: sk}} if sk is not None else {})


def _everything(ddb: Any, table: str) -> list[dict[str, Any]]:
    items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
    return sorted(items, key=lambda i: (i["pk"][S], i.get("sk", {}).get(S, "")))


def _seed(ddb: Any, table: str) -> None:
    rich = {"v": {"N": "1"}, "doc": {"M": {"list": {"L": [{S: "x"}, {"N": "2"}]}, "flag": {"BOOL": True}}}}
    for item in (
        _key("p1", "a") | rich,  # updated by the transaction
        _key("p1", "b") | {"v": {"N": "5"}},  # deleted by it
        _key("p2", "d") | {"v": {"N": "7"}, "tags": {"SS": ["one", "two"]}},  # overwritten by its Put
    ):
        ddb.put_item(TableName=table, Item=item)


def _writes(table: str) -> list[dict[str, Any]]:
    """Every kind of write, each leaving a trace if it were kept."""
    return [
        {"Put": {"TableName": table, "Item": _key("p3", "c") | {"v": {"N": "9"}}}},  # new item, new partition
        {"Delete": {"TableName": table, "Key": _key("p1", "b")}},
        {
            "Update": {
                "TableName": table,
                "Key": _key("p1", "a"),
                "UpdateExpression": "SET v = v + :one, doc.flag = :no REMOVE doc.#l",
                "ExpressionAttributeNames": {"#l": "list"},
                "ExpressionAttributeValues": {":one": {"N": "1"}, ":no": {"BOOL": False}},
            }
        },
        {"Put": {"TableName": table, "Item": _key("p2", "d") | {"v": {"N": "0"}}}},
        {  # an Update of a missing item creates it
            "Update": {
                "TableName": table,
                "Key": _key("p1", "e"),
                "UpdateExpression": "SET v = :v",
                "ExpressionAttributeValues": {":v": {"N": "3"}},
            }
        },
    ]


def _failing_check(table: str, key: dict[str, Any] | None = None) -> dict[str, Any]:
    missing = key or _key("p9", "z")
    return {"ConditionCheck": {"TableName": table, "Key": missing, "ConditionExpression": "attribute_exists(pk)"}}


@pytest.mark.parametrize("failing_at", [0, 2, 5])
def test_a_cancelled_transaction_leaves_every_item_as_it_was(ddb: Any, failing_at: int) -> None:
    table = _table(ddb)
    _seed(ddb, table)
    before = _everything(ddb, table)
    actions = _writes(table)
    actions.insert(failing_at, _failing_check(table))

    with pytest.raises(ClientError) as caught:
        ddb.transact_write_items(TransactItems=actions)

    assert caught.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = [r["Code"] for r in caught.value.response["CancellationReasons"]]
    assert reasons == ["None"] * failing_at + ["ConditionalCheckFailed"] + ["None"] * (len(actions) - failing_at - 1)
    assert _everything(ddb, table) == before
    new_partition = ddb.query(
        TableName=table, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {S: "p3"}}
    )
    assert new_partition["Items"] == []


def test_the_same_transaction_without_the_failing_check_applies_every_write(ddb: Any) -> None:
    """The control for the test above: these writes do change the table when nothing fails."""
    table = _table(ddb)
    _seed(ddb, table)
    ddb.transact_write_items(TransactItems=_writes(table))
    after = {(i["pk"][S], i["sk"][S]): i for i in _everything(ddb, table)}
    assert sorted(after) == [("p1", "a"), ("p1", "e"), ("p2", "d"), ("p3", "c")]
    assert after[("p1", "a")]["v"] == {"N": "2"} and after[("p1", "a")]["doc"] == {"M": {"flag": {"BOOL": False}}}
    assert after[("p2", "d")] == _key("p2", "d") | {"v": {"N": "0"}}


def test_a_transaction_refused_mid_way_for_naming_an_item_twice_leaves_the_earlier_writes_undone(ddb: Any) -> None:
    table = _table(ddb)
    _seed(ddb, table)
    before = _everything(ddb, table)
    actions = [
        *_writes(table)[:2],  # applied by moto before it meets the second action on p3/c
        {"Delete": {"TableName": table, "Key": _key("p3", "c")}},
    ]
    with pytest.raises(ClientError) as caught:
        ddb.transact_write_items(TransactItems=actions)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert _everything(ddb, table) == before


def test_a_cancelled_transaction_on_a_table_without_sort_key_leaves_it_as_it_was(ddb: Any) -> None:
    table = _table(ddb, sort_key=False)
    ddb.put_item(TableName=table, Item=_key("kept") | {"v": {"N": "1"}})
    ddb.put_item(TableName=table, Item=_key("gone") | {"v": {"N": "2"}})
    before = _everything(ddb, table)
    with pytest.raises(ClientError):
        ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table, "Item": _key("new") | {"v": {"N": "3"}}}},
                {"Delete": {"TableName": table, "Key": _key("gone")}},
                {"Put": {"TableName": table, "Item": _key("kept") | {"v": {"N": "4"}}}},
                _failing_check(table, _key("x")),
            ]
        )
    assert _everything(ddb, table) == before


def _stream_records(moto_server: MotoServer, ddb: Any, table: str) -> list[dict[str, Any]]:
    streams = boto3.session.Session(region_name="us-east-1").client(
        "dynamodbstreams", endpoint_url=moto_server.endpoint_url
    )
    arn = ddb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    return streams.get_records(ShardIterator=iterator["ShardIterator"])["Records"]  # type: ignore[no-any-return]


def test_a_cancelled_transaction_leaves_no_stream_record(moto_server: MotoServer, ddb: Any) -> None:
    table = _table(ddb, stream=True)
    ddb.put_item(TableName=table, Item=_key("p1", "a") | {"v": {"N": "1"}})
    with pytest.raises(ClientError):
        ddb.transact_write_items(TransactItems=[*_writes(table)[:3], _failing_check(table)])
    assert [r["eventName"] for r in _stream_records(moto_server, ddb, table)] == ["INSERT"]

    ddb.transact_write_items(TransactItems=[_writes(table)[0]])
    records = _stream_records(moto_server, ddb, table)
    assert [(r["eventName"], r["dynamodb"]["Keys"]["pk"][S]) for r in records] == [("INSERT", "p1"), ("INSERT", "p3")]
    numbers = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
    assert numbers[1] == numbers[0] + 1  # no gap where the cancelled writes were


# -- Query by partition key ---------------------------------------------------------------------


def _query(ddb: Any, table: str, pk: str, **extra: Any) -> list[dict[str, Any]]:
    """Every page of a Query of partition ``pk`` (with ``extra`` conditions), in order."""
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :p" + extra.pop("and_key", ""),
        "ExpressionAttributeValues": {":p": {S: pk}, **extra.pop("values", {})},
        **extra,
    }
    return _pages(ddb, request)


def _pages(ddb: Any, request: dict[str, Any]) -> list[dict[str, Any]]:
    """The items of every page of the Query ``request``, in order (each page from the last's key)."""
    items: list[dict[str, Any]] = []
    while True:
        page = ddb.query(**request)
        items += page["Items"]
        if "LastEvaluatedKey" not in page:
            return items
        request = {**request, "ExclusiveStartKey": page["LastEvaluatedKey"]}


def test_a_partition_query_returns_that_partition_in_sort_key_order_with_every_option(ddb: Any) -> None:
    table = _table(ddb)
    for p in ("p0", "p1", "p2"):  # neighbours on both sides, written interleaved
        for i in (7, 3, 11, 0, 5, 9, 1):
            ddb.put_item(TableName=table, Item=_key(p, f"s{i:02d}") | {"n": {"N": str(i)}, "p": {S: p}})
    mine = [f"s{i:02d}" for i in (0, 1, 3, 5, 7, 9, 11)]

    def sks(items: list[dict[str, Any]]) -> list[str]:
        return [i["sk"][S] for i in items]

    assert sks(_query(ddb, table, "p1")) == mine
    assert {i["p"][S] for i in _query(ddb, table, "p1")} == {"p1"}
    assert sks(_query(ddb, table, "p1", Limit=2)) == mine  # paged two at a time
    assert sks(_query(ddb, table, "p1", ScanIndexForward=False, Limit=3)) == mine[::-1]
    between = {"and_key": " AND sk BETWEEN :a AND :b", "values": {":a": {S: "s03"}, ":b": {S: "s09"}}}
    assert sks(_query(ddb, table, "p1", **between)) == ["s03", "s05", "s07", "s09"]
    assert sks(_query(ddb, table, "p1", and_key=" AND begins_with(sk, :b)", values={":b": {S: "s0"}})) == mine[:6]
    filtered = _query(ddb, table, "p1", FilterExpression="n > :m", values={":m": {"N": "4"}}, ProjectionExpression="sk")
    assert filtered == [{"sk": {S: s}} for s in ("s05", "s07", "s09", "s11")]
    before = ddb.scan(TableName=table)["Count"]
    assert _query(ddb, table, "nowhere") == []
    assert ddb.scan(TableName=table)["Count"] == before


def test_a_query_on_a_table_without_sort_key_finds_its_one_item(ddb: Any) -> None:
    table = _table(ddb, sort_key=False)
    for k in ("a", "b", "c"):
        ddb.put_item(TableName=table, Item=_key(k) | {"v": {S: k}})
    assert _query(ddb, table, "b") == [_key("b") | {"v": {S: "b"}}]
    assert _query(ddb, table, "zz") == []


def test_an_index_query_returns_moto_s_answer_from_that_index_partition_alone(ddb: Any) -> None:
    """moto_query's index path: the candidates are the items with the Query's index key values,
    not every item of the table sorted; the answer is what moto's own path gives, in its order:
    by the index's sort key, then the table's keys, paged either way, items without the index's
    keys left out, numbers equal as numbers (1 and 1.0)."""
    table = f"index-{uuid.uuid4().hex[:10]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": a, "AttributeType": t}
            for a, t in (("pk", S), ("sk", S), ("g", S), ("r", "N"), ("h", "N"))
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-g",
                "Projection": {"ProjectionType": "ALL"},
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}, {"AttributeName": "r", "KeyType": "RANGE"}],
            },
            {
                "IndexName": "by-h",
                "Projection": {"ProjectionType": "ALL"},
                "KeySchema": [{"AttributeName": "h", "KeyType": "HASH"}],
            },
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    written = []
    for i in range(60):  # three index partitions interleaved over ten table partitions; some with no index keys
        item = _key(f"p{i % 10}", f"s{i:02d}")
        if i % 7:
            item["g"] = {S: f"g{i % 3}"}
        if i % 5:
            item["r"] = {"N": str(i % 4)}  # ties on the index's sort key: the table's keys order them
        item["h"] = {"N": "1.0" if i % 2 else "1"} if i % 3 == 0 else {"N": str(i % 3 + 1)}
        ddb.put_item(TableName=table, Item=item)
        written.append(item)

    def query(index: str, key: str, **extra: Any) -> list[str]:
        request = {"TableName": table, "IndexName": index, "KeyConditionExpression": key, **extra}
        return [item["sk"][S] for item in _pages(ddb, request)]

    def expected(partition: str, low: int = 0, high: int = 9) -> list[str]:
        mine = [i for i in written if i.get("g") == {S: partition} and "r" in i and low <= int(i["r"]["N"]) <= high]
        return [i["sk"][S] for i in sorted(mine, key=lambda i: (int(i["r"]["N"]), i["pk"][S], i["sk"][S]))]

    g1 = {":g": {S: "g1"}}
    assert len(expected("g1")) > 10
    assert query("by-g", "g = :g", ExpressionAttributeValues=g1) == expected("g1")
    assert query("by-g", "g = :g", ExpressionAttributeValues=g1, Limit=3) == expected("g1")
    assert (
        query("by-g", "g = :g", ExpressionAttributeValues=g1, Limit=4, ScanIndexForward=False) == expected("g1")[::-1]
    )
    between = {**g1, ":a": {"N": "1"}, ":b": {"N": "2"}}
    assert query("by-g", "g = :g AND r BETWEEN :a AND :b", ExpressionAttributeValues=between, Limit=2) == expected(
        "g1", 1, 2
    )
    assert query("by-g", "g = :g", ExpressionAttributeValues={":g": {S: "none"}}) == []
    ones = sorted(i["sk"][S] for i in written if float(i["h"]["N"]) == 1)
    assert len(ones) == 20 and sorted(query("by-h", "h = :h", ExpressionAttributeValues={":h": {"N": "1"}})) == ones


def test_an_index_query_returns_each_item_as_its_index_projects_it_keys_only_or_include(ddb: Any) -> None:
    """moto_query projects an index partition's items before moto's deep copy of them (a deep
    copy of whole items, then a serialising round trip an attribute, was most of a stop's
    listing: 1,000 tasks' META, ~1 s): each item answered holds the table's keys, the index's
    and the attributes it includes, with the values written (numbers, nested maps and lists,
    sets), and a filter and a projection expression apply to those as DynamoDB applies them."""
    table = f"proj-{uuid.uuid4().hex[:10]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": S} for a in ("pk", "sk", "g", "r")],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "keys",
                "Projection": {"ProjectionType": "KEYS_ONLY"},
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
            },
            {
                "IndexName": "incl",
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["n", "m", "ss"]},
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}, {"AttributeName": "r", "KeyType": "RANGE"}],
            },
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    written = {}
    for i in range(30):
        item = {
            **_key(f"p{i % 4}", f"s{i:02d}"),
            "g": {S: "g1" if i % 3 else "g2"},
            "r": {S: f"r{i % 5}"},
            "n": {"N": f"{i}.50"},
            "m": {"M": {"deep": {"L": [{"N": "1"}, {"M": {"x": {S: "y"}}}]}, "b": {"BOOL": bool(i % 2)}}},
            "ss": {"SS": ["a", "b"]},
            "big": {S: "x" * 2000},  # in neither index
        }
        if i % 7 == 0:
            del item["m"]  # an included attribute an item lacks stays absent
        ddb.put_item(TableName=table, Item=item)
        written[item["sk"][S]] = item

    def query(index: str, **extra: Any) -> list[dict[str, Any]]:
        request = {"TableName": table, "IndexName": index, "KeyConditionExpression": "g = :g", "Limit": 7, **extra}
        request["ExpressionAttributeValues"] = {":g": {S: "g1"}, **extra.get("ExpressionAttributeValues", {})}
        return _pages(ddb, request)

    g1 = sorted(k for k, item in written.items() if item["g"] == {S: "g1"})
    kept = {"keys": ("pk", "sk", "g"), "incl": ("pk", "sk", "g", "r", "n", "m", "ss")}
    for index, names in kept.items():
        items = query(index)
        assert sorted(i["sk"][S] for i in items) == g1, index
        for item in items:
            want = {name: value for name, value in written[item["sk"][S]].items() if name in names}
            assert item == want, index
    odd = query("incl", FilterExpression="m.b = :t", ExpressionAttributeValues={":t": {"BOOL": True}})
    assert sorted(i["sk"][S] for i in odd) == [k for k in g1 if "m" in written[k] and int(k[1:]) % 2]
    assert all(set(i) == {"n"} for i in query("incl", ProjectionExpression="n"))


# -- dispatch -----------------------------------------------------------------------------------


def test_the_dispatcher_picks_the_backend_moto_picks_and_looks_each_host_up_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    hosts = [
        "dynamodb.us-east-1.amazonaws.com",
        "sqs.us-east-1.amazonaws.com",
        "s3.amazonaws.com",
        "states.us-east-1.amazonaws.com",
        "moto_api",
        None,
    ]
    stock = DomainDispatcherApplication(create_backend_app)
    expected = [stock.get_backend_for_host(h) for h in hosts]
    assert expected[:4] == ["dynamodb", "sqs", "s3", "stepfunctions"]

    lookups: list[str | None] = []
    original = DomainDispatcherApplication.get_backend_for_host

    def counted(self: Any, host: str | None) -> Any:
        lookups.append(host)
        return original(self, host)

    monkeypatch.setattr(DomainDispatcherApplication, "get_backend_for_host", counted)
    dispatcher = Dispatcher(create_backend_app)
    assert [dispatcher.get_backend_for_host(h) for h in hosts * 3] == expected * 3
    assert lookups == hosts


def test_an_sqs_queue_remembers_only_its_most_recent_deleted_receipts(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto kept every deleted message's receipt handle for ever (memory growing with traffic);
    a queue now keeps the newest ones, and a second delete of a recent one still succeeds."""
    import boto3
    from moto import mock_aws

    from agentq_dev import moto_sqs

    moto_sqs.install()
    receipts = moto_sqs.RecentReceipts(limit=3)
    receipts.update(["a", "b", "c", "d"])
    assert list(receipts) == ["b", "c", "d"] and "a" not in receipts and "d" in receipts
    monkeypatch.setattr(moto_sqs, "RECENT", 3)
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="recent")["QueueUrl"]
        for i in range(5):
            sqs.send_message(QueueUrl=url, MessageBody=str(i))
            [message] = sqs.receive_message(QueueUrl=url)["Messages"]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])  # again: still a success
        from moto.sqs.models import sqs_backends

        queue = sqs_backends["123456789012"]["us-east-1"].queues["recent"]
        assert isinstance(queue.deleted_messages, moto_sqs.RecentReceipts) and len(queue.deleted_messages) == 3


def test_a_message_made_visible_again_wakes_the_long_polls_waiting_on_its_queue() -> None:
    """SQS hands a message made visible again (visibility 0: how a dead worker's tasks are
    handed on) to a long poll already waiting; moto woke its waiting polls only for a new
    message, so they slept out the rest of their second. The waiter below is woken by the
    change itself (``wait`` answers True), not by its timeout."""
    import threading

    from moto import mock_aws
    from moto.sqs.models import sqs_backends

    from agentq_dev import moto_sqs

    moto_sqs.install()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="wake")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="task")
        [held] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"]
        lock = sqs_backends["123456789012"]["us-east-1"].queues["wake"]._messages_lock
        waiting = threading.Event()
        woken: list[bool] = []

        def long_poll() -> None:
            with lock:
                waiting.set()
                woken.append(lock.wait(timeout=60))

        poller = threading.Thread(target=long_poll)
        poller.start()
        waiting.wait()  # the poller holds the lock until it waits: the change cannot come first
        sqs.change_message_visibility_batch(
            QueueUrl=url, Entries=[{"Id": "0", "ReceiptHandle": held["ReceiptHandle"], "VisibilityTimeout": 0}]
        )
        poller.join()
        assert woken == [True]
        assert [m["Body"] for m in sqs.receive_message(QueueUrl=url)["Messages"]] == ["task"]


def test_a_long_poll_whose_client_has_gone_takes_no_message_sent_while_it_waits() -> None:
    """A worker that ends (or is killed) while its idle tier waits out a 20 s long poll leaves
    the poll waiting in the server. moto then took the next message sent, or made visible (a dead
    worker's task handed on), for a client that would never read it: invisible for its visibility
    timeout, one receive nearer the dead-letter queue. Now such a poll ends at its next wake
    and takes nothing, while a poll whose client is there takes the message as before. Each
    poll answers a socket of its own; the message is sent once the poll waits."""
    import socket
    import threading

    from moto import mock_aws
    from moto.sqs.models import sqs_backends

    from agentq_dev import moto_http, moto_sqs

    moto_sqs.install()

    class Watched(threading.Condition):
        """The queue's condition, telling when a long poll waits on it."""

        def __init__(self) -> None:
            super().__init__()
            self.waiting = threading.Event()

        def wait_for(self, predicate: Any, timeout: float | None = None) -> Any:
            self.waiting.set()
            return super().wait_for(predicate, timeout)

    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="gone")["QueueUrl"]
        backend = sqs_backends["123456789012"]["us-east-1"]

        def poll_while_a_message_is_sent(client_there: bool) -> list[Any]:
            backend.queues["gone"]._messages_lock = lock = Watched()
            server_end, client_end = socket.socketpair()
            if not client_there:
                client_end.close()
            got: list[Any] = []

            def long_poll() -> None:
                moto_http._answering.connection = server_end
                try:
                    got.append([m.body for m in backend.receive_message("gone", 1, 20, 30)])
                except moto_sqs.ClientGone as gone:
                    got.append(gone)

            poller = threading.Thread(target=long_poll)
            poller.start()
            lock.waiting.wait(timeout=10)
            sqs.send_message(QueueUrl=url, MessageBody="task")
            poller.join(timeout=30)
            server_end.close()
            client_end.close()
            return got

        [gone] = poll_while_a_message_is_sent(client_there=False)
        assert isinstance(gone, moto_sqs.ClientGone)
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"]) == (
            "1",
            "0",
        )
        [message] = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"]
        assert message["Attributes"]["ApproximateReceiveCount"] == "1"  # the gone poll's was not a receive
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

        assert poll_while_a_message_is_sent(client_there=True) == [["task"]]


def test_a_stream_shard_keeps_its_newest_records_with_sequence_numbers_going_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's stream shard kept a record of every write forever; the local server keeps a window
    (here in-process moto, with the same patch the server installs, and a window of 5)."""
    from moto import mock_aws

    from agentq_dev import moto_streams

    moto_streams.install()
    monkeypatch.setattr(moto_streams.trim, "__defaults__", (5, 0))
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(
            TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
        )  # fmt: skip
        for i in range(12):
            ddb.put_item(TableName="t", Item={"pk": {"S": f"p{i}"}})
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        shard = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].tables["t"].stream_shard
        assert shard is not None
        records = shard.get(0, 100)  # from before the window: read from its start
        assert len(shard.items) == 5
    assert [r["dynamodb"]["Keys"]["pk"]["S"] for r in records] == [f"p{i}" for i in range(7, 12)]
    numbers = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
    assert numbers == sorted(numbers) and len(set(numbers)) == 5  # still increasing, none reused


def test_the_server_keeps_no_item_objects_of_deleted_items() -> None:
    """moto tracked every model object it ever created (every item copy) for its dashboard;
    with the local server's patch, deleted items leave nothing behind (in-process moto here)."""
    import gc

    from moto import mock_aws
    from moto.dynamodb.models.dynamo_type import Item

    from agentq_dev import moto_models

    moto_models.install()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(
            TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
        )  # fmt: skip
        for i in range(200):
            key = {"pk": {"S": f"p{i}"}}
            ddb.put_item(TableName="t", Item=key | {"v": {"N": "1"}})
            ddb.update_item(TableName="t", Key=key, UpdateExpression="SET v = :v",
                            ExpressionAttributeValues={":v": {"N": "2"}}, ReturnValues="ALL_OLD")  # fmt: skip
            ddb.delete_item(TableName="t", Key=key)
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, Item)] == []


# -- fast paths (moto_speed) --------------------------------------------------------------------

EVERY_TYPE = {
    "s": {S: "text"},
    "empty": {S: ""},
    "n": {"N": "-12.5"},
    "b": {"B": b"\x00\x01bytes"},
    "ss": {"SS": ["a", "b"]},
    "ns": {"NS": ["1", "2.5"]},
    "bs": {"BS": [b"x", b"y"]},
    "m": {"M": {"inner": {"L": [{S: "x"}, {"N": "2"}, {"M": {"deep": {"BOOL": False}}}]}, "nil": {"NULL": True}}},
    "l": {"L": []},
    "bool": {"BOOL": True},
    "null": {"NULL": True},
}


def test_an_item_of_every_attribute_type_reads_back_as_written_through_every_read(ddb: Any) -> None:
    """Responses are serialised through the AttributeValue fast path (and a binary one through
    moto's generic path): what GetItem, Query, BatchGetItem and UpdateItem's ALL_NEW return is
    what was written."""
    table = _table(ddb)
    item = _key("p", "a") | EVERY_TYPE
    ddb.put_item(TableName=table, Item=item)
    assert ddb.get_item(TableName=table, Key=_key("p", "a"), ConsistentRead=True)["Item"] == item
    assert _query(ddb, table, "p") == [item]
    got = ddb.batch_get_item(RequestItems={table: {"Keys": [_key("p", "a")]}})["Responses"][table]
    assert got == [item]
    new = ddb.update_item(
        TableName=table, Key=_key("p", "a"), UpdateExpression="SET s = :s", ExpressionAttributeValues={":s": {S: "t"}},
        ReturnValues="ALL_NEW",
    )["Attributes"]  # fmt: skip
    assert new == item | {"s": {S: "t"}}


def test_the_attribute_value_fast_path_serialises_as_moto_does() -> None:
    """The fast path against moto's own serializer, for the same results (a subclass here, so
    nothing in this process is patched)."""
    import json

    from moto.core.serialize import XFormedAttributePicker, get_serializer_class
    from moto.core.utils import get_service_model

    from agentq_dev.moto_speed import attribute_value_fast_path

    service = get_service_model("dynamodb")
    generic = get_serializer_class("dynamodb", "json")
    fast = type("Fast", (generic,), {})
    fast._serialize_type_structure = attribute_value_fast_path(generic._serialize_type_structure)  # type: ignore[attr-defined]
    wire = {k: v for k, v in EVERY_TYPE.items() if k not in ("b", "bs")} | {"b": {"B": "AAFieXRlcw=="}}
    results = {
        "GetItem": {"Item": wire},
        "Query": {"Items": [wire, _key("p", "b")], "Count": 2, "ScannedCount": 2, "LastEvaluatedKey": _key("p", "b")},
        "BatchGetItem": {"Responses": {"t": [wire]}, "UnprocessedKeys": {}},
        "UpdateItem": {"Attributes": wire, "ConsumedCapacity": {"TableName": "t", "CapacityUnits": 0.5}},
    }
    for operation, result in results.items():
        bodies = [
            json.loads(
                cls(
                    operation_model=service.operation_model(operation), value_picker=XFormedAttributePicker()
                ).serialize(result)["body"]
            )
            for cls in (generic, fast)
        ]
        assert bodies[0] == bodies[1], operation
        assert bodies[1]


def _graph(root: Any) -> Any:
    """An object graph as nested tuples, each list and object numbered where first met and a
    later reference to it by that number: two graphs are the same shape, sharing included, when
    their tuples are equal. Also the ids of every list and object in it."""
    numbers: dict[int, int] = {}

    def visit(value: Any) -> Any:
        if isinstance(value, (str, int, float, bool, type(None), bytes)):
            return value
        if id(value) in numbers:
            return ("ref", numbers[id(value)])
        numbers[id(value)] = len(numbers)
        if isinstance(value, list):
            return ("list", [visit(v) for v in value])
        if isinstance(value, dict):
            return ("dict", [(k, visit(v)) for k, v in value.items()])
        return (type(value).__name__, [(k, visit(v)) for k, v in vars(value).items()])

    return visit(root), set(numbers)


def test_an_expression_tree_copies_as_copy_s_generic_deepcopy_copies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto copies an update expression's tree before each validation; the structural copy
    (moto_speed), and a parsed tree's copy by its plan, give what ``copy.deepcopy`` gives without
    it: the same classes, attributes in the same order, parents pointing into the copy, shared
    nodes still shared, nothing of the original in it, values that are not nodes copied by their
    own ``__deepcopy__``."""
    import copy
    import importlib

    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]

    from agentq_dev import moto_speed

    assert moto_speed.install()
    trees = [
        UpdateExpressionParser.make(expression)
        for expression in (
            "SET #a = :x, b.c[2].d = if_not_exists(#e, :y) + :z, f = list_append(f, :l) "
            "REMOVE g[0], h.i ADD j :one DELETE k :set",
            "SET #u0 = :u0, #u1 = if_not_exists(#u2, :u1) ADD #u3 :u2 REMOVE #u4",
        )
    ]
    ast_nodes = importlib.import_module("moto.dynamodb.parsing.ast_nodes")  # a "# type: ignore" module
    typed = ast_nodes.DDBTypedValue(DynamoType({"M": {"a": {"L": [{S: "x"}]}}}))
    shared = ast_nodes.UpdateExpressionValue(children=[typed, typed])  # the same node twice
    unparsed = copy.deepcopy(trees[1])  # a parsed tree is never changed: this one becomes a child
    trees.append(ast_nodes.UpdateExpressionSetAction(children=[shared, unparsed]))
    assert all(id(tree) in moto_speed._PLANS for tree in trees[:2])  # parsed trees are copied by their plan
    assert id(trees[2]) not in moto_speed._PLANS
    copies = [copy.deepcopy(tree) for tree in trees]
    monkeypatch.delattr(ast_nodes.Node, "__deepcopy__")  # copy's generic deepcopy
    for tree, fast in zip(trees, copies, strict=True):
        generic = copy.deepcopy(tree)
        (fast_graph, fast_ids), (generic_graph, _) = _graph(fast), _graph(generic)
        assert fast_graph == generic_graph
        assert not fast_ids & _graph(tree)[1]


def test_update_expressions_parsed_once_still_apply_each_request_s_own_names_and_values(ddb: Any) -> None:
    table = _table(ddb)
    for target, value in (("x", "1"), ("y", "2"), ("x", "3")):
        ddb.update_item(
            TableName=table, Key=_key("p", "a"), UpdateExpression="SET #t = :v ADD hits :one",
            ExpressionAttributeNames={"#t": target}, ExpressionAttributeValues={":v": {"N": value}, ":one": {"N": "1"}},
        )  # fmt: skip
    got = ddb.get_item(TableName=table, Key=_key("p", "a"), ConsistentRead=True)["Item"]
    assert got == _key("p", "a") | {"x": {"N": "3"}, "y": {"N": "2"}, "hits": {"N": "3"}}


@pytest.mark.parametrize(
    ("expression", "values", "message"),
    [
        ("SET v = :a, v = :b", {":a": {"N": "1"}, ":b": {"N": "2"}}, "Two document paths overlap"),
        ("SET v = :a SET w = :b", {":a": {"N": "1"}, ":b": {"N": "2"}}, 'The "SET" section can only be used once'),
        ("SET sk = :a", {":a": {S: "z"}}, "Cannot update attribute sk"),
        (
            "SET v = absent_attr + :a",
            {":a": {"N": "1"}},
            "The provided expression refers to an attribute that does not exist",
        ),
    ],
)
def test_an_update_expression_moto_refuses_is_still_refused(
    ddb: Any, expression: str, values: Any, message: str
) -> None:
    """The validator's walks (looked up by node type) still find what they look for."""
    table = _table(ddb)
    ddb.put_item(TableName=table, Item=_key("p", "a") | {"v": {"N": "0"}})
    for _ in range(2):  # the second time from the parsed-expression cache
        with pytest.raises(ClientError) as err:
            ddb.update_item(
                TableName=table, Key=_key("p", "a"), UpdateExpression=expression, ExpressionAttributeValues=values
            )
        assert err.value.response["Error"]["Code"] == "ValidationException"
        assert message in err.value.response["Error"]["Message"]
    assert ddb.get_item(TableName=table, Key=_key("p", "a"), ConsistentRead=True)["Item"] == _key("p", "a") | {
        "v": {"N": "0"}
    }


# -- keep-alive (moto_http) ---------------------------------------------------------------------


class ClosingMotoServer(MotoServer):
    """moto_app as werkzeug serves it: every connection closed after its response."""

    def command(self) -> list[str]:
        program = "import sys; from agentq_dev.moto_app import main; main(sys.argv[1:], keep_alive=False)"
        return [sys.executable, "-c", program]


@pytest.fixture(scope="module")
def closing_server() -> Iterator[MotoServer]:
    with ClosingMotoServer() as server:
        yield server


# Headers that differ between any two answers (ids, time) or by how the body is framed.
_FRAMING_AND_IDS = {"date", "last-modified", "connection", "content-length", "transfer-encoding", "x-amzn-requestid",
                    "x-amz-request-id", "x-amz-id-2"}  # fmt: skip


def _recorder(answers: list[Any]) -> Any:
    """A botocore ``response-received`` handler appending each raw answer to ``answers``: status,
    body, headers but framing and ids."""

    def record(response_dict: dict[str, Any], **_: Any) -> None:
        headers = {k.lower(): v for k, v in response_dict["headers"].items() if k.lower() not in _FRAMING_AND_IDS}
        body = response_dict["body"]  # a streamed body (GetObject's) is read by the call
        if isinstance(body, bytes):  # S3's error bodies carry random ids
            body = re.sub(rb"<(RequestId|HostId)>[^<]*</", rb"<\1></", body)
        answers.append((response_dict["status_code"], body if isinstance(body, bytes) else "streamed", headers))

    return record


def _a_client_s_session(endpoint: str, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], int]:
    """The same calls through boto3 on one client per service: every raw answer (status, body,
    headers but framing and ids) and the number of TCP connections the clients opened."""
    from botocore.awsrequest import AWSHTTPConnection
    from botocore.config import Config

    connects: list[int] = []
    original = AWSHTTPConnection.connect
    port = int(endpoint.rsplit(":", 1)[1])

    def counted(self: Any) -> None:
        if self.port == port:  # the session stack's threads in this process talk to another server
            connects.append(1)
        original(self)

    monkeypatch.setattr(AWSHTTPConnection, "connect", counted)
    answers: list[Any] = []
    record = _recorder(answers)
    session = boto3.session.Session(region_name="us-east-1")
    s3_config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    ddb = session.client("dynamodb", endpoint_url=endpoint, config=Config(retries={"max_attempts": 1}))
    s3 = session.client("s3", endpoint_url=endpoint, config=s3_config)
    table = bucket = name
    ddb.create_table(TableName=table, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")  # fmt: skip
    s3.create_bucket(Bucket=bucket)
    for client in (ddb, s3):
        client.meta.events.register("response-received", record)
    for i in range(3):
        ddb.put_item(TableName=table, Item=_key(f"p{i}") | {"v": {"N": str(i)}})
        ddb.update_item(TableName=table, Key=_key(f"p{i}"), UpdateExpression="SET v = v + :one",
                        ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="ALL_NEW")  # fmt: skip
        ddb.get_item(TableName=table, Key=_key(f"p{i}"), ConsistentRead=True)
        with pytest.raises(ClientError):
            ddb.get_item(TableName=f"{table}-missing", Key=_key("p"))
        s3.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x" * 70_000)
        answers.append(s3.get_object(Bucket=bucket, Key=f"k{i}")["Body"].read())
        s3.head_object(Bucket=bucket, Key=f"k{i}")
        with pytest.raises(ClientError):
            s3.get_object(Bucket=bucket, Key="missing")
    for client in (ddb, s3):
        client.meta.events.unregister("response-received", record)
    return answers, len(connects)


def test_a_client_s_calls_share_one_connection_per_client_and_get_the_answers_a_closing_server_gives(
    moto_server: MotoServer, closing_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """werkzeug closed every connection after its answer (a connect per call, a server thread per
    connection); moto_app now keeps them open. Same answers byte for byte, errors and a body
    larger than a socket buffer included; one connection per client instead of one per call."""
    name = f"keepalive-{uuid.uuid4().hex[:8]}"
    kept, kept_connects = _a_client_s_session(moto_server.endpoint_url, name, monkeypatch)
    closed, closed_connects = _a_client_s_session(closing_server.endpoint_url, name, monkeypatch)
    assert len(kept) == len(closed) == 27
    assert kept == closed
    assert closed_connects == 26  # the 24 calls and the table's and the bucket's creation
    assert kept_connects == 2  # one for DynamoDB's client, one for S3's


def test_a_request_of_unknown_length_is_answered_and_its_connection_closed(moto_server: MotoServer) -> None:
    """A chunked body's end is known only by reading it through; the server answers it and closes,
    as werkzeug did for every request, and the object it carried is stored whole."""
    import http.client

    bucket = f"chunked-{uuid.uuid4().hex[:8]}"
    s3 = boto3.session.Session(region_name="us-east-1").client("s3", endpoint_url=moto_server.endpoint_url)
    s3.create_bucket(Bucket=bucket)
    auth = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=10)
    connection.request("PUT", f"/{bucket}/chunked", body=iter([b"a" * 10, b"b" * 5]), encode_chunked=True,
                       headers={"Authorization": auth, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})  # fmt: skip
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    assert response.getheader("Connection") == "close"
    assert s3.get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"a" * 10 + b"b" * 5
    connection.close()


@pytest.mark.parametrize(
    "block",
    [
        b"Host: 127.0.0.1\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\nContent-Length: 12\r\n\r\n",
        b"Host:a\r\nX:  b c \r\nX: d\r\nEmpty:\r\nX_under: 1\r\n\r\n",  # repeated, blank, underscored
        b"A: 1\r\n folded\r\n\r\n",  # a folded line: the email parser's
        b"A: 1\r\nnot a header\r\n\r\n",  # the email parser's (a defect, and the rest is body)
        b"A: 1\rB: 2\r\n\r\n",  # a bare CR ends a line for the email parser
        b"From nobody: x\r\n\r\n",
        b"A: 1\n\n",
        b"A: 1\r\n",  # the connection ended before the blank line
    ],
)
def test_request_headers_parse_as_http_client_parses_them(block: bytes) -> None:
    import http.client
    import io

    from agentq_dev.moto_http import parse_headers

    fast, stock = parse_headers(io.BytesIO(block)), http.client.parse_headers(io.BytesIO(block))
    assert type(fast) is type(stock)
    assert fast.items() == stock.items() and fast.get_payload() == stock.get_payload()
    assert [type(d) for d in fast.defects] == [type(d) for d in stock.defects]


def test_condition_expressions_lexed_once_give_moto_s_tokens_fresh_to_every_parse() -> None:
    from moto.dynamodb.comparisons import ConditionExpressionParser

    from agentq_dev import moto_speed

    assert moto_speed.install()
    cached = ConditionExpressionParser._lex_condition_expression
    stock = cached.__wrapped__  # type: ignore[attr-defined]
    for expression in (
        "attribute_not_exists(pk)",
        "#s = :running AND lease_epoch = :e AND (attribute_not_exists(x) OR x <> :v)",
        "size(doc.list[0]) >= :n AND begins_with(#k, :p) AND v IN (:a, :b) AND v BETWEEN :lo AND :hi",
    ):
        parser = ConditionExpressionParser(expression, None, None)
        first, second = cached(parser), cached(parser)
        assert list(first) == list(second) == list(stock(parser))
        assert all(a is not b and a.children is not b.children for a, b in zip(first, second, strict=True))
    with pytest.raises(ValueError, match="Cannot parse condition"):
        cached(ConditionExpressionParser("v = :a ; DROP", None, None))


def test_a_condition_lexed_once_still_checks_each_request_s_own_names_and_values(ddb: Any) -> None:
    table = _table(ddb)
    condition = "attribute_not_exists(#n) OR #n < :limit"
    for limit, n, applied in ((5, 1, True), (5, 7, False), (9, 7, True), (1, 0, True)):
        ddb.put_item(TableName=table, Item=_key("p", "a") | {"n": {"N": str(n)}})
        attempt = {"TableName": table, "Item": _key("p", "a") | {"n": {"N": "100"}}, "ConditionExpression": condition,
                   "ExpressionAttributeNames": {"#n": "n"}, "ExpressionAttributeValues": {":limit": {"N": str(limit)}}}  # fmt: skip
        if applied:
            ddb.put_item(**attempt)
        else:
            with pytest.raises(ClientError, match="ConditionalCheckFailed"):
                ddb.put_item(**attempt)
        stored = ddb.get_item(TableName=table, Key=_key("p", "a"), ConsistentRead=True)["Item"]["n"]["N"]
        assert stored == ("100" if applied else str(n))


# -- an update expression's own checks once (moto_updates) --------------------------------------


class PlainMotoServer(MotoServer):
    """moto_app without its fast paths (moto_speed, moto_updates): moto's own answers."""

    def command(self) -> list[str]:
        program = "import sys; from agentq_dev.moto_app import main; main(sys.argv[1:], fast_paths=False)"
        return [sys.executable, "-c", program]


@pytest.fixture(scope="module")
def plain_server() -> Iterator[MotoServer]:
    with PlainMotoServer() as server:
        yield server


def _updates(endpoint: str, name: str) -> list[Any]:
    """UpdateItems whose expressions pass and fail moto's checks of the expression alone, each
    expression again with other names, on another table with other keys, and again after a
    refusal: every raw answer (status, body, headers but framing and ids)."""
    from botocore.config import Config

    ddb: Any = boto3.session.Session(region_name="us-east-1").client(
        "dynamodb", endpoint_url=endpoint, config=Config(retries={"max_attempts": 1})
    )
    keyed_by_v = f"{name}-v"
    _create = {"BillingMode": "PAY_PER_REQUEST"}
    ddb.create_table(TableName=name, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": a, "AttributeType": S} for a in ("pk", "sk")], **_create)  # fmt: skip
    ddb.create_table(TableName=keyed_by_v, KeySchema=[{"AttributeName": "v", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "v", "AttributeType": S}], **_create)  # fmt: skip
    ddb.put_item(TableName=name, Item=_key("p", "a") | {"v": {S: "0"}, "w": {S: "0"}, "n": {"N": "1"}})
    ddb.put_item(TableName=keyed_by_v, Item={"v": {S: "k"}, "w": {S: "0"}})
    values = {":x": {S: "x"}, ":y": {S: "y"}}
    two = "SET #a = :x, #b = :y"
    calls: list[tuple[Any, ...]] = [  # (table, key, expression, names, values, return values)
        (name, _key("p", "a"), two, {"#a": "v", "#b": "w"}, values, "ALL_NEW"),
        (name, _key("p", "a"), two, {"#a": "v", "#b": "v"}, values, "NONE"),  # the same path twice
        (name, _key("p", "a"), two, {"#a": "v", "#b": "w"}, values, "UPDATED_OLD"),
        (name, _key("p", "a"), two, {"#a": "v", "#b": "sk"}, values, "NONE"),  # a key attribute
        (name, _key("p", "a"), two, {"#a": "v", "#b": "sk"}, values, "NONE"),
        (name, _key("p", "new"), two, {"#a": "v", "#b": "w"}, values, "ALL_NEW"),  # creates the item
        (keyed_by_v, {"v": {S: "k"}}, two, {"#a": "w", "#b": "z"}, values, "ALL_NEW"),
        (keyed_by_v, {"v": {S: "k"}}, two, {"#a": "v", "#b": "w"}, values, "ALL_NEW"),  # v: this table's key
        (name, _key("p", "a"), "SET #a = :x ADD n :one", {"#a": "v"}, {":x": {S: "x"}, ":one": {"N": "1"}}, "ALL_NEW"),
        (name, _key("p", "a"), "SET #a = :x ADD n :one", {"#a": "v"}, {":x": {S: "x"}, ":one": {"N": "1"}}, "UPDATED_NEW"),
        (name, _key("p", "a"), "SET v = :x SET w = :y", None, values, "NONE"),  # two SET clauses
        (name, _key("p", "a"), "SET v = :x SET w = :y", None, values, "NONE"),
        (name, _key("p", "a"), "SET doc.a = :x, doc = :y", None, values, "NONE"),  # overlapping paths
        (name, _key("p", "a"), "SET doc.a = :x, doc = :y", None, values, "NONE"),
        (name, _key("p", "a"), "SET #a = :x, #b = :missing", {"#a": "v", "#b": "w"}, {":x": {S: "x"}}, "NONE"),
    ]  # fmt: skip
    answers: list[Any] = []
    record = _recorder(answers)
    ddb.meta.events.register("response-received", record)
    for table, key, expression, names, vals, returns in calls:
        request = {"TableName": table, "Key": key, "UpdateExpression": expression, "ExpressionAttributeValues": vals,
                   "ReturnValues": returns} | ({"ExpressionAttributeNames": names} if names else {})  # fmt: skip
        with contextlib.suppress(ClientError):
            ddb.update_item(**request)
    ddb.meta.events.unregister("response-received", record)
    answers.append(sorted(ddb.scan(TableName=name)["Items"], key=str))
    answers.append(ddb.scan(TableName=keyed_by_v)["Items"])
    return answers


def test_update_expressions_checked_once_answer_every_request_as_moto_does(
    moto_server: MotoServer, plain_server: MotoServer
) -> None:
    """moto_app remembers which expressions passed the checks of the expression alone; the same
    expression with other names, on a table with other keys, or after it was refused, answers as
    moto answers it without the fast paths, byte for byte, and leaves the same items."""
    name = f"checks-{uuid.uuid4().hex[:8]}"
    fast, plain = _updates(moto_server.endpoint_url, name), _updates(plain_server.endpoint_url, name)
    assert fast == plain
    codes = [status for status, *_ in fast[:-2]]
    assert codes == [200, 400, 200, 400, 400, 200, 200, 400, 200, 200, 400, 400, 400, 400, 400]
    refusals = b" ".join(body for status, body, _ in fast[:-2] if status == 400)
    for reason in (b"Two document paths overlap", b"Cannot update attribute sk", b"Cannot update attribute v",
                   b'The \\"SET\\" section can only be used once', b"An expression attribute value used in expression is not defined"):  # fmt: skip
        assert reason in refusals


def _shape(node: Any) -> Any:
    """A validated expression tree as nested tuples: each node's class and children."""
    children = node.children if isinstance(node.children, list) else []
    return (type(node).__name__, tuple(_shape(c) if hasattr(c, "children") else c for c in children))


def test_an_expression_s_own_checks_run_once_per_tree_names_and_table_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the three walks that read only the expression run for a tree the first time it
    comes with given names on a table with given keys, and every time they refuse it."""
    from moto.dynamodb.exceptions import UpdateHashRangeKeyException
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.parsing import validators
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser  # type: ignore[attr-defined]

    from agentq_dev import moto_updates

    assert moto_updates.install()
    walks: list[str] = []
    for check in (validators.ActionCountValidator, validators.OverlappingPathsValidator,
                  validators.UpdateHashRangeKeyValidator):  # fmt: skip

        def counted(self: Any, node: Any, _walk: Any = check.traverse, _name: str = check.__name__) -> Any:
            walks.append(_name)
            return _walk(self, node)

        monkeypatch.setattr(check, "traverse", counted)

    class Table:
        def __init__(self, keys: list[str]) -> None:
            self.table_key_attrs = self.attribute_keys = keys
            self.attr = [{"AttributeName": k, "AttributeType": S} for k in keys]

    tree = UpdateExpressionParser.make("SET #a = :x")
    by_pk, by_v = Table(["pk", "sk"]), Table(["v"])

    def validate(names: dict[str, str], table: Table) -> Any:
        item = Item(DynamoType({S: "p"}), DynamoType({S: "a"}), attrs={})
        validator = validators.UpdateExpressionValidator(tree, names, {":x": {S: "x"}}, item, table)  # type: ignore[arg-type]
        return validator.validate()

    first = validate({"#a": "v"}, by_pk)
    assert len(walks) == 3
    again = validate({"#a": "v"}, by_pk)
    assert len(walks) == 3  # remembered
    assert _shape(again) == _shape(first) and again is not first
    validate({"#a": "w"}, by_pk)  # other names
    validate({"#a": "w"}, by_v)  # a table with other keys
    assert len(walks) == 9
    for _ in range(2):  # a refusal is never remembered
        with pytest.raises(UpdateHashRangeKeyException):
            validate({"#a": "v"}, by_v)
    assert len(walks) == 15


# -- a condition expression parsed once (moto_conditions) ---------------------------------------


def _conditions(endpoint: str, name: str) -> list[Any]:
    """Conditional writes, transactions and filters whose conditions pass, fail, or are refused,
    each expression again with other values and other names: every raw answer (status, body,
    headers but framing and ids), then the table."""
    from botocore.config import Config

    ddb: Any = boto3.session.Session(region_name="us-east-1").client(
        "dynamodb", endpoint_url=endpoint, config=Config(retries={"total_max_attempts": 1})
    )
    _table_named(ddb, name)
    item = {"n": {"N": "3"}, "s": {S: "text"}, "l": {"L": [{"N": "1"}, {"N": "2"}]}, "m": {"M": {"k": {S: "v"}}}}
    ddb.put_item(TableName=name, Item=_key("p", "a") | item)
    ddb.put_item(TableName=name, Item=_key("p", "b") | item | {"n": {"N": "9"}})

    def call(operation: str, condition: str, names: Any, values: Any, **request: Any) -> tuple[str, dict[str, Any]]:
        key = "FilterExpression" if operation in ("query", "scan") else "ConditionExpression"
        request |= {"TableName": name, key: condition}
        request |= {"ExpressionAttributeNames": names} if names is not None else {}
        return operation, request | ({"ExpressionAttributeValues": values} if values is not None else {})

    n, five, two, new = {"#n": "n"}, {"N": "5"}, {"N": "2"}, {":new": {S: "text"}}
    fence = "#n < :lim AND attribute_exists(pk)"
    rich = "size(l) > :z AND begins_with(s, :p) AND s IN (:a, :b) AND NOT (#n BETWEEN :lo AND :hi) AND m.k = :v"
    rich_values = {":z": {"N": "1"}, ":p": {S: "te"}, ":a": {S: "x"}, ":b": {S: "text"}, ":lo": {"N": "4"},
                   ":hi": {"N": "8"}, ":v": {S: "v"}}  # fmt: skip
    update = {"Key": _key("p", "a"), "UpdateExpression": "SET s = :new"}
    put, put_new = {"Item": _key("p", "a") | item}, {"Item": _key("p", "c") | item}
    calls = [
        call("update_item", fence, n, {":lim": five} | new, **update),
        call("update_item", fence, n, {":lim": two} | new, **update, ReturnValuesOnConditionCheckFailure="ALL_OLD"),
        call("update_item", fence, {"#n": "s"}, {":lim": {S: "zzz"}} | new, **update),  # other names
        call("update_item", fence, n, new, **update),  # :lim missing
        call("update_item", fence, n, new, **update),
        call("update_item", fence, n, {":lim": five, ":extra": {S: "x"}} | new, **update),  # a value unused
        call("update_item", fence, n | {"#unused": "x"}, {":lim": five} | new, **update),  # a name unused
        call("put_item", "attribute_not_exists(pk)", None, None, **put),
        call("put_item", "attribute_not_exists(pk)", None, None, **put_new),
        call("put_item", "attribute_not_exists(pk)", None, None, **put_new),
        call("put_item", rich, n, rich_values, **put),
        call("put_item", rich, n, rich_values | {":lo": {"N": "1"}}, **put),
        call("put_item", "((#n = :a))", n, {":a": {"N": "3"}}, **put),  # redundant parentheses
        call("put_item", "((#n = :a))", n, {":a": {"N": "3"}}, **put),
        call("put_item", "#n = :a", None, None, **put),  # no names, no values
        call("delete_item", "#n = :a", n, {":a": {"N": "4"}}, Key=_key("p", "c")),
        call("delete_item", "#n = :a", n, {":a": {"N": "3"}}, Key=_key("p", "c"), ReturnValues="ALL_OLD"),
        call("query", "#n > :m", n, {":p": {S: "p"}, ":m": {"N": "4"}}, KeyConditionExpression="pk = :p"),
        call("query", "#n > :m", n, {":p": {S: "p"}, ":m": {"N": "1"}}, KeyConditionExpression="pk = :p"),
        call("scan", "#n > :m", {"#n": "s"}, {":m": {S: "a"}}),
    ]
    for lim in (five, two):
        _, check = call("condition_check", fence, n, {":lim": lim}, Key=_key("p", "a"))
        guarded = {
            "TableName": name,
            "Item": _key("p", f"t{lim['N']}"),
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        calls.append(("transact_write_items", {"TransactItems": [{"ConditionCheck": check}, {"Put": guarded}]}))
    answers: list[Any] = []
    record = _recorder(answers)
    ddb.meta.events.register("response-received", record)
    for operation, request in calls:
        with contextlib.suppress(ClientError):
            getattr(ddb, operation)(**request)
    ddb.meta.events.unregister("response-received", record)
    answers.append(sorted(ddb.scan(TableName=name)["Items"], key=str))
    return answers


def _table_named(ddb: Any, name: str) -> None:
    ddb.create_table(TableName=name, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                     AttributeDefinitions=[{"AttributeName": a, "AttributeType": S} for a in ("pk", "sk")],
                     BillingMode="PAY_PER_REQUEST")  # fmt: skip


def test_conditions_parsed_once_answer_every_request_as_moto_does(
    moto_server: MotoServer, plain_server: MotoServer
) -> None:
    """moto_app parses a condition once per expression and names; the same expression with other
    values, other names, a value missing, unused names or values, in a transaction or a filter,
    answers as moto answers it without the fast paths, byte for byte, and leaves the same items."""
    name = f"conditions-{uuid.uuid4().hex[:8]}"
    fast, plain = _conditions(moto_server.endpoint_url, name), _conditions(plain_server.endpoint_url, name)
    assert fast == plain
    codes = [status for status, *_ in fast[:-1]]
    assert codes == [200, 400, 200, 500, 500, 400, 400, 400, 200, 400, 200, 400, 400, 400, 500, 400, 200, 200, 200,
                     200, 200, 400]  # fmt: skip
    bodies = b" ".join(body for _, body, _ in fast[:-1])
    for answer in (b"ConditionalCheckFailedException", b"TransactionCanceledException", b"redundant parentheses",
                   b"unused in expressions", b'"Item": {'):  # fmt: skip
        assert answer in bodies


def test_a_condition_parsed_once_is_built_with_each_request_s_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the passes after lexing run once per expression and names, and every time the
    parse refuses; each parse's operations compare the item with its own request's values."""
    from moto.dynamodb.comparisons import ConditionExpressionParser
    from moto.dynamodb.models.dynamo_type import DynamoType, Item

    from agentq_dev import moto_conditions

    assert moto_conditions.install()
    passes: list[str] = []
    apply_functions = ConditionExpressionParser._apply_functions

    def counted(self: Any, nodes: Any) -> Any:
        passes.append(self.condition_expression)
        return apply_functions(self, nodes)

    monkeypatch.setattr(ConditionExpressionParser, "_apply_functions", counted)
    item = Item(DynamoType({S: "p"}), DynamoType({S: "a"}), attrs={"n": {"N": "3"}, "s": {S: "text"}})

    def holds(expression: str, names: dict[str, str] | None, values: dict[str, Any] | None) -> bool:
        parser = ConditionExpressionParser(expression, names, values)
        held = bool(parser.parse().expr(item))
        assert parser.expr_attr_values_found == sorted(values or {})  # what the handler checks
        return held

    x = f"#x{uuid.uuid4().hex[:8]}"  # an expression no other test parsed in this process
    expression = f"{x} < :lim AND attribute_exists(s) AND begins_with(s, :p)"
    assert holds(expression, {x: "n"}, {":lim": {"N": "5"}, ":p": {S: "te"}})
    assert not holds(expression, {x: "n"}, {":lim": {"N": "2"}, ":p": {S: "te"}})
    assert not holds(expression, {x: "n"}, {":lim": {"N": "5"}, ":p": {S: "x"}})
    assert len(passes) == 1
    assert holds(expression, {x: "s"}, {":lim": {S: "z"}, ":p": {S: "te"}})  # other names: parsed again
    assert len(passes) == 2
    for _ in range(2):  # a value missing raises as the parse raises it, from the remembered parse too
        with pytest.raises(KeyError, match=":p"):
            ConditionExpressionParser(expression, {x: "n"}, {":lim": {"N": "5"}}).parse()
    assert len(passes) == 2
    for _ in range(2):  # a refused parse is not remembered
        with pytest.raises(Exception, match="redundant parentheses"):
            ConditionExpressionParser(f"(({x} = :lim))", {x: "n"}, {":lim": {"N": "3"}}).parse()
    assert len(passes) == 4
    # A name that is not a string (a raw request's 1 or 1.0, equal as keys, read apart by moto:
    # 1.0 is no list index) is parsed by moto every time, never taken from the cache.
    listed = Item(DynamoType({S: "p"}), DynamoType({S: "a"}), attrs={"l": {"L": [{S: "x"}, {S: "y"}]}})
    raw = f"{x}.#i = :v"
    for index, matches in ((1, True), (1.0, False), (1, True)):
        parser = ConditionExpressionParser(raw, {x: "l", "#i": index}, {":v": {S: "y"}})  # type: ignore[dict-item]
        assert bool(parser.parse().expr(listed)) is matches, index
    assert len(passes) == 7


# -- an item's size summed inline (moto_sizes) --------------------------------------------------


def test_an_item_s_size_check_refuses_exactly_where_moto_s_refuses() -> None:
    """In-process: for items of every kind of value, a new attribute that brings the item to
    exactly moto's limit is kept and one byte more is refused, by the inline sum as by moto's
    own ``__setitem__``; an unencodable string raises the same error from both."""
    from moto.dynamodb.exceptions import ItemSizeTooLarge
    from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict

    from agentq_dev import moto_sizes

    assert moto_sizes.install()
    fast = LimitedSizeDict.__setitem__
    moto_s = fast.__wrapped__  # type: ignore[attr-defined]
    kinds: dict[str, dict[str, Any]] = {"s": {S: "tëxt"}, "n": {"N": "-12.5"}, "ss": {"SS": ["a", "bb"]}, "ns": {"NS": ["1", "22"]},
             "b": {"B": b"\x00\x01"}, "l": {"L": [{S: "x"}, {"N": "2"}]}, "m": {"M": {"k": {S: "v"}}},
             "bool": {"BOOL": True}, "null": {"NULL": True}}  # fmt: skip
    held = {name: DynamoType(value) for name, value in kinds.items()} | {"plain": "not a DynamoType"}
    moto_size = sum(v.size() if type(v) is DynamoType else len(str(v).encode()) for v in [*held, *held.values()])

    def outcome(setitem: Any, value: Any) -> Any:
        item = LimitedSizeDict()
        dict.update(item, held)
        try:
            setitem(item, "new", value)
        except (ItemSizeTooLarge, UnicodeEncodeError) as refused:
            return type(refused), str(refused)
        return dict(item)

    room = moto_sizes.LIMIT - moto_size - len("new")
    for value in (DynamoType({S: "é" * (room // 2)}), DynamoType({S: "x" * room}), DynamoType({"N": "9" * room}),
                  DynamoType({S: "x" * (room + 1)}), DynamoType({"N": "9" * (room + 1)}), "y" * room, "y" * (room + 1),
                  DynamoType({"L": [DynamoType({S: "x" * (room + 1)})]}), DynamoType({S: "\ud800"})):  # fmt: skip
        assert outcome(fast, value) == outcome(moto_s, value)
    assert outcome(fast, DynamoType({S: "x" * room}))["new"] == DynamoType({S: "x" * room})
    assert outcome(fast, DynamoType({S: "x" * (room + 1)}))[0] is ItemSizeTooLarge
    held["bad"] = DynamoType({S: "\ud800"})  # one already held: raises while summing, in both
    assert outcome(fast, DynamoType({S: "x"})) == outcome(moto_s, DynamoType({S: "x"}))
    assert outcome(fast, DynamoType({S: "x"}))[0] is UnicodeEncodeError


# -- handler methods listed once (moto_dispatch) ------------------------------------------------


def test_a_response_class_s_methods_are_listed_once_and_as_moto_lists_them() -> None:
    """In-process: the names call_action checks an action against are moto's own list of each
    handler class's methods, worked out the first time that class asks (the same set after)."""
    import importlib

    from moto.dynamodb.responses import DynamoHandler
    from moto.s3.responses import S3Response
    from moto.sqs.responses import SQSResponse

    from agentq_dev import moto_dispatch

    assert moto_dispatch.install()
    cached = importlib.import_module("moto.core.responses").method_names_from_class
    mine = type("FreshHandler", (DynamoHandler,), {"describe_nothing": lambda self: None})
    for clazz in (mine, SQSResponse, S3Response):
        first = cached(clazz)
        assert first == set(cached.__wrapped__(clazz))  # moto's own list
        assert cached(clazz) is first  # listed once
    assert {"describe_nothing", "update_item"} <= cached(mine) and "send_message" in cached(SQSResponse)
    assert "send_message" not in cached(mine)


NUMBERS_AND_DYNAMODB_SIZES = [  # DynamoDB's rule: 1 byte per 2 significant digits, plus 1 (docs/storage: item_size)
    ("0", 2), ("7", 2), ("-7", 2), ("+7", 2), ("12", 2), ("123", 3), ("-12.5", 3), ("100", 2), ("1.00", 2),
    ("0.05", 2), ("1E2", 2), ("1.5e-7", 2), ("120.50", 3), ("9" * 38, 20), ("-0.000" + "1" * 37, 20),
]  # fmt: skip


def test_the_local_server_sizes_a_number_by_dynamodb_s_rule_wherever_moto_sizes_one() -> None:
    """In-process, after install: a number's size is DynamoDB's, alone, in a number set, in a
    list and in a map (moto 5.2.5 counted the characters, 5.2.6 an exponent's digits too)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    from agentq_dev import moto_sizes

    assert moto_sizes.install()
    for text, size in NUMBERS_AND_DYNAMODB_SIZES:
        assert DynamoType({"N": text}).size() == size, text
        assert DynamoType({"NS": [text, "1"]}).size() == size + 2, text
        assert DynamoType({"L": [{"N": text}]}).size() == size, text
        assert DynamoType({"M": {"k": {"N": text}}}).size() == 1 + size, text


def test_an_item_at_the_limit_with_numbers_is_kept_and_one_byte_more_refused_by_the_server(ddb: Any) -> None:
    """Against the server: the limit falls where DynamoDB's sizes put it, for every number above."""
    from agentq_dev import moto_sizes

    table = _table(ddb, sort_key=False)
    for i, (text, size) in enumerate(NUMBERS_AND_DYNAMODB_SIZES):
        pk = f"p{i:02d}"
        room = moto_sizes.LIMIT - (len("pk") + len(pk)) - (len("n") + size) - len("pad")
        fits = {"pk": {S: pk}, "n": {"N": text}, "pad": {S: "x" * room}}
        ddb.put_item(TableName=table, Item=fits)
        with pytest.raises(ClientError, match="Item size has exceeded the maximum allowed size"):
            ddb.put_item(TableName=table, Item=fits | {"pad": {S: "x" * (room + 1)}})
        assert ddb.get_item(TableName=table, Key={"pk": {S: pk}})["Item"]["pad"][S] == "x" * room


def test_a_server_whose_port_was_taken_before_it_bound_comes_up_on_another() -> None:
    """The port is chosen free before the server binds it; another process that binds it in
    between (two suites on one machine) made the server exit 1 and the test fail. Here the port
    is held by a listening socket for the whole start: the server answers on another port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with MotoServer(port=port) as server:
            assert server.port != port
            assert urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=5).status == 200
