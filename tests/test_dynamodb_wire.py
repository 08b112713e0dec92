"""``storage.dynamodb`` turns strings, numbers, booleans and nulls into DynamoDB's wire format
and back itself, so a read of such an item (the authorizer's key lookup) loads no boto3: what
it gives must be exactly what boto3's own (de)serializer gives, for every type."""

from __future__ import annotations

import decimal
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import DYNAMODB_CONTEXT, Binary, TypeDeserializer

from agentq.storage import dynamodb, serdes

WIRE_VALUES: list[Any] = [
    {"S": ""},
    {"S": "APIKEY#ab12"},
    {"S": "ünïcødé ✓"},
    {"N": "0"},
    {"N": "-17"},
    {"N": "1763912345.123456"},
    {"N": "1E+2"},
    {"N": "0.000000000000000000000000000000000001"},
    {"N": "9" * 38},
    {"BOOL": True},
    {"BOOL": False},
    {"NULL": True},
    {"M": {"a": {"N": "1.5"}, "b": {"L": [{"S": "x"}, {"BOOL": True}]}}},
    {"L": []},
    {"SS": ["a", "b"]},
    {"NS": ["1", "2.5"]},
    {"B": b"\x00\x01"},
]


@pytest.mark.parametrize("wire", WIRE_VALUES, ids=lambda w: next(iter(w)))
def test_a_read_value_is_what_boto3_s_deserializer_gives(wire: Any) -> None:
    ours = dynamodb.from_wire({"v": wire})["v"]
    theirs = TypeDeserializer().deserialize(wire)
    assert ours == theirs and type(ours) is type(theirs)
    if isinstance(theirs, Decimal):
        assert ours.as_tuple() == theirs.as_tuple()  # the same digits and exponent, not just equal


def test_a_number_beyond_dynamodb_s_precision_is_refused_as_boto3_refuses_it() -> None:
    with pytest.raises(decimal.Inexact):
        TypeDeserializer().deserialize({"N": "1" * 39 + "1"})
    with pytest.raises(decimal.Inexact):
        dynamodb.from_wire({"v": {"N": "1" * 39 + "1"}})


def test_the_number_context_is_boto3_s() -> None:
    ours, theirs = dynamodb._NUMBERS, DYNAMODB_CONTEXT
    assert (ours.prec, ours.Emin, ours.Emax, ours.rounding) == (theirs.prec, theirs.Emin, theirs.Emax, theirs.rounding)
    assert {t for t, on in ours.traps.items() if on} == {t for t, on in theirs.traps.items() if on}


@pytest.mark.parametrize(
    "value",
    [
        "",
        "TASK#1",
        "ünïcødé",
        0,
        -3,
        1.5,
        0.1,
        Decimal("2.50"),
        True,
        False,
        {"a": [1, "x"]},
        ["a", 2],
        Binary(b"\x01"),
    ],
    ids=repr,
)
def test_a_written_value_is_what_boto3_s_serializer_gives(value: Any) -> None:
    assert dynamodb.to_wire({"v": value, "gone": None}) == serdes.to_item({"v": value, "gone": None})
