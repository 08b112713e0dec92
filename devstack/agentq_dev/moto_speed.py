"""moto's DynamoDB at the CPU cost of the work, not of its generic machinery: six fast paths.

Why: the local stack's tasks wait in the one moto process that serves DynamoDB (``moto_app``
serialises its requests), so how many tasks a worker holds on 30 s turns is that process's
calls/s over the calls a held task makes. Profiled under ``bench/concurrency.py`` at 1,000
held tasks (py-spy, docs/BENCHMARKS.md), moto spent ~5.8 ms of CPU per call of a turn
(``bench/moto_throughput.py``), and most of it on things whose result does not depend on the
request's data:

1. Response serialisation (24 % of the server's time): moto 5.2 serialises every response
   by walking the botocore output shape, and for each DynamoDB ``AttributeValue`` (every
   attribute of every item returned) it asks an attribute picker, through six alias providers,
   for each of the ten members of the union (S, N, B, ...), to find the one that is there.
   Here an ``AttributeValue`` given as moto gives it (a dict of one member) serialises that
   member only, through the same serializer method for the member's shape; the nine absent
   members were skipped by the generic path too. Taken only when no response transformer is
   registered (those could rename or drop a member by its path).
2. Update expressions are parsed once per distinct expression string (11 % with 3.): moto
   tokenises and parses the ``UpdateExpression`` twice per UpdateItem (the handler's check of
   the names used, then the backend). agentq's expressions are templates (values are
   ``:placeholders``), so a few dozen strings recur. The parsed tree is shared: moto only
   reads it (``find_clauses``) or deep-copies it before changing it (the validator's first act).
3. Those deep copies (a copy of the whole tree, with parents, per UpdateItem) copy the tree's
   nodes structurally (``Node.__deepcopy__``) instead of through ``copy``'s generic reduce
   protocol, and a node's child nodes are copied by a direct call, not through
   ``copy.deepcopy``'s dispatch (a 136-node claim expression: 0.45 -> 0.30 ms); any attribute
   that is not a node, a list or an immutable scalar still goes through ``copy.deepcopy``, with
   the same memo, so sharing and cycles come out the same. A parsed tree (2., never changed) is
   planned once as it is parsed, each node's attributes as constants, nodes of the tree or lists
   of those, and copied by its plan when copied on its own (0.30 -> 0.125 ms); a tree holding
   anything else gets no plan and is copied structurally.
4. The validator's ten walks of the tree (and ``find_clauses``, some 80 calls per UpdateItem)
   ask at every node whether it is a node, whether a processor handles it (building the
   processor's map of node types to handlers each time, twice) and which handler: each an
   ``isinstance`` against moto's abstract node classes, which goes through ``ABCMeta``. The
   answers depend only on the node's type (and the processor, whose map holds its own bound
   methods), so they are looked up by type, each worked out once with ``issubclass``.
5. Condition expressions are tokenised once per distinct string: moto's condition parser
   lexes the expression with a list of regular expressions tried in turn at every token (a
   third of its parse, ~4 % of the server's CPU per call of a turn), and the tokens depend on
   the string alone; names and values are substituted after, from each request's own maps.
   Each parse gets fresh tokens (a new deque of new nodes, each with a new empty children
   list), as lexing gave it.
6. Every request logged one line (werkzeug's request log, 4 %) to a server whose output the
   stack discards: the request log is off; warnings and errors still print.

None of these changes what a request returns or which error it raises; ``tests/test_moto_app.py``
checks the serialisation against moto's own for the items agentq writes and the other paths
through the server. ``bench/moto_throughput.py --apps agentq,plain`` measures the difference.

Which moto: ``moto_version.VERIFIED_MOTO`` (read in 5.2.5, and again in 5.2.6): ``BaseJSONSerializer``
with ``_serialize``/``_default_serialize``/``_value_picker``, ``UpdateExpressionParser.make``,
``ast_nodes.Node`` and ``DepthFirstTraverser``; ``install`` patches nothing on another version.
"""

from __future__ import annotations

import collections
import copy
import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

from agentq_dev import moto_version

EXPRESSION_CACHE = 4096  # distinct update expressions kept parsed (agentq uses a few dozen)
_IMMUTABLE = (str, int, float, bool, type(None), bytes)


@moto_version.verified_patch
def install() -> None:
    """Patch moto in this process (idempotent). False on a moto version not verified."""
    _fast_attribute_values()
    _parse_update_expressions_once()
    _copy_expression_trees_structurally()
    _walk_trees_by_type()
    _lex_conditions_once()
    quiet_request_log()


def _untyped(module: str) -> Any:
    """A moto module its own ``# type: ignore`` hides from mypy (the expression parser's)."""
    return importlib.import_module(module)


def quiet_request_log() -> None:
    """werkzeug logs every request at INFO; keep its warnings and errors."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def attribute_value_fast_path(generic: Callable[..., None]) -> Callable[..., None]:
    """``generic`` (a JSON serializer's ``_serialize_type_structure``) with 1. above in front."""

    def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if (
            key
            and shape.name == "AttributeValue"
            and type(value) is dict
            and len(value) == 1
            and not self._value_picker.response_transformers
            and self.operation_model.service_model.service_name == "dynamodb"
        ):
            ((member_key, member_value),) = value.items()
            member = shape.members.get(member_key)
            if member is not None and member_value is not None:
                wrapper: dict[str, Any] = {}
                member.parent = shape  # as the generic path leaves it
                self._serialize(wrapper, member_value, member, member_key)
                self._default_serialize(serialized, wrapper, shape, key)
                return
        generic(self, serialized, value, shape, key)

    return _serialize_type_structure


def _fast_attribute_values() -> None:
    from moto.core.serialize import BaseJSONSerializer

    fast = attribute_value_fast_path(BaseJSONSerializer._serialize_type_structure)
    BaseJSONSerializer._serialize_type_structure = fast  # type: ignore[method-assign]


def _parse_update_expressions_once() -> None:
    parser = _untyped("moto.dynamodb.parsing.expressions").UpdateExpressionParser
    parse = parser.make.__func__

    @functools.lru_cache(maxsize=EXPRESSION_CACHE)
    def make(expression: str) -> Any:
        tree = parse(parser, expression)
        _remember_plan(tree)
        return tree

    parser.make = staticmethod(make)


def _lex_conditions_once() -> None:
    parser = importlib.import_module("moto.dynamodb.comparisons").ConditionExpressionParser
    lex = parser._lex_condition_expression

    @functools.lru_cache(maxsize=EXPRESSION_CACHE)
    def tokens(expression: str) -> tuple[Any, ...]:
        return tuple(lex(parser(expression, None, None)))  # lexing reads the expression only

    def _lex_condition_expression(self: Any) -> collections.deque[Any]:
        return collections.deque(node._replace(children=[]) for node in tokens(self.condition_expression))

    _lex_condition_expression.__wrapped__ = lex  # type: ignore[attr-defined]  # moto's, for the tests
    parser._lex_condition_expression = _lex_condition_expression


def _copy_value(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)`` for what an expression tree holds: immutable scalars as
    they are, lists and nodes here, anything else through ``copy.deepcopy``."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    known = memo.get(id(value))
    if known is not None:
        return known
    if kind is list:
        return _copy_list(value, memo)
    if _is_copied_here(kind):  # what copy.deepcopy would call, without its dispatch
        return _copy_node(value, memo)
    return copy.deepcopy(value, memo)


def _copy_list(value: list[Any], memo: dict[int, Any]) -> list[Any]:
    """A list not copied yet (a node's children): its items copied in order, as above."""
    out: list[Any] = []
    memo[id(value)] = out
    append = out.append
    for item in value:
        kind = type(item)
        if kind in _IMMUTABLE:
            append(item)
        elif _NODE_COPIERS.get(kind) and id(item) not in memo:  # a child node: the common case
            append(_copy_node(item, memo))
        else:
            append(_copy_value(item, memo))
    copy._keep_alive(value, memo)  # type: ignore[attr-defined]  # what copy.deepcopy does for every copy
    return out


def _copy_node(self: Any, memo: dict[int, Any]) -> Any:
    """``Node.__deepcopy__``: a new node of the same class, each attribute copied as above (in
    their order, so memo and sharing come out as with ``copy.deepcopy``); a parsed tree's root,
    copied on its own (an empty memo), by its plan."""
    if not memo:
        planned = _PLANS.get(id(self))
        if planned is not None and planned[0] is self:
            return _copy_by_plan(planned[1], memo)
    cls = self.__class__
    new = cls.__new__(cls)
    memo[id(self)] = new
    attributes = {}
    for name, value in self.__dict__.items():
        kind = type(value)
        if kind in _IMMUTABLE:
            attributes[name] = value
        elif kind is list and id(value) not in memo:
            attributes[name] = _copy_list(value, memo)
        else:
            attributes[name] = _copy_value(value, memo)
    new.__dict__.update(attributes)
    copy._keep_alive(self, memo)  # type: ignore[attr-defined]
    return new


_NODE_COPIERS: dict[type, bool] = {}  # per class: does copy.deepcopy copy its instances with _copy_node?


def _is_copied_here(kind: type) -> bool:
    copied = _NODE_COPIERS.get(kind)
    if copied is None:  # nodes have no __deepcopy__ of their own: Node's, _copy_node
        copied = _NODE_COPIERS[kind] = getattr(kind, "__deepcopy__", None) is _copy_node
    return copied


# A parsed (cached, never changed) tree's id -> the tree and its copy plan.
_PLANS: dict[int, tuple[Any, tuple[Any, ...]]] = {}


def _remember_plan(tree: Any) -> None:
    """Plan the copies of a parsed tree: its nodes in the order the structural copy meets them,
    each attribute a constant, a node of the tree or a list of those. A tree with anything else
    (a value that is not a node, a list or an immutable scalar, a node or list met twice, a
    parent outside the tree) gets no plan: it is copied structurally."""
    nodes: list[Any] = []
    index: dict[int, int] = {}

    def collect(node: Any) -> None:
        index[id(node)] = len(nodes)
        nodes.append(node)
        for child in node.children if type(node.children) is list else ():
            if _is_copied_here(type(child)):
                if id(child) in index:
                    raise ValueError("a node met twice")
                collect(child)

    try:
        collect(tree)
    except (ValueError, AttributeError):
        return
    lists: list[list[Any]] = []
    list_ids: set[int] = set()
    layouts: list[tuple[tuple[str, int, Any], ...]] = []
    for node in nodes:
        layout: list[tuple[str, int, Any]] = []
        for name, value in node.__dict__.items():
            if type(value) in _IMMUTABLE:
                layout.append((name, _CONSTANT, value))
            elif id(value) in index:
                layout.append((name, _NODE, index[id(value)]))
            elif type(value) is list and id(value) not in list_ids:
                items = tuple((True, index[id(v)]) if id(v) in index else (False, v) for v in value)
                if not all(planned or type(v) in _IMMUTABLE for planned, v in items):
                    return
                lists.append(value)
                list_ids.add(id(value))
                layout.append((name, _LIST, items))
            else:
                return
        layouts.append(tuple(layout))
    if len(_PLANS) >= EXPRESSION_CACHE:
        _PLANS.clear()
    _PLANS[id(tree)] = (tree, (tuple(type(n) for n in nodes), tuple(layouts), tuple(nodes), tuple(lists)))


_CONSTANT, _NODE, _LIST = 0, 1, 2


def _copy_by_plan(plan: tuple[Any, ...], memo: dict[int, Any]) -> Any:
    """A copy of a planned tree: every node new, constants as they are, references to nodes of
    the tree to their copies, each list new; memo and keep-alive filled as the structural copy
    fills them."""
    classes, layouts, originals, original_lists = plan
    copies = [cls.__new__(cls) for cls in classes]
    new_lists = []
    for new, layout in zip(copies, layouts, strict=True):
        attributes = new.__dict__
        for name, kind, payload in layout:
            if kind == _CONSTANT:
                attributes[name] = payload
            elif kind == _NODE:
                attributes[name] = copies[payload]
            else:
                attributes[name] = items = [copies[v] if planned else v for planned, v in payload]
                new_lists.append(items)
    memo.update(zip(map(id, originals), copies, strict=True))
    memo.update(zip(map(id, original_lists), new_lists, strict=True))
    memo.setdefault(id(memo), []).extend([*originals, *original_lists])
    return copies[0]


def _copy_expression_trees_structurally() -> None:
    node_class = _untyped("moto.dynamodb.parsing.ast_nodes").Node
    node_class.__deepcopy__ = _copy_node


def _walk_trees_by_type() -> None:
    nodes = _untyped("moto.dynamodb.parsing.ast_nodes")
    node_class, traverser = nodes.Node, nodes.DepthFirstTraverser
    descend_into = (nodes.Expression, nodes.UpdateExpressionFunction)

    is_node: dict[type, bool] = {}
    descends: dict[type, bool] = {}

    def handler(self: Any, kind: type) -> Any:
        """The processor's handler for nodes of type ``kind`` (None: not processed), as
        ``process`` picks it: the first key of its map that ``kind`` is an instance of."""
        handlers: dict[type, Any] | None = self.__dict__.get("_agentq_handlers")
        if handlers is None:
            handlers = self.__dict__["_agentq_handlers"] = {}
            self.__dict__["_agentq_map"] = self._processing_map()
        if kind not in handlers:
            handlers[kind] = next((h for k, h in self.__dict__["_agentq_map"].items() if issubclass(kind, k)), None)
        return handlers[kind]

    def traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
        kind = type(node)
        if kind not in is_node:
            is_node[kind] = issubclass(kind, node_class)
        if is_node[kind]:
            parent_node = node.parent
            if node.children is not None:
                for i, child_node in enumerate(node.children):
                    self.pre_processing_of_child(node, i)
                    self.traverse_node_recursively(child_node, i)
            process = handler(self, kind)
            if process is not None:
                node = process(node)
                node.parent = parent_node
                if parent_node:
                    parent_node.children[child_id] = node
        return node

    def find_clauses(self: Any, clause_types: list[type]) -> list[Any]:
        clauses = []
        for child in self.children or []:
            kind = type(child)
            if kind in clause_types:
                clauses.append(child)
                continue
            if kind not in descends:
                descends[kind] = issubclass(kind, descend_into)
            if descends[kind]:
                clauses.extend(child.find_clauses(clause_types))
        return clauses

    traverser.traverse_node_recursively = traverse_node_recursively
    node_class.find_clauses = find_clauses
