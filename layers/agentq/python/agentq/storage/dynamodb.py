"""The DynamoDB backend of ``Table``: the only module that calls DynamoDB's data plane.

Conditions are rendered with boto3's own expression builder; updates are rendered here
(``SET``/``ADD``/``REMOVE``). A cancelled transaction's reasons are mapped back to the names
of its actions, positionally, in exactly one place (``_failed_names``).

boto3 is imported on first need, not with this module: a read of an item of strings, numbers
and booleans (what the authorizer does: one GetItem of an API key) is (de)serialized here,
in boto3's own terms (``_NUMBERS`` is its number context), and loads no boto3 at all, whose
import costs the authorizer's cold start about 70 ms (s3transfer, multiprocessing). Other
values, conditions and expressions go through boto3's serializer and builder.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from decimal import Clamped, Context, Inexact, Overflow, Rounded, Underflow
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agentq.storage.table import (
    Action,
    Check,
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
    TransactionConflict,
    Update,
)

if TYPE_CHECKING:
    from boto3.dynamodb.conditions import ConditionBase

# boto3.dynamodb.types.DYNAMODB_CONTEXT: DynamoDB's numbers (38 digits) exactly, or an error.
_NUMBERS = Context(Emin=-128, Emax=126, prec=38, traps=[Clamped, Overflow, Inexact, Rounded, Underflow])


def to_wire(item: Item) -> dict[str, Any]:
    """DynamoDB attribute values; floats become Decimal (DynamoDB has no float), None is dropped."""
    return {k: ({"S": v} if type(v) is str else _wire_value(v)) for k, v in item.items() if v is not None}


def from_wire(item: dict[str, Any]) -> Item:
    """Python values as boto3's TypeDeserializer gives them (numbers as Decimal)."""
    out: Item = {}
    for name, attr in item.items():
        ((kind, value),) = attr.items()
        if kind in ("S", "BOOL"):
            out[name] = value
        elif kind == "N":
            out[name] = _NUMBERS.create_decimal(value)
        elif kind == "NULL":
            out[name] = None
        else:
            out[name] = _deserializer().deserialize(attr)
    return out


def _deserializer() -> Any:
    from agentq.storage import serdes

    return serdes.DESERIALIZER


class _Expression:
    """Collects the names and values placeholders of one request's expressions."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        from boto3.dynamodb.conditions import ConditionExpressionBuilder

        self._builder = ConditionExpressionBuilder()

    def condition(self, condition: ConditionBase) -> str:
        built = self._builder.build_expression(condition)
        self.names.update(built.attribute_name_placeholders)
        self.values.update({k: _wire_value(v) for k, v in built.attribute_value_placeholders.items()})
        return str(built.condition_expression)

    def _name(self, attribute: str) -> str:
        placeholder = f"#u{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def _value(self, value: Any) -> str:
        placeholder = f":u{len(self.values)}"
        self.values[placeholder] = _wire_value(value)
        return placeholder

    def update(self, update: Update) -> str:
        sets = [f"{self._name(k)} = {self._value(v)}" for k, v in update.set.items() if v is not None]
        sets += [
            f"{(n := self._name(k))} = if_not_exists({n}, {self._value(v)})" for k, v in update.set_if_absent.items()
        ]
        sets += [
            f"{self._name(k)} = if_not_exists({self._name(src)}, {self._value(default)})"
            for k, (src, default) in update.copy_from.items()
        ]
        removes = [self._name(k) for k in update.remove]
        removes += [self._name(k) for k, v in update.set.items() if v is None]  # None means "not stored"
        adds = [f"{self._name(k)} {self._value(v)}" for k, v in update.add.items()]
        parts = []
        if sets:
            parts.append("SET " + ", ".join(sets))
        if adds:
            parts.append("ADD " + ", ".join(adds))
        if removes:
            parts.append("REMOVE " + ", ".join(removes))
        return " ".join(parts)

    def request(self, **fields: Any) -> dict[str, Any]:
        request = {k: v for k, v in fields.items() if v is not None}
        if self.names:
            request["ExpressionAttributeNames"] = self.names
        if self.values:
            request["ExpressionAttributeValues"] = self.values
        return request


def _wire_value(value: Any) -> Any:
    from agentq.storage.serdes import to_attr

    return to_attr(value)


class DynamoTable:
    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    def get(self, key: Key, *, consistent: bool = True) -> Item | None:
        """One item; ``consistent=False``: an eventually consistent read (half the read units)."""
        resp = self.client.get_item(TableName=self.name, Key=to_wire(key), ConsistentRead=consistent)
        return from_wire(resp["Item"]) if "Item" in resp else None

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
        values: dict[str, Any] = {":pk": pk}
        condition = "pk = :pk"
        if prefix is not None:
            condition += " AND begins_with(sk, :prefix)"
            values[":prefix"] = prefix
        elif between is not None:
            condition += " AND sk BETWEEN :lo AND :hi"
            values[":lo"], values[":hi"] = between
        request: dict[str, Any] = {
            "TableName": self.name,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": {k: _wire_value(v) for k, v in values.items()},
            "ConsistentRead": True,
            "ScanIndexForward": not descending,
        }
        if keys_only:
            request["ProjectionExpression"] = "pk, sk"
        elif attributes is not None:
            names = {f"#p{i}": name for i, name in enumerate(attributes)}  # "path" is a reserved word
            request["ProjectionExpression"] = ", ".join(names)
            request["ExpressionAttributeNames"] = names
        if after is not None:
            request["ExclusiveStartKey"] = to_wire({"pk": pk, "sk": after})
        items: list[Item] = []
        while True:
            if limit is not None:
                request["Limit"] = limit - len(items)
            resp = self.client.query(**request)
            items.extend(from_wire(i) for i in resp["Items"])
            last = resp.get("LastEvaluatedKey")
            if last is None or (limit is not None and len(items) >= limit):
                return items
            request["ExclusiveStartKey"] = last

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
        expr = _Expression()
        attribute, value = partition
        expr.names["#ipk"] = attribute
        expr.values[":ipk"] = _wire_value(value)
        filter_expression = expr.condition(filter) if filter is not None else None
        request = expr.request(
            TableName=self.name,
            IndexName=index,
            KeyConditionExpression="#ipk = :ipk",
            FilterExpression=filter_expression,
            ScanIndexForward=not descending,
            Limit=limit,
            ExclusiveStartKey=to_wire(start) if start else None,
        )
        resp = self.client.query(**request)
        last = resp.get("LastEvaluatedKey")
        return Page(items=[from_wire(i) for i in resp["Items"]], last_key=from_wire(last) if last else None)

    def put(self, item: Item, *, condition: ConditionBase | None = None) -> None:
        expr = _Expression()
        cond = expr.condition(condition) if condition is not None else None
        try:
            self.client.put_item(
                **expr.request(
                    TableName=self.name,
                    Item=to_wire(item),
                    ConditionExpression=cond,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD" if cond else None,
                )
            )
        except ClientError as exc:
            raise _condition_failed(exc) from exc

    def update(
        self, key: Key, update: Update, *, condition: ConditionBase | None = None, returns: Returns = "NONE"
    ) -> Item | None:
        expr = _Expression()
        update_expression = expr.update(update)
        cond = expr.condition(condition) if condition is not None else None
        try:
            resp = self.client.update_item(
                **expr.request(
                    TableName=self.name,
                    Key=to_wire(key),
                    UpdateExpression=update_expression,
                    ConditionExpression=cond,
                    ReturnValues=returns,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD" if cond else None,
                )
            )
        except ClientError as exc:
            raise _condition_failed(exc) from exc
        return from_wire(resp["Attributes"]) if "Attributes" in resp else None

    def delete(self, key: Key, *, condition: ConditionBase | None = None) -> Item | None:
        expr = _Expression()
        cond = expr.condition(condition) if condition is not None else None
        try:
            resp = self.client.delete_item(
                **expr.request(
                    TableName=self.name,
                    Key=to_wire(key),
                    ConditionExpression=cond,
                    ReturnValues="ALL_OLD",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD" if cond else None,
                )
            )
        except ClientError as exc:
            raise _condition_failed(exc) from exc
        return from_wire(resp["Attributes"]) if "Attributes" in resp else None

    def transact(self, actions: Sequence[Action], *, token: str | None = None) -> None:
        request: dict[str, Any] = {"TransactItems": [self._action(a) for a in actions]}
        if token is not None:
            request["ClientRequestToken"] = token
        try:
            self.client.transact_write_items(**request)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "IdempotentParameterMismatchException":
                raise IdempotentParameterMismatch(str(exc)) from exc
            if code != "TransactionCanceledException":
                raise
            failed = _failed_names(exc, actions)
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            if not failed and "TransactionConflict" in reasons:
                raise TransactionConflict(str(exc)) from exc
            if not failed and "ConditionalCheckFailed" not in str(exc):
                raise  # throttling: not an answer about our conditions
            raise TransactionCancelled(failed) from exc

    def _action(self, action: Action) -> dict[str, Any]:
        expr = _Expression()
        cond = expr.condition(action.condition) if action.condition is not None else None
        if isinstance(action, Put):
            return {"Put": expr.request(TableName=self.name, Item=to_wire(action.item), ConditionExpression=cond)}
        if isinstance(action, Patch):
            update_expression = expr.update(action.update)
            return {
                "Update": expr.request(
                    TableName=self.name,
                    Key=to_wire(action.key),
                    UpdateExpression=update_expression,
                    ConditionExpression=cond,
                )
            }
        if isinstance(action, Delete):
            return {"Delete": expr.request(TableName=self.name, Key=to_wire(action.key), ConditionExpression=cond)}
        assert isinstance(action, Check)
        return {"ConditionCheck": expr.request(TableName=self.name, Key=to_wire(action.key), ConditionExpression=cond)}

    def batch_get(self, keys: Sequence[Key]) -> list[Item]:
        found: list[Item] = []
        for i in range(0, len(keys), 100):
            request: dict[str, Any] = {
                self.name: {"Keys": [to_wire(k) for k in keys[i : i + 100]], "ConsistentRead": True}
            }
            while request:
                resp = self.client.batch_get_item(RequestItems=request)
                found.extend(from_wire(item) for item in resp["Responses"].get(self.name, []))
                request = resp.get("UnprocessedKeys") or {}
        return found

    def batch_delete(
        self, keys: Sequence[Key], *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        for start in range(0, len(keys), 25):
            pending = [{"DeleteRequest": {"Key": to_wire(k)}} for k in keys[start : start + 25]]
            for attempt in range(attempts):
                resp = self.client.batch_write_item(RequestItems={self.name: pending})
                pending = (resp.get("UnprocessedItems") or {}).get(self.name, [])
                if not pending:
                    break
                sleep(min(5.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))  # throttled: back off
            else:
                first = from_wire(pending[0]["DeleteRequest"]["Key"])
                raise RuntimeError(
                    f"{len(pending)} deletes still unprocessed after {attempts} attempts (first: {first})"
                )


def _condition_failed(exc: ClientError) -> Exception:
    if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
        return exc
    old = exc.response.get("Item")  # present when the request asked for ReturnValuesOnConditionCheckFailure
    return ConditionFailed(from_wire(old) if isinstance(old, dict) and old else None)


def _failed_names(exc: ClientError, actions: Sequence[Action]) -> frozenset[str]:
    """The names of the actions whose condition failed (reasons are positional)."""
    reasons = exc.response.get("CancellationReasons") or []
    codes = [str(r.get("Code", "None")) for r in reasons]
    if not codes:
        # Some endpoints only put the reasons in the message: "[None, ConditionalCheckFailed]".
        msg = exc.response.get("Error", {}).get("Message", "")
        if "[" in msg and "]" in msg:
            codes = [part.strip() for part in msg[msg.index("[") + 1 : msg.rindex("]")].split(",")]
    # Not strict: an error that names no reasons at all (codes == []) names no failed action.
    return frozenset(a.name for a, code in zip(actions, codes, strict=False) if code == "ConditionalCheckFailed")
