"""An item's size check sums its attributes' sizes without a method call per string or number.

Why: moto keeps an item's attributes in a ``LimitedSizeDict`` whose ``__setitem__`` refuses an
item over 405,000 bytes by summing, on every attribute set, the size of every key and every
value already in the item (``DynamoType.size``: four type checks and a helper per value). An
UpdateItem that sets 25 attributes of a 40-attribute task item sums ~1,600 sizes; under
``bench/moto_throughput.py`` that was ~6.5 % of the server's CPU (py-spy) after the other
fast paths.

Here the same sum is computed with the sizes of the two kinds agentq's items are made of
worked out inline: a ``DynamoType`` of type ``S`` holding a ``str`` is the length of its UTF-8
encoding, a ``str`` key the length of its UTF-8 encoding, exactly what ``DynamoType.size`` and
``bytesize`` give them; every other value (sets, lists, maps, binary, booleans, nulls, anything
that is not exactly a ``DynamoType``) still goes through moto's own ``size()``/``bytesize(str(...))``.
Keys first, then values, as moto lists them, so an unencodable string raises where it raised; the
same total, the same refusal (``ItemSizeTooLarge``) at the same size.

Numbers are sized by DynamoDB's documented rule (``agentq.storage.item_size.number_size``: one byte
per two significant digits, plus one), inline and wherever moto sizes one (its ``number_size``,
which ``DynamoType.size`` calls for ``N`` and ``NS`` members, nested ones included), so the local
item limit follows DynamoDB, not a moto release: moto 5.2.5 counted ``len(str(n))``, 5.2.6 counts
about half the digits but not an exponent's (``1E2`` as three digits).

Which moto: ``moto_version.VERIFIED_MOTO``, read in 5.2.6 (and 5.2.5):
``LimitedSizeDict.__setitem__``, ``DynamoType.size`` and the ``number_size`` it imports from
``moto/dynamodb/models/utilities.py`` into ``moto/dynamodb/models/dynamo_type.py``.
``install`` patches nothing on another version.
"""

from __future__ import annotations

from typing import Any

from agentq.storage.item_size import number_size
from agentq_dev import moto_version

LIMIT = 405_000  # moto's: between DynamoDB's measured 409 and 410 KB


@moto_version.verified_patch
def install() -> None:
    """Patch moto's item size check in this process (idempotent). False on a moto version not
    verified."""
    from moto.dynamodb.exceptions import ItemSizeTooLarge
    from moto.dynamodb.models import dynamo_type
    from moto.dynamodb.models.dynamo_type import DDBType, DynamoType, LimitedSizeDict
    from moto.dynamodb.models.utilities import bytesize

    dynamo_type.number_size = number_size  # type: ignore[attr-defined,assignment]  # what DynamoType.size calls for a number, a set's and a nested one's

    string, number = DDBType.STRING, DDBType.NUMBER

    def size(value: Any) -> int:
        """``value.size()`` of a DynamoType, ``bytesize(str(value))`` of anything else."""
        kind = type(value)
        if kind is DynamoType:
            inner = value.value
            if value.type == string and type(inner) is str:
                return len(inner.encode("utf-8"))
            if value.type == number:
                return number_size(str(inner))
            return int(value.size())
        if kind is str:
            return len(value.encode("utf-8"))
        return bytesize(str(value))

    def __setitem__(self: Any, key: str, value: Any) -> None:
        current = 0
        for name in self:  # keys, then values, as moto lists them
            current += len(name.encode("utf-8")) if type(name) is str else size(name)
        for held in dict.values(self):
            if type(held) is DynamoType:
                inner = held.value
                if held.type == string and type(inner) is str:
                    current += len(inner.encode("utf-8"))
                    continue
                if held.type == number:
                    current += number_size(str(inner))
                    continue
            current += size(held)
        if current + bytesize(key) + size(value) > LIMIT:
            raise ItemSizeTooLarge
        dict.__setitem__(self, key, value)

    __setitem__.__wrapped__ = LimitedSizeDict.__setitem__  # type: ignore[attr-defined]  # moto's, for the tests
    LimitedSizeDict.__setitem__ = __setitem__  # type: ignore[method-assign]
