"""The table primitives: conditions, updates and transactions mean the same on every backend."""

from __future__ import annotations

from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr

from agentq.storage.container import Storage
from agentq.storage.table import (
    Action,
    Check,
    ConditionFailed,
    Delete,
    Patch,
    Put,
    TransactionCancelled,
    Update,
    absent,
    merge,
    plain,
)


def _key(sk: str) -> dict[str, str]:
    return {"pk": "T#1", "sk": sk}


def test_a_put_with_absent_never_overwrites_and_names_the_old_item(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("a"), "v": 1}, condition=absent())
    with pytest.raises(ConditionFailed) as failed:
        t.put({**_key("a"), "v": 2}, condition=absent())
    assert plain(failed.value.old or {}).get("v") == 1
    assert plain(t.get(_key("a")) or {})["v"] == 1


def test_numbers_come_back_as_decimal_and_floats_keep_their_value(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("n"), "i": 3, "f": 0.1, "nested": {"x": 1.5}, "none": None})
    item = t.get(_key("n"))
    assert item is not None and item["i"] == Decimal(3) and item["f"] == Decimal("0.1")
    assert "none" not in item and plain(item)["nested"] == {"x": 1.5}


def test_update_sets_adds_removes_and_reads_operands_before_the_write(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("u"), "count": 5, "beat": 10, "gone": "x"})
    new = t.update(
        _key("u"),
        Update(
            set={"beat": 20},
            add={"count": 2, "fresh": 3},
            remove=["gone"],
            set_if_absent={"count_first": 1, "beat_first": 0},
            copy_from={"prev_beat": ("beat", 0)},
        ),
        returns="ALL_NEW",
    )
    assert new is not None
    got = plain(new)
    assert got["count"] == 7 and got["fresh"] == 3 and "gone" not in got
    assert got["beat"] == 20 and got["prev_beat"] == 10  # the old value, not the one set in the same write
    assert got["count_first"] == 1 and got["beat_first"] == 0


def test_update_of_a_missing_item_creates_it_unless_the_condition_says_otherwise(backend: Storage) -> None:
    t = backend.table
    t.update(_key("m"), Update(add={"held": 5}))
    assert plain(t.get(_key("m")) or {})["held"] == 5
    with pytest.raises(ConditionFailed):
        t.update(_key("m2"), Update(set={"x": 1}), condition=Attr("pk").exists())
    assert t.get(_key("m2")) is None


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        (Attr("n").eq(3), True),
        (Attr("n").eq("3"), False),  # a number never equals a string
        (Attr("n").gte(3) & Attr("n").lt(4), True),
        (Attr("s").is_in(["running", "queued"]), True),
        (Attr("s").is_in(["paused"]), False),
        (Attr("missing").not_exists() | Attr("missing").lt(1), True),
        (Attr("missing").lt(1), False),  # a comparison with a missing attribute is false
        (Attr("m.epoch").eq(2), True),  # a nested path
        (Attr("m.other").exists(), False),
        (~Attr("n").eq(3), False),
        (Attr("s").begins_with("run"), True),
        (Attr("n").between(1, 3), True),
    ],
)
def test_conditions_evaluate_as_dynamodb_does(backend: Storage, condition: object, holds: bool) -> None:
    t = backend.table
    t.put({**_key("c"), "n": 3, "s": "running", "m": {"epoch": 2}})
    try:
        t.update(_key("c"), Update(set={"touched": True}), condition=condition)  # type: ignore[arg-type]
        result = True
    except ConditionFailed:
        result = False
    assert result is holds


def test_a_transaction_writes_all_or_nothing_and_names_the_failed_actions(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("budget"), "available": 10})
    t.put({**_key("meta"), "epoch": 1})
    actions: list[Action] = [
        Put("step", {**_key("step1"), "x": 1}, absent()),
        Patch("meta", _key("meta"), Update(add={"epoch": 1}), Attr("epoch").eq(1)),
        Patch("budget", _key("budget"), Update(add={"available": -20}), Attr("available").gte(20)),
    ]
    with pytest.raises(TransactionCancelled) as cancelled:
        t.transact(actions)
    assert cancelled.value.failed == {"budget"}
    assert t.get(_key("step1")) is None and plain(t.get(_key("meta")) or {})["epoch"] == 1
    t.transact([*actions[:2], Patch("budget", _key("budget"), Update(add={"available": -5}), Attr("available").gte(5))])
    assert plain(t.get(_key("budget")) or {})["available"] == 5 and t.get(_key("step1")) is not None


def test_check_and_delete_take_part_in_a_transaction(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("lease"), "epoch": 2})
    t.put({**_key("doomed")})
    with pytest.raises(TransactionCancelled) as cancelled:
        t.transact([Check("lease", _key("lease"), Attr("epoch").eq(1)), Delete("doomed", _key("doomed"))])
    assert cancelled.value.failed == {"lease"} and t.get(_key("doomed")) is not None
    t.transact([Check("lease", _key("lease"), Attr("epoch").eq(2)), Delete("doomed", _key("doomed"))])
    assert t.get(_key("doomed")) is None


def test_a_retried_transaction_with_its_token_is_not_applied_twice(backend: Storage) -> None:
    if not hasattr(backend.table, "items"):
        pytest.skip("moto server ignores ClientRequestToken (DynamoDB keeps a token ten minutes)")
    t = backend.table
    t.put({**_key("ctr"), "n": 0})
    actions: list[Action] = [Patch("ctr", _key("ctr"), Update(add={"n": 1})), Put("once", {**_key("once")}, absent())]
    t.transact(actions, token="tok-1")
    t.transact(actions, token="tok-1")
    assert plain(t.get(_key("ctr")) or {})["n"] == 1


def test_query_reads_a_partition_in_sort_key_order_by_prefix_range_and_limit(backend: Storage) -> None:
    t = backend.table
    for sk in ["STEP#000003", "STEP#000001", "STEP#000002", "NOTE#a", "META"]:
        t.put({**_key(sk)})
    assert [i["sk"] for i in t.query("T#1", prefix="STEP#")] == ["STEP#000001", "STEP#000002", "STEP#000003"]
    assert [i["sk"] for i in t.query("T#1", prefix="STEP#", descending=True, limit=1)] == ["STEP#000003"]
    assert [i["sk"] for i in t.query("T#1", between=("STEP#000002", "STEP#999999"))] == ["STEP#000002", "STEP#000003"]
    assert [i["sk"] for i in t.query("T#1", keys_only=True)] == [
        "META",
        "NOTE#a",
        "STEP#000001",
        "STEP#000002",
        "STEP#000003",
    ]


def test_a_query_goes_on_after_a_sort_key_and_reads_only_the_attributes_asked(backend: Storage) -> None:
    """A listing's next page starts after the last key it gave, whether or not that item still
    exists, in either direction and within a prefix; a projection leaves out what a listing
    does not show (a memory document's content, up to 100 kB a head)."""
    t = backend.table
    for sk in ["DOC#/a", "DOC#/b", "DOC#/c", "DOC#/d", "VER#/a#1"]:
        t.put({**_key(sk), "path": sk[4:], "content": "x" * 1000, "version": 1})
    assert [i["sk"] for i in t.query("T#1", prefix="DOC#", after="DOC#/b")] == ["DOC#/c", "DOC#/d"]
    assert [i["sk"] for i in t.query("T#1", prefix="DOC#", after="DOC#/bb", limit=1)] == ["DOC#/c"]
    assert [i["sk"] for i in t.query("T#1", prefix="DOC#", after="DOC#/c", descending=True)] == ["DOC#/b", "DOC#/a"]
    listed = t.query("T#1", prefix="DOC#", attributes=("path", "version", "missing"), limit=2)
    assert listed == [{"path": "/a", "version": 1}, {"path": "/b", "version": 1}]


def test_batch_get_and_batch_delete(backend: Storage) -> None:
    t = backend.table
    keys = [_key(f"k{i:03d}") for i in range(130)]
    for k in keys:
        t.put({**k, "v": 1})
    assert len(t.batch_get([*keys, _key("absent")])) == 130
    t.batch_delete(keys[:60])
    assert len(t.query("T#1")) == 70


def test_merged_writes_to_one_item_apply_together_and_only_if_every_condition_holds(backend: Storage) -> None:
    t = backend.table
    t.put({**_key("meta"), "epoch": 1, "available": 10, "inflight": 3})
    ticket = Patch("meta", _key("meta"), Update(set={"inflight": 7}), Attr("epoch").eq(1))
    hold = Patch("budget", _key("meta"), Update(add={"available": -20}), Attr("available").gte(20))
    both = merge("meta", ticket, hold)
    with pytest.raises(ConditionFailed) as refused:
        t.update(both.key, both.update, condition=both.condition)
    assert plain(refused.value.old or {})["inflight"] == 3  # the item as the refusal found it: tells why
    assert plain(t.get(_key("meta")) or {}) == {**_key("meta"), "epoch": 1, "available": 10, "inflight": 3}
    both = merge("meta", ticket, Patch("budget", _key("meta"), Update(add={"available": -4}), Attr("available").gte(4)))
    t.update(both.key, both.update, condition=both.condition)
    assert plain(t.get(_key("meta")) or {}) == {**_key("meta"), "epoch": 1, "available": 6, "inflight": 7}
    merged = merge("lease", Check("lease", _key("meta"), Attr("epoch").eq(1)), ticket)
    t.transact([merged, Put("step", {**_key("step1")}, absent())])
    with pytest.raises(ValueError, match="cannot merge"):
        merge("x", ticket, Patch("other", _key("other"), Update(set={"a": 1})))
    with pytest.raises(ValueError, match="inflight"):
        merge("x", ticket, Patch("again", _key("meta"), Update(remove=["inflight"])))
