"""A condition expression is parsed once per expression string and names, not on every request.

Why: every conditional write (PutItem, UpdateItem, DeleteItem, a transaction's actions) and
every FilterExpression is parsed by moto's ``ConditionExpressionParser``, twice for most
writes (the handler's check of the names and values used, then the backend): lexing (once per
string already, ``moto_speed``), paths, functions, comparators, IN, BETWEEN, parentheses and
booleans, each a pass over a deque of tokens, ~9 % of the server's CPU per call of a turn after
the other fast paths (py-spy under ``bench/moto_throughput.py``). agentq's conditions are
templates (``#n0 = :v0 AND ...``) whose placeholders change only their values.

What the parse reads: the expression, its ``ExpressionAttributeNames`` (substituted into paths)
and its ``ExpressionAttributeValues``, which only the operands built last take (an
``AttributeValue`` from the value a ``:placeholder`` names); every pass before decides on kinds
and texts alone. So the parsed tree of an expression with given names is remembered, and a
request with the same expression and names gets the operations built from it with its own
values: the placeholders are looked up in its values in the order the parse looked them up
(a missing one raises what the parse raised), the names and values the parse found are reported
to the handler's check as the parse reported them, and ``_make_operand`` takes a placeholder's
value from the request's own values by its text (the same dict the parse would have put into the
node). A parse that raises is never remembered. At most ``REMEMBERED`` parses are kept; then the
memory is dropped.

Which moto: ``moto_version.VERIFIED_MOTO`` (read in 5.2.5, and again in 5.2.6):
``ConditionExpressionParser.parse`` as lex, ``_parse_paths``, ``_apply_functions``,
``_apply_comparator``, ``_apply_in``, ``_apply_between``, ``_apply_parens_and_booleans``,
``_assert_no_redundant_parentheses``, ``_find_literals``/``_find_expr_attr_values`` into
``expr_attr_names_found``/``expr_attr_values_found``, then ``_make_op_condition``; values read
only through ``_lookup_expression_attribute_value`` (``_parse_path_element``) and used only by
``_make_operand``. ``install`` patches nothing on another version.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentq_dev import moto_version

REMEMBERED = 4096  # (expression, names) parsed; agentq's make a few dozen


@moto_version.verified_patch
def install() -> None:
    """Patch moto's condition parser in this process (idempotent). False on a moto version not
    verified."""
    comparisons = importlib.import_module("moto.dynamodb.comparisons")
    parser_class = comparisons.ConditionExpressionParser
    original_parse = parser_class.parse
    original_lookup = parser_class._lookup_expression_attribute_value
    original_operand = parser_class._make_operand
    value_kind = parser_class.Kind.EXPRESSION_ATTRIBUTE_VALUE
    attribute_value = comparisons.AttributeValue  # what moto's _make_operand makes of a value
    parsed: dict[tuple[Any, ...], tuple[Any, list[str], list[str], tuple[str, ...]]] = {}

    def parse(self: Any) -> Any:
        if not self.condition_expression:
            return original_parse(self)
        try:
            key = (self.condition_expression, _names(self.expression_attribute_names))
            hash(key)
        except TypeError:  # not names as moto's model gives them
            return original_parse(self)
        entry = parsed.get(key)
        if entry is None:
            entry = _parse(self)
            if len(parsed) >= REMEMBERED:
                parsed.clear()
            parsed[key] = entry
        else:
            for name in entry[3]:  # raises where the parse would have (a value missing)
                original_lookup(self, name)
        node, names_found, values_found, _ = entry
        self.expr_attr_names_found.extend(names_found)
        self.expr_attr_values_found.extend(values_found)
        return self._make_op_condition(node)

    def _parse(self: Any) -> tuple[Any, list[str], list[str], tuple[str, ...]]:
        """moto's parse up to the operations: the tree, the names and values it found, and the
        placeholders it looked up, in order."""
        looked_up: list[str] = []
        self._agentq_looked_up = looked_up
        try:
            nodes = self._lex_condition_expression()
            nodes = self._parse_paths(nodes)
            nodes = self._apply_functions(nodes)
            nodes = self._apply_comparator(nodes)
            nodes = self._apply_in(nodes)
            nodes = self._apply_between(nodes)
            nodes = self._apply_parens_and_booleans(nodes)
            node = nodes[0]
            self._assert_no_redundant_parentheses(node)
        finally:
            del self._agentq_looked_up
        return node, self._find_literals(node), self._find_expr_attr_values(node), tuple(looked_up)

    def _lookup_expression_attribute_value(self: Any, name: str) -> Any:
        value = original_lookup(self, name)
        looked_up = self.__dict__.get("_agentq_looked_up")
        if looked_up is not None:
            looked_up.append(name)
        return value

    def _make_operand(self: Any, node: Any) -> Any:
        if node.kind == value_kind:  # this request's value, not the one the tree was parsed with
            return attribute_value(original_lookup(self, node.text))
        return original_operand(self, node)

    parser_class.parse = parse
    parser_class._lookup_expression_attribute_value = _lookup_expression_attribute_value
    parser_class._make_operand = _make_operand


def _names(names: Any) -> tuple[tuple[str, str], ...] | None:
    """The names as a cache key; a name that is not a string (a raw request's ``1``, ``1.0`` or
    ``true``, equal keys that moto reads differently) is not cached: TypeError, moto parses it."""
    if names is None:
        return None
    if not all(isinstance(value, str) for value in names.values()):
        raise TypeError("a name that is not a string")
    return tuple(sorted(names.items()))
