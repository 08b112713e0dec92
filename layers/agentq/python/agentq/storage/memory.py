"""An in-memory backend of ``Table``, and an in-memory payload store, for tests that need the
storage rules but not the network: the engine and control-plane tests run on it in
milliseconds.

It keeps DynamoDB's semantics where the repositories rely on them: items are stored as
DynamoDB would type them (through the same serializer), conditions are the same
``boto3.dynamodb.conditions`` objects evaluated here, a transaction checks every condition
before it writes anything, a single lock makes each request atomic (as DynamoDB is per item
and per transaction), and items over 400 KB or with a key over DynamoDB's limits are refused.
The conformance suite runs every repository over this and over DynamoDB on moto server, so the
two cannot drift. Races between real processes still run against moto server: this table lives
in one process.
"""

from __future__ import annotations

import copy
import hashlib
import io
import threading
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import (
    And,
    AttributeBase,
    AttributeExists,
    AttributeNotExists,
    BeginsWith,
    Between,
    ConditionBase,
    Equals,
    GreaterThan,
    GreaterThanEquals,
    In,
    LessThan,
    LessThanEquals,
    Not,
    NotEquals,
    Or,
)

from agentq.core.ports import Readable
from agentq.storage.dynamodb import from_wire, to_wire
from agentq.storage.serdes import MissingObject
from agentq.storage.table import (
    Action,
    ConditionFailed,
    Delete,
    IdempotentParameterMismatch,
    Item,
    Key,
    Page,
    Patch,
    Put,
    Returns,
    TransactionCancelled,
    Update,
)

MAX_ITEM_BYTES = 400 * 1024
MAX_KEY_BYTES = {"pk": 2048, "sk": 1024}  # DynamoDB's partition and sort key limits
_MISSING = object()


class ItemTooLarge(ValueError):
    pass


class KeyTooLong(ValueError):
    pass


class MemoryTable:
    def __init__(self, name: str = "memory", indexes: dict[str, tuple[str, str]] | None = None) -> None:
        """``indexes``: GSI name -> (partition attribute, sort attribute)."""
        self.name = name
        self.indexes = (
            indexes
            if indexes is not None
            else {
                "gsi1": ("gsi1pk", "gsi1sk"),
                "live": ("live_pk", "live_sk"),
                "owner": ("owner_worker", "owner_task"),
                "user": ("user_pk", "gsi1sk"),
                "tenant_live": ("gsi1pk", "live_sk"),
            }
        )
        self._items: dict[tuple[str, str], Item] = {}
        self._lock = threading.RLock()
        # token -> a digest of the transaction it was used for (every logged write has one)
        self._tokens: dict[str, str] = {}

    # ------------------------------------------------------------------ reads

    def get(self, key: Key, *, consistent: bool = True) -> Item | None:
        with self._lock:
            item = self._items.get((key["pk"], key["sk"]))
            return copy.deepcopy(item) if item is not None else None

    def query(
        self,
        pk: str,
        *,
        prefix: str | None = None,
        between: tuple[str, str] | None = None,
        descending: bool = False,
        limit: int | None = None,
        keys_only: bool = False,
        after: str | None = None,
        attributes: Sequence[str] | None = None,
    ) -> list[Item]:
        with self._lock:
            found = sorted((sk, item) for (p, sk), item in self._items.items() if p == pk)
        if prefix is not None:
            found = [(sk, i) for sk, i in found if sk.startswith(prefix)]
        elif between is not None:
            found = [(sk, i) for sk, i in found if between[0] <= sk <= between[1]]
        if after is not None:
            found = [(sk, i) for sk, i in found if (sk < after if descending else sk > after)]
        if descending:
            found.reverse()
        items = [i for _, i in found][:limit]
        if keys_only:
            return [{"pk": i["pk"], "sk": i["sk"]} for i in items]
        if attributes is not None:
            return [copy.deepcopy({k: i[k] for k in attributes if k in i}) for i in items]
        return copy.deepcopy(items)

    def query_index(
        self,
        index: str,
        partition: tuple[str, str],
        *,
        descending: bool,
        limit: int,
        filter: ConditionBase | None = None,
        start: Item | None = None,
    ) -> Page:
        pk_attr, sk_attr = self.indexes[index]
        attribute, value = partition
        assert attribute == pk_attr, f"{index} is partitioned by {pk_attr}"
        with self._lock:
            entries = sorted(
                ((i[sk_attr], i["pk"], i["sk"]), i)
                for i in self._items.values()
                if i.get(pk_attr) == value and sk_attr in i
            )
        if descending:
            entries.reverse()
        if start is not None:
            mark = (start[sk_attr], start["pk"], start["sk"])
            entries = [(o, i) for o, i in entries if (o < mark if descending else o > mark)]
        read = entries[:limit]
        last = None
        if len(entries) > limit and read:
            item = read[-1][1]
            last = {k: item[k] for k in ("pk", "sk", pk_attr, sk_attr)}
        items = [copy.deepcopy(i) for _, i in read if filter is None or _holds(filter, i)]
        return Page(items=items, last_key=last)

    def batch_get(self, keys: Sequence[Key]) -> list[Item]:
        return [item for key in keys if (item := self.get(key)) is not None]

    # ----------------------------------------------------------------- writes

    def put(self, item: Item, *, condition: ConditionBase | None = None) -> None:
        with self._lock:
            self._check_or_fail(_key_of(item), condition)
            self._store(normalise(item))

    def update(
        self, key: Key, update: Update, *, condition: ConditionBase | None = None, returns: Returns = "NONE"
    ) -> Item | None:
        with self._lock:
            old = self._check_or_fail(key, condition)
            new = _apply(old, key, update)
            self._store(new)
        if returns == "ALL_NEW":
            return copy.deepcopy(new)
        if returns == "ALL_OLD":
            return old
        if returns == "UPDATED_NEW":
            changed = set(update.set) | set(update.add) | set(update.set_if_absent) | set(update.copy_from)
            return {k: copy.deepcopy(v) for k, v in new.items() if k in changed}
        return None

    def delete(self, key: Key, *, condition: ConditionBase | None = None) -> Item | None:
        with self._lock:
            old = self._check_or_fail(key, condition)
            self._items.pop((key["pk"], key["sk"]), None)
            return old

    def transact(self, actions: Sequence[Action], *, token: str | None = None) -> None:
        keys = [(_key_of(a.item) if isinstance(a, Put) else a.key) for a in actions]
        if len({(k["pk"], k["sk"]) for k in keys}) != len(keys):
            raise ValueError("a transaction may not touch one item twice")
        with self._lock:
            used = hashlib.sha256(repr(actions).encode()).hexdigest() if token is not None else ""
            if token is not None and token in self._tokens:
                if self._tokens[token] != used:
                    raise IdempotentParameterMismatch(f"token {token} was used for another transaction")
                return  # a retry of a transaction that went through
            failed = frozenset(
                a.name
                for a, k in zip(actions, keys, strict=True)
                if a.condition is not None and not _holds(a.condition, self._raw(k))
            )
            if failed:
                raise TransactionCancelled(failed)
            new_items: list[tuple[Action, Item | None]] = []
            for action, key in zip(actions, keys, strict=True):
                if isinstance(action, Put):
                    new_items.append((action, normalise(action.item)))
                elif isinstance(action, Patch):
                    new_items.append((action, _apply(self._raw(key), key, action.update)))
                else:
                    new_items.append((action, None))
            for written in (i for _, i in new_items if i is not None):
                _check_limits(written)
            for (action, new), key in zip(new_items, keys, strict=True):
                if isinstance(action, Delete):
                    self._items.pop((key["pk"], key["sk"]), None)
                elif new is not None:
                    self._items[(key["pk"], key["sk"])] = new
            if token is not None:
                self._tokens[token] = used

    def batch_delete(
        self, keys: Sequence[Key], *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        with self._lock:
            for key in keys:
                self._items.pop((key["pk"], key["sk"]), None)

    # ---------------------------------------------------------------- helpers

    def items(self) -> list[Item]:
        """Every item (tests look at the whole table)."""
        with self._lock:
            return copy.deepcopy(list(self._items.values()))

    def _raw(self, key: Key) -> Item | None:
        return self._items.get((key["pk"], key["sk"]))

    def _check_or_fail(self, key: Key, condition: ConditionBase | None) -> Item | None:
        old = self._raw(key)
        if condition is not None and not _holds(condition, old):
            raise ConditionFailed(copy.deepcopy(old))
        return copy.deepcopy(old)

    def _store(self, item: Item) -> None:
        _check_limits(item)
        self._items[(item["pk"], item["sk"])] = item


def normalise(item: Item) -> Item:
    """The item as DynamoDB would give it back: floats as Decimal, None attributes dropped."""
    return from_wire(to_wire(item))


def _key_of(item: Item) -> Key:
    return {"pk": item["pk"], "sk": item["sk"]}


def _check_limits(item: Item) -> None:
    for name, limit in MAX_KEY_BYTES.items():
        length = len(str(item[name]).encode())
        if length > limit:
            raise KeyTooLong(f"{name} of an item is {length} bytes, over DynamoDB's {limit}")
    size = len(str(to_wire(item)).encode())  # an upper bound of DynamoDB's own measure
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"item {item['pk']}/{item['sk']} is {size} bytes, over DynamoDB's 400 KB")


def _apply(old: Item | None, key: Key, update: Update) -> Item:
    new: Item = copy.deepcopy(old) if old is not None else dict(key)
    before = old or {}
    for name, (source, default) in update.copy_from.items():
        new[name] = copy.deepcopy(before[source]) if source in before else normalise({"v": default})["v"]
    for name, value in update.set.items():
        if value is None:
            new.pop(name, None)
        else:
            new[name] = normalise({"v": value})["v"]
    for name, value in update.set_if_absent.items():
        if name not in new:
            new[name] = normalise({"v": value})["v"]
    for name, amount in update.add.items():
        current = new.get(name, Decimal(0))
        new[name] = Decimal(current) + Decimal(str(amount))
    for name in update.remove:
        new.pop(name, None)
    return new


def _resolve(item: Item | None, operand: Any) -> Any:
    if not isinstance(operand, AttributeBase):
        return normalise({"v": operand})["v"] if operand is not None else None
    value: Any = item if item is not None else {}
    for part in operand.name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _compare(a: Any, b: Any, op: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return False
    try:
        return bool(op(a, b))
    except TypeError:  # DynamoDB: values of different types never compare true
        return False


def _holds(condition: ConditionBase, item: Item | None) -> bool:
    values = condition.get_expression()["values"]
    if isinstance(condition, And):
        return _holds(values[0], item) and _holds(values[1], item)
    if isinstance(condition, Or):
        return _holds(values[0], item) or _holds(values[1], item)
    if isinstance(condition, Not):
        return not _holds(values[0], item)
    if isinstance(condition, AttributeExists):
        return _resolve(item, values[0]) is not _MISSING
    if isinstance(condition, AttributeNotExists):
        return _resolve(item, values[0]) is _MISSING
    left = _resolve(item, values[0])
    if isinstance(condition, In):
        options = [_resolve(item, v) for v in values[1]]
        return left is not _MISSING and any(_compare(left, o, lambda x, y: x == y) for o in options)
    if isinstance(condition, Between):
        lo, hi = _resolve(item, values[1]), _resolve(item, values[2])
        return _compare(left, lo, lambda x, y: x >= y) and _compare(left, hi, lambda x, y: x <= y)
    right = _resolve(item, values[1])
    if isinstance(condition, BeginsWith):
        return isinstance(left, str) and isinstance(right, str) and left.startswith(right)
    operators = {
        Equals: lambda x, y: type(x) is type(y) and x == y,
        NotEquals: lambda x, y: not (type(x) is type(y) and x == y),
        LessThan: lambda x, y: type(x) is type(y) and x < y,
        LessThanEquals: lambda x, y: type(x) is type(y) and x <= y,
        GreaterThan: lambda x, y: type(x) is type(y) and x > y,
        GreaterThanEquals: lambda x, y: type(x) is type(y) and x >= y,
    }
    for kind, op in operators.items():
        if type(condition) is kind:
            if kind is NotEquals and (left is _MISSING):
                return True  # DynamoDB: a missing attribute is "not equal" to any value
            return _compare(left, right, op)
    raise NotImplementedError(f"condition {type(condition).__name__} is not supported by MemoryTable")


class MemoryPayloads:
    """``PayloadStore`` in memory: the same encode/decode contract over a dict of objects."""

    def __init__(self, threshold: int = 64 * 1024) -> None:
        self.threshold = threshold
        self.objects: dict[str, bytes] = {}
        self.bucket = "memory"

    def encode(self, key: str, payload: str) -> dict[str, Any]:
        data = payload.encode()
        if len(data) <= self.threshold:
            return {"body": payload}
        self.objects[key] = data
        return {"ref": key, "ref_bytes": len(data)}

    def copy(self, source_key: str, key: str) -> None:
        self.objects[key] = self.objects[source_key]

    def decode(self, attrs: dict[str, Any]) -> str:
        if "body" in attrs:
            return str(attrs["body"])
        return self.objects[attrs["ref"]].decode()

    def put_bytes(
        self, key: str, data: bytes | Readable, *, create_only: bool = False, sha256: str | None = None
    ) -> bool:
        whole = bytes(data) if isinstance(data, bytes) else b"".join(iter(lambda: data.read(1 << 20), b""))
        if sha256 is not None and hashlib.sha256(whole).hexdigest() != sha256:
            raise ValueError(f"the body of {key} does not hash to {sha256} (S3: BadDigest)")
        if create_only and key in self.objects:
            return False
        self.objects[key] = whole
        return True

    def get_bytes(self, key: str) -> bytes:
        if key not in self.objects:
            raise MissingObject(key)
        return self.objects[key]

    def open_bytes(self, key: str) -> Readable:
        return io.BytesIO(self.get_bytes(key))

    def delete_prefix(self, prefix: str) -> int:
        doomed = [k for k in self.objects if k.startswith(prefix)]
        for k in doomed:
            del self.objects[k]
        return len(doomed)
