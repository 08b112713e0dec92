"""UpdateItem's checks that depend only on its expression run once per expression, not per request.

Why: moto validates every UpdateItem's expression with ten walks of its tree, and the first
three only check the expression itself: at most one SET, REMOVE and ADD clause
(``ActionCountValidator``), no two actions on overlapping paths (``OverlappingPathsValidator``),
no action on the table's key attributes (``UpdateHashRangeKeyValidator``). moto runs them at
every node of the tree that is an ``UpdateExpression`` (every clause and every action is one),
and each such run collects the clauses below it again: for agentq's claim (27 actions) that was
about half of the validation, ~1 ms of the ~2.3 ms it took, and validation was ~30 % of the
server's CPU per call of a turn (py-spy under ``bench/moto_throughput.py``). agentq's update
expressions are templates, parsed once per distinct string (``moto_speed``), so the same parsed
tree comes back with the same names again and again.

What they read: the parsed tree, the request's ``ExpressionAttributeNames`` and the table's key
attribute names; they change nothing (each returns the node it was given). So once all three
have passed for a tree with given names on a table with given keys, they pass again: a validation
of the same tree, names and keys starts at the fourth walk. A check that fails is never
remembered, so every failing request runs moto's own walks and raises what moto raises. The
remembered trees are kept alive with their entries (an entry is keyed by the tree's ``id``),
and the whole memory is dropped when it holds ``REMEMBERED`` entries.

Which moto: ``moto_version.VERIFIED_MOTO`` (read in 5.2.5, and again in 5.2.6):
``UpdateExpressionValidator.get_ast_processors`` lists the three checks first, ``Validator``
keeps them in ``processors`` and the copied tree in ``node_to_validate``, and ``validate`` runs
the processors in order. ``install`` patches nothing on another version, and skips only the
leading processors of those three types, so a moto that moved them runs them all.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentq_dev import moto_version

REMEMBERED = 4096  # (tree, names, keys) combinations that passed; agentq makes a few dozen


@moto_version.verified_patch
def install() -> None:
    """Patch moto's update-expression validator in this process (idempotent). False on a moto
    version not verified."""
    validators = importlib.import_module("moto.dynamodb.parsing.validators")
    static = (
        validators.ActionCountValidator,
        validators.OverlappingPathsValidator,
        validators.UpdateHashRangeKeyValidator,
    )
    validator_class = validators.UpdateExpressionValidator
    original_init = validator_class.__init__
    passed: dict[tuple[Any, ...], Any] = {}  # key -> the tree it names (kept alive: ids stay unique)

    def __init__(self: Any, expression: Any, expression_attribute_names: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, expression, expression_attribute_names, *args, **kwargs)
        self._agentq_tree = expression
        self._agentq_checks = _key(expression, expression_attribute_names, self.table)

    def validate(self: Any) -> Any:
        n = self.node_to_validate
        processors = self.processors
        leading = 0
        while leading < len(processors) and type(processors[leading]) in static:
            leading += 1
        key = self._agentq_checks
        start = leading if key is not None and passed.get(key) is self._agentq_tree else 0
        for index in range(start, len(processors)):
            n = processors[index].traverse(n)
            if index == leading - 1 and key is not None:  # the checks of the expression alone passed
                if len(passed) >= REMEMBERED:
                    passed.clear()
                passed[key] = self._agentq_tree
        return n

    def _key(expression: Any, names: Any, table: Any) -> tuple[Any, ...] | None:
        """The tree's id, its names and the table's key attributes; None when they cannot be a key."""
        try:
            key = (
                id(expression),
                None if names is None else tuple(sorted(names.items())),
                tuple(table.table_key_attrs),
            )
            hash(key)
        except (TypeError, AttributeError):  # not names or keys as moto's model gives them
            return None
        return key

    validator_class.__init__ = __init__
    validator_class.validate = validate
